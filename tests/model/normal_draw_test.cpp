// The initialisation's normal draw (core/random.hpp): the vectorised block equals the
// scalar draw bit for bit, agrees with Box-Muller through the C library's log and cos,
// and is a standard normal.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "core/random.hpp"

namespace pptrain {
namespace {

double libm_normal(uint64_t key) {
  double u1 = uniform01(key ^ 0x5851F42D4C957F2Dull);
  const double u2 = uniform01(key ^ 0x14057B7EF767814Full);
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

TEST(NormalDraw, BlockEqualsScalarDraw) {
  // Odd starts and lengths cross the 256-element blocks and leave vector remainders.
  for (const auto& [first, count] : std::vector<std::pair<uint64_t, std::size_t>>{
           {0, 1}, {7, 255}, {1000, 257}, {(1ull << 40) + 3, 1031}}) {
    std::vector<float> block(count);
    fill_standard_normal(42, first, count, 0.02, block.data());
    for (std::size_t k = 0; k < count; ++k)
      ASSERT_EQ(std::bit_cast<uint32_t>(block[k]),
                std::bit_cast<uint32_t>(float(0.02 * standard_normal(hash_words(42, first + k)))))
          << "element " << first + k;
  }
}

TEST(NormalDraw, AgreesWithTheCLibrary) {
  // The polynomials are within a few double ulps of log and cos, so as floats the draws
  // equal the C library's in all but rare roundings (none in 20 M measured).
  const std::size_t n = 1 << 20;
  std::vector<float> ours(n);
  fill_standard_normal(3, 0, n, 1.0, ours.data());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float theirs = float(libm_normal(hash_words(3, i)));
    const int64_t ulps = std::llabs(int64_t(std::bit_cast<int32_t>(ours[i])) - std::bit_cast<int32_t>(theirs));
    ASSERT_LE(ulps, 1) << "element " << i << ": " << ours[i] << " against " << theirs;
    differ += ulps != 0;
  }
  EXPECT_LE(differ, 2u);
  // Relative agreement in double away from the zeros of cos (near them the C library's
  // side carries the rounding of 2 pi u2 as an absolute error).
  for (uint64_t i = 0; i < 100000; ++i) {
    const double theirs = libm_normal(hash_words(9, i));
    if (std::fabs(theirs) > 0.1) ASSERT_NEAR(standard_normal(hash_words(9, i)) / theirs, 1.0, 1e-13) << i;
  }
}

TEST(NormalDraw, IsStandardNormal) {
  const std::size_t n = 1 << 20;
  std::vector<float> x(n);
  fill_standard_normal(5, 0, n, 1.0, x.data());
  double mean = 0, var = 0, beyond2 = 0;
  for (float v : x) mean += v;
  mean /= double(n);
  for (float v : x) {
    var += (v - mean) * (v - mean);
    beyond2 += std::fabs(v) > 2.0f;
  }
  var /= double(n);
  EXPECT_NEAR(mean, 0.0, 5e-3);  // standard error 1e-3
  EXPECT_NEAR(var, 1.0, 5e-3);   // standard error 1.4e-3
  EXPECT_NEAR(beyond2 / double(n), 0.0455, 2e-3);
}

}  // namespace
}  // namespace pptrain
