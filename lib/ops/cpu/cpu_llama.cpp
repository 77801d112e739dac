// CPU backend: the Llama-family block ops. RMSNorm's row sums run in double in a fixed
// order and its weight gradient sums each column over the rows in order, so results do
// not depend on the thread count; SwiGLU and the rotary embedding are elementwise.
#include <cmath>

#include "ops/cpu/cpu_math.hpp"
#include "ops/cpu/cpu_ops.hpp"

namespace pptrain::ops {

namespace {

// sum_c a[c] * b[c] in double, in order.
double dot(const float* a, const float* b, int C) {
  double s = 0.0;
  for (int c = 0; c < C; ++c) s += double(a[c]) * b[c];
  return s;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// The angle of pair i of a head of `head_size` at `position`, as Hugging Face's
// LlamaRotaryEmbedding computes it in fp32.
float rope_angle(int position, int i, int head_size, float theta) {
  const float inv_freq = 1.0f / std::pow(theta, float(2 * i) / float(head_size));
  return float(position) * inv_freq;
}

}  // namespace

void CpuOps::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N,
                             int C, float eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + std::size_t(n) * C;
    float* o = out + std::size_t(n) * C;
    const float r = float(1.0 / std::sqrt(dot(x, x, C) / C + double(eps)));
    for (int c = 0; c < C; ++c) o[c] = x[c] * r * w[c];
    rstd[n] = r;
  }
}

// d(x_c r)/dx_k = r (delta_ck - x_c x_k r^2 / C): dx = r (g - x r^2 mean(g x)), g = dout w.
void CpuOps::rmsnorm_backward_input(float* dinp, const float* dresidual, const float* dout,
                                    const float* inp, const float* w, const float* rstd, int N,
                                    int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::size_t off = std::size_t(n) * C;
    const float *x = inp + off, *d = dout + off;
    double gx = 0.0;
    for (int c = 0; c < C; ++c) gx += double(d[c] * w[c]) * x[c];
    const float r = rstd[n];
    const float k = float(gx / C) * r * r;
    for (int c = 0; c < C; ++c) dinp[off + c] = dresidual[off + c] + r * (d[c] * w[c] - x[c] * k);
  }
}

void CpuOps::rmsnorm_backward_weight(float* dw, const float* dout, const float* inp,
                                     const float* rstd, int N, int C) {
  double* acc = double_scratch(std::size_t(C));
  cpu::in_column_ranges(C, [&](int c0, int c1) {
    for (int c = c0; c < c1; ++c) acc[c] = 0.0;
    for (int n = 0; n < N; ++n) {
      const std::size_t off = std::size_t(n) * C;
      for (int c = c0; c < c1; ++c) acc[c] += dout[off + c] * (inp[off + c] * rstd[n]);
    }
    for (int c = c0; c < c1; ++c) dw[c] += float(acc[c]);
  });
}

void CpuOps::swiglu_forward(float* out, const float* gate_up, int N, int F) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float *g = gate_up + std::size_t(n) * 2 * F, *u = g + F;
    float* o = out + std::size_t(n) * F;
    for (int f = 0; f < F; ++f) o[f] = g[f] * sigmoid(g[f]) * u[f];
  }
}

// silu'(g) = s (1 + g (1 - s)), s = sigmoid(g).
void CpuOps::swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int N,
                             int F) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::size_t row = std::size_t(n) * 2 * F;
    const float *g = gate_up + row, *u = g + F, *d = dout + std::size_t(n) * F;
    float *dg = dgate_up + row, *du = dg + F;
    for (int f = 0; f < F; ++f) {
      const float s = sigmoid(g[f]);
      du[f] = d[f] * g[f] * s;
      dg[f] = d[f] * u[f] * s * (1.0f + g[f] * (1.0f - s));
    }
  }
}

void CpuOps::rope(float* x, int N, int T, int stride, int heads, int head_size, float theta,
                  bool inverse, int first) {
  const int half = head_size / 2;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    float* row = x + std::size_t(n) * stride;
    for (int i = 0; i < half; ++i) {
      const float a = rope_angle(first + n % T, i, head_size, theta);
      const float c = std::cos(a), s = inverse ? -std::sin(a) : std::sin(a);
      for (int h = 0; h < heads; ++h) {
        float* v = row + std::size_t(h) * head_size;
        const float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c - x2 * s;
        v[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

}  // namespace pptrain::ops
