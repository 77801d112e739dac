// Roofline costs of a GPT layer's F, B and W passes, the head and the embedding, the
// collectives of each parallel dimension, and the simulated pipeline that combines them.
#include "plan/time_model.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "plan/kernel_traffic.hpp"

#include "model/param_layout.hpp"
#include "ops/ops.hpp"
#include "optim/adamw.hpp"
#include "pipeline/executor.hpp"
#include "pipeline/simulator.hpp"
#include "train/grad_buckets.hpp"
#include "train/memory_plan.hpp"
#include "train/session.hpp"

namespace pptrain {

double gemm_seconds(const DeviceSpec& d, double M, double N, double K, double e) {
  const double smallest = std::min({M, N, K});
  const double eff = d.gemm_efficiency * smallest / (smallest + d.gemm_half_dim);
  const double compute = 2 * M * N * K / (d.peak_tflops * 1e12 * eff);
  const double memory = (M * K + K * N + M * N) * e / (d.hbm_gbps * 1e9 * d.memory_efficiency);
  return std::max(compute, memory) + d.launch_us * 1e-6;
}

double all_reduce_seconds(const LinkSpec& link, double bytes, int n) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * bytes / (link.gbps * 1e9) + 2.0 * (n - 1) * link.latency_us * 1e-6;
}

double gather_seconds(const LinkSpec& link, double bytes, int n) {
  if (n <= 1) return 0;
  return double(n - 1) / n * bytes / (link.gbps * 1e9) + (n - 1) * link.latency_us * 1e-6;
}

