// The layout search and the table it prints.
#include "plan/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "model/gpt.hpp"
#include "ops/ops.hpp"
#include "pipeline/schedule.hpp"
#include "plan/time_model.hpp"
#include "train/memory_plan.hpp"
#include "train/session.hpp"

namespace pptrain {

namespace {

// The shortest sequence the search splits over context-parallel ranks.
constexpr int kLongSequence = 8192;

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int k = 1; k <= n; ++k)
    if (n % k == 0) out.push_back(k);
  return out;
}

Config with_row(Config c, const PlanRow& r, const Cluster& cluster) {
  apply_layout(c, r);
  auto& p = c.parallel;
  c.device = cluster.device.cpu ? Device::Cpu : Device::Cuda;
  if (!cluster.device.cpu && c.train.precision == Precision::Auto) c.train.precision = Precision::BF16;
  if (p.layers_per_stage.automatic && r.pp * r.virtual_stages <= c.model.n_layer)
    p.layers_per_stage.counts = balance_layers(c, cluster);  // balanced for this layout
  else if (!p.layers_per_stage.empty() && int(p.layers_per_stage.size()) != r.pp * r.virtual_stages)
    p.layers_per_stage.clear();
  return c;
}

// Why the layout cannot run this model, or "".
std::string constraint(const Config& c, const PlanRow& r) {
  const ModelConfig& m = c.model;
  if (m.n_head % r.tp != 0) return "tp must divide n_head";
  if (kv_heads(m) % r.tp != 0) return "tp must divide n_kv_head";
  if (ffn_width(m) % r.tp != 0) return "tp must divide ffn_hidden";
  if (r.pp * r.virtual_stages > m.n_layer) return "more stages than layers";
  if (r.sequence_parallel && (r.tp == 1 || (r.micro_batch_size * m.seq_len) % r.tp != 0))
    return "sequence parallelism needs tp > 1 and token rows divisible by tp";
  if (r.zero == 1 && r.dp * r.cp == 1) return "ZeRO-1 needs dp * cp > 1";
  if (r.cp > 1 && m.seq_len % (2 * r.cp) != 0) return "cp needs seq_len divisible by 2 * cp";
  return schedule_constraint_error(r.schedule, r.pp, r.micro_batches, r.virtual_stages);
}

PlanRow make_row(int tp, int cp, int pp, int dp, int v, int mbs, int m, ScheduleKind kind,
                 Recompute rc, bool sp, int zero) {
  PlanRow r;
  r.tp = tp, r.cp = cp, r.pp = pp, r.dp = dp, r.virtual_stages = v, r.micro_batch_size = mbs;
  r.micro_batches = m, r.schedule = kind, r.recompute = rc, r.sequence_parallel = sp, r.zero = zero;
  return r;
}

// Every stage's steps for a layout's schedule, built once for all the layouts that share
// them (they differ in tp, recomputation, SP or ZeRO); the last few kept.
class StepsCache {
 public:
  const std::vector<std::vector<Step>>& steps(const Config& c, const Cluster& cluster) {
    const auto& p = c.parallel;
    const Key key{int(p.schedule), p.pp, p.micro_batches, p.virtual_stages};
    auto it = built_.find(key);
    if (it == built_.end()) {
      if (built_.size() >= kKept) built_.clear();
      it = built_.emplace(key, build_all_steps(p.schedule, p.pp, p.micro_batches, p.virtual_stages,
                                               message_mode(c, !cluster.device.cpu),
                                               planned_costs(c))).first;
    }
    return it->second;
  }

 private:
  using Key = std::tuple<int, int, int, int>;  // schedule, pp, micro-batches, virtual stages
  static constexpr std::size_t kKept = 8;
  std::map<Key, std::vector<std::vector<Step>>> built_;
};

// The row's peak memory and whether it fits; then, unless `only_if_fits` and it does
// not, its step time and what follows from it.
void predict(const Config& base, const Cluster& cluster, PlanRow& r, StepsCache& cache,
             bool only_if_fits = false) {
  const Config c = with_row(base, r, cluster);
  const auto& steps = cache.steps(c, cluster);
  const RankMemory mem = predict_peak_memory(c, backend_traits(c, !cluster.device.cpu), steps);
  r.peak_memory_mib = mem.total() / (1024.0 * 1024.0);
  r.fits = r.peak_memory_mib <= (cluster.device.memory_gib - cluster.device.reserved_gib) * 1024.0;
  if (only_if_fits && !r.fits) return;
  const StepPrediction t = predict_step(c, cluster, steps);
  r.step_time_s = t.step_time_s;
  r.bubble = t.bubble;
  r.tokens_per_s = double(tokens_per_step(c)) / t.step_time_s;
  r.tflops_per_gpu = flops_per_token(c.model) * r.tokens_per_s / cluster.world() / 1e12;
  r.mfu = r.tflops_per_gpu / cluster.device.peak_tflops;
}

