// The training loop of one rank in any (tp, pp, dp) layout: the pipeline schedule with
// gradient accumulation, data-parallel and tied-embedding gradient reduction, global
// clipping, AdamW, periodic validation, logging, traces and checkpoints.
#include "train/trainer.hpp"

#include <spdlog/spdlog.h>

#include <sys/resource.h>

#include <chrono>
#include <optional>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "checkpoint/dir_lock.hpp"
#include "core/aligned_buffer.hpp"
#include "core/error.hpp"
#include "data/dataset.hpp"
#include "optim/adamw.hpp"
#include "optim/lr_schedule.hpp"
#include "pipeline/simulator.hpp"
#include "train/metrics.hpp"
#include "train/mfu.hpp"
#include "train/grad_sync.hpp"
#include "train/run_checkpoint.hpp"
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

// Per-step timings aggregated over ranks for the log.
// Bubble over ranks (mean, min, max), mean seconds per rank in each kind of work, the
// most activation sets any rank held at once and the largest resident set (MiB).
struct StepReport {
  double bubble = 0, bubble_min = 0, bubble_max = 0, compute_s = 0, wait_s = 0, comm_s = 0;
  StageCosts costs;  // mean seconds of one micro-batch's F, B and W on a whole stage
  int peak_activations = 0;
  double peak_rss_mib = 0;
  double peak_memory_mib = 0;  // most backend memory a rank held at once, max over ranks
  bool stop = false;  // some rank got a stop signal
};

StepReport aggregate(Session& s, const PipelineStats& st, double comm_s, bool stop) {
  const double bubble = st.elapsed_s > 0 ? 1.0 - st.compute_s / st.elapsed_s : 0.0;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  double sums[7] = {bubble, st.compute_s, st.wait_s, comm_s,
                    st.forward_s, st.backward_input_s, st.backward_weight_s};
  double extremes[6] = {bubble, -bubble, double(st.peak_activations),
                        double(usage.ru_maxrss) / 1024, stop ? 1.0 : 0.0,
                        double(s.ops->peak_memory_bytes()) / (1024.0 * 1024.0)};
  s.comms.all->all_reduce(sums, 7, comm::ReduceOp::Sum);
  s.comms.all->all_reduce(extremes, 6, comm::ReduceOp::Max);
  const double n = s.grid.world_size(), per_action = n * s.cfg.parallel.micro_batches;
  const StageCosts costs{sums[4] / per_action, sums[5] / per_action, sums[6] / per_action, 0};
  return {sums[0] / n, -extremes[1], extremes[0], sums[1] / n, sums[2] / n, sums[3] / n, costs,
          int(extremes[2]), extremes[3], extremes[5], extremes[4] > 0};
}

// The ranks' steps simulated with this step's measured F, B and W times and free
// messages: what the bubble would be if the ranks only waited for each other's compute.
double simulated_bubble(const std::vector<std::vector<Step>>& steps, const Config& cfg,
                        const StageCosts& costs, MessageMode mode) {
  const auto& p = cfg.parallel;
  if (costs.forward <= 0) return 0;
  return simulate_steps(steps, placement_of(cfg), p.micro_batches, mode, costs,
                        p.layers_per_stage)
      .bubble;
}

// True when some rank has been asked to stop (collective).
bool stop_requested_anywhere(Session& s, const StopSignals& signals) {
  double stop = signals.requested() ? 1 : 0;
  s.comms.all->all_reduce(&stop, 1, comm::ReduceOp::Max);
  return stop > 0;
}

// True when every parameter of every rank is finite.
bool parameters_finite(Session& s) {
  // A sum of fp32 squares in fp64 cannot overflow: it is finite iff every element is.
  const double sq = s.ops->sum_squares({{s.model.params(), s.model.layout().total_floats()}});
  double bad = std::isfinite(sq) ? 0 : 1;
  s.comms.all->all_reduce(&bad, 1, comm::ReduceOp::Max);
  return bad == 0;
}
}  // namespace

