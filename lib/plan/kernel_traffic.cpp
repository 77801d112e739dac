// The CUDA kernels' traffic (see kernel_traffic.hpp), read off their code: a warp-per-row
// kernel whose lanes all read a row's statistic reads it 32 times; a column sum's thread
// reads each row's statistics once per column.
#include "plan/kernel_traffic.hpp"

#include <algorithm>
#include <cmath>

namespace pptrain {

namespace {
constexpr double kTile = 64;        // flash attention's query and key tiles
constexpr double kSumRows = 64;     // rows per chunk of a column sum (ops.hpp)
constexpr double kWarp = 32;
constexpr double kEmbeddingTile = 256;  // the table gradient's tiles of positions (ops.hpp)
double chunks(double rows) { return std::ceil(rows / kSumRows); }

Traffic kernel(double read, double written) {
  Traffic t;
  t.launches = 1, t.read = read, t.written = written;
  return t;
}

// The second pass of `sums` column sums of width C over R rows: the chunks and the
// gradients read, the gradients written.
Traffic finish_column_sums(double sums, double R, double C) {
  const double grads = sums * C * 4;
  return kernel(sums * chunks(R) * C * 4 + grads, grads);
}

// Query rows [0, Lq) against key rows [0, Lk) of one head, query i at d positions after
// key i (d = the pieces' first positions' difference): it sees keys j <= i + d. Per query
// tile: the key tiles its queries see and their rows; per key tile: the query rows from
// the first tile that sees it; the queries that see any key.
struct Geometry {
  double tile_pairs = 0, key_rows = 0;        // the query tiles' side
  double key_pairs = 0, query_rows = 0;       // the key tiles' side
  double live = 0;
};
Geometry geometry(double Lq, double Lk, double d) {
  Geometry g;
  for (double q0 = 0; q0 < Lq; q0 += kTile) {
    const double keys = std::max(0.0, std::min(Lk, q0 + kTile + d));
    const double tiles = std::ceil(keys / kTile);
    g.tile_pairs += tiles;
    g.key_rows += std::min(kTile * tiles, Lk);
  }
  for (double k0 = 0; k0 < Lk; k0 += kTile) {
    const double query = k0 - d, first = query <= 0 ? 0 : std::floor(query / kTile) * kTile;
    if (first >= Lq) continue;
    g.key_pairs += std::ceil((Lq - first) / kTile);
    g.query_rows += Lq - first;
  }
  g.live = Lk > 0 ? std::max(0.0, Lq - std::max(0.0, -d)) : 0;
  return g;
}

// The forward kernel over B*H heads: Q once, K and V for each key tile a query tile meets;
// the live rows' output and log-sum-exp written, or merged (the output and every lane of
// a row's four reading the log-sum-exp first). Two 64 x 64 x hs products a pair.
Traffic flash_forward_launch(double heads, double Lq, double Lk, double d, double hs, double e,
                             bool write) {
  const Geometry g = geometry(Lq, Lk, d);
  Traffic t = kernel(heads * ((Lq + 2 * g.key_rows) * hs * e + (write ? 0 : g.live * (hs * e + 16))),
                     heads * g.live * (hs * e + 4));
  t.mma = heads * g.tile_pairs * 4 * hs;
  return t;
}

// The backward's three kernels: the row dots (dO . O); dQ (Q, dO, the row statistics once,
// K and V per pair; 3 products a pair); dK/dV, one block per key/value head's tile (K and V
// once, Q, dO and the row statistics per pair; 4 products a pair). Gradients written, or
// added (read first).
Traffic flash_backward_launch(double B, double H, double KV, double Lq, double Lk, double d,
                              double hs, double e, bool add) {
  const Geometry g = geometry(Lq, Lk, d);
  const double heads = B * H, kv = B * KV, sum = add ? 2 : 1;
  Traffic dots = kernel(heads * 2 * Lq * hs * e, heads * 4 * Lq);
  Traffic dq = kernel(heads * ((2 * Lq + 2 * g.key_rows + (sum - 1) * Lq) * hs * e + 8 * Lq),
                      heads * Lq * hs * e);
  dq.mma = heads * g.tile_pairs * 6 * hs;
  Traffic dkv = kernel(kv * sum * 2 * Lk * hs * e + heads * g.query_rows * (2 * hs * e + 8),
                       kv * 2 * Lk * hs * e);
  dkv.mma = heads * g.key_pairs * 8 * hs;
  return dots + dq + dkv;
}

// copy_columns of rows x cols elements.
Traffic copy(double n, double e) { return kernel(n * e, n * e); }

// out[R,C] += bias[C] (in place; each thread reads its bias once for the rows of its
// block, at most 4096 blocks down the rows) and out = a + b over n elements: the unfused
// epilogue of a row-parallel product under tensor parallelism.
Traffic add_bias(double R, double C, double e) {
  return kernel((R + std::min(R, 4096.0)) * C * e, R * C * e);
}
Traffic add(double n, double e) { return kernel(2 * n * e, n * e); }
}  // namespace

Traffic& Traffic::operator+=(const Traffic& o) {
  launches += o.launches, read += o.read, written += o.written, mma += o.mma;
  return *this;
}
Traffic operator+(Traffic a, const Traffic& b) { return a += b; }
Traffic operator-(Traffic a, const Traffic& b) {
  a.launches -= b.launches, a.read -= b.read, a.written -= b.written, a.mma -= b.mma;
  return a;
}
Traffic operator*(double k, Traffic a) {
  a.launches *= k, a.read *= k, a.written *= k, a.mma *= k;
  return a;
}

// Forward: the row three times (mean, variance, output), w and b once a row; the output
// and (lane 0) the mean and rstd written.
Traffic layernorm_forward(double R, double C, double e) {
  return kernel(5 * R * C * e, R * C * e + 8 * R);
}
// Input gradient: x, dout, w twice (the two sums, then the output), the residual's
// gradient once, the mean and rstd by every lane.
Traffic layernorm_backward_input(double R, double C, double e) {
  return kernel(7 * R * C * e + kWarp * 8 * R, R * C * e);
}
// Weight gradient: dout and x once, the row's mean and rstd per element; two partial sums
// a chunk; then both finished in one launch.
Traffic layernorm_backward_weight(double R, double C, double e) {
  return kernel(2 * R * C * e + 8 * R * C, 2 * chunks(R) * C * 4) + finish_column_sums(2, R, C);
}
// Both in one pass (B and W together): the input gradient's loads and stores, the two
// partial sums a chunk written from shared memory, then both finished in one launch.
Traffic layernorm_backward(double R, double C, double e) {
  return kernel(7 * R * C * e + kWarp * 8 * R, R * C * e + 2 * chunks(R) * C * 4) +
         finish_column_sums(2, R, C);
}
Traffic rmsnorm_forward(double R, double C, double e) { return kernel(3 * R * C * e, R * C * e + 4 * R); }
Traffic rmsnorm_backward_input(double R, double C, double e) {
  return kernel(7 * R * C * e + kWarp * 4 * R, R * C * e);
}
Traffic rmsnorm_backward_weight(double R, double C, double e) {
  return kernel(2 * R * C * e + 4 * R * C, chunks(R) * C * 4) + finish_column_sums(1, R, C);
}
Traffic rmsnorm_backward(double R, double C, double e) {
  return kernel(7 * R * C * e + kWarp * 4 * R, R * C * e + chunks(R) * C * 4) +
         finish_column_sums(1, R, C);
}
Traffic swiglu_forward(double N, double F, double e) { return kernel(2 * N * F * e, N * F * e); }
Traffic swiglu_backward(double N, double F, double e) { return kernel(3 * N * F * e, 2 * N * F * e); }
Traffic rope(double N, double heads, double hs, double e) {
  const double bytes = N * heads * hs * e;
  return kernel(bytes, bytes);
}
Traffic add_column_sums(double C) { return finish_column_sums(1, 1, C); }

Traffic flash_attention_forward(double B, double H, double T, double hs, double e) {
  return flash_forward_launch(B * H, T, T, 0, hs, e, true);
}

Traffic flash_attention_backward(double B, double H, double KV, double T, double hs, double e) {
  return flash_backward_launch(B, H, KV, T, T, 0, hs, e, false);
}

namespace {
// A product batched over `batch` dense matrices: one launch.
Traffic batched_product(double batch, double M, double N, double K, double e) {
  Traffic t = batch * product(M, N, K, e, e);
  t.launches = 1;
  return t;
}

// The entries a causal softmax's pass over [T, T] loads (row i's i + 1 live entries in
// packs of W, a partial last pack loaded whole): W-pack rows only where T is a multiple.
double causal_loaded(double T, double e) {
  const double W = std::fmod(T, 16 / e) == 0 ? 16 / e : 1;
  const double packs = std::floor(T / W), rest = T - packs * W;
  return W * W * packs * (packs + 1) / 2 + rest * (packs + 1) * W;
}

// q|k|v rows of N positions to head-major q, k and v (H heads each), and back (the
// key/value gradients summed over each group); a head-major [N, H * hs] to rows or back.
Traffic split_heads(double N, double H, double KV, double hs, double e) {
  return kernel(N * (H + 2 * KV) * hs * e, 3 * N * H * hs * e);
}
Traffic merge_qkv_grad(double N, double H, double KV, double hs, double e) {
  return kernel(3 * N * H * hs * e, N * (H + 2 * KV) * hs * e);
}
}  // namespace

Traffic unfused_attention_forward(double B, double H, double KV, double T, double hs, double e) {
  const double heads = B * H, N = B * T;
  return split_heads(N, H, KV, hs, e) + batched_product(heads, T, T, hs, e) +
         kernel(3 * heads * causal_loaded(T, e) * e, heads * T * T * e) +
         batched_product(heads, T, hs, T, e) + copy(N * H * hs, e);
}

Traffic unfused_attention_backward(double B, double H, double KV, double T, double hs, double e,
                                   bool recomputed) {
  const double heads = B * H, N = B * T, loaded = heads * causal_loaded(T, e) * e;
  Traffic t = split_heads(N, H, KV, hs, e) + copy(N * H * hs, e) +
              3 * batched_product(heads, T, hs, T, e) + batched_product(heads, T, T, hs, e) +
              kernel(4 * loaded, heads * T * T * e) + merge_qkv_grad(N, H, KV, hs, e);
  if (recomputed) t += batched_product(heads, T, T, hs, e) + kernel(3 * loaded, heads * T * T * e);
  return t;
}

RingTraffic ring_attention(double B, double H, double KV, double T, double cp, int rank,
                           double hs, double e) {
  const double len = T / 2, rows = B * T, block = rows * 2 * KV * hs;  // k|v of the held rows
  const int n = int(cp), r = rank;
  const int queries[2] = {r, 2 * n - 1 - r};  // this rank's pieces of the sequence
  RingTraffic t;
  t.forward_kernels = copy(block, e);  // its own k|v block
  t.backward_kernels = copy(block, e) + copy(block, e);  // again; and its returned gradient
  for (int step = 0; step < n; ++step) {
    const int owner = (r - step + n) % n, keys[2] = {owner, 2 * n - 1 - owner};
    Traffic forward, backward;
    for (int p = 0; p < 2; ++p) {
      // The order RingAttention::forward takes: at step 0 the diagonal first, written.
      const int order[2] = {step == 0 ? p : 0, step == 0 ? 1 - p : 1};
      for (int k : order) {
        if (keys[k] > queries[p]) continue;  // no query sees a key: skipped
        const double d = (queries[p] - keys[k]) * len;
        forward += flash_forward_launch(B * H, len, len, d, hs, e, step == 0 && k == p);
        backward += flash_backward_launch(B, H, KV, len, len, d, hs, e, true);
      }
    }
    t.forward_steps.push_back(forward);
    t.backward_steps.push_back(backward);
    if (step > 0) t.backward_kernels += add(block, e);  // the arriving gradient
  }
  return t;
}

Traffic product(double M, double N, double K, double a, double d, ProductEpilogue epi) {
  Traffic t = kernel((M * K + K * N) * a, M * N * d);
  if (epi.reads_c) t.read += M * N * d;
  if (epi.bias) t.read += N * d;
  if (epi.aux_read) t.read += M * N * d;
  if (epi.aux_written) t.written += M * N * d;
  if (epi.bias_grad) t.written += N * 4;
  t.mma = 2 * M * N * K / kMmaFlops;
  return t;
}

LayerProducts layer_products(const LayerShape& s) {
  const double N = s.B * s.T, R = s.sp ? N / s.t : N, e = s.e, C = s.C;
  const double Cl = s.heads / s.t * s.hs;
  const double Ql = (s.heads + 2 * s.kv_heads) * s.hs / s.t, Fl = s.ffn / s.t;
  const double Gl = s.llama ? 2 * Fl : Fl;  // the MLP's first product's width
  const bool bias = !s.llama;
  // A product of N rows whose input is gathered or whose output is summed over tp.
  const double blocks = s.row_blocks ? s.t : 1;
  const auto over_tp = [&](double Nout, double K, ProductEpilogue epi = {}) {
    return blocks * product(N / blocks, Nout, K, e, e, epi);
  };
  const auto row_parallel = [&](double K) {
    return s.t == 1 ? product(R, C, K, e, e, {.reads_c = true, .bias = bias}) : over_tp(C, K);
  };
  const auto weight_grad = [&](double Cin, double Cout) {
    return product(Cin, Cout, N, e, 4, {.reads_c = true, .bias_grad = bias});
  };
  LayerProducts p;
  p.qkv = over_tp(Ql, C, {.bias = bias});
  p.proj = row_parallel(Cl);
  p.fc = over_tp(Gl, C, {.bias = bias, .aux_written = bias});
  p.fcproj = row_parallel(Fl);
  // The first product of each half reads the gathered output gradient.
  p.fcproj_input = over_tp(Fl, C, {.aux_read = bias});
  p.fc_input = product(N, C, Gl, e, e);
  p.proj_input = over_tp(Cl, C);
  p.qkv_input = product(N, C, Ql, e, e);
  p.fcproj_weight = weight_grad(Fl, C);
  p.fc_weight = weight_grad(C, Gl);
  p.proj_weight = weight_grad(Cl, C);
  p.qkv_weight = weight_grad(C, Ql);
  return p;
}

LayerTraffic layer_traffic(const LayerShape& s) {
  const double N = s.B * s.T, R = s.sp ? N / s.t : N, e = s.e, C = s.C;
  const double H = s.heads / s.t, KV = s.kv_heads / s.t, Fl = s.ffn / s.t;
  const double Ql = (s.heads + 2 * s.kv_heads) * s.hs / s.t, Gl = s.llama ? 2 * Fl : Fl;
  const bool bias = !s.llama;
  LayerTraffic L;
  PassTraffic &f = L.forward, &b = L.backward_input, &w = L.backward_weight;
  const LayerProducts p = layer_products(s);
  f.products = p.qkv + p.proj + p.fc + p.fcproj;
  b.products = p.fcproj_input + p.fc_input + p.proj_input + p.qkv_input;
  w.products = p.fcproj_weight + p.fc_weight + p.proj_weight + p.qkv_weight;
  if (s.t > 1)  // proj's and fcproj's bias and residual, added after the sum over tp
    f.kernels += 2 * ((bias ? add_bias(R, C, e) : Traffic{}) + add(R * C, e));
  if (bias)  // the bias gradients the weight products wrote apart
    w.kernels += 2 * add_column_sums(C) + add_column_sums(Gl) + add_column_sums(Ql);
  if (s.cp > 1) {
    const RingTraffic ring = ring_attention(s.B, H, KV, s.T, s.cp, s.rank, s.hs, e);
    if (s.attention == AttentionKernels::Flash) {
      for (const Traffic& step : ring.forward_steps) f.attention += step;
      for (const Traffic& step : ring.backward_steps) b.attention += step;
    }
    f.kernels += ring.forward_kernels;
    b.kernels += ring.backward_kernels;
  } else if (s.attention == AttentionKernels::Flash) {
    f.attention = flash_attention_forward(s.B, H, s.T, s.hs, e);
    b.attention = flash_attention_backward(s.B, H, KV, s.T, s.hs, e);
  } else {
    f.attention = unfused_attention_forward(s.B, H, KV, s.T, s.hs, e);
    b.attention = unfused_attention_backward(s.B, H, KV, s.T, s.hs, e,
                                             s.attention == AttentionKernels::UnfusedRecomputed);
  }
  if (s.llama) {
    f.kernels += 2 * rmsnorm_forward(R, C, e) + rope(N, H + KV, s.hs, e) + swiglu_forward(N, Fl, e);
    b.kernels += swiglu_backward(N, Fl, e) + rope(N, H + KV, s.hs, e);
    if (s.weight_follows_input) {  // the norms' weight gradients in B, in one pass
      b.kernels += 2 * rmsnorm_backward(R, C, e);
    } else {
      b.kernels += 2 * rmsnorm_backward_input(R, C, e);
      w.kernels += 2 * rmsnorm_backward_weight(R, C, e);
    }
  } else {
    f.kernels += 2 * layernorm_forward(R, C, e);
    if (s.weight_follows_input) {
      b.kernels += 2 * layernorm_backward(R, C, e);
    } else {
      b.kernels += 2 * layernorm_backward_input(R, C, e);
      w.kernels += 2 * layernorm_backward_weight(R, C, e);
    }
  }
  return L;
}

LayerTraffic head_traffic(const HeadShape& s, int rank) {
  const double N = s.B * s.T, R = s.sp ? N / s.t : N, C = s.C, e = s.e;
  const double Vl = s.Vp / s.t;
  const double real = std::clamp(s.V - rank * Vl, 0.0, Vl);  // this shard's real columns
  constexpr double kRowThreads = 512;
  const double pack = 16 / e;  // the row's loads: 16-byte packs (Vl is a multiple)
  const double row = std::ceil(real / pack) * pack * e;
  Traffic cross_entropy;
  if (s.t == 1) {
    cross_entropy = kernel(N * (2 * row + kRowThreads * (4 + e)), N * (4 + Vl * e));
  } else {
    const double target = N * e * real / s.V;  // the targets' logits this rank holds
    cross_entropy = kernel(N * row, N * 12) +                                       // statistics
                    kernel(N * 16 + target, N * 8) +                                // sums
                    kernel(N * (row + kRowThreads * 12 + 4), N * (4 + Vl * e));     // finish
  }
  const Traffic add_mean = kernel(N * 4 + 8, 8);
  LayerTraffic h;
  h.forward.kernels =
      (s.llama ? rmsnorm_forward(R, C, e) : layernorm_forward(R, C, e)) + cross_entropy + add_mean;
  h.forward.products = product(N, Vl, C, e, e);
  h.backward_input.kernels =
      s.llama ? rmsnorm_backward_input(R, C, e) : layernorm_backward_input(R, C, e);
  h.backward_input.products = product(N, C, Vl, e, e);
  h.backward_weight.kernels =
      s.llama ? rmsnorm_backward_weight(R, C, e) : layernorm_backward_weight(R, C, e);
  h.backward_weight.products = product(Vl, C, N, e, 4, {.reads_c = true});
  return h;
}

namespace {
// The table gradient's blocks: threads for C / 4 column packs (a multiple of 32, at most
// 256), each block a slice of threads * 4 columns by a shard of rows in 32 KiB of shared
// memory (at most 64 rows).
double table_grad_columns(double C) {
  const double packs = std::ceil(C / 4);
  return 4 * (packs >= 256 ? 256 : std::ceil(packs / 32) * 32);
}
}  // namespace

double embedding_shard_rows(double C) {
  return std::max(1.0, std::min(64.0, std::floor(8192 / table_grad_columns(C))));
}

TokenCounts uniform_tokens(double N, double V, double rows, double C) {
  const double shard = std::min(embedding_shard_rows(C), rows), shards = std::ceil(rows / shard);
  const auto some = [&](double n) { return 1 - std::pow(1 - shard / V, n); };  // a shard's token
  TokenCounts k;
  k.positions = N * rows / V;
  k.distinct = rows * (1 - std::pow(1 - 1 / V, N));
  k.shards = shards * some(N);
  k.shard_rows = k.shards * shard;
  const double whole = std::floor(N / kEmbeddingTile), rest = N - whole * kEmbeddingTile;
  k.tile_positions = shards * (whole * kEmbeddingTile * some(kEmbeddingTile) + rest * some(rest));
  return k;
}

Traffic embedding_table_grad(const EmbeddingShape& s, const TokenCounts& k) {
  const double N = s.B * s.T, cols = table_grad_columns(s.C);
  const double slices = std::ceil(s.C / cols);
  const double words = std::ceil(std::ceil(N / kEmbeddingTile) / 32);
  const Traffic mark = kernel(N * 4 + k.positions * 4, k.positions * 4);
  const double bits = slices * (s.rows + k.shard_rows) * words * 4;
  return mark + kernel(bits + slices * k.tile_positions * 4 + k.distinct * s.C * 4 +
                           k.positions * s.C * s.e,
                       k.distinct * s.C * 4);
}

LayerTraffic embedding_traffic(const EmbeddingShape& s, const TokenCounts& k) {
  const double N = s.B * s.T, C = s.C, e = s.e;
  const bool vocab_parallel = s.t > 1 || s.cp > 1;
  const double pieces = s.cp == 1 ? 1 : 2;
  const double pack = 16 / e;
  LayerTraffic m;
  const bool positions_in_lookup = s.positions && !vocab_parallel;
  m.forward.kernels = kernel(N * (C / pack) * 4 + k.positions * C * e +
                                 (positions_in_lookup ? N * C * e : 0),
                             N * C * e);
  if (s.positions && vocab_parallel) {
    const double held = (s.sp ? N / s.t : N) / pieces;
    m.forward.kernels += pieces * add_bias(1, held * C, e);  // whole sequences: one row
  }
  m.backward_weight.kernels = embedding_table_grad(s, k);
  if (!s.positions) return m;
  if (s.cp == 1) {
    const double TC = s.T * C;
    m.backward_weight.kernels += kernel(TC * 4 + s.B * TC * e, TC * 4);
  } else {  // each piece's rows of every sequence: column sums of B rows of len * C
    const double width = s.T / pieces * C;
    m.backward_weight.kernels +=
        pieces * (kernel(s.B * width * e, chunks(s.B) * width * 4) + finish_column_sums(1, s.B, width));
  }
  return m;
}

}  // namespace pptrain
