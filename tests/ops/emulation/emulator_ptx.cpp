// The PTX instructions of emulator_ptx.hpp (layouts and semantics there).
#include "emulator_ptx.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>

#include "emulator_block.hpp"
#include "emulator_counters.hpp"
#include "emulator_races.hpp"

namespace pptrain_emu::ptx {
namespace {

using detail::Launch;

std::atomic<unsigned long long> mma_count{0}, ldmatrix_count{0}, cp_async_count{0};

Launch& in_kernel(const char* what) {
  Launch* L = detail::current_launch();
  if (L == nullptr || L->running() < 0)
    throw std::logic_error(std::string(what) + " called outside an emulated kernel");
  return *L;
}

// Half `half` of a register of two bf16 (the lower element in the lower 16 bits).
float bf16_half(std::uint32_t reg, int half) {
  const std::uint32_t u = (half ? reg >> 16 : reg & 0xFFFFu) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct MmaLane {
  float* d;
  const std::uint32_t* a;
  const std::uint32_t* b;
  const float* c;
};

void complete_mma(void* const* lanes, unsigned mask) {
  if (mask != 0xFFFFFFFFu) fail("mma.sync: needs the full warp");
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    const auto& x = *static_cast<const MmaLane*>(lanes[l]);
    const int g = l / 4, t = l % 4;
    for (int r = 0; r < 4; ++r) {
      const int row = g + r % 2 * 8, col = 2 * t + r / 2 * 8;
      A[row][col] = bf16_half(x.a[r], 0);
      A[row][col + 1] = bf16_half(x.a[r], 1);
    }
    for (int r = 0; r < 2; ++r) {
      const int k = 2 * t + r * 8;
      B[k][g] = bf16_half(x.b[r], 0);
      B[k + 1][g] = bf16_half(x.b[r], 1);
    }
    for (int i = 0; i < 4; ++i) C[g + i / 2 * 8][2 * t + i % 2] = x.c[i];
  }
  for (int l = 0; l < 32; ++l) {  // every C is read above: d may alias c
    const auto& x = *static_cast<const MmaLane*>(lanes[l]);
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + i / 2 * 8, col = 2 * t + i % 2;
      float s = C[row][col];
      for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
      x.d[i] = s;
    }
  }
  ++mma_count;
  counters::mma(1);
}

struct LdmatrixLane {
  std::uint32_t* r;
  const void* row;
  int count;
  bool trans;
};

void complete_ldmatrix(void* const* lanes, unsigned mask) {
  if (mask != 0xFFFFFFFFu) fail("ldmatrix: needs the full warp");
  const auto& first = *static_cast<const LdmatrixLane*>(lanes[0]);
  Launch& L = in_kernel("ldmatrix");
  std::uint16_t m[4][8][8];
  for (int l = 0; l < 32; ++l) {
    const auto& x = *static_cast<const LdmatrixLane*>(lanes[l]);
    if (x.count != first.count || x.trans != first.trans)
      fail("ldmatrix: lanes disagree on the shape");
    if (l >= 8 * x.count) continue;  // only lanes 0 .. 8*count-1 give addresses
    if (reinterpret_cast<std::uintptr_t>(x.row) % 16 != 0)
      fail(("ldmatrix: lane " + std::to_string(l) + "'s row is not 16-byte aligned").c_str());
    if (!L.in_shared(x.row, 16))
      fail(("ldmatrix: lane " + std::to_string(l) + "'s row is not in shared memory").c_str());
    std::memcpy(m[l / 8][l % 8], x.row, 16);
  }
  for (int l = 0; l < 32; ++l) {
    const auto& x = *static_cast<const LdmatrixLane*>(lanes[l]);
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < x.count; ++i) {
      const std::uint16_t lo = x.trans ? m[i][2 * t][g] : m[i][g][2 * t];
      const std::uint16_t hi = x.trans ? m[i][2 * t + 1][g] : m[i][g][2 * t + 1];
      x.r[i] = std::uint32_t(lo) | std::uint32_t(hi) << 16;
    }
  }
  ++ldmatrix_count;
  counters::shared_moved(std::size_t(first.count) * 128, false);
}

}  // namespace

void mma_bf16_m16n8k16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                       const float (&c)[4], std::source_location w) {
  MmaLane lane{d, a, b, c};
  sync_warp("mma.sync.m16n8k16", 0xFFFFFFFFu, &lane, &complete_mma, nullptr, w);
}

void ldmatrix(std::uint32_t* r, int count, bool trans, const void* row, std::source_location w) {
  if (count != 1 && count != 2 && count != 4) fail("ldmatrix: .x1, .x2 or .x4 only");
  LdmatrixLane lane{r, row, count, trans};
  sync_warp("ldmatrix", 0xFFFFFFFFu, &lane, &complete_ldmatrix, nullptr, w);
}

void cp_async_16(void* dst, const void* src, bool fill) {
  Launch& L = in_kernel("cp.async");
  if (reinterpret_cast<std::uintptr_t>(dst) % 16 != 0 ||
      reinterpret_cast<std::uintptr_t>(src) % 16 != 0)
    fail("cp.async: an address that is not 16-byte aligned");
  if (!L.in_shared(dst, 16)) fail("cp.async: the destination is not in shared memory");
  detail::AsyncCopy copy{dst, {}};
  if (fill) {
    races::note(src, 16, false);
    counters::global_access(16, false);
    std::memcpy(copy.bytes, src, 16);
  }
  std::memset(dst, detail::kPoison, 16);  // until its wait
  L.fiber().copies.push_back(copy);
  counters::shared_moved(16, true);
  ++cp_async_count;
}

void cp_async_commit() {
  detail::Fiber& f = in_kernel("cp.async.commit_group").fiber();
  f.groups.push_back(f.copies.size());
}

void cp_async_wait(int newest_pending) {
  detail::Fiber& f = in_kernel("cp.async.wait_group").fiber();
  const auto keep = static_cast<std::size_t>(std::max(newest_pending, 0));
  if (f.groups.size() <= keep) return;
  const std::size_t groups = f.groups.size() - keep;
  const std::size_t landed = f.groups[groups - 1];
  for (std::size_t i = 0; i < landed; ++i) std::memcpy(f.copies[i].dst, f.copies[i].bytes, 16);
  f.copies.erase(f.copies.begin(), f.copies.begin() + static_cast<std::ptrdiff_t>(landed));
  f.groups.erase(f.groups.begin(), f.groups.begin() + static_cast<std::ptrdiff_t>(groups));
  for (std::size_t& end : f.groups) end -= landed;
}

Counters counters() { return {mma_count.load(), ldmatrix_count.load(), cp_async_count.load()}; }

}  // namespace pptrain_emu::ptx