namespace {

// The sizes of one micro-batch on one rank and what it runs on.
struct Shape {
  // T: the whole sequence; Tl: the positions a context-parallel rank holds (T / cp), and
  // N = B * Tl the tokens it holds; rows: N, or N/t under SP.
  double B, T, Tl, cp, C, heads, t, V, N, rows, e;
  double vocab;  // V is the padded vocabulary, vocab the real one
  double qkv, ffn;  // the q|k|v width (all heads) and the MLP's hidden width
  double kv_heads, hs;
  bool gated;       // SwiGLU: the MLP's first product is gate|up (2 ffn wide)
  bool sp, fused_attention;
  AttentionKernels attention;  // on a GPU, what the CUDA backend runs
  // tp collectives run beside the GEMMs (GPUs, parallel.overlap, tp > 1); B and W run
  // together, so the input gradients' tp sums travel beside W's GEMMs.
  bool tp_beside, weights_follow_input;
  const DeviceSpec* dev;
  LinkSpec tp_link, cp_link;
};

double memory_seconds(const Shape& s, double bytes, int kernels) {
  return bytes / (s.dev->hbm_gbps * 1e9 * s.dev->memory_efficiency) +
         kernels * s.dev->launch_us * 1e-6;
}

// Seconds of kernels that move `t`'s bytes and run its tensor-core instructions (at the
// efficiency a product whose smallest dimension is `dim` reaches), plus their launches.
double kernel_seconds(const Shape& s, const Traffic& t, double dim) {
  const DeviceSpec& d = *s.dev;
  const double eff = d.gemm_efficiency * dim / (dim + d.gemm_half_dim);
  const double compute = t.mma * kMmaFlops / (d.peak_tflops * 1e12 * eff);
  const double memory = t.bytes() / (d.hbm_gbps * 1e9 * d.memory_efficiency);
  return std::max(compute, memory) + t.launches * d.launch_us * 1e-6;
}

// What the CUDA kernels of one layer move and compute on this rank (kernel_traffic.hpp).
LayerShape gpu_layer_shape(const Shape& s) {
  LayerShape l;
  l.B = s.B, l.T = s.Tl, l.C = s.C, l.heads = s.heads, l.kv_heads = s.kv_heads, l.hs = s.hs;
  l.ffn = s.ffn, l.t = s.t, l.sp = s.sp, l.llama = s.gated, l.e = s.e, l.cp = s.cp;
  l.weight_follows_input = s.weights_follow_input;
  l.row_blocks = s.sp && s.tp_beside;
  l.attention = s.attention;
  return l;
}

// On a GPU, the attention kernels' own traffic and tensor-core work: the flash kernels' (the
// causal tile pairs; under cp the ring's piece pairs) or the unfused launches' (priced as
// one kernel: its batched products move more than they compute at these head sizes);
// else (CPU ranks; the ring's loop kernels) a roofline of batched GEMMs.
bool counted_attention(const Shape& s) {
  return !s.dev->cpu && (s.attention == AttentionKernels::Flash || s.cp == 1);
}

// The attention core on this rank's Tl queries against Tl keys: q k^T and (softmax) v
// per head, as batched GEMMs, and the softmax.
double attention_block(const Shape& s) {
  const double hd = s.C / (s.heads), per_rank_heads = s.heads / s.t;
  const double gemms = 2 * per_rank_heads * s.B *
                       (gemm_seconds(*s.dev, s.Tl, s.Tl, hd, s.e) - s.dev->launch_us * 1e-6);
  const double softmax = s.fused_attention ? 0 : 3 * s.B * per_rank_heads * s.Tl * s.Tl * s.e;
  return gemms + memory_seconds(s, softmax, 3);
}

// One k|v block of the context-parallel ring: a rank's rows of its key/value heads.
double ring_block_seconds(const Shape& s) {
  const double bytes = s.N * ((s.qkv - s.C) / s.t) * s.e;
  return bytes / (s.cp_link.gbps * 1e9) + s.cp_link.latency_us * 1e-6;
}

// The attention core's forward and backward, each step's work given (one step without
// context parallelism). The ring's forward: each step after the first waits for the larger
// of its attention and the next block's transfer (RingAttention::forward). Its backward:
// each step waits for the larger of its attention and what travels beside it on the same
// link (RingAttention::backward): the next block (not after the last step) and the held
// block's gradient (not at the first); the last gradient, to its owner, is exposed.
double attention_forward(const Shape& s, const std::vector<double>& steps) {
  double total = steps[0];
  for (std::size_t step = 1; step < steps.size(); ++step)
    total += std::max(steps[step], ring_block_seconds(s));
  return total;
}
double attention_backward(const Shape& s, const std::vector<double>& steps) {
  if (s.cp == 1) return steps[0];
  const double hop = ring_block_seconds(s);
  double total = hop;  // the own block's gradient, after the last step
  for (int step = 0; step < s.cp; ++step)
    total += std::max(steps[size_t(step)], ((step + 1 < s.cp) + (step > 0)) * hop);
  return total;
}

// Each step's attention work, forward and backward: the kernels' (counted_attention), or
// the roofline's block (twice for the backward).
std::pair<std::vector<double>, std::vector<double>> attention_steps(const Shape& s,
                                                                    const LayerTraffic& t) {
  const int steps = int(s.cp);
  std::vector<double> forward(static_cast<std::size_t>(steps)), backward(forward);
  if (!counted_attention(s)) {
    const double block = attention_block(s);
    std::fill(forward.begin(), forward.end(), block);
    std::fill(backward.begin(), backward.end(), 2 * block);
  } else if (steps == 1) {
    forward[0] = kernel_seconds(s, t.forward.attention, s.hs);
    backward[0] = kernel_seconds(s, t.backward_input.attention, s.hs);
  } else {
    const RingTraffic ring = ring_attention(s.B, s.heads / s.t, s.kv_heads / s.t, s.Tl, s.cp, 0,
                                            s.hs, s.e);
    for (int k = 0; k < steps; ++k) {
      forward[size_t(k)] = kernel_seconds(s, ring.forward_steps[size_t(k)], s.hs);
      backward[size_t(k)] = kernel_seconds(s, ring.backward_steps[size_t(k)], s.hs);
    }
  }
  return {forward, backward};
}

// The tensor-parallel collectives of one pass: `count` sums of [N, C] (all-reduces, or
// under SP reduce-scatters), `gathers` all-gathers (SP only).
double tp_comm(const Shape& s, int count, int gathers) {
  const int t = int(s.t);
  const double bytes = s.N * s.C * s.e;
  if (!s.sp) return count * all_reduce_seconds(s.tp_link, bytes, t);
  return (count + gathers) * gather_seconds(s.tp_link, bytes, t);
}

// One rank's block of [N, C] rows travelling on the tp link (a broadcast or a reduce).
double tp_block_seconds(const Shape& s) {
  return s.N / s.t * s.C * s.e / (s.tp_link.gbps * 1e9) + s.tp_link.latency_us * 1e-6;
}

// A product [M, N] = [M, K] x [K, N]: on a GPU priced from what its launches move (`moved`,
// kernel_traffic.hpp's, the epilogue's bytes included) at the efficiency of its smallest
// dimension; on CPU ranks the GEMM roofline of its operands.
double product_seconds(const Shape& s, double M, double N, double K, const Traffic& moved) {
  if (s.dev->cpu) return gemm_seconds(*s.dev, M, N, K, s.e);
  return kernel_seconds(s, moved, std::min({M, N, K}));
}

// A product [N, width] = [N, K] x [K, width] whose input rows are gathered over tp under SP
// (TensorParallelRegions::gather_rows): after one all-gather, or beside (GPUs) in t row
// blocks (`moved`: all of them), each block's product waiting for its block (this rank's
// own first, then in rank order, each broadcast in turn).
double gathered_gemm(const Shape& s, double width, double K, const Traffic& moved) {
  if (!s.sp) return product_seconds(s, s.N, width, K, moved);
  if (!s.tp_beside) return product_seconds(s, s.N, width, K, moved) + tp_comm(s, 0, 1);
  const int t = int(s.t);
  const double block = product_seconds(s, s.N / t, width, K, (1 / s.t) * moved);
  const double hop = tp_block_seconds(s);
  return t * block + std::max(0.0, t * hop - (t - 1) * block);
}

// A product [N, C] = [N, K] x [K, C] whose partial sums are summed over tp (reduce_rows):
// whole, then the sum; or under SP beside in t row blocks, each block's sum leaving after
// its product, so that the last one is exposed.
double summed_gemm(const Shape& s, double K, const Traffic& moved) {
  if (!s.sp || !s.tp_beside) return product_seconds(s, s.N, s.C, K, moved) + tp_comm(s, 1, 0);
  const int t = int(s.t);
  const double block = product_seconds(s, s.N / t, s.C, K, (1 / s.t) * moved);
  const double hop = tp_block_seconds(s);
  return t * block + std::max(hop, t * hop - (t - 1) * block);
}

// One layer's F, B (input gradients) and W (weight gradients) on this rank.
StageCosts layer_costs(const Shape& s, Recompute recompute) {
  const double N = s.N, C = s.C, Cl = s.C / s.t, e = s.e;
  const double Ql = s.qkv / s.t, Fl = s.ffn / s.t, Gl = (s.gated ? 2 : 1) * Fl;
  // The kernels besides the products and attention: on a GPU what the CUDA kernels move
  // (norms, activations, rope, bias gradients); on CPU ranks norms, residual adds and
  // biases on the held rows and the MLP's activation on N x Gl.
  double others[3];
  const LayerTraffic t = s.dev->cpu ? LayerTraffic{} : layer_traffic(gpu_layer_shape(s));
  const LayerProducts p = s.dev->cpu ? LayerProducts{} : layer_products(gpu_layer_shape(s));
  if (s.dev->cpu) {
    const double rowwise = 2 * (2 * s.rows * C * e) + 2 * (4 * s.rows * C * e);
    const double gelu = 2 * N * Gl * e;
    others[0] = memory_seconds(s, rowwise + gelu, 10);
    // The norms compute their weight gradients in B where W follows B.
    const double norm_weights = 2 * s.rows * C * e;
    const bool norms_in_b = s.weights_follow_input;
    others[1] = memory_seconds(s, 2 * (rowwise + gelu) + (norms_in_b ? norm_weights : 0), 12);
    others[2] = memory_seconds(s, 3 * N * C * e + (norms_in_b ? 0 : norm_weights), 8);
  } else {
    int k = 0;
    for (const PassTraffic* pass : {&t.forward, &t.backward_input, &t.backward_weight})
      others[k++] = kernel_seconds(s, pass->kernels, 1);
  }
  const auto [forward_steps, backward_steps] = attention_steps(s, t);
  const double attention = attention_forward(s, forward_steps);
  const double attention_back = attention_backward(s, backward_steps);
  StageCosts c{0, 0, 0, 0};
  c.forward = gathered_gemm(s, Ql, C, p.qkv) + summed_gemm(s, Cl, p.proj) +
              gathered_gemm(s, Gl, C, p.fc) + summed_gemm(s, Fl, p.fcproj) + attention + others[0];
  const double refwd = recompute == Recompute::Full       ? c.forward
                       : recompute == Recompute::Selective ? attention
                                                           : 0;
  // Each half's input-gradient work after the product that reads the gathered output
  // gradient: the MLP's first GEMM; the attention core's backward and q|k|v's GEMM.
  const double b_mlp = product_seconds(s, N, C, Gl, p.fc_input);
  const double b_attention = attention_back + product_seconds(s, N, C, Ql, p.qkv_input);
  c.backward_input = refwd + gathered_gemm(s, Fl, C, p.fcproj_input) + b_mlp +
                     gathered_gemm(s, Cl, C, p.proj_input) + b_attention + others[1] +
                     tp_comm(s, 2, 0);
  // wgrads (K = N) and the bias and norm reductions; SP gathers ln1 and ln2 again.
  const double w_attention =
      product_seconds(s, C, Ql, N, p.qkv_weight) + product_seconds(s, Cl, C, N, p.proj_weight);
  const double w_mlp =
      product_seconds(s, C, Gl, N, p.fc_weight) + product_seconds(s, Fl, C, N, p.fcproj_weight);
  const double gather = s.sp ? gather_seconds(s.tp_link, N * C * e, int(s.t)) : 0;
  c.backward_weight = w_attention + w_mlp + others[2] + 2 * gather;
  if (s.tp_beside && s.weights_follow_input) {
    // Each half's norm output is gathered again under the rest of its input gradient,
    // and its input-gradient sum hides under its weight-gradient GEMMs.
    c.backward_weight -= std::min(gather, b_mlp) + std::min(gather, b_attention);
    const double sum = tp_comm(s, 1, 0);
    c.backward_input -= std::min(sum, w_mlp) + std::min(sum, w_attention);
  } else if (s.tp_beside) {
    c.backward_weight -= std::min(gather, w_mlp);  // W apart: ln1's gather under the MLP's
  }
  return c;
}

// The last virtual stage's final norm, head and vocab-parallel cross-entropy. On a GPU
// the kernels are priced from what they move on the rank with the most real vocabulary
// columns, the first (kernel_traffic.hpp).
StageCosts head_costs(const Shape& s) {
  const DeviceSpec& d = *s.dev;
  const double Vl = s.V / s.t, N = s.N, C = s.C, e = s.e;
  const double stats = s.t > 1 ? 2 * all_reduce_seconds(s.tp_link, N * 8, int(s.t)) : 0;
  const double gather = s.sp ? gather_seconds(s.tp_link, N * C * e, int(s.t)) : 0;
  if (!d.cpu) {
    HeadShape h;
    h.B = s.B, h.T = s.Tl, h.C = C, h.V = s.vocab, h.Vp = s.V, h.t = s.t, h.sp = s.sp;
    h.llama = s.gated, h.e = e;
    const LayerTraffic t = head_traffic(h);
    const auto pass = [&](const PassTraffic& p) {  // one product and the kernels
      return kernel_seconds(s, p.products, std::min({N, Vl, C})) + kernel_seconds(s, p.kernels, 1);
    };
    return {pass(t.forward) + stats + gather, pass(t.backward_input) + tp_comm(s, 1, 0),
            pass(t.backward_weight), 0};
  }
  const double gemms[3] = {gemm_seconds(d, N, Vl, C, e), gemm_seconds(d, N, C, Vl, e),
                           gemm_seconds(d, Vl, C, N, e)};
  StageCosts c{0, 0, 0, 0};
  c.forward = memory_seconds(s, 2 * s.rows * C * e + 3 * N * Vl * e, 5) + gemms[0] + stats + gather;
  c.backward_input = gemms[1] + tp_comm(s, 1, 0) + memory_seconds(s, 3 * s.rows * C * e, 2);
  c.backward_weight = gemms[2] + memory_seconds(s, 2 * s.rows * C * e, 2);
  return c;
}

// The first virtual stage's embedding lookup (its sum over tp) and its weight gradient
// (SP gathers the input gradient's rows first). On a GPU the kernels are priced from what
// they move, for tokens drawn uniformly (kernel_traffic.hpp).
StageCosts embedding_costs(const Shape& s) {
  StageCosts c{0, 0, 0, 0};
  const double sum = tp_comm(s, s.t > 1 ? 1 : 0, 0);
  const double gather = s.sp ? gather_seconds(s.tp_link, s.N * s.C * s.e, int(s.t)) : 0;
  if (!s.dev->cpu) {
    EmbeddingShape m;
    m.B = s.B, m.T = s.Tl, m.C = s.C, m.rows = s.V / s.t, m.t = s.t, m.cp = s.cp, m.sp = s.sp;
    m.positions = !s.gated, m.e = s.e;
    const TokenCounts tokens = uniform_tokens(s.N, s.vocab, std::min(m.rows, s.vocab), s.C);
    const LayerTraffic t = embedding_traffic(m, tokens);
    c.forward = kernel_seconds(s, t.forward.kernels, 1) + sum;
    c.backward_weight = kernel_seconds(s, t.backward_weight.kernels, 1) + gather;
    return c;
  }
  c.forward = memory_seconds(s, 2 * s.N * s.C * s.e, 2) + sum;
  c.backward_weight = memory_seconds(s, 3 * s.N * s.C * 4, 2) + gather;
  return c;
}

StageCosts operator+(StageCosts a, const StageCosts& b) {
  a.forward += b.forward;
  a.backward_input += b.backward_input;
  a.backward_weight += b.backward_weight;
  return a;
}
StageCosts operator*(double k, StageCosts a) {
  a.forward *= k;
  a.backward_input *= k;
  a.backward_weight *= k;
  return a;
}

// The link a group of `ranks` consecutive-in-stride ranks spans: within a node when the
// group's extent (stride * ranks) fits in one.
const LinkSpec& link_for(const Cluster& c, int stride, int ranks) {
  return stride * ranks <= c.gpus_per_node ? c.intra_node : c.inter_node;
}

Shape shape_of(const Config& cfg, const Cluster& cluster) {
  const auto& p = cfg.parallel;
  const ModelConfig& m = cfg.model;
  const DeviceSpec& d = cluster.device;
  Shape s;
  s.B = p.micro_batch_size;
  s.T = m.seq_len;
  s.cp = p.cp;
  s.Tl = SequenceSplit{p.cp, 0, m.seq_len}.local_len();
  s.C = m.d_model;
  s.heads = m.n_head;
  s.qkv = m.d_model + 2.0 * kv_heads(m) * head_size(m);
  s.kv_heads = kv_heads(m);
  s.hs = head_size(m);
  s.ffn = ffn_width(m);
  s.gated = m.arch == Arch::Llama;
  s.t = p.tp;
  s.V = padded_vocab(m, 128 * p.tp);
  s.vocab = m.vocab_size;
  s.N = s.B * s.Tl;
  s.sp = p.sequence_parallel;
  s.rows = s.sp ? s.N / s.t : s.N;
  s.e = d.cpu ? 4 : 2;
  s.fused_attention = uses_fused_attention(cfg.train, !d.cpu, p.cp);
  // The flash kernels run on bf16 and the head sizes they take (cuda_ops_attention.cpp).
  const bool flash_on = backend_traits(cfg, true).logsumexp_attention;
  s.attention = !flash_on ? AttentionKernels::Unfused
                : ops::cuda_fused_attention_head_size(int(s.hs)) ? AttentionKernels::Flash
                                                                 : AttentionKernels::UnfusedRecomputed;
  // On CPU ranks the tp collectives complete before the work beside them starts (MPI
  // progresses only inside its calls): nothing hides.
  s.tp_beside = !d.cpu && activation_policy(cfg).overlap_tensor_parallel;
  s.weights_follow_input = weight_follows_input(p.schedule);
  s.dev = &d;
  // Rank order tp-cp-dp-pp: a tp group is tp consecutive ranks, a cp group strides tp.
  s.tp_link = link_for(cluster, 1, p.tp);
  s.cp_link = link_for(cluster, p.tp, p.cp);
  return s;
}

}  // namespace

