// What every command that runs the model needs: the numeric backend chosen by
// `device`, and the model built on it; plus the validation-loss routine they share.
#pragma once
#include <memory>
#include <vector>

#include "config/config.hpp"
#include "model/gpt.hpp"
#include "ops/ops.hpp"

namespace pptrain {

// The backend for config.device ("cpu", or "auto" without CUDA). InputError for
// "cuda" while this build has no CUDA backend.
std::unique_ptr<ops::Ops> make_backend(const Config& config);

struct Session {
  Session(const Config& config, int batch)
      : ops(make_backend(config)), model(config.model, batch, *ops) {}
  std::unique_ptr<ops::Ops> ops;
  GptModel model;
};

// Mean loss over consecutive windows of seq_len+1 tokens of `tokens`, in order, the
// last partial window dropped; at most max_batches * batch windows when max_batches > 0.
double validation_loss(GptModel& model, const std::vector<int32_t>& tokens, int max_batches);

}  // namespace pptrain
