#include "train/memory_check.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "train/memory_plan.hpp"
#include "train/session.hpp"

namespace pptrain {

namespace {
// The first number in `path`, or nullopt ("max", missing, unreadable).
std::optional<double> read_number(const std::string& path) {
  std::ifstream in(path);
  double v = 0;
  if (in >> v) return v;
  return std::nullopt;
}

// A /proc/meminfo entry ("MemAvailable:", "MemTotal:") in bytes.
std::optional<double> meminfo(const std::string& entry) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == entry) return kib * 1024;
  return std::nullopt;
}

struct CgroupMemory {
  double limit, usage;
};
// This process's memory cgroup's limit and usage, when it has a limit.
std::optional<CgroupMemory> cgroup_memory() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    // "0::/path" (v2) or "N:memory:/path" (v1; the controller list may hold others).
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    std::optional<double> limit, usage;
    if (controllers.empty()) {
      limit = read_number("/sys/fs/cgroup" + path + "/memory.max");
      usage = read_number("/sys/fs/cgroup" + path + "/memory.current");
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      limit = read_number("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes");
      usage = read_number("/sys/fs/cgroup/memory" + path + "/memory.usage_in_bytes");
    }
    if (limit && usage && *limit < 1e18) return CgroupMemory{*limit, *usage};  // v1: 2^63 is none
  }
  return std::nullopt;
}

// The smaller of two optional amounts.
std::optional<double> least(std::optional<double> a, std::optional<double> b) {
  if (a && b) return std::min(*a, *b);
  return a ? a : b;
}
}  // namespace

std::string gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / double(1 << 30)); }

std::string predicted_peak_note(const Config& c) {
  const RankMemory r = predict_peak_memory(c, backend_traits(c, runs_on_cuda(c)));
  return fmt::format("; the memory plan predicts {} on the heaviest rank (stage {}, tp rank {})",
                     gib(r.total()), r.stage, r.tp_rank);
}

std::optional<double> host_memory_available() {
  const auto cgroup = cgroup_memory();
  return least(meminfo("MemAvailable:"),
               cgroup ? std::optional(std::max(0.0, cgroup->limit - cgroup->usage)) : std::nullopt);
}

std::optional<double> host_memory_total() {
  const auto cgroup = cgroup_memory();
  return least(meminfo("MemTotal:"), cgroup ? std::optional(cgroup->limit) : std::nullopt);
}

void check_memory(const Config& c, comm::Comms& comms, const ops::Ops& ops, int ranks_on_host) {
  if (c.train.memory_check == MemoryCheck::Off) return;
  const bool device = ops.device_memory();
  const int sharing = std::max(1, ranks_on_host);
  double mine = -1;  // unknown
  if (device) mine = double(ops.device_memory_free());
  else if (const auto host = host_memory_available()) mine = *host / sharing;
  // The smallest over the ranks that know (Max of the negated; unknown ranks send -inf).
  double least = mine >= 0 ? -mine : -1e300;
  comms.all->all_reduce(&least, 1, comm::ReduceOp::Max);
  if (least <= -1e300) return;  // nobody could tell
  const double available = -least;
  const RankMemory r = predict_peak_memory(c, backend_traits(c, device));
  if (r.total() <= available) return;
  const std::string where =
      device ? "the emptiest GPU has " + gib(available) + " free"
             : fmt::format("this host has {} available ({} rank(s) sharing it: {} each)",
                           gib(available * sharing), sharing, gib(available));
  const std::string line = fmt::format(
      "{}: train.memory_check: the run is predicted to need {} on its heaviest rank (stage "
      "{}, tp rank {}; check-config itemises it), but {}",
      c.source_path, gib(r.total()), r.stage, r.tp_rank, where);
  if (c.train.memory_check == MemoryCheck::Error) throw MemoryDoesNotFit(line, available);
  if (comms.world->rank() == 0) spdlog::warn("{}; starting anyway (train.memory_check: warn)", line);
}

}  // namespace pptrain
