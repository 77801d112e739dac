// The fused attention kernels (flash_attention.cu, flash_attention_backward.cu) under the
// CUDA emulator against the CPU backend's attention (fp32, on the same bf16-rounded
// inputs): output, logsumexp and the three gradients, for head sizes 16 and 64, sequences
// of one row, of part of a tile, of one whole tile and of several tiles, with 16-byte
// aligned and misaligned qkv, with as many key/value heads as query heads and with fewer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <sstream>
#include <string>
#include <vector>

#include "emulated_kernels.hpp"
#include "emulation_test_util.hpp"
#include "ops/cpu/cpu_ops.hpp"

namespace pptrain::emulation_test {
namespace {

struct FlashShape {
  int B, T, NH, NKV, hs, skew;
  int C() const { return NH * hs; }
  int Ckv() const { return NKV * hs; }
  int W() const { return C() + 2 * Ckv(); }  // a qkv row
};
std::string describe(const FlashShape& s) {
  std::ostringstream o;
  o << "B " << s.B << " T " << s.T << " NH " << s.NH << " NKV " << s.NKV << " hs " << s.hs
    << " skew " << s.skew;
  return o.str();
}

class EmulatedFlash : public ::testing::TestWithParam<FlashShape> {
 protected:
  ops::CpuOps cpu{1};
};

// lse[(b*NH+h)*T+t] = log sum_{s<=t} exp(q_t . k_s / sqrt(hs)), in double.
// k: of query head h's key/value head h / (NH/NKV).
std::vector<double> lse_reference(const std::vector<float>& qkv, const FlashShape& s) {
  std::vector<double> lse(std::size_t(s.B) * s.NH * s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        const float* q = &qkv[(std::size_t(b) * s.T + t) * s.W() + h * s.hs];
        const int kvh = h / (s.NH / s.NKV);
        std::vector<double> x(t + 1);
        double m = -INFINITY, sum = 0.0;
        for (int j = 0; j <= t; ++j) {
          const float* k = &qkv[(std::size_t(b) * s.T + j) * s.W() + s.C() + kvh * s.hs];
          double dot = 0.0;
          for (int d = 0; d < s.hs; ++d) dot += double(q[d]) * k[d];
          x[j] = dot / std::sqrt(double(s.hs));
          m = std::fmax(m, x[j]);
        }
        for (int j = 0; j <= t; ++j) sum += std::exp(x[j] - m);
        lse[(std::size_t(b) * s.NH + h) * s.T + t] = m + std::log(sum);
      }
  return lse;
}

// Part g (0: q, 1: k, 2: v) of a [B*T, W] qkv-shaped array.
std::vector<float> part(const std::vector<float>& x, int rows, const FlashShape& s, int g) {
  const int begin = g == 0 ? 0 : s.C() + (g - 1) * s.Ckv(), width = g == 0 ? s.C() : s.Ckv();
  std::vector<float> out;
  for (int r = 0; r < rows; ++r) {
    const auto row = x.begin() + std::size_t(r) * s.W() + begin;
    out.insert(out.end(), row, row + width);
  }
  return out;
}

TEST_P(EmulatedFlash, ForwardAndBackwardMatchCpu) {
  const FlashShape s = GetParam();
  const int C = s.C(), rows = s.B * s.T;
  const std::size_t n = std::size_t(rows) * C, n_qkv = std::size_t(rows) * s.W();
  const std::vector<float> qkv = rounded<bf16>(randn(n_qkv, 1)), dout = rounded<bf16>(randn(n, 2));
  Device<bf16> dqkv_in(qkv, s.skew), ddout(dout, s.skew), out(n), dqkv(n_qkv);
  Device<float> lse(std::size_t(s.B) * s.NH * s.T);
  kern::flash_attention_forward(out.get(), lse.get(), dqkv_in.get(), s.B, s.T, s.NH, s.NKV, s.hs,
                                nullptr);

  std::vector<float> want_out(n), att(std::size_t(s.B) * s.NH * s.T * s.T);
  cpu.attention_forward(want_out.data(), att.data(), qkv.data(), s.B, s.T, C, s.NH, s.NKV);
  EXPECT_TRUE(all_close(out.read(), want_out, 2e-2)) << "out, " << describe(s);
  EXPECT_TRUE(all_close(lse.read(), lse_reference(qkv, s), 1e-4)) << "lse, " << describe(s);

  Device<unsigned char> workspace(kern::flash_attention_backward_workspace_bytes(s.B, s.T, s.NH));
  kern::flash_attention_backward(dqkv.get(), ddout.get(), dqkv_in.get(), out.get(), lse.get(),
                                 workspace.get(), s.B, s.T, s.NH, s.NKV, s.hs, nullptr);
  std::vector<float> want(n_qkv);
  cpu.attention_backward(want.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, C, s.NH,
                         s.NKV);
  const std::vector<float> got = dqkv.read();
  // Each part against its own largest value, but at least a thousandth of the largest
  // of all: with T = 1, dq and dk are 0 up to the rounding of the bf16 output in D.
  double largest = 0.0;
  for (float x : want) largest = std::fmax(largest, std::fabs(x));
  const char* names[] = {"dq", "dk", "dv"};
  for (int g = 0; g < 3; ++g)
    EXPECT_TRUE(all_close(part(got, rows, s, g), part(want, rows, s, g), 2e-2, 1e-3 * largest))
        << names[g] << ", " << describe(s);
}

// Head sizes 16 and 64: one row, part of a tile, one whole tile, several tiles; and a
// misaligned qkv (the element-wise tile loads). Then grouped key/value heads: two query
// heads per key/value head, and four on one, over several tiles and misaligned.
INSTANTIATE_TEST_SUITE_P(Shapes, EmulatedFlash,
                         ::testing::Values(FlashShape{2, 1, 2, 2, 16, 0},    //
                                           FlashShape{2, 37, 2, 2, 16, 0},   //
                                           FlashShape{2, 64, 2, 2, 16, 0},   //
                                           FlashShape{1, 130, 2, 2, 16, 0},  //
                                           FlashShape{2, 1, 2, 2, 64, 0},    //
                                           FlashShape{2, 37, 2, 2, 64, 0},   //
                                           FlashShape{1, 64, 2, 2, 64, 0},   //
                                           FlashShape{1, 130, 1, 1, 64, 0},  //
                                           FlashShape{1, 37, 3, 3, 64, 1},   //
                                           FlashShape{2, 37, 4, 2, 16, 0},   //
                                           FlashShape{1, 130, 4, 1, 16, 0},  //
                                           FlashShape{1, 37, 4, 2, 64, 1}),
                         [](const ::testing::TestParamInfo<FlashShape>& p) {
                           std::ostringstream o;
                           o << "T" << p.param.T << "_hs" << p.param.hs;
                           if (p.param.NKV != p.param.NH)
                             o << "_nh" << p.param.NH << "_kv" << p.param.NKV;
                           o << (p.param.skew ? "_misaligned" : "");
                           return o.str();
                         });

TEST(EmulatedFlashSupport, HeadSizesAndSharedMemory) {
  constexpr int kH200 = 227 * 1024;
  for (int hs : {16, 32, 64, 128}) EXPECT_TRUE(kern::flash_attention_supported(hs, kH200)) << hs;
  EXPECT_FALSE(kern::flash_attention_supported(48, kH200));
  EXPECT_FALSE(kern::flash_attention_supported(128, 48 * 1024));
}

}  // namespace
}  // namespace pptrain::emulation_test
