#include "plan/auto_layout.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"
#include "ops/ops.hpp"
#include "train/memory_check.hpp"
#include "train/session.hpp"

namespace pptrain {

namespace {

constexpr double kGiB = double(1ull << 30);

// The preset whose rates a GPU of this model has.
std::string preset_for(const std::string& model, double memory_gib) {
  if (model.find("H200") != std::string::npos) return "h200";
  if (model.find("A100") != std::string::npos) return memory_gib > 60 ? "a100-80gb" : "a100-40gb";
  return "h100-sxm";
}

// One "--set" value of each layout key.
std::vector<std::string> layout_sets(const Config& c) {
  const ParallelConfig& p = c.parallel;
  return {"parallel.tp=" + std::to_string(p.tp),
          "parallel.cp=" + std::to_string(p.cp),
          "parallel.pp=" + std::to_string(p.pp),
          "parallel.dp=" + std::to_string(p.dp),
          "parallel.schedule=" + std::string(name_of(p.schedule)),
          "parallel.virtual_stages=" + std::to_string(p.virtual_stages),
          "parallel.micro_batch_size=" + std::to_string(p.micro_batch_size),
          "parallel.micro_batches=" + std::to_string(p.micro_batches),
          "parallel.sequence_parallel=" + std::string(p.sequence_parallel ? "true" : "false"),
          "parallel.zero=" + std::to_string(p.zero),
          "train.recompute=" + std::string(name_of(c.train.recompute))};
}

// Whether row r keeps every layout key the config gives.
bool keeps_given(const Config& c, const PlanRow& r) {
  const ParallelConfig& p = c.parallel;
  auto given = [&](const char* key) { return c.given_keys.count(key) > 0; };
  if (given("parallel.tp") && r.tp != p.tp) return false;
  if (given("parallel.pp") && r.pp != p.pp) return false;
  if (given("parallel.dp") && r.dp != p.dp) return false;
  if (given("parallel.cp") && r.cp != p.cp) return false;
  if (given("parallel.virtual_stages") && r.virtual_stages != p.virtual_stages) return false;
  if (given("parallel.schedule") && r.schedule != p.schedule) return false;
  if (given("parallel.sequence_parallel") && r.sequence_parallel != p.sequence_parallel) return false;
  if (given("parallel.zero") && r.zero != p.zero) return false;
  if (given("train.recompute") && r.recompute != c.train.recompute) return false;
  if (!p.layers_per_stage.automatic && !p.layers_per_stage.empty() &&
      int(p.layers_per_stage.size()) != r.pp * r.virtual_stages)
    return false;
  return true;
}

Config with_layout(Config c, const PlanRow& r) {
  apply_layout(c, r);
  c.parallel.layout = LayoutChoice::Manual;
  return c;
}

}  // namespace

Cluster local_machine(const Config& c, int launched_ranks, int ranks_per_host) {
  Cluster m;
  const bool cuda = runs_on_cuda(c);
  int ranks = launched_ranks;
  if (cuda) {
    const int gpus = visible_gpus(c);
    if (gpus == 0)
      throw InputError(c.source_path + ": parallel.layout: auto plans for the GPUs the run "
                                       "starts on, and device cuda sees none here (for other "
                                       "machines: pptrain plan --cluster FILE)");
    const ops::CudaDeviceInfo gpu = ops::cuda_device_info(0);
    const double memory_gib = double(gpu.total_bytes) / kGiB;
    const std::string preset = preset_for(gpu.name, memory_gib);
    m.device = device_preset(preset);
    m.device.name = gpu.name;
    m.device.memory_gib = memory_gib;
    m.intra_node = preset_intra_node(preset);
    m.inter_node = preset_inter_node(preset);
    if (ranks == 0) ranks = gpus;
  } else {
    m.device = device_preset("cpu");
    m.intra_node = preset_intra_node("cpu");
    m.inter_node = preset_inter_node("cpu");
    if (ranks == 0) ranks = 1;
  }
  m.gpus_per_node = ranks_per_host > 0 && ranks % ranks_per_host == 0 ? ranks_per_host : ranks;
  m.nodes = ranks / m.gpus_per_node;
  if (!cuda) {
    const double host = host_memory_total().value_or(m.device.memory_gib * kGiB * m.gpus_per_node);
    m.device.memory_gib = host / kGiB / m.gpus_per_node;
    m.device.reserved_gib = m.device.memory_gib / 10;
  }
  m.source = describe_machine(m);
  return m;
}

std::string describe_machine(const Cluster& m) {
  const std::string what = m.device.cpu ? "CPU rank(s)" : m.device.name;
  return fmt::format("{}{} x {} ({:.2f} GiB each, {:.2f} GiB of it usable)",
                     m.nodes > 1 ? fmt::format("{} nodes x ", m.nodes) : std::string(),
                     m.gpus_per_node, what, m.device.memory_gib,
                     m.device.memory_gib - m.device.reserved_gib);
}

AutoLayout choose_layout(const Config& c, const Cluster& machine) {
  PlanOptions options;
  options.top = 1;
  options.accept = [&](const PlanRow& r) { return keeps_given(c, r); };
  std::vector<PlanRow> rows = plan_layouts(c, machine, options);
  if (rows.empty()) {
    options.all = true;  // every layout, to name the one that comes closest
    rows = plan_layouts(c, machine, options);
    const PlanRow* least = nullptr;
    for (const PlanRow& r : rows)
      if (r.dropped.empty() && (!least || r.peak_memory_mib < least->peak_memory_mib)) least = &r;
    std::string closest = "no layout of this model and global batch can run on them";
    if (least) {
      closest = fmt::format("the least any needs is {:.2f} GiB a rank: --set parallel.layout=manual",
                            least->peak_memory_mib / 1024);
      for (const std::string& s : layout_sets(with_layout(c, *least))) closest += " --set " + s;
    }
    throw InputError(fmt::format("{}: parallel.layout: auto: no layout fits {}: {}", c.source_path,
                                 machine.source, closest));
  }
  AutoLayout a{with_layout(c, rows.front()), {}, rows.front()};
  a.sets = layout_sets(a.config);
  try {  // the layout passes the rules any config does
    (void)parse_config(to_yaml(a.config), c.source_path);
  } catch (const InputError& e) {
    throw std::logic_error(std::string("parallel.layout: auto chose a layout the config rules refuse: ") + e.what());
  }
  return a;
}

}  // namespace pptrain
