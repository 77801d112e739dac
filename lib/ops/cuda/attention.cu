// The attention pieces around the batched GEMMs: the head permutations between the
// row-major qkv[B,T,W] / out[B,T,NH*hs] and the head-major [B,NH,T,hs] arrays, and the
// in-place causal softmax over rows of att[BH,T,T] (forward on scale * scores, and
// its backward), one warp per row in fp32, zeros above the diagonal. A qkv row holds
// NH query heads, then NKV key and NKV value heads (W = (NH + 2*NKV) * hs); the
// head-major k and v have one head per query head, query head h's a copy of key/value
// head h / (NH/NKV), and their gradients are summed back over each group.
#include <cmath>

#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/kernels.hpp"

namespace pptrain::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;

// The heads of a row-major layout: G parts (1: out, 3: qkv), part 0 of NH heads and
// parts 1 and 2 of NKV heads each, all of hs elements.
struct Heads {
  int G, NH, NKV, Tn, hs;
  __host__ __device__ int width() const { return (NH + (G - 1) * NKV) * hs; }
};

// Element e of the row-major layout: its part, its head within the part, and the offset
// of its (b, t, d) in a head-major [B,NH,T,hs] array, to which head h' adds h' * T * hs.
// Every index fits in int (checked by the launchers).
struct HeadPos {
  int part, head, base;
};
__device__ __forceinline__ HeadPos head_pos(int e, const Heads& L) {
  const int width = L.width();
  const int bt = e / width;
  int c = e - bt * width, part = 0;
  if (c >= L.NH * L.hs) {  // k or v
    c -= L.NH * L.hs;
    part = 1 + c / (L.NKV * L.hs);
    c -= (part - 1) * L.NKV * L.hs;
  }
  const int b = bt / L.Tn, t = bt - b * L.Tn;
  return {part, c / L.hs, (b * L.NH * L.Tn + t) * L.hs + c % L.hs};
}

template <typename T>
__device__ __forceinline__ T* pick(int g, T* p0, T* p1, T* p2) {
  return g == 0 ? p0 : (g == 1 ? p1 : p2);
}

// Head-major h_part from the row-major `rows`, W elements at a time (W divides hs): a
// key/value head goes to each query head of its group.
template <typename T, int W>
__global__ void gather_heads_kernel(T* h0, T* h1, T* h2, const T* __restrict__ rows, Heads L,
                                    unsigned packs) {
  const int group = L.NH / L.NKV, head_stride = L.Tn * L.hs;
  for (unsigned p = blockIdx.x * blockDim.x + threadIdx.x; p < packs; p += gridDim.x * blockDim.x) {
    const int e = static_cast<int>(p) * W;
    const HeadPos hp = head_pos(e, L);
    const Pack<T, W> x = load_pack<W>(rows + e);
    if (hp.part == 0) {
      store_pack<W>(h0 + hp.base + hp.head * head_stride, x);
      continue;
    }
    T* h = pick(hp.part, h0, h1, h2) + hp.base;
    for (int i = 0; i < group; ++i) store_pack<W>(h + (hp.head * group + i) * head_stride, x);
  }
}

// The inverse direction: rows[e] from h_part; a key/value element is the sum, in fp32 and
// in head order, of its group's query heads.
template <typename T, int W>
__global__ void scatter_heads_kernel(T* __restrict__ rows, const T* h0, const T* h1, const T* h2,
                                     Heads L, unsigned packs) {
  const int group = L.NH / L.NKV, head_stride = L.Tn * L.hs;
  for (unsigned p = blockIdx.x * blockDim.x + threadIdx.x; p < packs; p += gridDim.x * blockDim.x) {
    const int e = static_cast<int>(p) * W;
    const HeadPos hp = head_pos(e, L);
    if (hp.part == 0) {
      store_pack<W>(rows + e, load_pack<W>(h0 + hp.base + hp.head * head_stride));
      continue;
    }
    const T* h = pick(hp.part, h0, h1, h2) + hp.base + hp.head * group * head_stride;
    float sum[W];
    const Pack<T, W> first = load_pack<W>(h);
#pragma unroll
    for (int k = 0; k < W; ++k) sum[k] = to_f32(first.v[k]);
    for (int i = 1; i < group; ++i) {
      const Pack<T, W> x = load_pack<W>(h + i * head_stride);
#pragma unroll
      for (int k = 0; k < W; ++k) sum[k] += to_f32(x.v[k]);
    }
    Pack<T, W> out;
#pragma unroll
    for (int k = 0; k < W; ++k) out.v[k] = from_f32<T>(sum[k]);
    store_pack<W>(rows + e, out);
  }
}

