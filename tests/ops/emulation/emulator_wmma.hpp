// nvcuda::wmma for the CUDA emulator (include/mma.h leads here): 16x16x16 fragments,
// elements held as fp32 whatever their type. Every lane holds the whole matrix (the
// hardware spreads it over the lanes; kernels that only pass fragments to wmma calls
// cannot tell). load, store and mma are warp collectives as on the device (all 32 lanes
// reach them with the same arguments; mma computes from lane 0's operands); fill_fragment
// is per lane. Which lane moves which element is unknown, so memory is touched at the
// edges the API allows: a load reads when the first lane arrives, a store lands when the
// warp next synchronises; lanes that write a load's source, or read a store's result,
// without a __syncwarp in between then see the wrong data. Products are exact (bf16 *
// bf16 fits in fp32) and summed in fp32 in k order onto the accumulator. The API's
// pointer and stride rules are checked: 32-byte aligned pointers, strides a multiple of
// 16 bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "cuda_emulator.hpp"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulator knows only 16x16x16 fragments");
  float m[16][16];
};

namespace detail {

struct Access {
  float (*m)[16];  // this lane's fragment
  const void* ptr;
  unsigned ld;
  bool col;    // column-major in memory
  bool first;  // a load: this lane arrived first and read the memory
};

inline void check_access(const Access& a, std::size_t elem, const char* what) {
  if (reinterpret_cast<std::uintptr_t>(a.ptr) % 32 != 0)
    pptrain_emu::fail((std::string(what) + ": pointer not 32-byte aligned").c_str());
  if (a.ld * elem % 16 != 0)
    pptrain_emu::fail((std::string(what) + ": stride not a multiple of 16 bytes").c_str());
}

// The same pointer, stride and layout from every lane.
inline const Access& agreed(void* const* lanes, unsigned mask, const char* what) {
  const auto& first = *static_cast<const Access*>(lanes[0]);
  if (mask != 0xFFFFFFFFu) pptrain_emu::fail((std::string(what) + ": needs the full warp").c_str());
  for (int l = 1; l < 32; ++l) {
    const auto& a = *static_cast<const Access*>(lanes[l]);
    if (a.ptr != first.ptr || a.ld != first.ld || a.col != first.col)
      pptrain_emu::fail((std::string(what) + ": lanes pass different arguments").c_str());
  }
  return first;
}

// A load reads the memory when the first lane arrives (so a lane's write that lacks a
// __syncwarp before the load is missed) and hands the matrix to every lane at the end.
// The counters (emulator_counters.hpp): a fragment's bytes, from shared or global memory.
inline void count_access(const void* p, std::size_t bytes, bool write) {
  if (!pptrain_emu::counters::shared_access(reinterpret_cast<std::uintptr_t>(p), bytes, write))
    pptrain_emu::counters::global_access(bytes, write);
}

template <typename T>
void first_load(void* data) {
  auto& a = *static_cast<Access*>(data);
  check_access(a, sizeof(T), "wmma::load_matrix_sync");
  count_access(a.ptr, 256 * sizeof(T), false);
  const T* p = static_cast<const T*>(a.ptr);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j)
      a.m[i][j] =
          static_cast<float>(a.col ? p[i + std::size_t(j) * a.ld] : p[i * std::size_t(a.ld) + j]);
  a.first = true;
}
inline void complete_load(void* const* lanes, unsigned mask) {
  agreed(lanes, mask, "wmma::load_matrix_sync");
  const Access* first = nullptr;
  for (int l = 0; l < 32; ++l)
    if (static_cast<const Access*>(lanes[l])->first) first = static_cast<const Access*>(lanes[l]);
  for (int l = 0; l < 32; ++l) {
    auto* a = static_cast<const Access*>(lanes[l]);
    if (a != first) std::memcpy(a->m, first->m, sizeof(float[16][16]));
  }
}

// A store lands when the warp next synchronises (pptrain_emu::defer_to_warp_sync).
struct Store {
  float m[16][16];
  float* p;
  unsigned ld;
  bool col;
};
inline void apply_store(const void* payload) {
  const auto& s = *static_cast<const Store*>(payload);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j)
      (s.col ? s.p[i + std::size_t(j) * s.ld] : s.p[i * std::size_t(s.ld) + j]) = s.m[i][j];
}
inline void complete_store(void* const* lanes, unsigned mask) {
  const Access& a = agreed(lanes, mask, "wmma::store_matrix_sync");
  check_access(a, sizeof(float), "wmma::store_matrix_sync");
  for (int l = 1; l < 32; ++l)
    if (std::memcmp(static_cast<const Access*>(lanes[l])->m, a.m, sizeof(float[16][16])) != 0)
      pptrain_emu::fail("wmma::store_matrix_sync: lanes hold different fragments");
  Store s;
  std::memcpy(s.m, a.m, sizeof(s.m));
  s.p = static_cast<float*>(const_cast<void*>(a.ptr)), s.ld = a.ld, s.col = a.col;
  count_access(a.ptr, 256 * sizeof(float), true);
  pptrain_emu::defer_to_warp_sync(&apply_store, &s, sizeof(s));
}

struct Mma {
  float (*d)[16];
  const float (*a)[16];
  const float (*b)[16];
  const float (*c)[16];
};

inline void complete_mma(void* const* lanes, unsigned mask) {
  if (mask != 0xFFFFFFFFu) pptrain_emu::fail("wmma::mma_sync: needs the full warp");
  const auto& x = *static_cast<const Mma*>(lanes[0]);
  float r[16][16];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float s = x.c[i][j];
      for (int k = 0; k < 16; ++k) s += x.a[i][k] * x.b[k][j];
      r[i][j] = s;
    }
  for (int l = 0; l < 32; ++l) std::memcpy(static_cast<const Mma*>(lanes[l])->d, r, sizeof(r));
  pptrain_emu::counters::mma(2);  // a 16x16x16 product is two m16n8k16 instructions
}

}  // namespace detail

template <typename Use, typename T, typename L>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, L>& f, const T* p, unsigned ld,
                      std::source_location w = std::source_location::current()) {
  static_assert(!std::is_same_v<Use, accumulator>, "accumulators load with a layout_t");
  detail::Access a{f.m, p, ld, std::is_same_v<L, col_major>, false};
  pptrain_emu::sync_warp("wmma::load_matrix_sync", 0xFFFFFFFFu, &a, &detail::complete_load,
                         &detail::first_load<T>, w);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ld, layout_t layout,
                             std::source_location w = std::source_location::current()) {
  detail::Access a{f.m, p, ld, layout == mem_col_major, false};
  pptrain_emu::sync_warp("wmma::load_matrix_sync", 0xFFFFFFFFu, &a, &detail::complete_load,
                         &detail::first_load<float>, w);
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ld, layout_t layout,
                              std::source_location w = std::source_location::current()) {
  detail::Access a{const_cast<float(*)[16]>(f.m), p, ld, layout == mem_col_major, false};
  pptrain_emu::sync_warp("wmma::store_matrix_sync", 0xFFFFFFFFu, &a, &detail::complete_store,
                         nullptr, w);
}
template <typename Use, typename T, typename L>
void fill_fragment(fragment<Use, 16, 16, 16, T, L>& f, float v) {
  for (auto& row : f.m)
    for (float& x : row) x = v;
}
template <typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c,
              std::source_location w = std::source_location::current()) {
  detail::Mma m{d.m, a.m, b.m, c.m};
  pptrain_emu::sync_warp("wmma::mma_sync", 0xFFFFFFFFu, &m, &detail::complete_mma, nullptr, w);
}

}  // namespace nvcuda::wmma
