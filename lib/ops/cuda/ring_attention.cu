// Ring attention's steps (context parallelism) on the GPU: the queries of one piece of
// the sequence against the keys and values of another, causal by position in the whole
// sequence, merged into a running output and log-sum-exp (ops::Ops's contract; the CPU's
// blocked kernels are the reference), where the fused kernels do not run them (fp32,
// train.attention: unfused, or a head size they do not take; cuda_ops_attention.cpp).
// Plain loops with fp32 sums, one thread per query row (the forward and the query
// gradient) or per key row (the key and value gradients, over the rows of every query
// head of its group in order): correct and deterministic, not fast.
#include <cmath>
#include <string>

#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/kernels.hpp"

namespace pptrain::ops::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxHead = 128;  // the head sizes pptrain's models use

// Rows of a piece: B sequences of `len` rows each; a query piece's rows are q|k|v
// ((NH + 2 NKV) hs values), a key/value piece's k|v alone (2 NKV hs).
template <typename T>
struct Rows {
  const T* rows;
  int first, len;
};

struct Dims {
  int B, NH, NKV, hs;
  __device__ int width() const { return (NH + 2 * NKV) * hs; }
  __device__ int kv_width() const { return 2 * NKV * hs; }
  __device__ int group() const { return NH / NKV; }
};

template <typename T>
__device__ const T* q_of(const Rows<T>& p, const Dims& d, int b, int row, int h) {
  return p.rows + (static_cast<std::size_t>(b) * p.len + row) * d.width() + h * d.hs;
}
template <typename T>
__device__ const T* k_of(const Rows<T>& p, const Dims& d, int b, int row, int kvh) {
  return p.rows + (static_cast<std::size_t>(b) * p.len + row) * d.kv_width() + kvh * d.hs;
}
template <typename T>
__device__ const T* v_of(const Rows<T>& p, const Dims& d, int b, int row, int kvh) {
  return k_of(p, d, b, row, kvh) + d.NKV * d.hs;
}

template <typename A, typename B>
__device__ float dot(const A* x, const B* y, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += to_f32(x[i]) * to_f32(y[i]);
  return s;
}

// Query row i of the B * NH * q.len a kernel's threads take: its sequence, query head,
// key/value head and row, and (b, h) as one index.
struct QueryRow {
  int b, h, kvh, row, bh;
};
__device__ QueryRow query_row(std::size_t i, int q_len, const Dims& d) {
  const int row = static_cast<int>(i % q_len), bh = static_cast<int>(i / q_len);
  return {bh / d.NH, bh % d.NH, (bh % d.NH) / d.group(), row, bh};
}

// The keys of kv that query row `row` of q sees: those at or before its position.
template <typename T>
__device__ int keys_seen(const Rows<T>& q, int row, const Rows<T>& kv) {
  return min(max(q.first + row - kv.first + 1, 0), kv.len);
}

template <typename T>
__global__ void ring_forward_kernel(T* out, float* lse, Rows<T> q, Rows<T> kv, Dims d,
                                    float scale, bool write) {
  const int C = d.NH * d.hs;
  const std::size_t rows = static_cast<std::size_t>(d.B) * d.NH * q.len;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < rows;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const auto [b, h, kvh, row, bh] = query_row(i, q.len, d);
    const int end = keys_seen(q, row, kv);
    if (end == 0) continue;  // nothing of this piece is visible: out and lse stay
    const T* qr = q_of(q, d, b, row, h);
    float acc[kMaxHead];
    for (int c = 0; c < d.hs; ++c) acc[c] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j < end; ++j) {
      const float s = dot(qr, k_of(kv, d, b, j, kvh), d.hs) * scale;
      const float m_new = fmaxf(m, s);
      const float alpha = expf(m - m_new), p = expf(s - m_new);
      const T* vr = v_of(kv, d, b, j, kvh);
      for (int c = 0; c < d.hs; ++c) acc[c] = acc[c] * alpha + p * to_f32(vr[c]);
      l = l * alpha + p;
      m = m_new;
    }
    T* o = out + (static_cast<std::size_t>(b) * q.len + row) * C + h * d.hs;
    float& row_lse = lse[static_cast<std::size_t>(bh) * q.len + row];
    const float piece = m + logf(l);
    if (write) {
      for (int c = 0; c < d.hs; ++c) o[c] = from_f32<T>(acc[c] / l);
      row_lse = piece;
      continue;
    }
    // The rows so far (lse -inf: nothing yet) and this piece's, each weighted by its
    // share of the row's total exp-sum.
    const float before = row_lse, top = fmaxf(before, piece);
    const float w_before = expf(before - top), w_piece = expf(piece - top);
    const float total = w_before + w_piece;
    const float keep = w_before / total, add = w_piece / (total * l);
    for (int c = 0; c < d.hs; ++c) o[c] = from_f32<T>(to_f32(o[c]) * keep + acc[c] * add);
    row_lse = top + logf(total);
  }
}

