// What training needs of the model part a rank holds, beyond what the pipeline drives
// (stage_model.hpp): the parameter and gradient arenas, laid out by the parameter layout
// table, and their initialisation. The session, gradient reduction, optimizer and
// checkpoints talk to this; make_model builds the config arch's (gpt.hpp, llama.hpp).
#pragma once
#include <cstdint>
#include <memory>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "model/activation_table.hpp"
#include "model/param_layout.hpp"
#include "model/ring_attention.hpp"
#include "model/stage_model.hpp"
#include "ops/ops.hpp"

namespace pptrain {

class Model : public StageModel {
 public:
  // Who holds the fp32 master weights: the model (its parameter arena, params()), or,
  // under a distributed optimizer, the optimizer (sharded; the model then holds only its
  // weight copy, in a compute dtype other than fp32).
  enum class Master { InModel, InOptimizer };

  virtual const ParamLayout& layout() const = 0;
  // The fp32 master parameters (null when the optimizer holds them) and the fp32
  // gradients, in backend memory, laid out by layout(); weights() is the copy the forward
  // computes with, in the backend's compute dtype (the master itself when that is fp32).
  virtual float* params() = 0;
  virtual float* grads() = 0;
  virtual ops::Act* weights() = 0;
  virtual bool has_weight_copy() const = 0;
  // Host copies of the master parameters (layout().total_floats() floats). write_params
  // also refreshes weights(); without a master it sets weights() alone. read_params
  // needs the master.
  virtual void read_params(float* host) const = 0;
  virtual void write_params(const float* host) = 0;
  // The architecture's initial values of every entry, a function of (seed, tensor name,
  // global element index): into a host arena (initial_parameters), or the model's own.
  virtual void initial_parameters(uint64_t seed, float* host) const = 0;
  virtual void init_parameters(uint64_t seed) = 0;
  virtual void zero_grads() = 0;
};

// The model part `part` of `config`, micro-batches of `batch` sequences, on `ops`; `tp`
// the tensor-parallel group for the backend's arrays (null when part.tp_size == 1);
// `ring` the context-parallel ring (ring_attention.hpp; none by default).
std::unique_ptr<Model> make_model(const ModelConfig& config, int batch, ops::Ops& ops,
                                  const ModelPartition& part, comm::Group* tp,
                                  const ActivationPolicy& policy, Model::Master master,
                                  const ContextRing& ring = {});

}  // namespace pptrain
