// The model part a rank holds, as the pipeline executor (pipeline/executor.hpp) drives
// it: activation sets per chunk, the stage-boundary arrays the messages move, and the
// three passes. GptModel is one; the memory plan runs the executor on another that only
// counts what it would allocate (activation_peaks), so the executor's rules are written
// once.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "model/activation_table.hpp"
#include "model/param_layout.hpp"
#include "ops/ops.hpp"

namespace pptrain {

class StageModel {
 public:
  // One micro-batch's saved values for one chunk, from its forward to its weight pass.
  // Owned by the caller (the executor pools them); the model reads and writes it.
  struct Set {
    virtual ~Set() = default;
  };
  using LayerFn = std::function<void(int layer)>;

  virtual ~StageModel() = default;
  virtual const ModelPartition& partition() const = 0;
  virtual ops::Ops& backend() const = 0;
  // Tokens of one micro-batch: batch * seq_len.
  virtual std::size_t micro_batch_tokens() const = 0;

  // A new set of `chunk`. Parts a set needs only between passes are lent while needed;
  // release_parts returns them once W is done. The boundary arrays (Slot::output,
  // output_grad, input_grad) are lent from their first use; release_boundaries returns
  // what a set holds of them, return_boundary one of them.
  virtual std::unique_ptr<Set> new_set(int chunk) = 0;
  virtual void release_parts(Set& s) = 0;
  virtual void release_boundaries(Set& s) = 0;
  virtual void return_boundary(Set& s, Slot slot) = 0;
  // A hop between chunks on this rank writes straight into the other set's array: the
  // forward's output into the next chunk's input_buffer, the input gradient into the
  // previous chunk's output_grad.
  virtual void output_into(Set& s, ops::Act* next_input) = 0;
  virtual void input_grad_into(Set& s, ops::Act* previous_output_grad) = 0;
  // The stage-boundary arrays, boundary_bytes() each, in backend memory.
  virtual ops::Act* input_buffer(Set& s) const = 0;  // a non-first chunk's input
  virtual ops::Act* output(Set& s) = 0;              // the rows sent forward
  virtual ops::Act* output_grad(Set& s) = 0;         // where dL/d(output) is received
  virtual ops::Act* input_grad(Set& s) = 0;          // dL/d(input), sent back
  virtual std::size_t boundary_bytes() const = 0;
  // The part of a boundary array sent or received between stages (byte offset, length),
  // and what completes the whole array after a receive.
  virtual std::pair<std::size_t, std::size_t> message_part() const = 0;
  virtual void complete_message(ops::Act* boundary) = 0;

  // The forward of one chunk on a micro-batch: a first chunk reads `tokens` (host), any
  // other `input` (backend memory). A last chunk returns the mean loss over `targets`
  // (host), or with `loss_total` adds it there (backend memory, fp64) and returns 0;
  // loss_scale > 0 prepares the backward of loss_scale * mean loss, 0 is evaluation.
  virtual float forward(int chunk, Set& s, const int32_t* tokens, const ops::Act* input,
                        const int32_t* targets, float loss_scale, double* loss_total) = 0;
  // The input-gradient and weight-gradient passes; `layer_done` is called with each layer
  // once its weight gradients are queued.
  virtual void backward_input(int chunk, Set& s, const LayerFn& layer_done) = 0;
  virtual void backward_weight(int chunk, Set& s, const LayerFn& layer_done) = 0;
  // Per-position losses [batch, seq_len] (host) of a last chunk's forward.
  virtual const std::vector<float>& position_losses(const Set& s) const = 0;
};

}  // namespace pptrain
