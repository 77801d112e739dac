// Before a run allocates anything: does the heaviest rank's predicted peak memory
// (memory_plan.hpp) fit what every rank has? train.memory_check says what a run that
// does not fit gets: an error (exit 2, one line), a warning, or nothing.
#pragma once
#include <optional>
#include <string>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "core/error.hpp"
#include "ops/ops.hpp"

namespace pptrain {

// What this host can still give a process: MemAvailable (/proc/meminfo) and the
// process's cgroup limit less its usage (cgroup v2, or v1's memory controller), the
// smaller of those readable; nullopt when none is.
std::optional<double> host_memory_available();
// What this host has at most: MemTotal, or the cgroup limit when lower. The same on every
// rank of the host whenever it is read.
std::optional<double> host_memory_total();

// The run does not fit (train.memory_check: error). what() is the line without the
// changes that would fit, which need the planner (plan/memory_fixes.hpp).
class MemoryDoesNotFit : public InputError {
 public:
  MemoryDoesNotFit(const std::string& message, double available_bytes)
      : InputError(message), available(available_bytes) {}
  double available;  // the smallest any rank has, bytes
};

// Collective over comms.all, before the model is built: each rank measures what it has
// (its device's free memory; on the CPU the host's available memory over the
// `ranks_on_host` ranks sharing it), the smallest is compared with the predicted peak,
// and every rank reaches the same verdict: throws MemoryDoesNotFit, or (warn) rank 0
// logs it, or returns.
void check_memory(const Config& config, comm::Comms& comms, const ops::Ops& ops,
                  int ranks_on_host);

// "63.2 GiB"
std::string gib(double bytes);

// For an allocation that failed anyway: "; the memory plan predicts 61.9 GiB on the
// heaviest rank (stage 0, tp rank 0)".
std::string predicted_peak_note(const Config& config);

}  // namespace pptrain