std::vector<int> balance_layers(const Config& cfg, const Cluster& cluster) {
  const Shape s = shape_of(cfg, cluster);
  auto total = [](const StageCosts& c) { return c.forward + c.backward_input + c.backward_weight; };
  const double layer = total(layer_costs(s, cfg.train.recompute));
  const double first = total(embedding_costs(s)), last = total(head_costs(s));
  const int P = cfg.parallel.pp * cfg.parallel.virtual_stages, L = cfg.model.n_layer;
  PPTRAIN_CHECK(P >= 1 && P <= L, "every virtual stage needs a layer");
  auto cost = [&](int k, int n) { return n * layer + (k == 0 ? first : 0) + (k == P - 1 ? last : 0); };
  // best[k][j]: the least possible slowest cost of virtual stages 0..k holding j layers.
  const double inf = 1e300;
  std::vector<std::vector<double>> best(size_t(P), std::vector<double>(size_t(L) + 1, inf));
  std::vector<std::vector<int>> take(size_t(P), std::vector<int>(size_t(L) + 1, 0));
  for (int j = 1; j <= L; ++j) best[0][size_t(j)] = cost(0, j), take[0][size_t(j)] = j;
  for (int k = 1; k < P; ++k)
    for (int j = k + 1; j <= L; ++j)
      for (int n = 1; n <= j - k; ++n) {
        const double c = std::max(best[size_t(k - 1)][size_t(j - n)], cost(k, n));
        if (c < best[size_t(k)][size_t(j)]) best[size_t(k)][size_t(j)] = c, take[size_t(k)][size_t(j)] = n;
      }
  std::vector<int> counts(static_cast<std::size_t>(P), 0);
  for (int k = P - 1, j = L; k >= 0; j -= counts[size_t(k)], --k) counts[size_t(k)] = take[size_t(k)][size_t(j)];
  return counts;
}