namespace {
TrainResult train_rank(Session& s, const StopSignals& signals) {
  const Config& cfg = s.cfg;
  GptModel& model = s.model;
  const auto& par = cfg.parallel;
  TrainData data = TrainData::open(cfg.data, cfg.model, cfg.train.seed);
  const std::vector<int32_t> val = load_validation_tokens(cfg.data, cfg.model, cfg.train.seed);
  GradSync sync(s);
  AdamW opt(*s.ops, model.layout(), cfg.train, sync.begin(), sync.end());
  const size_t arena = model.layout().total_floats();

  TrainResult result;
  const std::string& ckpt_dir = cfg.checkpoint.dir;
  // Rank 0 holds the directory for the whole run; no rank reads it before that.
  std::optional<CheckpointDirLock> ckpt_lock;
  if (!ckpt_dir.empty()) {
    if (s.rank == 0) ckpt_lock.emplace(ckpt_dir);
    s.comms.world->barrier();
  }
  const std::string resume = ckpt_dir.empty() && cfg.checkpoint.resume == "auto"
                                 ? std::string()
                                 : resolve_resume(ckpt_dir, cfg.checkpoint.resume);
  if (!resume.empty()) {
    AlignedBuffer<float> m(arena), v(arena);
    const CheckpointMeta meta = load_run_checkpoint(s, resume, m.data(), v.data());
    check_same_model(cfg, meta, resume);
    result.steps_done = meta.step;
    sync.load_moments(m.data(), v.data(), opt);
    if (s.logs()) spdlog::info("resumed from {} at step {}", resume, result.steps_done);
  } else {
    if (!ckpt_dir.empty() && has_checkpoints(ckpt_dir))
      throw InputError(cfg.checkpoint.resume == "auto"
                           ? ckpt_dir + ": holds checkpoints but none of them is valid (see the "
                                        "warnings above); move them away or choose another "
                                        "checkpoint.dir"
                           : ckpt_dir + ": already holds checkpoints of an earlier run; set "
                                        "checkpoint.resume: auto to continue it, or choose "
                                        "another checkpoint.dir");
    model.init_parameters(cfg.train.seed);
  }
  // MFU's denominator: only for GPUs (or a configured peak).
  const double peak_tflops = peak_tflops_for(cfg.train.peak_tflops, s.ops->device_model());
  const ScheduleKind kind = parse_schedule(par.schedule);
  const MessageMode mode = message_mode(cfg, s.ops->device_memory());
  const double bubble_theory = theoretical_bubble(kind, par.pp, par.micro_batches,
                                                  par.virtual_stages, mode, planned_costs(cfg));
  // Every rank's steps (the executor runs its own part), simulated at each step's times.
  const auto pipeline_steps = build_all_steps(kind, par.pp, par.micro_batches,
                                              par.virtual_stages, mode, planned_costs(cfg));
  if (s.logs()) {
    spdlog::info("data: {}; validation: {} tokens", data.describe(), val.size());
    spdlog::info("model: {} parameters; {} tokens per step; layout tp {} pp {} dp {}, {} ranks, "
                 "schedule {} (theoretical bubble {:.3f})",
                 gpt_param_layout(cfg.model).hf_param_count(), tokens_per_step(cfg), par.tp,
                 par.pp, par.dp, s.grid.world_size(), par.schedule, bubble_theory);
    spdlog::info("backend: {}{}", s.ops->name(),
                 peak_tflops > 0 ? fmt::format("; MFU against {:.0f} TFLOP/s per GPU", peak_tflops)
                                 : std::string());
  }

  MetricsWriter metrics(s.logs() ? cfg.logging.metrics : "");
  if (!cfg.logging.trace.empty()) s.comms.world->barrier();  // align the ranks' trace clocks
  TraceRecorder trace(cfg.logging.trace, cfg.logging.trace_steps, s.rank);
  const int M = par.micro_batches, B = model.batch(), T = cfg.model.seq_len;
  const int64_t last_step = cfg.train.steps;
  const double flops_per_step = gpt_flops_per_token(cfg.model) * double(tokens_per_step(cfg));
  std::vector<int32_t> window(size_t(T) + 1);
  double train_seconds = 0;
  int nonfinite_in_a_row = 0;
  const int64_t first_step = result.steps_done;
  if (stop_requested_anywhere(s, signals)) {
    if (s.logs()) spdlog::warn("stop signal received before step {}: nothing to save", first_step + 1);
    result.stopped_by_signal = true;
    return result;
  }
  if (first_step >= last_step && s.logs()) spdlog::info("nothing to train: already at step {}", first_step);

  for (int64_t step = first_step; step < last_step; ++step) {
    const auto t0 = Clock::now();
    model.zero_grads();
    // Sequence j of micro-batch mb on data-parallel rank d is the step's global sequence
    // (d * M + mb) * B + j: the step's batch does not depend on the layout.
    auto fill = [&](int mb, int32_t* in, int32_t* tg) {
      for (int b = 0; b < B; ++b) {
        data.sequence(step, (int64_t(s.coord.dp) * M + mb) * B + b, window.data());
        std::copy(window.begin(), window.end() - 1, in + size_t(b) * T);
        std::copy(window.begin() + 1, window.end(), tg + size_t(b) * T);
      }
    };
    sync.start_step();
    auto chunk_done = [&](int c) { sync.chunk_done(c); };
    PipelineExecutor::ActionFn on_action;
    // Trace steps count from 1, as in the log.
    const bool traced = trace.enabled_for(step + 1);
    if (traced)
      on_action = [&](const Action& a, Clock::time_point b, Clock::time_point e) {
        trace.add(std::string(op_name(a.op)) + " mb" + std::to_string(a.microbatch) +
                      (par.virtual_stages > 1 ? " c" + std::to_string(a.chunk) : ""),
                  step + 1, b, e);
      };
    const PipelineStats st = s.executor.train_step(fill, 1.0f / float(M * par.dp), on_action, chunk_done);

    const auto c0 = Clock::now();
    const double norm = sync.finish();
    const double loss = share(s, st.loss_sum / (M * par.dp), s.head_stage() && s.coord.tp == 0);
    const double comm_s = seconds(Clock::now() - c0);
    const double lr = learning_rate(cfg.train, step);
    const auto o0 = Clock::now();
    // loss and norm are the same on every rank, so every rank decides alike.
    if (std::isfinite(loss) && std::isfinite(norm)) {
      nonfinite_in_a_row = 0;
      sync.update(opt, float(lr), clip_scale(norm, cfg.train.grad_clip), step + 1);
    } else {
      const std::string what = "step " + std::to_string(step + 1) + ": loss " + std::to_string(loss) +
                               ", grad norm " + std::to_string(norm) + " is not finite";
      if (cfg.train.on_nonfinite == "stop" || ++nonfinite_in_a_row >= cfg.train.max_nonfinite)
        throw std::runtime_error(what + "; stopping before the update");
      if (s.logs()) spdlog::warn("{}; update skipped ({} in a row)", what, nonfinite_in_a_row);
    }
    const auto t1 = Clock::now();
    if (traced) trace.add("optimizer", step + 1, o0, t1);

    const StepReport rep = aggregate(s, st, comm_s, signals.requested());
    double step_s = seconds(t1 - t0);
    s.comms.all->all_reduce(&step_s, 1, comm::ReduceOp::Max);
    train_seconds += step_s;
    result.steps_done = step + 1;
    result.last_loss = loss;
    const int64_t n = result.steps_done;
    std::optional<double> val_loss;
    if (!val.empty() && due(n, cfg.train.eval_every, last_step)) {
      val_loss = validation_loss(s, val, cfg.train.eval_batches);
      result.last_val_loss = val_loss;
    }
    if (s.logs() && (due(n, cfg.logging.every, last_step) || val_loss || n == first_step + 1)) {
      const double tok_s = double(tokens_per_step(cfg)) / step_s;
      const double flops_per_rank = flops_per_step / step_s / s.grid.world_size();
      const double util = mfu(flops_per_rank, peak_tflops);
      const double eta = train_seconds / double(n - first_step) * double(last_step - n);
      spdlog::info("step {}/{} | loss {:.4f}{} | lr {:.3e} | grad norm {:.3f} | {:.0f} tok/s{} | "
                   "{:.3f} s | bubble {:.3f} (theory {:.3f}) | eta {}",
                   n, last_step, loss, val_loss ? fmt::format(" | val {:.4f}", *val_loss) : "", lr,
                   norm, tok_s, peak_tflops > 0 ? fmt::format(" | MFU {:.1f}%", 100 * util) : "",
                   step_s, rep.bubble, bubble_theory, format_eta(eta));
      nlohmann::json rec = {{"step", n},
                            {"loss", loss},
                            {"lr", lr},
                            {"grad_norm", norm},
                            {"tokens_per_s", tok_s},
                            {"step_time_s", step_s},
                            {"tflops_per_rank", flops_per_rank / 1e12},
                            {"bubble", rep.bubble},
                            {"bubble_min", rep.bubble_min},
                            {"bubble_max", rep.bubble_max},
                            {"bubble_theory", bubble_theory},
                            {"bubble_sim", simulated_bubble(pipeline_steps, cfg, rep.costs, mode)},
                            {"forward_ms", rep.costs.forward * 1e3},
                            {"backward_input_ms", rep.costs.backward_input * 1e3},
                            {"backward_weight_ms", rep.costs.backward_weight * 1e3},
                            {"compute_s", rep.compute_s},
                            {"wait_s", rep.wait_s},
                            {"comm_s", rep.comm_s},
                            {"peak_activations", rep.peak_activations},
                            {"peak_rss_mib", rep.peak_rss_mib},
                            {"peak_memory_mib", rep.peak_memory_mib}};
      if (val_loss) rec["val_loss"] = *val_loss;
      if (peak_tflops > 0) rec["mfu"] = util;
      if (s.ops->device_memory()) rec["peak_device_mib"] = rep.peak_memory_mib;  // its old name
      metrics.write(rec);
    }
    if (!ckpt_dir.empty() && (due(n, cfg.checkpoint.every, last_step) || rep.stop)) {
      if (!parameters_finite(s))
        throw std::runtime_error("step " + std::to_string(n) +
                                 ": the model has non-finite parameters; not checkpointed");
      CheckpointMeta meta;
      meta.step = n;
      meta.config_yaml = to_yaml(cfg);
      meta.train_state = {{"data_cursor", {{"seed", cfg.train.seed}, {"next_step", n}}},
                          {"tokens_seen", n * tokens_per_step(cfg)},
                          {"loss", loss}};
      meta.extra_files["config.json"] = hf_gpt2_config(cfg.model);
      AlignedBuffer<float> m(arena), v(arena);
      sync.full_moments(opt, m.data(), v.data());
      result.last_checkpoint = save_run_checkpoint(s, m.data(), v.data(), meta);
    }
    if (rep.stop) {
      if (s.logs()) spdlog::warn("stop signal received: stopped after step {}{}", n,
                                 ckpt_dir.empty() ? " (checkpoints disabled: nothing saved)"
                                                  : ", checkpoint saved");
      result.stopped_by_signal = true;
      break;
    }
  }
  if (metrics.lost() > 0)
    spdlog::error("logging.metrics: {} of {} records could not be written to {}", metrics.lost(),
                  metrics.lost() + metrics.written(), metrics.path());
  trace.write();
  if (!cfg.logging.trace.empty()) {
    s.comms.world->barrier();
    if (s.logs()) merge_traces(cfg.logging.trace, s.grid.world_size());
  }
  return result;
}
}  // namespace

TrainResult train(const Config& cfg, const StopSignals& signals) {
  Session s(cfg);
  return run_all_or_none(s, [&](Session& session) { return train_rank(session, signals); });
}

TrainResult train(const Config& cfg) {
  const StopSignals signals;
  return train(cfg, signals);
}

}  // namespace pptrain
