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
#include "model/gpt.hpp"
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
  int device_syncs = 0;        // most host waits on the device any rank made in the step
  bool stop = false;  // some rank got a stop signal
};

StepReport aggregate(Session& s, const PipelineStats& st, double comm_s, double device_syncs,
                     bool stop) {
  const double bubble = st.elapsed_s > 0 ? 1.0 - st.compute_s / st.elapsed_s : 0.0;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  double sums[7] = {bubble, st.compute_s, st.wait_s, comm_s,
                    st.forward_s, st.backward_input_s, st.backward_weight_s};
  double extremes[7] = {bubble, -bubble, double(st.peak_activations),
                        double(usage.ru_maxrss) / 1024, stop ? 1.0 : 0.0,
                        double(s.ops->peak_memory_bytes()) / (1024.0 * 1024.0), device_syncs};
  s.comms.all->all_reduce(sums, 7, comm::ReduceOp::Sum);
  s.comms.all->all_reduce(extremes, 7, comm::ReduceOp::Max);
  const double n = s.grid.world_size(), per_action = n * s.cfg.parallel.micro_batches;
  const StageCosts costs{sums[4] / per_action, sums[5] / per_action, sums[6] / per_action, 0};
  return {sums[0] / n, -extremes[1], extremes[0], sums[1] / n, sums[2] / n, sums[3] / n, costs,
          int(extremes[2]), extremes[3], extremes[5], int(extremes[6]), extremes[4] > 0};
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

// True when every master weight of every rank is finite.
bool parameters_finite(Session& s, GradSync& sync, AdamW& opt) {
  // A sum of fp32 squares in fp64 cannot overflow: it is finite iff every element is.
  const double sq = s.ops->sum_squares({sync.master(opt)});
  double bad = std::isfinite(sq) ? 0 : 1;
  s.comms.all->all_reduce(&bad, 1, comm::ReduceOp::Max);
  return bad == 0;
}

// One rank's run, as named steps: resume or initialise, then per step train, validate
// when due, report, checkpoint when due, and stop on a signal. Every rank calls the same
// collectives in the same order, so each step below runs on every rank.
class RankTrainer {
 public:
  RankTrainer(Session& s, const StopSignals& signals);
  TrainResult run();

 private:
  // What one optimizer step produced, the same on every rank.
  struct StepOutcome {
    double loss = 0, grad_norm = 0, lr = 0, seconds = 0;
    std::int64_t device_syncs = 0;  // this rank's host waits on the device in the step
    // What this rank's kernels did in the step, where the runtime counts it.
    std::optional<ops::Ops::KernelCounters> kernels;
    StepReport report;
  };
  void resume_or_init();
  void log_start() const;
  StepOutcome train_step(int64_t step);
  void check_finite(int64_t step, double loss, double norm);
  std::optional<double> maybe_validate(int64_t n);
  void report(int64_t n, const StepOutcome& o, const std::optional<double>& val_loss);
  void maybe_checkpoint(int64_t n, const StepOutcome& o);
  void finish_logs();

  Session& s_;
  const Config& cfg_;
  const StopSignals& signals_;
  TrainData data_;
  const std::vector<int32_t> val_;
  GradSync sync_;
  AdamW opt_;
  std::optional<CheckpointDirLock> ckpt_lock_;  // rank 0, for the whole run
  // The pipeline: the schedule's steps of every rank (the executor runs its own part),
  // simulated at each step's measured times, and its bubble at the planned ones.
  const MessageMode mode_;
  const std::vector<std::vector<Step>>& pipeline_steps_;  // the executor's
  const double bubble_theory_;
  const double peak_tflops_;  // MFU's denominator: only for GPUs (or a configured peak)
  MetricsWriter metrics_;
  std::optional<TraceRecorder> trace_;
  const int64_t last_step_;
  int64_t first_step_ = 0;
  double train_seconds_ = 0;
  int nonfinite_in_a_row_ = 0;
  TrainResult result_;
};

RankTrainer::RankTrainer(Session& s, const StopSignals& signals)
    : s_(s),
      cfg_(s.cfg),
      signals_(signals),
      data_(TrainData::open(cfg_.data, cfg_.model, cfg_.train.seed)),
      val_(load_validation_tokens(cfg_.data, cfg_.model, cfg_.train.seed)),
      sync_(s),
      opt_(*s.ops, s.model.layout(), cfg_.train, sync_.ranges(),
           /*holds_master=*/s.model.params() == nullptr),
      mode_(message_mode(cfg_, s.ops->device_memory())),
      pipeline_steps_(s.executor.all_steps()),
      bubble_theory_(theoretical_bubble(cfg_.parallel.schedule, cfg_.parallel.pp,
                                        cfg_.parallel.micro_batches, cfg_.parallel.virtual_stages,
                                        mode_, planned_costs(cfg_))),
      peak_tflops_(peak_tflops_for(cfg_.train.peak_tflops, s.ops->device_model())),
      metrics_(s.logs() ? cfg_.logging.metrics : ""),
      last_step_(cfg_.train.steps) {
  if (cfg_.train.cuda_graph) {
    if (!s.ops->device_memory())
      throw InputError("train.cuda_graph: needs a CUDA device; this run is on the CPU backend");
    s.executor.keep_batches_in_host_memory();
  }
  // Rank 0 holds the checkpoint directory for the whole run; no rank reads it before.
  if (!cfg_.checkpoint.dir.empty()) {
    if (s.rank == 0) ckpt_lock_.emplace(cfg_.checkpoint.dir);
    s.comms.world->barrier();
  }
}

TrainResult RankTrainer::run() {
  resume_or_init();
  log_start();
  if (!cfg_.logging.trace.empty()) s_.comms.world->barrier();  // align the ranks' trace clocks
  trace_.emplace(cfg_.logging.trace, cfg_.logging.trace_steps, s_.rank);
  if (stop_requested_anywhere(s_, signals_)) {
    if (s_.logs()) spdlog::warn("stop signal received before step {}: nothing to save", first_step_ + 1);
    result_.stopped_by_signal = true;
    return result_;
  }
  if (first_step_ >= last_step_ && s_.logs()) spdlog::info("nothing to train: already at step {}", first_step_);
  for (int64_t step = first_step_; step < last_step_; ++step) {
    const StepOutcome o = train_step(step);
    const int64_t n = step + 1;
    const std::optional<double> val_loss = maybe_validate(n);
    report(n, o, val_loss);
    maybe_checkpoint(n, o);
    if (o.report.stop) {
      if (s_.logs()) spdlog::warn("stop signal received: stopped after step {}{}", n,
                                  cfg_.checkpoint.dir.empty() ? " (checkpoints disabled: nothing saved)"
                                                              : ", checkpoint saved");
      result_.stopped_by_signal = true;
      break;
    }
  }
  finish_logs();
  return result_;
}

// Loads the checkpoint to resume from (weights, moments, step), or starts fresh: from
// checkpoint.init_from's weights, else GPT-2's initialisation; refuses a directory that
// holds checkpoints it is not asked to resume.
void RankTrainer::resume_or_init() {
  const std::string& dir = cfg_.checkpoint.dir;
  const std::string resume = dir.empty() && cfg_.checkpoint.resume == "auto"
                                 ? std::string()
                                 : resolve_resume(dir, cfg_.checkpoint.resume);
  if (!resume.empty()) {
    const size_t arena = s_.model.layout().total_floats();
    AlignedBuffer<float> params(arena), m(arena), v(arena);
    const CheckpointMeta meta = load_run_checkpoint(s_, resume, params.data(), m.data(), v.data());
    check_same_model(cfg_, meta, resume);
    result_.steps_done = first_step_ = meta.step;
    sync_.write_params(opt_, params.data());
    sync_.load_moments(m.data(), v.data(), opt_);
    if (s_.logs()) spdlog::info("resumed from {} at step {}", resume, first_step_);
    return;
  }
  if (!dir.empty() && has_checkpoints(dir))
    throw InputError(cfg_.checkpoint.resume == "auto"
                         ? dir + ": holds checkpoints but none of them is valid (see the "
                                 "warnings above); move them away or choose another "
                                 "checkpoint.dir"
                         : dir + ": already holds checkpoints of an earlier run; set "
                                 "checkpoint.resume: auto to continue it, or choose "
                                 "another checkpoint.dir");
  if (cfg_.checkpoint.init_from.empty() && s_.model.params()) {
    s_.model.init_parameters(cfg_.train.seed);  // in place in host memory
    return;
  }
  std::vector<float> params(s_.model.layout().total_floats(), 0.0f);
  if (cfg_.checkpoint.init_from.empty())
    s_.model.initial_parameters(cfg_.train.seed, params.data());
  else
    init_from_hf(s_, params.data());
  sync_.write_params(opt_, params.data());
}

void RankTrainer::log_start() const {
  if (!s_.logs()) return;
  const auto& par = cfg_.parallel;
  spdlog::info("data: {}; validation: {} tokens", data_.describe(), val_.size());
  spdlog::info("model: {} parameters; {} tokens per step; layout tp {}{} pp {} dp {}, {} ranks, "
               "schedule {} (theoretical bubble {:.3f})",
               param_layout(cfg_.model).hf_param_count(), tokens_per_step(cfg_), par.tp,
               par.cp > 1 ? fmt::format(" cp {}", par.cp) : std::string(), par.pp, par.dp,
               s_.grid.world_size(), name_of(par.schedule), bubble_theory_);
  spdlog::info("backend: {}{}", s_.ops->name(),
               peak_tflops_ > 0 ? fmt::format("; MFU against {:.0f} TFLOP/s per GPU", peak_tflops_)
                                : std::string());
}

// The schedule over the step's micro-batches, the gradient reduction and the update, all
// queued on the backend; then the step's one wait on the device, for its loss, gradient
// norm and timings. With train.cuda_graph the first step runs so (every allocation and
// cuBLASLt plan made), the next is captured whole, and later steps replay that graph:
// the host writes the micro-batches and the update's learning rate and step where the
// graph's copies read them, and launches it.
RankTrainer::StepOutcome RankTrainer::train_step(int64_t step) {
  const auto& par = cfg_.parallel;
  const int M = par.micro_batches, B = par.micro_batch_size, T = cfg_.model.seq_len;
  ops::Ops& ops = *s_.ops;
  const std::int64_t waits_before = ops.host_waits() ? ops.host_waits()->count() : 0;
  const auto kernels_before = ops.kernel_counters();
  const auto t0 = Clock::now();
  // Sequence j of micro-batch mb on data-parallel rank d is the step's global sequence
  // (d * M + mb) * B + j: the step's batch does not depend on the layout.
  // A context-parallel rank takes its pieces of each sequence (s_.split).
  std::vector<int32_t> window(size_t(T) + 1);
  auto fill = [&](int mb, int32_t* in, int32_t* tg) {
    for (int b = 0; b < B; ++b) {
      try {
        data_.sequence(step, (int64_t(s_.coord.dp) * M + mb) * B + b, window.data());
      } catch (const DataChanged& e) {  // the other ranks wait in a collective: end them too
        s_.comms.world_for_model().abort(e.what(), kExitRunFailure);
      }
      s_.split.take(window.data(), B, b, in);
      s_.split.take(window.data() + 1, B, b, tg);
    }
  };
  // Each of the step's micro-batches on each replica (dp * cp of them, every one the same
  // number of tokens) adds its mean loss: the step's loss is their mean.
  const int means = M * s_.grid.replicas();
  const bool graphed = cfg_.train.cuda_graph && step > first_step_;
  // Trace steps count from 1, as the log; a graph's work is not timed.
  const bool traced = trace_->enabled_for(step + 1) && !graphed;
  s_.comms.timeline->start_step(traced);  // time zero: where the executor's first mark goes
  if (cfg_.train.cuda_graph) s_.executor.fill_batches(fill);
  StepOutcome o;
  o.lr = learning_rate(cfg_.train, step);
  std::size_t comm_begin = 0, comm_end = 0, update_end = 0;
  const bool capture = graphed && !ops.replayable();  // the first, or memory was freed since
  if (!graphed || capture) {
    if (capture) ops.begin_capture();
    s_.model.zero_grads();
    s_.executor.train_step(fill, 1.0f / float(means), sync_.loss_total(), sync_.hooks());
    comm_begin = ops.mark();
    sync_.finish(cfg_.train.grad_clip);
    comm_end = ops.mark();
    sync_.update(opt_, float(o.lr), step + 1);
    update_end = ops.mark();
    if (capture) {
      ops.end_capture();
      if (s_.logs()) spdlog::info("step {}: captured as a CUDA graph, replayed from now on", step + 1);
    }
  } else {
    opt_.stage_schedule(float(o.lr), step + 1);  // what the graph's update copies in
  }
  comm::World& world = s_.comms.world_for_model();
  if (graphed) {
    ops.replay();
    world.watch_queue("cuda_graph_replay");
  }
  ops.wait_queue([&] { world.check_progress(); });
  const std::vector<double> marks = ops.take_marks();
  const auto t1 = Clock::now();

  PipelineExecutor::ActionFn on_action;
  if (traced)
    on_action = [&](const Action& a, Clock::time_point b, Clock::time_point e) {
      trace_->add(std::string(op_name(a.op)) + " mb" + std::to_string(a.microbatch) +
                      (par.virtual_stages > 1 ? " c" + std::to_string(a.chunk) : ""),
                  step + 1, b, e);
    };
  // A replayed graph takes no marks: its whole time counts as compute.
  PipelineStats st;
  if (graphed) {
    st.elapsed_s = st.compute_s = seconds(t1 - t0);
    st.peak_activations = s_.executor.peak_activations();
  } else {
    st = s_.executor.step_stats(marks, on_action);
  }
  if (traced) {
    const auto update_span = std::chrono::duration<double>(marks[update_end] - marks[comm_end]);
    trace_->add("optimizer", step + 1, t1 - std::chrono::duration_cast<Clock::duration>(update_span),
                t1);
  }
  for (const comm::CommSpan& c : s_.comms.timeline->take(s_.executor.step_started()))
    trace_->add_on(c.track, c.name, step + 1, c.begin, c.end);
  o.loss = sync_.loss_sum() / means;
  o.grad_norm = sync_.grad_norm();
  check_finite(step, o.loss, o.grad_norm);
  o.device_syncs = ops.host_waits() ? ops.host_waits()->count() - waits_before : 0;
  if (const auto after = ops.kernel_counters(); after && kernels_before)
    o.kernels = ops::Ops::KernelCounters{after->launches - kernels_before->launches,
                                         after->global_bytes - kernels_before->global_bytes,
                                         after->shared_bytes - kernels_before->shared_bytes,
                                         after->mma_ops - kernels_before->mma_ops};
  o.report = aggregate(s_, st, graphed ? 0.0 : marks[comm_end] - marks[comm_begin],
                       double(o.device_syncs), signals_.requested());
  o.seconds = seconds(t1 - t0);
  s_.comms.all->all_reduce(&o.seconds, 1, comm::ReduceOp::Max);
  train_seconds_ += o.seconds;
  result_.steps_done = step + 1;
  result_.last_loss = o.loss;
  return o;
}

// train.on_nonfinite: the backend skipped the update of a step whose loss or norm is not
// finite (the same values on every rank, so every rank skipped it); stop, or go on while
// fewer than max_nonfinite steps in a row were skipped.
void RankTrainer::check_finite(int64_t step, double loss, double norm) {
  if (std::isfinite(loss) && std::isfinite(norm)) {
    nonfinite_in_a_row_ = 0;
    return;
  }
  const std::string what = "step " + std::to_string(step + 1) + ": loss " + std::to_string(loss) +
                           ", grad norm " + std::to_string(norm) + " is not finite";
  if (cfg_.train.on_nonfinite == OnNonfinite::Stop || ++nonfinite_in_a_row_ >= cfg_.train.max_nonfinite)
    throw std::runtime_error(what + "; stopped, the update was not applied");
  if (s_.logs()) spdlog::warn("{}; update skipped ({} in a row)", what, nonfinite_in_a_row_);
}

std::optional<double> RankTrainer::maybe_validate(int64_t n) {
  if (val_.empty() || !due(n, cfg_.train.eval_every, last_step_)) return std::nullopt;
  result_.last_val_loss = validation_loss(s_, val_, cfg_.train.eval_batches);
  return result_.last_val_loss;
}

// The console line and the metrics record of step n (rank 0, when due).
void RankTrainer::report(int64_t n, const StepOutcome& o, const std::optional<double>& val_loss) {
  if (!s_.logs() || !(due(n, cfg_.logging.every, last_step_) || val_loss || n == first_step_ + 1))
    return;
  const StepReport& rep = o.report;
  const double tok_s = double(tokens_per_step(cfg_)) / o.seconds;
  const double flops_per_step = flops_per_token(cfg_.model) * double(tokens_per_step(cfg_));
  const double flops_per_rank = flops_per_step / o.seconds / s_.grid.world_size();
  const double util = mfu(flops_per_rank, peak_tflops_);
  const double eta = train_seconds_ / double(n - first_step_) * double(last_step_ - n);
  spdlog::info("step {}/{} | loss {:.4f}{} | lr {:.3e} | grad norm {:.3f} | {:.0f} tok/s{} | "
               "{:.3f} s | bubble {:.3f} (theory {:.3f}) | eta {}",
               n, last_step_, o.loss, val_loss ? fmt::format(" | val {:.4f}", *val_loss) : "", o.lr,
               o.grad_norm, tok_s, peak_tflops_ > 0 ? fmt::format(" | MFU {:.1f}%", 100 * util) : "",
               o.seconds, rep.bubble, bubble_theory_, format_eta(eta));
  nlohmann::json rec = {{"step", n},
                        {"loss", o.loss},
                        {"lr", o.lr},
                        {"grad_norm", o.grad_norm},
                        {"tokens_per_s", tok_s},
                        {"step_time_s", o.seconds},
                        {"tflops_per_rank", flops_per_rank / 1e12},
                        {"bubble", rep.bubble},
                        {"bubble_min", rep.bubble_min},
                        {"bubble_max", rep.bubble_max},
                        {"bubble_theory", bubble_theory_},
                        {"bubble_sim", simulated_bubble(pipeline_steps_, cfg_, rep.costs, mode_)},
                        {"forward_ms", rep.costs.forward * 1e3},
                        {"backward_input_ms", rep.costs.backward_input * 1e3},
                        {"backward_weight_ms", rep.costs.backward_weight * 1e3},
                        {"compute_s", rep.compute_s},
                        {"wait_s", rep.wait_s},
                        {"comm_s", rep.comm_s},
                        {"peak_activations", rep.peak_activations},
                        {"peak_rss_mib", rep.peak_rss_mib},
                        {"peak_memory_mib", rep.peak_memory_mib},
                        {"device_syncs", rep.device_syncs}};
  if (val_loss) rec["val_loss"] = *val_loss;
  if (peak_tflops_ > 0) rec["mfu"] = util;
  if (o.kernels) {  // rank 0's kernels in the step (the CUDA emulator counts them)
    rec["kernel_launches"] = o.kernels->launches;
    rec["global_bytes"] = o.kernels->global_bytes;
    rec["shared_bytes"] = o.kernels->shared_bytes;
    rec["mma_ops"] = o.kernels->mma_ops;
  }
  if (s_.ops->device_memory()) rec["peak_device_mib"] = rep.peak_memory_mib;  // its old name
  metrics_.write(rec);
}

// A checkpoint after step n when due or when stopping, never of non-finite weights.
void RankTrainer::maybe_checkpoint(int64_t n, const StepOutcome& o) {
  if (cfg_.checkpoint.dir.empty() || !(due(n, cfg_.checkpoint.every, last_step_) || o.report.stop))
    return;
  if (!parameters_finite(s_, sync_, opt_))
    throw std::runtime_error("step " + std::to_string(n) +
                             ": the model has non-finite parameters; not checkpointed");
  CheckpointMeta meta;
  meta.step = n;
  meta.config_yaml = to_yaml(cfg_);
  meta.train_state = {{"data_cursor", {{"seed", cfg_.train.seed}, {"next_step", n}}},
                      {"tokens_seen", n * tokens_per_step(cfg_)},
                      {"loss", o.loss}};
  meta.extra_files["config.json"] = hf_config(cfg_.model);
  AlignedBuffer<float> params(s_.model.layout().total_floats()), m(opt_.size()), v(opt_.size());
  sync_.read_params(opt_, params.data());
  s_.ops->download(m.data(), opt_.exp_avg(), opt_.size() * sizeof(float));
  s_.ops->download(v.data(), opt_.exp_avg_sq(), opt_.size() * sizeof(float));
  result_.last_checkpoint =
      save_run_checkpoint(s_, params.data(), {m.data(), v.data(), &opt_.ranges()}, meta);
}

void RankTrainer::finish_logs() {
  if (metrics_.lost() > 0)
    spdlog::error("logging.metrics: {} of {} records could not be written to {}", metrics_.lost(),
                  metrics_.lost() + metrics_.written(), metrics_.path());
  trace_->write();
  if (!cfg_.logging.trace.empty()) {
    s_.comms.world->barrier();
    if (s_.logs()) merge_traces(cfg_.logging.trace, s_.grid.world_size());
  }
}

TrainResult train_rank(Session& s, const StopSignals& signals) {
  RankTrainer trainer(s, signals);
  // A failure ends the job while the trainer still holds its device memory: freeing it
  // would wait for transfers whose peers have stopped.
  return run_all_or_none(s, [&](Session&) { return trainer.run(); });
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