// Key k's probability for query q (whose row has log-sum-exp L) and the gradient of its
// score before the scale: p (dout . v - delta), delta = dout . out of the query's row.
struct ScoreGrad {
  float p, g;
};
template <typename T>
__device__ ScoreGrad score_grad(const T* q, const T* k, const T* v, const T* dout, float delta,
                                float L, int hs, float scale) {
  const float p = expf(fminf(dot(q, k, hs) * scale - L, 0.0f));
  return {p, p * (dot(dout, v, hs) - delta)};
}

// dq (the q part of q's rows) += scale * sum_j p_j (dout . v_j - delta) k_j.
template <typename T>
__global__ void ring_backward_dq_kernel(T* dq, const T* dout, const T* out, const float* lse,
                                        Rows<T> q, Rows<T> kv, Dims d, float scale) {
  const int C = d.NH * d.hs;
  const std::size_t rows = static_cast<std::size_t>(d.B) * d.NH * q.len;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < rows;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const auto [b, h, kvh, row, bh] = query_row(i, q.len, d);
    const int end = keys_seen(q, row, kv);
    if (end == 0) continue;
    const std::size_t at = (static_cast<std::size_t>(b) * q.len + row) * C + h * d.hs;
    const float delta = dot(dout + at, out + at, d.hs);
    const float L = lse[static_cast<std::size_t>(bh) * q.len + row];
    const T* qr = q_of(q, d, b, row, h);
    float acc[kMaxHead];
    for (int c = 0; c < d.hs; ++c) acc[c] = 0.0f;
    for (int j = 0; j < end; ++j) {
      const T* kr = k_of(kv, d, b, j, kvh);
      const ScoreGrad s = score_grad(qr, kr, v_of(kv, d, b, j, kvh), dout + at, delta, L, d.hs, scale);
      for (int c = 0; c < d.hs; ++c) acc[c] += s.g * to_f32(kr[c]);
    }
    T* dqr = dq + (qr - q.rows);
    for (int c = 0; c < d.hs; ++c) dqr[c] = from_f32<T>(to_f32(dqr[c]) + scale * acc[c]);
  }
}

// dk, dv (dkv's rows, in kv's k|v layout) += the sums over the query rows that see the
// key, in every query head of its group in order.
template <typename T>
__global__ void ring_backward_dkv_kernel(T* dkv, const T* dout, const T* out, const float* lse,
                                         Rows<T> q, Rows<T> kv, Dims d, float scale) {
  const int C = d.NH * d.hs;
  const std::size_t rows = static_cast<std::size_t>(d.B) * d.NKV * kv.len;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < rows;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(i % kv.len), bkv = static_cast<int>(i / kv.len);
    const int b = bkv / d.NKV, kvh = bkv % d.NKV;
    const int first_row = max(kv.first + j - q.first, 0);  // the first query that sees it
    if (first_row >= q.len) continue;
    const T* kr = k_of(kv, d, b, j, kvh);
    const T* vr = v_of(kv, d, b, j, kvh);
    float dk[kMaxHead], dv[kMaxHead];
    for (int c = 0; c < d.hs; ++c) dk[c] = dv[c] = 0.0f;
    for (int h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h)
      for (int row = first_row; row < q.len; ++row) {
        const std::size_t at = (static_cast<std::size_t>(b) * q.len + row) * C + h * d.hs;
        const T* qr = q_of(q, d, b, row, h);
        const float L = lse[(static_cast<std::size_t>(b) * d.NH + h) * q.len + row];
        const ScoreGrad s =
            score_grad(qr, kr, vr, dout + at, dot(dout + at, out + at, d.hs), L, d.hs, scale);
        for (int c = 0; c < d.hs; ++c) {
          dv[c] += s.p * to_f32(dout[at + c]);
          dk[c] += scale * s.g * to_f32(qr[c]);
        }
      }
    T* dkr = dkv + (kr - kv.rows);
    T* dvr = dkv + (vr - kv.rows);
    for (int c = 0; c < d.hs; ++c) {
      dkr[c] = from_f32<T>(to_f32(dkr[c]) + dk[c]);
      dvr[c] = from_f32<T>(to_f32(dvr[c]) + dv[c]);
    }
  }
}

