// CPU backend: softmax cross-entropy over the first V of Vp logit columns. Rows are
// split over the OpenMP threads (each with its own scratch row); a row's result does
// not depend on which thread computes it.
#include <algorithm>
#include <cmath>
#include <limits>

#include <omp.h>

#include "core/error.hpp"
#include "ops/cpu/cpu_math.hpp"
#include "ops/cpu/cpu_ops.hpp"

namespace pptrain::ops {

namespace {
// The row kernels, compiled for the widest vectors this CPU runs (the same operations in
// the same order on every width: the same bits).
PPTRAIN_WIDE_CLONES
float wide_row_max(const float* x, int n) { return cpu::row_max(x, n); }

// e[j] = exp(x[j] - shift) for j in [0, n) (e may be x); returns their sum.
PPTRAIN_WIDE_CLONES
double exp_shifted_sum(float* e, const float* x, int n, float shift) {
  for (int j = 0; j < n; ++j) e[j] = cpu::exp_nonpositive(x[j] - shift);
  return cpu::row_sum(e, n);
}

// d[j] = exp(x[j] - shift) * scale for j in [0, n) (d may be x); zeros on [n, width).
PPTRAIN_WIDE_CLONES
void exp_shifted_scaled(float* d, const float* x, int n, int width, float shift, float scale) {
  for (int j = 0; j < n; ++j) d[j] = cpu::exp_nonpositive(x[j] - shift) * scale;
  for (int j = n; j < width; ++j) d[j] = 0.0f;
}

// e[j] *= scale for j in [0, n); zeros on [n, width).
PPTRAIN_WIDE_CLONES
void scale_row(float* e, int n, int width, float scale) {
  for (int j = 0; j < n; ++j) e[j] *= scale;
  for (int j = n; j < width; ++j) e[j] = 0.0f;
}
}  // namespace

void CpuOps::cross_entropy(float* losses, float* dlogits, const float* logits,
                           const int32_t* targets, int N, int V, int Vp, float dloss) {
  PPTRAIN_CHECK(V > 0 && V <= Vp, "cross_entropy: need 0 < V <= Vp");
  // exp(x - max) goes to dlogits (later scaled to probabilities) or, for the loss
  // alone, to a scratch row: one exp per column either way.
  for (int n = 0; n < N; ++n)
    PPTRAIN_CHECK(targets[n] >= 0 && targets[n] < V, "cross_entropy: target outside [0, V)");
  float* scratch = dlogits == nullptr ? thread_rows(V) : nullptr;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::size_t off = static_cast<std::size_t>(n) * Vp;
    const float* x = logits + off;
    const int32_t target = targets[n];
    const float maxv = wide_row_max(x, V);
    // Read the target logit now: dlogits may alias logits and is overwritten below.
    const double shifted_target = static_cast<double>(x[target]) - maxv;
    float* e = dlogits != nullptr ? dlogits + off
                                  : scratch + static_cast<std::size_t>(omp_get_thread_num()) * V;
    const double sum = exp_shifted_sum(e, x, V, maxv);
    losses[n] = static_cast<float>(std::log(sum) - shifted_target);
    if (dlogits == nullptr) continue;
    // dlogits = dloss * (p - onehot(target)), zero on the padded columns.
    scale_row(e, V, Vp, static_cast<float>(dloss / sum));
    e[target] -= dloss;
  }
}

namespace {
// The real (unpadded) columns of a shard: [0, count) of its local columns.
int real_columns(int Vl, int col_begin, int V) { return std::max(0, std::min(Vl, V - col_begin)); }
}  // namespace

void CpuOps::ce_row_max(float* rowmax, const float* logits, int N, int Vl, int col_begin, int V) {
  const int real = real_columns(Vl, col_begin, V);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n)
    rowmax[n] = real > 0 ? wide_row_max(logits + static_cast<std::size_t>(n) * Vl, real)
                         : -std::numeric_limits<float>::infinity();
}

void CpuOps::ce_partial_sums(float* stats, const float* logits, const float* rowmax,
                             const int32_t* targets, int N, int Vl, int col_begin, int V) {
  const int real = real_columns(Vl, col_begin, V);
  for (int n = 0; n < N; ++n)
    PPTRAIN_CHECK(targets[n] >= 0 && targets[n] < V, "cross_entropy: target outside [0, V)");
  const int width = std::max(real, 1);
  float* rows = thread_rows(width);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = logits + static_cast<std::size_t>(n) * Vl;
    float* e = rows + static_cast<std::size_t>(omp_get_thread_num()) * width;
    stats[2 * n] = real > 0 ? static_cast<float>(exp_shifted_sum(e, x, real, rowmax[n])) : 0.0f;
    const int local = targets[n] - col_begin;
    stats[2 * n + 1] = local >= 0 && local < real ? x[local] : 0.0f;
  }
}

void CpuOps::ce_finish(float* losses, float* dlogits, const float* logits, const float* rowmax,
                       const float* stats, const int32_t* targets, int N, int Vl, int col_begin,
                       int V, float dloss) {
  const int real = real_columns(Vl, col_begin, V);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const double sum = stats[2 * n];
    losses[n] = static_cast<float>(std::log(sum) + rowmax[n] - double(stats[2 * n + 1]));
    if (dlogits == nullptr) continue;
    const std::size_t off = static_cast<std::size_t>(n) * Vl;
    const float* x = logits + off;
    float* d = dlogits + off;
    exp_shifted_scaled(d, x, real, Vl, rowmax[n], static_cast<float>(dloss / sum));
    const int local = targets[n] - col_begin;
    if (local >= 0 && local < real) d[local] -= dloss;
  }
}

}  // namespace pptrain::ops