// The rows of att[BH,T,T] go one per warp; row `row` is query position row % T and
// its live entries are [0, row % T]. W-wide packs need T % W == 0 and aligned rows.
template <typename T, int W>
__global__ void causal_softmax_forward_kernel(T* att, float scale, int rows, int T_) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % 32;
  const int live = row % T_ + 1;
  T* a = att + static_cast<std::size_t>(row) * T_;
  float m = -INFINITY;
  for (int j = lane * W; j < live; j += 32 * W) {
    const Pack<T, W> p = load_pack<W>(a + j);
#pragma unroll
    for (int k = 0; k < W; ++k)
      if (j + k < live) m = fmaxf(m, scale * to_f32(p.v[k]));
  }
  m = warp_max(m);
  float sum = 0.0f;
  for (int j = lane * W; j < live; j += 32 * W) {
    const Pack<T, W> p = load_pack<W>(a + j);
#pragma unroll
    for (int k = 0; k < W; ++k)
      if (j + k < live) sum += expf(scale * to_f32(p.v[k]) - m);
  }
  const float inv = 1.0f / warp_sum(sum);
  for (int j = lane * W; j < T_; j += 32 * W) {
    Pack<T, W> p;
    if (j < live) p = load_pack<W>(a + j);
#pragma unroll
    for (int k = 0; k < W; ++k)
      p.v[k] = from_f32<T>(j + k < live ? expf(scale * to_f32(p.v[k]) - m) * inv : 0.0f);
    store_pack<W>(a + j, p);
  }
}

// datt = scale * p * (datt - sum_j p_j datt_j) on the live entries, 0 above them.
template <typename T, int W>
__global__ void causal_softmax_backward_kernel(T* datt, const T* __restrict__ att, float scale,
                                               int rows, int T_) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int live = row % T_ + 1;
  const std::size_t off = static_cast<std::size_t>(row) * T_;
  T* d = datt + off;
  const T* a = att + off;
  float dot = 0.0f;
  for (int j = lane * W; j < live; j += 32 * W) {
    const Pack<T, W> pd = load_pack<W>(d + j), pa = load_pack<W>(a + j);
#pragma unroll
    for (int k = 0; k < W; ++k)
      if (j + k < live) dot += to_f32(pa.v[k]) * to_f32(pd.v[k]);
  }
  dot = warp_sum(dot);
  for (int j = lane * W; j < T_; j += 32 * W) {
    Pack<T, W> pd, pa;
    if (j < live) {
      pd = load_pack<W>(d + j);
      pa = load_pack<W>(a + j);
    }
    Pack<T, W> r;
#pragma unroll
    for (int k = 0; k < W; ++k)
      r.v[k] = from_f32<T>(j + k < live ? scale * to_f32(pa.v[k]) * (to_f32(pd.v[k]) - dot) : 0.0f);
    store_pack<W>(d + j, r);
  }
}

// Checks the sizes of a head permutation between B*T rows of layout L and G head-major
// arrays of B*NH*T*hs elements; true when there is something to do.
bool check_heads(const char* op, int B, const Heads& L) {
  PPTRAIN_CHECK(B >= 0 && L.Tn >= 0 && L.NH >= 0 && L.hs >= 0,
                std::string(op) + ": negative size");
  PPTRAIN_CHECK(L.G == 1 || (L.NKV > 0 && L.NH % L.NKV == 0),
                std::string(op) + ": NH must be a multiple of NKV");
  const long long total = static_cast<long long>(B) * L.Tn * L.G * L.NH * L.hs;
  PPTRAIN_CHECK(total < (1LL << 31), std::string(op) + ": more than 2^31 elements");
  return total > 0;
}