// The `top` fastest rows that fit, predicting as few as it can: a row's step time is at
// least its lower bound (time_model.hpp), so once the bound of the next row in bound
// order exceeds the top-th best step time found, no row left can enter.
std::vector<PlanRow> best_that_fit(const Config& base, const Cluster& cluster,
                                   const std::vector<PlanRow>& candidates, int top) {
  std::vector<std::pair<double, std::size_t>> order;  // bound, candidate
  for (std::size_t i = 0; i < candidates.size(); ++i)
    if (candidates[i].dropped.empty())
      order.emplace_back(step_time_lower_bound(with_row(base, candidates[i], cluster), cluster), i);
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  StepsCache cache;
  std::vector<std::pair<std::size_t, PlanRow>> best;  // candidate index, row
  std::vector<double> times;                          // step times of the rows that fit
  for (const auto& [bound, i] : order) {
    if (int(times.size()) >= top) {
      std::nth_element(times.begin(), times.begin() + (top - 1), times.end());
      if (bound > times[size_t(top - 1)] * (1 + 1e-9)) break;
    }
    PlanRow r = candidates[i];
    predict(base, cluster, r, cache, true);
    if (!r.fits) continue;
    times.push_back(r.step_time_s);
    best.emplace_back(i, r);
  }
  // In the order the full search lists them (candidate order before its stable sort).
  std::sort(best.begin(), best.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<PlanRow> rows;
  for (auto& [i, r] : best) rows.push_back(r);
  return rows;
}

}  // namespace

void apply_layout(Config& c, const PlanRow& r) {
  auto& p = c.parallel;
  p.tp = r.tp;
  p.cp = r.cp;
  p.pp = r.pp;
  p.dp = r.dp;
  p.virtual_stages = r.virtual_stages;
  p.micro_batch_size = r.micro_batch_size;
  p.micro_batches = r.micro_batches;
  p.schedule = r.schedule;
  p.sequence_parallel = r.sequence_parallel;
  p.zero = r.zero;
  c.train.recompute = r.recompute;
}

std::vector<PlanRow> plan_layouts(const Config& config, const Cluster& cluster,
                                  const PlanOptions& options) {
  const auto& p = config.parallel;
  const int world = cluster.world();
  const int64_t global = int64_t(p.dp) * p.micro_batches * p.micro_batch_size;  // sequences
  std::vector<PlanRow> rows;
  if (options.this_layout) {
    if (world_size(config) != world)
      throw InputError(config.source_path + ": parallel: tp*cp*pp*dp = " +
                       std::to_string(world_size(config)) + " ranks, but " + cluster.source +
                       " has " + std::to_string(world));
    PlanRow r = make_row(p.tp, p.cp, p.pp, p.dp, p.virtual_stages, p.micro_batch_size, p.micro_batches,
                         p.schedule, config.train.recompute, p.sequence_parallel, p.zero);
    r.dropped = constraint(config, r);
    StepsCache cache;
    if (r.dropped.empty()) predict(config, cluster, r, cache);
    return {r};
  }
  // Every layout the search varies, with the reason it cannot run, if any.
  std::vector<PlanRow> candidates;
  const ScheduleKind kinds[] = {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved,
                                ScheduleKind::ZeroBubbleH1, ScheduleKind::ZeroBubbleV};
  // Context parallelism for long sequences, where the ring's blocks can hide under the
  // attention; on GPUs where the ring's steps run the fused kernels (bf16, a head size
  // they take), as the time model costs them: the loops that run otherwise are slower.
  const ModelConfig& model = config.model;
  Config split = config;
  split.parallel.cp = 2;
  const bool ring_fused = cluster.device.cpu ||
                          (backend_traits(split, true).logsumexp_attention &&
                           ops::cuda_fused_attention_head_size(head_size(model)));
  for (int tp : divisors(world)) {
    if (!options.tp_across_nodes && tp > cluster.gpus_per_node) continue;
    for (int cp : divisors(world / tp)) {
    if (cp > 1 && (!ring_fused || model.seq_len < kLongSequence || model.seq_len % (2 * cp) != 0))
      continue;
    for (int pp : divisors(world / tp / cp)) {
      const int dp = world / tp / cp / pp;
      if (global % dp != 0) continue;
      for (int mbs : divisors(int(global / dp))) {
        const int m = int(global / dp / mbs);
        for (ScheduleKind kind : kinds) {
          if (pp == 1 && kind != ScheduleKind::OneFOneB) continue;  // one stage: all the same
          for (int v : kind == ScheduleKind::Interleaved ? std::vector<int>{2, 4}
                       : kind == ScheduleKind::ZeroBubbleV ? std::vector<int>{2}
                                                          : std::vector<int>{1}) {
            for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
              for (bool sp : {false, true}) {
                if (sp && tp == 1) continue;
                for (int zero : {0, 1}) {
                  if (zero == 1 && dp * cp == 1) continue;
                  PlanRow r = make_row(tp, cp, pp, dp, v, mbs, m, kind, rc, sp, zero);
                  if (options.accept && !options.accept(r)) continue;
                  r.dropped = constraint(config, r);
                  candidates.push_back(r);
                }
              }
            }
          }
        }
      }
    }
    }
  }
  if (options.top > 0 && !options.all) {
    rows = best_that_fit(config, cluster, candidates, options.top);
  } else {
    StepsCache cache;
    for (PlanRow& r : candidates) {
      if (r.dropped.empty()) predict(config, cluster, r, cache);
      if (r.dropped.empty() ? (r.fits || options.all) : options.all) rows.push_back(r);
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const PlanRow& a, const PlanRow& b) {
    const int ka = a.dropped.empty() ? (a.fits ? 0 : 1) : 2, kb = b.dropped.empty() ? (b.fits ? 0 : 1) : 2;
    if (ka != kb) return ka < kb;
    return a.tokens_per_s > b.tokens_per_s;
  });
  return rows;
}

