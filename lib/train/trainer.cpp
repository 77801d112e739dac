// The single-rank training loop: micro-batch gradient accumulation, clipping, AdamW,
// periodic validation, logging and checkpoints.
#include "train/trainer.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "core/error.hpp"
#include "data/dataset.hpp"
#include "model/gpt.hpp"
#include "optim/adamw.hpp"
#include "optim/lr_schedule.hpp"
#include "train/metrics.hpp"
#include "train/session.hpp"

namespace pptrain {

namespace {
using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string format_eta(double s) {
  const long t = std::lround(s);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  return buf;
}

bool due(int64_t steps_done, int every, int64_t last_step) {
  return steps_done == last_step || (every > 0 && steps_done % every == 0);
}
}  // namespace

TrainResult train(const Config& cfg) {
  Session s(cfg, cfg.parallel.micro_batch_size);
  TrainData data = TrainData::open(cfg.data, cfg.model, cfg.train.seed);
  const std::vector<int32_t> val = load_validation_tokens(cfg.data, cfg.model, cfg.train.seed);
  if (!val.empty() && validation_windows(val.size(), cfg.model.seq_len) == 0)
    throw InputError(cfg.data.val_path + ": holds " + std::to_string(val.size()) +
                     " tokens, fewer than one window of seq_len+1");
  AdamW opt(s.model.layout(), cfg.train);
  GptModel& model = s.model;

  TrainResult result;
  const std::string& ckpt_dir = cfg.checkpoint.dir;
  const std::string resume = ckpt_dir.empty() && cfg.checkpoint.resume == "auto"
                                 ? std::string()
                                 : resolve_resume(ckpt_dir, cfg.checkpoint.resume);
  if (!resume.empty()) {
    CheckpointMeta meta = load_checkpoint(resume, model.layout(), model.params(),
                                          opt.exp_avg(), opt.exp_avg_sq());
    result.steps_done = meta.step;
    spdlog::info("resumed from {} at step {}", resume, meta.step);
  } else {
    if (!ckpt_dir.empty() && has_checkpoints(ckpt_dir))
      throw InputError(ckpt_dir + ": already holds checkpoints of an earlier run; set "
                       "checkpoint.resume: auto to continue it, or choose another checkpoint.dir");
    model.init_parameters(cfg.train.seed);
  }
  spdlog::info("data: {}; validation: {} tokens", data.describe(), val.size());
  spdlog::info("model: {} parameters; {} tokens per step", model.layout().hf_param_count(),
               tokens_per_step(cfg));

  MetricsWriter metrics(cfg.logging.metrics);
  TraceRecorder trace(cfg.logging.trace, cfg.logging.trace_steps);
  const int M = cfg.parallel.micro_batches, B = model.batch(), T = cfg.model.seq_len;
  const int64_t last_step = cfg.train.steps;
  const double flops_per_step = gpt_flops_per_token(cfg.model) * double(tokens_per_step(cfg));
  std::vector<int32_t> window(T + 1), inputs(size_t(B) * T), targets(size_t(B) * T);
  double train_seconds = 0;
  const int64_t first_step = result.steps_done;
  if (first_step >= last_step) spdlog::info("nothing to train: already at step {}", first_step);

  for (int64_t step = first_step; step < last_step; ++step) {
    const auto t0 = Clock::now();
    const bool traced = trace.enabled_for(step);
    model.zero_grads();
    double loss_sum = 0;
    for (int mb = 0; mb < M; ++mb) {
      for (int b = 0; b < B; ++b) {
        data.sequence(step, int64_t(mb) * B + b, window.data());
        std::copy(window.begin(), window.end() - 1, inputs.begin() + size_t(b) * T);
        std::copy(window.begin() + 1, window.end(), targets.begin() + size_t(b) * T);
      }
      const auto f0 = Clock::now();
      loss_sum += model.forward(inputs.data(), targets.data(), 1.0f / float(M));
      const auto f1 = Clock::now();
      model.backward_input();
      const auto f2 = Clock::now();
      model.backward_weight();
      const auto f3 = Clock::now();
      if (traced) {
        const std::string id = " mb" + std::to_string(mb);
        trace.add("F" + id, step, f0, f1);
        trace.add("B" + id, step, f1, f2);
        trace.add("W" + id, step, f2, f3);
      }
    }
    const double loss = loss_sum / M;
    const double norm = grad_norm(model.layout(), model.grads());
    if (!std::isfinite(loss) || !std::isfinite(norm))
      throw std::runtime_error("step " + std::to_string(step + 1) + ": loss " +
                               std::to_string(loss) + ", grad norm " + std::to_string(norm) +
                               " is not finite; stopping before the update");
    const double lr = learning_rate(cfg.train, step);
    const auto o0 = Clock::now();
    opt.step(model.params(), model.grads(), float(lr), clip_scale(norm, cfg.train.grad_clip),
             step + 1);
    const auto t1 = Clock::now();
    if (traced) trace.add("optimizer", step, o0, t1);

    const double step_s = seconds(t1 - t0);
    train_seconds += step_s;
    result.steps_done = step + 1;
    result.last_loss = loss;
    const int64_t n = result.steps_done;
    std::optional<double> val_loss;
    if (!val.empty() && due(n, cfg.train.eval_every, last_step)) {
      val_loss = validation_loss(model, val, cfg.train.eval_batches);
      result.last_val_loss = val_loss;
    }
    if (due(n, cfg.logging.every, last_step) || val_loss || n == first_step + 1) {
      const double tok_s = double(tokens_per_step(cfg)) / step_s;
      const double eta = train_seconds / double(n - first_step) * double(last_step - n);
      spdlog::info("step {}/{} | loss {:.4f}{} | lr {:.3e} | grad norm {:.3f} | {:.0f} tok/s | "
                   "{:.3f} s | eta {}",
                   n, last_step, loss, val_loss ? fmt::format(" | val {:.4f}", *val_loss) : "", lr,
                   norm, tok_s, step_s, format_eta(eta));
      nlohmann::json rec = {{"step", n},           {"loss", loss},          {"lr", lr},
                            {"grad_norm", norm},   {"tokens_per_s", tok_s}, {"step_time_s", step_s},
                            {"tflops_per_rank", flops_per_step / step_s / 1e12}};
      if (val_loss) rec["val_loss"] = *val_loss;
      metrics.write(rec);
    }
    if (!ckpt_dir.empty() && due(n, cfg.checkpoint.every, last_step)) {
      CheckpointMeta meta;
      meta.step = n;
      meta.config_yaml = to_yaml(cfg);
      meta.train_state = {{"data_cursor", {{"seed", cfg.train.seed}, {"next_step", n}}},
                          {"tokens_seen", n * tokens_per_step(cfg)},
                          {"loss", loss}};
      meta.extra_files["config.json"] = hf_gpt2_config(cfg.model);
      result.last_checkpoint = save_checkpoint(ckpt_dir, cfg.checkpoint.keep, model.layout(),
                                               model.params(), opt.exp_avg(), opt.exp_avg_sq(), meta);
    }
  }
  trace.write();
  return result;
}

}  // namespace pptrain
