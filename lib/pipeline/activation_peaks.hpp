// What a pipeline stage allocates for activations while it runs its steps: the
// executor's own rules (pipeline/executor.hpp: sets from per-chunk pools, released sets
// whose sends are still leaving reused from the step the plan gives, boundary arrays
// lent from first use), run on a model that computes nothing and only counts.
#pragma once
#include <cstddef>
#include <vector>

#include "pipeline/schedule.hpp"

namespace pptrain {

// The most activation sets, and the most parts lent between F and B and between B and W,
// one chunk holds at once while its rank runs `steps` (per chunk), and the most boundary
// arrays the rank lends at once (any chunk's). `fused[c]`: chunk c runs W inside B
// (GptModel's fused backward). `reusable[i]`: the step from which the executor may reuse
// a set whose sends it posted in step i (sends_waitable_from); empty: from step i itself
// (or blocking batches, which post no sends).
struct ActivationPeaks {
  std::vector<int> sets, until_b, from_b;
  int boundaries = 0;
};
ActivationPeaks activation_peaks(const std::vector<Step>& steps, const Placement& placement,
                                 int stage, const std::vector<bool>& fused,
                                 const std::vector<std::size_t>& reusable = {});

}  // namespace pptrain
