// Value rules for a decoded Config: ranges, allowed names and cross-key constraints.
// Each failure names the key and the place its value came from (file line or --set).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>

#include "config/config_detail.hpp"
#include "core/error.hpp"

namespace pptrain::config_detail {
namespace {

// The shortest text that reads back as v (3e-4, not 0.00029999999999999997).
std::string num(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// Small helpers that throw with the key's origin when a rule is broken.
class Rules {
 public:
  explicit Rules(const Origins& origins) : origins_(origins) {}

  void at_least(const char* key, long long value, long long min) const {
    if (value < min)
      fail(key, "must be >= " + std::to_string(min) + " (got " + std::to_string(value) + ")");
  }
  void in_range(const char* key, long long value, long long min, long long max) const {
    at_least(key, value, min);
    if (value > max)
      fail(key, "must be <= " + std::to_string(max) + " (got " + std::to_string(value) + ")");
  }
  void positive(const char* key, double value) const {
    if (!(value > 0)) fail(key, "must be > 0 (got " + num(value) + ")");
  }
  void non_negative(const char* key, double value) const {
    if (!(value >= 0)) fail(key, "must be >= 0 (got " + num(value) + ")");
  }
  void unit_interval(const char* key, double value) const {  // [0, 1)
    if (!(value >= 0 && value < 1)) fail(key, "must be in [0, 1) (got " + num(value) + ")");
  }
  [[noreturn]] void fail(const char* key, const std::string& reason) const {
    fail_key(origins_, key, reason);
  }

 private:
  const Origins& origins_;
};

// Upper bounds far beyond any real model or cluster. They keep every size product in
// range of 64-bit integers and stop typos (dp=1000000) before anything is allocated
// or launched.
constexpr long long kMaxLayers = 4096, kMaxHeads = 4096, kMaxWidth = 1 << 17;
constexpr long long kMaxSeqLen = 1 << 20, kMaxVocab = 1 << 24, kMaxBatch = 1 << 20;
constexpr long long kMaxTokensPerStep = 1ll << 40;

void validate_model(const ModelConfig& m, const Rules& r) {
  r.in_range("model.n_layer", m.n_layer, 1, kMaxLayers);
  r.in_range("model.n_head", m.n_head, 1, kMaxHeads);
  r.in_range("model.d_model", m.d_model, 1, kMaxWidth);
  if (m.d_model % m.n_head != 0)
    r.fail("model.d_model", "must be divisible by model.n_head (got d_model=" +
                                std::to_string(m.d_model) + ", n_head=" +
                                std::to_string(m.n_head) + ")");
  r.in_range("model.seq_len", m.seq_len, 1, kMaxSeqLen);
  r.in_range("model.vocab_size", m.vocab_size, 2, kMaxVocab);
  r.in_range("model.n_kv_head", m.n_kv_head, 1, m.n_head);
  if (m.n_head % m.n_kv_head != 0)
    r.fail("model.n_kv_head", "must divide model.n_head (got n_kv_head=" +
                                  std::to_string(m.n_kv_head) + ", n_head=" +
                                  std::to_string(m.n_head) + ")");
  r.in_range("model.ffn_hidden", m.ffn_hidden, 1, 4 * kMaxWidth);
  r.positive("model.rope_theta", m.rope_theta);
  r.positive("model.norm_eps", m.norm_eps);
}

// What each architecture can be: GPT-2's block is fixed; a llama head must rotate in pairs.
void validate_arch(const ModelConfig& m, const Rules& r) {
  if (m.arch == Arch::Gpt2) {
    if (m.n_kv_head != m.n_head)
      r.fail("model.n_kv_head", "must equal model.n_head for model.arch: gpt2 (grouped-query "
                                "attention is model.arch: llama)");
    if (m.ffn_hidden != 4 * m.d_model)
      r.fail("model.ffn_hidden", "must be 4 * model.d_model = " + std::to_string(4 * m.d_model) +
                                     " for model.arch: gpt2 (got " + std::to_string(m.ffn_hidden) + ")");
    if (!m.tie_embeddings)
      r.fail("model.tie_embeddings", "must be true for model.arch: gpt2 (its head is wte)");
    if (m.norm_eps != ModelConfig{}.norm_eps)
      r.fail("model.norm_eps", "must be 1e-05 for model.arch: gpt2");
    // Its default is accepted, so that to_yaml's output (every key) parses back.
    if (m.rope_theta != ModelConfig{}.rope_theta)
      r.fail("model.rope_theta", "applies to model.arch: llama only");
    return;
  }
  if (head_size(m) % 2 != 0)
    r.fail("model.d_model", "d_model / n_head must be even for the rotary embedding (got " +
                                std::to_string(head_size(m)) + ")");
}

void validate_parallel(const ParallelConfig& p, const Rules& r) {
  r.in_range("parallel.tp", p.tp, 1, kMaxWorldSize);
  r.in_range("parallel.pp", p.pp, 1, kMaxWorldSize);
  r.in_range("parallel.dp", p.dp, 1, kMaxWorldSize);
  r.in_range("parallel.cp", p.cp, 1, kMaxWorldSize);
  // Each factor <= 2^18: tp*pp*dp fits 64 bits, and times cp once that is <= 2^18.
  long long world = (long long)p.tp * p.pp * p.dp;
  if (world <= kMaxWorldSize) world *= p.cp;
  if (world > kMaxWorldSize)
    r.fail("parallel.dp", "tp*cp*pp*dp = " + std::to_string(world) + " ranks is more than the " +
                              std::to_string(kMaxWorldSize) + " pptrain supports");
  r.in_range("parallel.micro_batches", p.micro_batches, 1, kMaxBatch);
  r.in_range("parallel.micro_batch_size", p.micro_batch_size, 1, kMaxBatch);
  r.in_range("parallel.virtual_stages", p.virtual_stages, 1, kMaxLayers);
  if (p.zero != 0 && p.zero != 1)
    r.fail("parallel.zero", "must be 0 or 1 (got " + std::to_string(p.zero) + ")");
}

// Context parallelism against the model and the other settings.
void validate_context_parallel(const Config& c, const Rules& r) {
  const ParallelConfig& p = c.parallel;
  if (p.cp == 1) return;
  const std::string cp = std::to_string(p.cp);
  if (c.model.seq_len % (2 * p.cp) != 0)
    r.fail("parallel.cp", "needs model.seq_len divisible by 2 * cp, the pieces of the causal "
                          "load balancing (got seq_len=" + std::to_string(c.model.seq_len) +
                              ", cp=" + cp + ")");
  if (p.layout == LayoutChoice::Auto)
    r.fail("parallel.cp", cp + " with parallel.layout: auto: give the whole layout, or leave "
                          "cp to the choice (it considers cp where pptrain plan does)");
}

// Cross-section rules of the parallel layout against the model. Under parallel.layout:
// auto the rules between layout keys wait for the layout chosen (plan/auto_layout.hpp),
// which must pass them all.
void validate_layout(const Config& c, const Rules& r) {
  const ParallelConfig& p = c.parallel;
  const bool chosen_later = p.layout == LayoutChoice::Auto;
  if (c.model.n_head % p.tp != 0)
    r.fail("parallel.tp", "must divide model.n_head (got tp=" + std::to_string(p.tp) +
                              ", n_head=" + std::to_string(c.model.n_head) + ")");
  if (c.model.n_kv_head % p.tp != 0)
    r.fail("parallel.tp", "must divide model.n_kv_head (got tp=" + std::to_string(p.tp) +
                              ", n_kv_head=" + std::to_string(c.model.n_kv_head) + ")");
  if (c.model.ffn_hidden % p.tp != 0)
    r.fail("parallel.tp", "must divide model.ffn_hidden (got tp=" + std::to_string(p.tp) +
                              ", ffn_hidden=" + std::to_string(c.model.ffn_hidden) + ")");
  const int parts = p.pp * p.virtual_stages;
  const bool listed = !p.layers_per_stage.automatic && !p.layers_per_stage.empty();
  if (!chosen_later && !listed && parts > c.model.n_layer)
    r.fail("parallel.pp", "pp * virtual_stages = " + std::to_string(parts) +
                              " is more than model.n_layer = " + std::to_string(c.model.n_layer) +
                              " (every stage needs a layer)");
  if (listed) {
    if (!chosen_later && int(p.layers_per_stage.size()) != parts)
      r.fail("parallel.layers_per_stage", "needs pp * virtual_stages = " + std::to_string(parts) +
                                              " entries (got " +
                                              std::to_string(p.layers_per_stage.size()) + ")");
    long long sum = 0;
    for (int n : p.layers_per_stage) {
      if (n < 1) r.fail("parallel.layers_per_stage", "entries must be >= 1 (got " + std::to_string(n) + ")");
      sum += n;
    }
    if (sum != c.model.n_layer)
      r.fail("parallel.layers_per_stage", "must sum to model.n_layer = " +
                                              std::to_string(c.model.n_layer) + " (got " +
                                              std::to_string(sum) + ")");
  }
  // In floating point: the product of four bounded factors can exceed 64 bits.
  const double tokens = double(p.dp) * p.micro_batches * p.micro_batch_size * c.model.seq_len;
  if (tokens > double(kMaxTokensPerStep))
    r.fail("parallel.micro_batches", "dp * micro_batches * micro_batch_size * model.seq_len = " +
                                         num(tokens) + " tokens per step is more than the " +
                                         std::to_string(kMaxTokensPerStep) + " allowed");
  if (p.schedule_costs.size() != 3)
    r.fail("parallel.schedule_costs", "needs 3 entries, the forward, backward-input and "
                                      "backward-weight times (got " +
                                          std::to_string(p.schedule_costs.size()) + ")");
  for (double t : p.schedule_costs)
    if (!(std::isfinite(t) && t > 0))
      r.fail("parallel.schedule_costs", "entries must be finite and > 0 (got " + num(t) + ")");
  if (p.sequence_parallel && p.tp == 1 && !chosen_later)
    r.fail("parallel.sequence_parallel", "true needs parallel.tp > 1 (it splits the tensor-parallel "
                                         "group's LayerNorm and residual rows)");
  else if (p.sequence_parallel && !chosen_later &&
           (int64_t(p.micro_batch_size) * c.model.seq_len) % p.tp != 0)
    r.fail("parallel.sequence_parallel",
           "true needs micro_batch_size * model.seq_len divisible by parallel.tp (got " +
               std::to_string(p.micro_batch_size) + " * " + std::to_string(c.model.seq_len) +
               " token rows, tp=" + std::to_string(p.tp) + ")");
  if (p.zero == 1 && replicas(p) == 1 && !chosen_later)
    r.fail("parallel.zero", "1 shards the optimizer state over data-parallel ranks and needs dp > 1");
  validate_context_parallel(c, r);
  if (!(p.grad_bucket_mib > 0) || p.grad_bucket_mib > 65536)
    r.fail("parallel.grad_bucket_mib", "must be > 0 and at most 65536 (got " + num(p.grad_bucket_mib) + ")");
  if (!(p.comm_timeout_s > 0))
    r.fail("parallel.comm_timeout_s", "must be > 0 (got " + num(p.comm_timeout_s) + ")");
}

void validate_train(const TrainConfig& t, const Rules& r) {
  r.at_least("train.steps", t.steps, 0);
  r.positive("train.lr", t.lr);
  r.non_negative("train.min_lr", t.min_lr);
  if (t.min_lr > t.lr)
    r.fail("train.min_lr", "must be <= train.lr (got min_lr=" + num(t.min_lr) + ", lr=" +
                               num(t.lr) + ")");
  r.at_least("train.warmup_steps", t.warmup_steps, 0);
  r.non_negative("train.weight_decay", t.weight_decay);
  r.non_negative("train.grad_clip", t.grad_clip);
  r.unit_interval("train.beta1", t.beta1);
  r.unit_interval("train.beta2", t.beta2);
  r.positive("train.eps", t.eps);
  r.at_least("train.eval_every", t.eval_every, 0);
  r.at_least("train.eval_batches", t.eval_batches, 0);
  r.at_least("train.threads", t.threads, 0);
  r.at_least("train.max_nonfinite", t.max_nonfinite, 1);
  r.at_least("train.recompute_layers", t.recompute_layers, 0);
  r.non_negative("train.peak_tflops", t.peak_tflops);
}

void validate_data(const Config& c, const Rules& r) {
  const DataConfig& d = c.data;
  if (d.source != DataSource::Synthetic && d.path.empty())
    r.fail("data.path", "is required when data.source is '" + std::string(name_of(d.source)) + "'");
  if (d.source == DataSource::Text && c.model.vocab_size < 256)
    r.fail("model.vocab_size", "must be >= 256 for data.source 'text' (byte tokens; got " +
                                   std::to_string(c.model.vocab_size) + ")");
}

void validate_checkpoint(const CheckpointConfig& k, const Rules& r) {
  r.at_least("checkpoint.every", k.every, 0);
  r.at_least("checkpoint.keep", k.keep, 1);
}

void validate_logging(const LoggingConfig& l, const Rules& r) {
  r.at_least("logging.every", l.every, 1);
  for (std::size_t i = 0; i < l.trace_steps.size(); ++i) {
    if (l.trace_steps[i] < 0)
      r.fail("logging.trace_steps", "entries must be >= 0 (got " +
                                        std::to_string(l.trace_steps[i]) + " at index " +
                                        std::to_string(i) + ")");
  }
}

}  // namespace

void validate(const Config& config, const Origins& origins) {
  Rules rules(origins);
  validate_model(config.model, rules);
  validate_arch(config.model, rules);
  validate_parallel(config.parallel, rules);
  validate_layout(config, rules);
  validate_train(config.train, rules);
  validate_data(config, rules);
  validate_checkpoint(config.checkpoint, rules);
  validate_logging(config.logging, rules);
  // device auto may still end on the CPU; the backend reports that when it is chosen.
  if (config.train.precision == Precision::BF16 && config.device == Device::Cpu)
    rules.fail("train.precision", "bf16 needs device cuda or auto; the CPU backend computes in "
                                  "fp32 (got device cpu)");
  if (config.train.cuda_graph && config.device == Device::Cpu)
    rules.fail("train.cuda_graph", "needs device cuda or auto (got device cpu)");
  // fused: the flash-style kernel on CUDA (bf16 only), the blocked kernel on the CPU.
  if (config.train.attention == Attention::Fused && config.device != Device::Cpu &&
      config.train.precision == Precision::FP32)
    rules.fail("train.attention", "fused on a CUDA device needs bf16 (got device " +
                                      std::string(name_of(config.device)) + ", precision fp32)");
}

}  // namespace pptrain::config_detail
