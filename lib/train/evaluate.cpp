// The `eval` command: validation loss of a checkpoint, in any layout.
#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint.hpp"
#include "core/error.hpp"
#include "data/dataset.hpp"
#include "train/run_checkpoint.hpp"
#include "train/session.hpp"
#include "train/trainer.hpp"

namespace pptrain {

double evaluate_checkpoint(const Config& cfg) {
  const bool hf = cfg.checkpoint.resume.empty() && !cfg.checkpoint.init_from.empty();
  if (cfg.checkpoint.resume.empty() && !hf)
    throw InputError(cfg.source_path + ": checkpoint.resume: eval needs a checkpoint (a path, "
                                       "or auto) or checkpoint.init_from");
  const std::string path = hf ? "" : resolve_resume(cfg.checkpoint.dir, cfg.checkpoint.resume);
  if (path.empty() && !hf)
    throw InputError(cfg.checkpoint.dir + ": no valid checkpoint to evaluate (checkpoint.resume: auto)");
  const std::vector<int32_t> val = load_validation_tokens(cfg.data, cfg.model, cfg.train.seed);
  if (val.empty())
    throw InputError(cfg.source_path + ": data.val_path: eval needs validation data");
  // The memory plan predicts training (gradients, optimizer state, activation sets of a
  // schedule), not an evaluation: it would refuse evaluations that fit.
  Config eval_cfg = cfg;
  eval_cfg.train.memory_check = MemoryCheck::Off;
  Session s(eval_cfg);
  return run_all_or_none(s, [&](Session& session) {
    std::vector<float> params(session.model.layout().total_floats(), 0.0f);
    if (hf) {
      init_from_hf(session, params.data());
      session.model.write_params(params.data());
      return validation_loss(session, val, 0);
    }
    const CheckpointMeta meta = load_run_checkpoint(session, path, params.data(), nullptr, nullptr);
    session.model.write_params(params.data());
    check_same_model(cfg, meta, path);
    if (session.logs())
      spdlog::info("evaluating {} (step {}) on {} windows", path, meta.step,
                   validation_windows(val.size(), cfg.model.seq_len));
    return validation_loss(session, val, 0);
  });
}

}  // namespace pptrain
