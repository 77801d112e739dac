// The fused attention kernels (flash_attention.cu, flash_attention_backward.cu) under the
// CUDA emulator against the CPU backend's attention (fp32, on the same bf16-rounded
// inputs): output, logsumexp and the three gradients, for every head size (16 to 128),
// sequences of one row, of part of a tile, of one whole tile and of several tiles, with 16-byte
// aligned and misaligned qkv, with as many key/value heads as query heads and with fewer;
// and the same kernels on pieces of the sequence against the CPU's ring steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
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
// heads per key/value head, and four on one, over several tiles and misaligned. Then
// every other head size up to 128 at a tile less one row and one more, and 1024 rows.
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
                                           FlashShape{1, 37, 4, 2, 64, 1},   //
                                           FlashShape{2, 63, 2, 2, 32, 0},   //
                                           FlashShape{1, 65, 2, 1, 48, 0},   //
                                           FlashShape{1, 65, 2, 2, 80, 0},   //
                                           FlashShape{1, 63, 1, 1, 96, 1},   //
                                           FlashShape{1, 65, 2, 2, 112, 0},  //
                                           FlashShape{1, 65, 2, 2, 128, 0},  //
                                           FlashShape{1, 1024, 1, 1, 64, 0}),
                         [](const ::testing::TestParamInfo<FlashShape>& p) {
                           std::ostringstream o;
                           o << "T" << p.param.T << "_hs" << p.param.hs;
                           if (p.param.NKV != p.param.NH)
                             o << "_nh" << p.param.NH << "_kv" << p.param.NKV;
                           o << (p.param.skew ? "_misaligned" : "");
                           return o.str();
                         });

// Ring attention's steps on the fused kernels (flash_attention_*_piece) against the CPU
// backend's ring steps (fp32, on the same bf16-rounded inputs). The queries of a piece
// at positions F = 2 len + 10 .. meet the k|v rows of their own piece (written), then
// merge a piece wholly before them, one that overlaps them at an offset no tile divides,
// one wholly after them (no row sees it: out and lse stay), and a longer one; the
// backward steps against the same pieces add to gradients that hold random values.
struct RingShape {
  int B, len, NH, NKV, hs, skew;
  int C() const { return NH * hs; }
  int Wkv() const { return 2 * NKV * hs; }
  int W() const { return C() + Wkv(); }
};

class EmulatedFlashRing : public ::testing::TestWithParam<RingShape> {
 protected:
  ops::CpuOps cpu{1};
};

