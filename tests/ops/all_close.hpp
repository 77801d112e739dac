// The closeness check of the op comparisons (the CUDA backend's tests, the emulated
// kernels' tests and the op table): relative to the largest reference magnitude, and
// failing on NaN, so an output left unwritten (poisoned with NaN) fails.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <sstream>
#include <vector>

namespace pptrain::test_support {

// Every |got[i] - want[i]| <= tol * max(max_j |want[j]| (finite want), floor); infinities
// must match exactly; NaN in got fails.
template <typename W>
::testing::AssertionResult all_close(const std::vector<float>& got, const std::vector<W>& want,
                                     double tol, double floor = 1e-30) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  double scale = 0.0;
  for (const W& w : want)
    if (std::isfinite(double(w))) scale = std::max(scale, std::fabs(double(w)));
  const double limit = tol * std::max(scale, floor);
  std::size_t bad = 0, first = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = double(want[i]);
    const double err = std::isinf(w) ? (g == w ? 0.0 : INFINITY) : std::fabs(g - w);
    if (!(err <= limit) && bad++ == 0) first = i;
    if (!(err <= worst)) worst = err;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream s;
  s << bad << " of " << got.size() << " elements off by more than " << tol << " x max|want| ("
    << scale << "); first at " << first << ": got " << got[first] << ", want "
    << double(want[first]) << "; worst error " << worst;
  return ::testing::AssertionFailure() << s.str();
}

}  // namespace pptrain::test_support