void resolve_layer_split(Config& cfg) {
  if (!cfg.parallel.layers_per_stage.automatic) return;
  Cluster here;
  const std::string preset = runs_on_cuda(cfg) ? "h100-sxm" : "cpu";
  here.device = device_preset(preset);
  here.intra_node = here.inter_node = preset_intra_node(preset);
  here.gpus_per_node = world_size(cfg);
  cfg.parallel.layers_per_stage.counts = balance_layers(cfg, here);
}

namespace {

// Each virtual stage's F, B and W seconds for one micro-batch: its layers, plus the
// embedding on the first and the head on the last.
std::vector<StageCosts> virtual_stage_costs(const Config& cfg, const Shape& s) {
  const auto& p = cfg.parallel;
  const int parts = p.pp * p.virtual_stages;
  const auto ranges = split_layers(cfg.model.n_layer, parts, p.layers_per_stage);
  const StageCosts layer = layer_costs(s, cfg.train.recompute);
  std::vector<StageCosts> costs;
  for (int k = 0; k < parts; ++k) {
    StageCosts c = double(ranges[size_t(k)].second - ranges[size_t(k)].first) * layer;
    if (k == 0) c = c + embedding_costs(s);
    if (k == parts - 1) c = c + head_costs(s);
    costs.push_back(c);
  }
  return costs;
}

// What follows the schedule: the exposed data-parallel and tied-embedding reductions,
// and the optimizer step, into r. `costs`: each virtual stage's per-micro-batch costs.
void after_schedule(const Config& cfg, const Cluster& cluster, const Shape& s,
                    const std::vector<StageCosts>& costs, StepPrediction& r) {
  const auto& p = cfg.parallel;
  const DeviceSpec& d = cluster.device;
  // The gradients reduce over the replicas, dp * cp ranks striding tp.
  const int replicas = pptrain::replicas(p);
  const LinkSpec& dp_link = link_for(cluster, p.tp, replicas);
  const LinkSpec& pp_link = link_for(cluster, p.tp * replicas, p.pp);
  const Placement placement = placement_of(cfg);
  const double bucket = 4 * double(bucket_floats(p));
  // A gradient reduction (reduce-scatter under ZeRO-1) of `bytes`.
  const auto reduce = [&](double bytes) {
    return zero_shards(p) ? gather_seconds(dp_link, bytes, replicas)
                          : all_reduce_seconds(dp_link, bytes, replicas);
  };
  // Per stage: its gradients' reduction, less what the last micro-batch's backward hides
  // (GradSync starts each bucket once its layer is done), but never less than what starts
  // only at the end: the lowest bucket, and a first stage's embedding bucket. ZeRO-1's
  // parameter all-gather runs beside the update, bucket by bucket.
  double params = 0;
  r.dp_exposed_s = 0;
  for (int stage = 0; stage < p.pp; ++stage) {
    const ModelPartition part = rank_partition(cfg, stage, 0);
    const double floats = double(param_layout(cfg.model, part).total_floats());
    params = std::max(params, floats);
    if (replicas == 1) continue;
    double hidden = 0, tail = bucket;
    for (int c = 0; c < placement.chunks(); ++c) {
      const StageCosts& k = costs[size_t(placement.virtual_stage(stage, c))];
      hidden += k.backward_input + k.backward_weight;
      if (part.chunks[size_t(c)].first)  // the embeddings (GPT-2's positions too)
        tail += 4 * (s.V / s.t * s.C + (s.gated ? 0 : s.T * s.C));
    }
    const double all = reduce(4 * floats), last = reduce(std::min(tail, 4 * floats));
    r.dp_exposed_s = std::max(r.dp_exposed_s, p.overlap ? std::max(all - hidden, last) : all);
  }
  if (p.pp > 1 && placement.head_stage() != 0 && cfg.model.tie_embeddings) {  // its two copies
    const double wte = s.V / s.t * s.C * 4;
    r.dp_exposed_s += all_reduce_seconds(pp_link, wte, 2);
  }
  // Grad norm (read g) and AdamW (read p, g, m, v; write p, m, v and the bf16 copy).
  const double shard = zero_shards(p) ? params / replicas : params;
  r.optimizer_s = shard * (4 + 30) / (d.hbm_gbps * 1e9 * d.memory_efficiency) +
                  2 * all_reduce_seconds(cluster.inter_node, 8, cluster.world() > 1 ? 2 : 1);
  if (zero_shards(p)) {  // the weight copy's bytes (s.e): bf16 on a GPU
    const double gather = gather_seconds(dp_link, s.e * params, replicas);
    r.dp_exposed_s +=
        p.overlap ? std::max(gather - r.optimizer_s,
                             gather_seconds(dp_link, std::min(bucket / 4 * s.e, s.e * params), replicas))
                  : gather;
  }
}

}  // namespace