Dims checked(const char* op, int B, int NH, int NKV, int hs, int q_len, int kv_len) {
  PPTRAIN_CHECK(B > 0 && NH > 0 && NKV > 0 && NH % NKV == 0 && q_len > 0 && kv_len > 0,
                std::string(op) + ": bad sizes");
  PPTRAIN_CHECK(hs > 0 && hs <= kMaxHead, std::string(op) + ": head size above " +
                                              std::to_string(kMaxHead));
  return {B, NH, NKV, hs};
}

}  // namespace

template <typename T>
void ring_attention_forward_step(T* out, float* lse, const T* q, int q_first, int q_len,
                                 const T* kv, int kv_first, int kv_len, int B, int NH, int NKV,
                                 int hs, bool write, cudaStream_t s) {
  const Dims d = checked("ring_attention_forward_step", B, NH, NKV, hs, q_len, kv_len);
  PPTRAIN_CHECK(out && lse && q && kv, "ring_attention_forward_step: null pointer");
  const std::size_t rows = std::size_t(B) * NH * q_len;
  ring_forward_kernel<T><<<grid_for(rows, kThreads), kThreads, 0, s>>>(
      out, lse, Rows<T>{q, q_first, q_len}, Rows<T>{kv, kv_first, kv_len}, d,
      1.0f / std::sqrt(static_cast<float>(hs)), write);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void ring_attention_backward_step(T* dq, T* dkv, const T* dout, const T* out, const float* lse,
                                  const T* q, int q_first, int q_len, const T* kv, int kv_first,
                                  int kv_len, int B, int NH, int NKV, int hs, cudaStream_t s) {
  const Dims d = checked("ring_attention_backward_step", B, NH, NKV, hs, q_len, kv_len);
  PPTRAIN_CHECK(dq && dkv && dout && out && lse && q && kv,
                "ring_attention_backward_step: null pointer");
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const Rows<T> qp{q, q_first, q_len}, kp{kv, kv_first, kv_len};
  const std::size_t q_rows = std::size_t(B) * NH * q_len, k_rows = std::size_t(B) * NKV * kv_len;
  ring_backward_dq_kernel<T><<<grid_for(q_rows, kThreads), kThreads, 0, s>>>(dq, dout, out, lse,
                                                                             qp, kp, d, scale);
  PPTRAIN_CUDA_CHECK_LAUNCH();
  ring_backward_dkv_kernel<T><<<grid_for(k_rows, kThreads), kThreads, 0, s>>>(
      dkv, dout, out, lse, qp, kp, d, scale);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

#define PPTRAIN_RING_ATTENTION(T)                                                              \
  template void ring_attention_forward_step<T>(T*, float*, const T*, int, int, const T*, int,   \
                                               int, int, int, int, int, bool, cudaStream_t);    \
  template void ring_attention_backward_step<T>(T*, T*, const T*, const T*, const float*,       \
                                                const T*, int, int, const T*, int, int, int,    \
                                                int, int, int, cudaStream_t);
PPTRAIN_RING_ATTENTION(float)
PPTRAIN_RING_ATTENTION(bf16)
#undef PPTRAIN_RING_ATTENTION

}  // namespace pptrain::ops::cuda
