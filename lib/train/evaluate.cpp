// Validation loss and the `eval` command.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "checkpoint/checkpoint.hpp"
#include "core/error.hpp"
#include "data/dataset.hpp"
#include "train/session.hpp"
#include "train/trainer.hpp"

namespace pptrain {

std::unique_ptr<ops::Ops> make_backend(const Config& config) {
  if (config.device == "cuda")
    throw InputError(config.source_path +
                     ": device: cuda is not available in this build (CPU backend only); use "
                     "device: cpu or auto");
  return ops::make_cpu_ops(config.train.threads);
}

double validation_loss(GptModel& model, const std::vector<int32_t>& tokens, int max_batches) {
  const int B = model.batch(), T = model.config().seq_len;
  int64_t windows = validation_windows(tokens.size(), T);
  if (max_batches > 0) windows = std::min<int64_t>(windows, int64_t(max_batches) * B);
  PPTRAIN_CHECK(windows > 0, "validation data holds no whole window");
  std::vector<int32_t> inputs(size_t(B) * T), targets(size_t(B) * T);
  double sum = 0;
  for (int64_t first = 0; first < windows; first += B) {
    const int rows = int(std::min<int64_t>(B, windows - first));
    for (int b = 0; b < B; ++b) {
      // A partial last batch repeats its first window in the unused rows; only the
      // real rows are counted.
      const int32_t* w = tokens.data() + (first + (b < rows ? b : 0)) * (T + 1);
      std::copy(w, w + T, inputs.begin() + size_t(b) * T);
      std::copy(w + 1, w + T + 1, targets.begin() + size_t(b) * T);
    }
    model.forward(inputs.data(), targets.data());
    const float* losses = model.position_losses();
    for (size_t i = 0; i < size_t(rows) * T; ++i) sum += losses[i];
  }
  return sum / (double(windows) * T);
}

double evaluate_checkpoint(const Config& cfg) {
  if (cfg.checkpoint.resume.empty())
    throw InputError(cfg.source_path +
                     ": checkpoint.resume: eval needs a checkpoint (a path, or auto)");
  const std::string path = resolve_resume(cfg.checkpoint.dir, cfg.checkpoint.resume);
  if (path.empty())
    throw InputError(cfg.checkpoint.dir + ": no valid checkpoint to evaluate (checkpoint.resume: auto)");
  const std::vector<int32_t> val = load_validation_tokens(cfg.data, cfg.model, cfg.train.seed);
  if (val.empty())
    throw InputError(cfg.source_path + ": data.val_path: eval needs validation data");
  if (validation_windows(val.size(), cfg.model.seq_len) == 0)
    throw InputError(cfg.data.val_path + ": holds " + std::to_string(val.size()) +
                     " tokens, fewer than one window of seq_len+1 = " +
                     std::to_string(cfg.model.seq_len + 1));
  Session s(cfg, cfg.parallel.micro_batch_size);
  const CheckpointMeta meta =
      load_checkpoint(path, s.model.layout(), s.model.params(), nullptr, nullptr);
  spdlog::info("evaluating {} (step {}) on {} windows", path, meta.step,
               validation_windows(val.size(), cfg.model.seq_len));
  return validation_loss(s.model, val, 0);
}

}  // namespace pptrain