StepPrediction predict_step(const Config& cfg, const Cluster& cluster) {
  const auto& p = cfg.parallel;
  return predict_step(cfg, cluster,
                      build_all_steps(p.schedule, p.pp, p.micro_batches, p.virtual_stages,
                                      message_mode(cfg, !cluster.device.cpu), planned_costs(cfg)));
}

StepPrediction predict_step(const Config& cfg, const Cluster& cluster,
                            const std::vector<std::vector<Step>>& steps) {
  const auto& p = cfg.parallel;
  PPTRAIN_CHECK(world_size(cfg) == cluster.world(), "the layout must fill the cluster");
  const Shape s = shape_of(cfg, cluster);
  const LinkSpec& pp_link = link_for(cluster, p.tp * replicas(p), p.pp);
  const Placement placement = placement_of(cfg);
  const std::vector<StageCosts> costs = virtual_stage_costs(cfg, s);
  // Each tp rank sends 1/t of a boundary array (its rows under SP; else its share,
  // all-gathered over tp after the receive: GptModel::message_part).
  const double message = s.N * s.C * s.e / s.t;
  const double gather = s.t > 1 && !s.sp ? gather_seconds(s.tp_link, s.N * s.C * s.e, int(s.t)) : 0;
  const double p2p = message / (pp_link.gbps * 1e9) + pp_link.latency_us * 1e-6 + gather;
  const MessageMode mode = message_mode(cfg, !cluster.device.cpu);
  const SimulationResult sim = simulate_steps_timed(steps, placement, p.micro_batches, mode, costs, p2p);

  StepPrediction r;
  r.pipeline_s = sim.makespan;
  r.bubble = sim.bubble;
  for (int c = 0; c < p.virtual_stages; ++c) {
    const StageCosts& k = costs[size_t(placement.virtual_stage(0, c))];
    r.first_stage = r.first_stage + k;
  }
  after_schedule(cfg, cluster, s, costs, r);
  r.step_time_s = r.pipeline_s + r.dp_exposed_s + r.optimizer_s;
  return r;
}

double step_time_lower_bound(const Config& cfg, const Cluster& cluster) {
  const auto& p = cfg.parallel;
  PPTRAIN_CHECK(world_size(cfg) == cluster.world(), "the layout must fill the cluster");
  const Shape s = shape_of(cfg, cluster);
  const Placement placement = placement_of(cfg);
  const std::vector<StageCosts> costs = virtual_stage_costs(cfg, s);
  double busiest = 0;  // a stage runs its F, B and W one after another
  for (int stage = 0; stage < p.pp; ++stage) {
    double busy = 0;
    for (int c = 0; c < p.virtual_stages; ++c) {
      const StageCosts& k = costs[size_t(placement.virtual_stage(stage, c))];
      busy += p.micro_batches * (k.forward + k.backward_input + k.backward_weight);
    }
    busiest = std::max(busiest, busy);
  }
  StepPrediction r;
  after_schedule(cfg, cluster, s, costs, r);
  return busiest + r.dp_exposed_s + r.optimizer_s;
}

}  // namespace pptrain
