#include "plan/memory_fixes.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "plan/cluster.hpp"
#include "plan/time_model.hpp"
#include "train/memory_check.hpp"
#include "train/memory_plan.hpp"
#include "train/session.hpp"

namespace pptrain {

namespace {
// One axis of change: the config's own value first (no change), then each other.
struct Option {
  std::vector<std::string> sets;  // empty: unchanged
  void (*apply)(Config&, int);
  int value;
};
}  // namespace

std::vector<MemoryFix> memory_fixes(const Config& base, bool cuda, double available, int count) {
  const ParallelConfig& p = base.parallel;
  std::vector<std::vector<Option>> axes(4);
  axes[0].push_back({{}, nullptr, 0});
  for (Recompute r : {Recompute::Selective, Recompute::Full})
    if (int(r) > int(base.train.recompute))
      axes[0].push_back({{"train.recompute=" + std::string(name_of(r))},
                         [](Config& c, int v) { c.train.recompute = Recompute(v); }, int(r)});
  axes[1].push_back({{}, nullptr, 0});
  for (int mbs = p.micro_batch_size / 2; mbs >= 1; mbs /= 2)
    if (p.micro_batch_size % mbs == 0)
      axes[1].push_back({{"parallel.micro_batch_size=" + std::to_string(mbs),
                          "parallel.micro_batches=" +
                              std::to_string(p.micro_batches * (p.micro_batch_size / mbs))},
                         [](Config& c, int v) {
                           c.parallel.micro_batches *= c.parallel.micro_batch_size / v;
                           c.parallel.micro_batch_size = v;
                         },
                         mbs});
  axes[2].push_back({{}, nullptr, 0});
  if (p.dp > 1 && p.zero == 0)
    axes[2].push_back({{"parallel.zero=1"}, [](Config& c, int) { c.parallel.zero = 1; }, 1});
  axes[3].push_back({{}, nullptr, 0});
  if (p.tp > 1 && !p.sequence_parallel)
    axes[3].push_back({{"parallel.sequence_parallel=true"},
                       [](Config& c, int) { c.parallel.sequence_parallel = true; }, 1});

  Cluster cluster;
  cluster.device = device_preset(cuda ? "h100-sxm" : "cpu");
  cluster.intra_node = preset_intra_node(cuda ? "h100-sxm" : "cpu");
  cluster.inter_node = preset_inter_node(cuda ? "h100-sxm" : "cpu");
  cluster.gpus_per_node = world_size(base);
  std::vector<MemoryFix> fits;
  for (const Option& a : axes[0])
    for (const Option& b : axes[1])
      for (const Option& z : axes[2])
        for (const Option& s : axes[3]) {
          Config c = base;
          MemoryFix fix;
          for (const Option* o : {&a, &b, &z, &s})
            if (o->apply) {
              o->apply(c, o->value);
              fix.sets.insert(fix.sets.end(), o->sets.begin(), o->sets.end());
            }
          if (fix.sets.empty()) continue;
          try {  // a combination the validator or the schedule refuses is no fix
            c = parse_config(to_yaml(c), base.source_path);
            check_schedule(c);
          } catch (const InputError&) {
            continue;
          }
          fix.peak_bytes = predict_peak_memory(c, backend_traits(c, cuda)).total();
          if (fix.peak_bytes > available) continue;
          fix.step_time_s = predict_step(c, cluster).step_time_s;
          fits.push_back(std::move(fix));
        }
  std::stable_sort(fits.begin(), fits.end(), [](const MemoryFix& x, const MemoryFix& y) {
    if (x.step_time_s != y.step_time_s) return x.step_time_s < y.step_time_s;
    return x.sets.size() < y.sets.size();
  });
  if (int(fits.size()) > count) fits.resize(std::size_t(count));
  return fits;
}

std::string describe_fixes(const std::vector<MemoryFix>& fixes) {
  std::string out;
  for (const MemoryFix& f : fixes) {
    out += out.empty() ? "; it fits with" : ", or";
    for (const std::string& s : f.sets) out += " --set " + s;
    out += " (" + gib(f.peak_bytes) + ")";
  }
  return out;
}

}  // namespace pptrain