template <typename T>
void gather(T* h0, T* h1, T* h2, const T* rows, int B, const Heads& L, cudaStream_t s) {
  constexpr int V = kVec<T>;
  const unsigned total = static_cast<unsigned>(B) * L.Tn * L.width();
  if (L.hs % V == 0 && aligned16({h0, h1, h2, rows}))
    gather_heads_kernel<T, V>
        <<<grid_for(total / V, kThreads), kThreads, 0, s>>>(h0, h1, h2, rows, L, total / V);
  else
    gather_heads_kernel<T, 1>
        <<<grid_for(total, kThreads), kThreads, 0, s>>>(h0, h1, h2, rows, L, total);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void scatter(T* rows, const T* h0, const T* h1, const T* h2, int B, const Heads& L,
             cudaStream_t s) {
  constexpr int V = kVec<T>;
  const unsigned total = static_cast<unsigned>(B) * L.Tn * L.width();
  if (L.hs % V == 0 && aligned16({rows, h0, h1, h2}))
    scatter_heads_kernel<T, V>
        <<<grid_for(total / V, kThreads), kThreads, 0, s>>>(rows, h0, h1, h2, L, total / V);
  else
    scatter_heads_kernel<T, 1>
        <<<grid_for(total, kThreads), kThreads, 0, s>>>(rows, h0, h1, h2, L, total);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

// Checks the sizes of att[BH,T,T]; returns its row count.
int check_rows(const char* op, const void* att, int BH, int T_) {
  PPTRAIN_CHECK(BH >= 0 && T_ >= 0, std::string(op) + ": negative size");
  const long long rows = static_cast<long long>(BH) * T_;
  PPTRAIN_CHECK(rows < (1LL << 31), std::string(op) + ": more than 2^31 rows");
  PPTRAIN_CHECK(rows == 0 || att != nullptr, std::string(op) + ": null pointer");
  return static_cast<int>(rows);
}

}  // namespace

template <typename T>
void split_heads(T* q, T* k, T* v, const T* qkv, int B, int T_, int NH, int NKV, int hs,
                 cudaStream_t s) {
  const Heads L{3, NH, NKV, T_, hs};
  if (!check_heads("split_heads", B, L)) return;
  PPTRAIN_CHECK(q && k && v && qkv, "split_heads: null pointer");
  gather(q, k, v, qkv, B, L, s);
}

template <typename T>
void merge_heads(T* out, const T* y, int B, int T_, int NH, int hs, cudaStream_t s) {
  const Heads L{1, NH, NH, T_, hs};
  if (!check_heads("merge_heads", B, L)) return;
  PPTRAIN_CHECK(out && y, "merge_heads: null pointer");
  scatter(out, y, y, y, B, L, s);
}

template <typename T>
void split_heads_grad(T* dy, const T* dout, int B, int T_, int NH, int hs, cudaStream_t s) {
  const Heads L{1, NH, NH, T_, hs};
  if (!check_heads("split_heads_grad", B, L)) return;
  PPTRAIN_CHECK(dy && dout, "split_heads_grad: null pointer");
  gather(dy, dy, dy, dout, B, L, s);
}

template <typename T>
void merge_qkv_grad(T* dqkv, const T* dq, const T* dk, const T* dv, int B, int T_, int NH, int NKV,
                    int hs, cudaStream_t s) {
  const Heads L{3, NH, NKV, T_, hs};
  if (!check_heads("merge_qkv_grad", B, L)) return;
  PPTRAIN_CHECK(dqkv && dq && dk && dv, "merge_qkv_grad: null pointer");
  scatter(dqkv, dq, dk, dv, B, L, s);
}

template <typename T>
void causal_softmax_forward(T* att, float scale, int BH, int T_, cudaStream_t s) {
  const int rows = check_rows("causal_softmax_forward", att, BH, T_);
  if (rows == 0) return;
  const unsigned grid = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  constexpr int V = kVec<T>;
  if (T_ % V == 0 && aligned16({att}))
    causal_softmax_forward_kernel<T, V><<<grid, kThreads, 0, s>>>(att, scale, rows, T_);
  else
    causal_softmax_forward_kernel<T, 1><<<grid, kThreads, 0, s>>>(att, scale, rows, T_);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void causal_softmax_backward(T* datt, const T* att, float scale, int BH, int T_, cudaStream_t s) {
  const int rows = check_rows("causal_softmax_backward", datt, BH, T_);
  if (rows == 0) return;
  PPTRAIN_CHECK(att != nullptr, "causal_softmax_backward: null pointer");
  const unsigned grid = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  constexpr int V = kVec<T>;
  if (T_ % V == 0 && aligned16({datt, att}))
    causal_softmax_backward_kernel<T, V><<<grid, kThreads, 0, s>>>(datt, att, scale, rows, T_);
  else
    causal_softmax_backward_kernel<T, 1><<<grid, kThreads, 0, s>>>(datt, att, scale, rows, T_);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

#define PPTRAIN_INSTANTIATE(T)                                                               \
  template void split_heads<T>(T*, T*, T*, const T*, int, int, int, int, int, cudaStream_t); \
  template void merge_heads<T>(T*, const T*, int, int, int, int, cudaStream_t);              \
  template void split_heads_grad<T>(T*, const T*, int, int, int, int, cudaStream_t);         \
  template void merge_qkv_grad<T>(T*, const T*, const T*, const T*, int, int, int, int, int, \
                                  cudaStream_t);                                             \
  template void causal_softmax_forward<T>(T*, float, int, int, cudaStream_t);                \
  template void causal_softmax_backward<T>(T*, const T*, float, int, int, cudaStream_t);
PPTRAIN_INSTANTIATE(float)
PPTRAIN_INSTANTIATE(bf16)
#undef PPTRAIN_INSTANTIATE

}  // namespace pptrain::ops::cuda