namespace {
nlohmann::ordered_json row_json(const PlanRow& r) {
  nlohmann::ordered_json j = {
      {"tp", r.tp}, {"cp", r.cp}, {"pp", r.pp}, {"dp", r.dp}, {"virtual_stages", r.virtual_stages},
      {"micro_batch_size", r.micro_batch_size}, {"micro_batches", r.micro_batches},
      {"schedule", name_of(r.schedule)}, {"recompute", name_of(r.recompute)},
      {"sequence_parallel", r.sequence_parallel}, {"zero", r.zero}};
  if (!r.dropped.empty()) {
    j["dropped"] = r.dropped;
    return j;
  }
  j["fits"] = r.fits;
  j["peak_memory_mib"] = r.peak_memory_mib;
  j["step_time_s"] = r.step_time_s;
  j["tokens_per_s"] = r.tokens_per_s;
  j["tflops_per_gpu"] = r.tflops_per_gpu;
  j["mfu"] = r.mfu;
  j["bubble"] = r.bubble;
  return j;
}
std::size_t shown(const std::vector<PlanRow>& rows, int top) {
  return top > 0 ? std::min(rows.size(), std::size_t(top)) : rows.size();
}
}  // namespace

std::string format_plan_json(const std::vector<PlanRow>& rows, int top) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < shown(rows, top); ++i) list.push_back(row_json(rows[i]));
  return list.dump(2) + "\n";
}

std::string format_plan(const std::vector<PlanRow>& rows, int top) {
  std::string out = fmt::format(
      "{:>3} {:>3} {:>3} {:>4} {:>2} {:>4} {:>4} {:<12} {:<9} {:>2} {:>4} {:>4} {:>10} {:>9} "
      "{:>11} {:>8} {:>6} {:>6}\n",
      "tp", "cp", "pp", "dp", "v", "mbs", "m", "schedule", "recompute", "sp", "zero", "fits",
      "peak_MiB", "step_s", "tokens/s", "TFLOP/s", "mfu", "bubble");
  for (std::size_t i = 0; i < shown(rows, top); ++i) {
    const PlanRow& r = rows[i];
    out += fmt::format("{:>3} {:>3} {:>3} {:>4} {:>2} {:>4} {:>4} {:<12} {:<9} {:>2} {:>4} ", r.tp,
                       r.cp, r.pp,
                       r.dp, r.virtual_stages, r.micro_batch_size, r.micro_batches,
                       name_of(r.schedule), name_of(r.recompute), r.sequence_parallel ? "y" : "n",
                       r.zero);
    if (!r.dropped.empty()) {
      out += "dropped: " + r.dropped + "\n";
      continue;
    }
    out += fmt::format("{:>4} {:>10.0f} {:>9.4f} {:>11.0f} {:>8.2f} {:>5.1f}% {:>6.3f}\n",
                       r.fits ? "yes" : "no", r.peak_memory_mib, r.step_time_s, r.tokens_per_s,
                       r.tflops_per_gpu, 100 * r.mfu, r.bubble);
  }
  if (rows.empty()) out += "(no layout fits)\n";
  return out;
}

}  // namespace pptrain
