// What to change when a run does not fit: layouts of the same model and global batch
// that need less memory, found with the memory plan and ranked with the time model.
#pragma once
#include <string>
#include <vector>

#include "config/config.hpp"

namespace pptrain {

struct MemoryFix {
  std::vector<std::string> sets;  // "train.recompute=full", ...
  double peak_bytes = 0;          // the heaviest rank's predicted peak with them
  double step_time_s = 0;         // predicted, on one node of the run's device kind
};

// The changes of recomputation, micro-batch size (the global batch kept), ZeRO-1 and
// sequence parallelism, alone or together, whose predicted peak is at most
// `available_bytes`: fastest first, then with fewer changes; at most `count`. `cuda`:
// the run's device (its backend traits; the time model's h100-sxm preset, else cpu).
std::vector<MemoryFix> memory_fixes(const Config& config, bool cuda, double available_bytes,
                                    int count = 3);

// "; it fits with --set train.recompute=full (21.4 GiB), or ..." (empty when none does).
std::string describe_fixes(const std::vector<MemoryFix>& fixes);

}  // namespace pptrain