TEST_P(EmulatedFlashRing, StepsMatchCpu) {
  const RingShape s = GetParam();
  const int F = 2 * s.len + 10, B = s.B, C = s.C();
  struct KeyPiece {
    const char* name;
    int first, len;
  };
  const std::vector<KeyPiece> pieces = {{"own", F, s.len},
                                        {"before", s.len + 5, s.len},
                                        {"overlapping", F - s.len / 2 - 3, s.len},
                                        {"after", F + s.len, s.len},
                                        {"longer", F - 20, s.len + 29}};
  const std::size_t n_out = std::size_t(B) * s.len * C, n_q = std::size_t(B) * s.len * s.W();
  const std::size_t n_lse = std::size_t(B) * s.NH * s.len;
  const std::vector<float> q = rounded<bf16>(randn(n_q, 1)), dout = rounded<bf16>(randn(n_out, 2));
  std::vector<std::vector<float>> kv;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    std::vector<float> rows = rounded<bf16>(randn(std::size_t(B) * pieces[i].len * s.Wkv(), 10 + i));
    if (i == 0)  // the own piece: the k|v columns of the queries' rows
      for (std::size_t r = 0; r < std::size_t(B) * s.len; ++r)
        std::copy_n(q.begin() + r * s.W() + C, s.Wkv(), rows.begin() + r * s.Wkv());
    kv.push_back(std::move(rows));
  }
  Device<bf16> d_q(q, s.skew), d_dout(dout, s.skew), out(n_out);
  Device<float> lse(n_lse);
  std::vector<std::unique_ptr<Device<bf16>>> d_kv;
  for (const auto& rows : kv) d_kv.push_back(std::make_unique<Device<bf16>>(rows, s.skew));
  const kern::FlashRows q_rows{s.W(), F, s.len, 0, 0};
  auto kv_rows = [&](std::size_t i) {
    return kern::FlashRows{s.Wkv(), pieces[i].first, pieces[i].len, 0, s.NKV * s.hs};
  };
  std::vector<float> want_out(n_out), want_lse(n_lse);
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    kern::flash_attention_forward_piece(out.get(), lse.get(), d_q.get(), q_rows, d_kv[i]->get(),
                                        kv_rows(i), B, s.NH, s.NKV, s.hs, i == 0, nullptr);
    cpu.ring_forward_step(want_out.data(), want_lse.data(), q.data(), F, s.len, kv[i].data(),
                          pieces[i].first, pieces[i].len, B, C, s.NH, s.NKV, i == 0);
  }
  EXPECT_TRUE(all_close(out.read(), want_out, 2e-2)) << "out, " << s.len << " rows";
  EXPECT_TRUE(all_close(lse.read(), want_lse, 1e-4)) << "lse, " << s.len << " rows";

  // The CPU's backward reads the kernels' out, rounded to bf16 as the device holds it.
  const std::vector<float> final_out = out.read(), final_lse = lse.read();
  std::vector<float> want_dq = rounded<bf16>(randn(n_q, 3));
  Device<bf16> dq(want_dq, s.skew);
  Device<unsigned char> workspace(kern::flash_attention_backward_workspace_bytes(B, s.len, s.NH));
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    std::vector<float> want_dkv = rounded<bf16>(randn(kv[i].size(), 20 + i));
    Device<bf16> dkv(want_dkv, s.skew);
    kern::flash_attention_backward_piece(dq.get(), dkv.get(), d_dout.get(), out.get(), lse.get(),
                                         workspace.get(), d_q.get(), q_rows, d_kv[i]->get(),
                                         kv_rows(i), B, s.NH, s.NKV, s.hs, nullptr);
    cpu.ring_backward_step(want_dq.data(), want_dkv.data(), dout.data(), final_out.data(),
                           final_lse.data(), q.data(), F, s.len, kv[i].data(), pieces[i].first,
                           pieces[i].len, B, C, s.NH, s.NKV);
    double largest = 0.0;
    for (float x : want_dkv) largest = std::fmax(largest, std::fabs(x));
    EXPECT_TRUE(all_close(dkv.read(), want_dkv, 2e-2, 1e-3 * largest))
        << "dkv of the " << pieces[i].name << " piece, " << s.len << " rows";
  }
  double largest = 0.0;
  for (float x : want_dq) largest = std::fmax(largest, std::fabs(x));
  EXPECT_TRUE(all_close(dq.read(), want_dq, 2e-2, 1e-3 * largest)) << "dq, " << s.len << " rows";
}

// Head sizes 16 and 64, pieces of part of a tile, one tile and several; grouped
// key/value heads; misaligned rows (the element-wise tile loads).
INSTANTIATE_TEST_SUITE_P(Pieces, EmulatedFlashRing,
                         ::testing::Values(RingShape{2, 37, 2, 2, 16, 0},   //
                                           RingShape{1, 64, 2, 2, 64, 0},   //
                                           RingShape{1, 130, 4, 2, 16, 0},  //
                                           RingShape{1, 37, 4, 1, 64, 1}),
                         [](const ::testing::TestParamInfo<RingShape>& p) {
                           std::ostringstream o;
                           o << "len" << p.param.len << "_hs" << p.param.hs;
                           if (p.param.NKV != p.param.NH)
                             o << "_nh" << p.param.NH << "_kv" << p.param.NKV;
                           o << (p.param.skew ? "_misaligned" : "");
                           return o.str();
                         });

TEST(EmulatedFlashSupport, HeadSizesAndSharedMemory) {
  constexpr int kH200 = 227 * 1024;
  for (int hs = 1; hs <= 256; ++hs)
    EXPECT_EQ(kern::flash_attention_supported(hs, kH200), hs % 16 == 0 && hs <= 128) << hs;
  EXPECT_FALSE(kern::flash_attention_supported(128, 48 * 1024));
}

}  // namespace
}  // namespace pptrain::emulation_test
