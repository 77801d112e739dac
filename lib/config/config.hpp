// The run configuration: plain structs decoded from YAML, with defaults, plus the
// loader that applies `--set key=value` overrides and validates every key.
// This header includes no MPI, CUDA or NCCL: it builds and tests anywhere.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "config/choices.hpp"

namespace pptrain {

// The model's shape. n_kv_head and ffn_hidden 0 mean their default (kv_heads,
// ffn_width); a loaded config holds the resolved values, and tie_embeddings left out of
// a file is the arch's default (false for llama).
struct ModelConfig {
  int n_layer = 2;
  int n_head = 2;
  int d_model = 64;
  int seq_len = 32;
  int vocab_size = 256;  // real vocabulary; padded internally to a multiple of 128
  Arch arch = Arch::Gpt2;
  int n_kv_head = 0;     // key/value heads (grouped-query attention); 0: n_head
  int ffn_hidden = 0;    // the MLP's hidden width; 0: the arch's default
  double rope_theta = 10000.0;  // llama: the rotary embedding's base
  double norm_eps = 1e-5;       // the norms' epsilon (GPT-2's LayerNorm: 1e-5 only)
  bool tie_embeddings = true;   // the output head is the token embedding
};

inline int kv_heads(const ModelConfig& m) { return m.n_kv_head > 0 ? m.n_kv_head : m.n_head; }
// gpt2: 4 d_model. llama: 8/3 d_model rounded up to a multiple of 256 (Meta's rule).
// (Before validation d_model may be anything: the result saturates.)
inline int default_ffn_hidden(Arch arch, int d_model) {
  const long long f = arch == Arch::Gpt2 ? 4LL * d_model : ((8LL * d_model + 2) / 3 + 255) / 256 * 256;
  return int(std::clamp<long long>(f, 0, std::numeric_limits<int>::max()));
}
inline int ffn_width(const ModelConfig& m) {
  return m.ffn_hidden > 0 ? m.ffn_hidden : default_ffn_hidden(m.arch, m.d_model);
}
inline int head_size(const ModelConfig& m) { return m.d_model / m.n_head; }

// parallel.layers_per_stage: the layers of each virtual stage (empty: an even split), or
// `auto`: balanced by the planner's cost model when the run starts (then `counts` holds
// the split chosen). Reads as the counts.
struct LayerSplit {
  bool automatic = false;
  std::vector<int> counts;
  operator const std::vector<int>&() const { return counts; }
  LayerSplit& operator=(std::vector<int> c) {
    counts = std::move(c);
    return *this;
  }
  bool empty() const { return counts.empty(); }
  std::size_t size() const { return counts.size(); }
  auto begin() const { return counts.begin(); }
  auto end() const { return counts.end(); }
  void clear() { counts.clear(); }
};

struct ParallelConfig {
  // auto: the planner picks tp, pp, dp, the schedule, the micro-batch split, recompute,
  // SP and ZeRO for the machine the run starts on (plan/auto_layout.hpp); keys given
  // explicitly are kept.
  LayoutChoice layout = LayoutChoice::Manual;
  int tp = 1;
  // Context parallelism: every sequence split over cp ranks (ring attention).
  int cp = 1;
  int pp = 1;
  int dp = 1;
  int micro_batches = 1;     // gradient-accumulation micro-batches per step (per DP rank)
  int micro_batch_size = 4;  // sequences per micro-batch
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int virtual_stages = 1;
  int zero = 0;  // 0: replicated optimizer state; 1: sharded over DP
  // LayerNorm and residual regions split over the tp group along the token rows.
  bool sequence_parallel = false;
  LayerSplit layers_per_stage;
  // Relative forward, backward-input and backward-weight times that zb-v plans its order
  // with (and the theoretical bubble is simulated at).
  std::vector<double> schedule_costs = {1, 1, 1};
  MessageModeChoice message_mode = MessageModeChoice::Auto;
  double comm_timeout_s = 300;        // a communication wait longer than this aborts the job
  // Gradient reductions start during the backward pass (false: all after it; same sums).
  bool overlap = true;
  // The most gradient floats one data-parallel reduction carries, in MiB (fp32).
  double grad_bucket_mib = 25;
};

struct TrainConfig {
  int steps = 100;
  double lr = 1e-3;
  double min_lr = 1e-4;
  int warmup_steps = 10;
  LrSchedule lr_schedule = LrSchedule::Cosine;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // 0 disables clipping
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  uint64_t seed = 1234;
  int eval_every = 0;    // validation every N steps (0: only at the end, if val data exists)
  int eval_batches = 0;  // 0: whole validation set; else at most N micro-batches
  int threads = 0;       // CPU threads for GEMMs; 0: all cores
  OnNonfinite on_nonfinite = OnNonfinite::Stop;  // what a non-finite loss/grad norm does
  int max_nonfinite = 5;              // skip: stop after this many such steps in a row
  // A run whose predicted peak memory exceeds what the rank has: refused, warned, or run.
  MemoryCheck memory_check = MemoryCheck::Error;
  // Activations and weight copy: auto (bf16 on CUDA, fp32 on the CPU) | bf16 | fp32.
  Precision precision = Precision::Auto;
  double peak_tflops = 0;  // MFU denominator per GPU; 0: the device's dense bf16 peak
  // auto | unfused (batched GEMMs around a softmax) | fused (flash-style on CUDA, blocked
  // on the CPU); see uses_fused_attention.
  Attention attention = Attention::Auto;
  // Activation recomputation: none | selective (the attention core) | full (whole layers
  // from their input), on the first recompute_layers layers of each chunk (0: all).
  Recompute recompute = Recompute::None;
  int recompute_layers = 0;
  // CUDA, one rank: the whole step (forward, backward, gradient norm, update) captured as
  // a CUDA graph at the second step and replayed from then on.
  bool cuda_graph = false;
};

// Whether a run on CUDA (on_cuda) or on the CPU, at context-parallel degree cp, uses the
// fused attention kernels. auto is fused on the CPU, where the blocked kernel is as fast
// or faster and keeps no T x T probabilities (docs/performance.md), and on CUDA in bf16,
// where the flash kernels keep S, P and O in registers (flash_attention.cu); in fp32 on
// CUDA, where there are no fused kernels, it is unfused but for context parallelism's
// ring (whose steps then run plain loop kernels).
inline bool uses_fused_attention(const TrainConfig& t, bool on_cuda, int cp) {
  if (t.attention != Attention::Auto) return t.attention == Attention::Fused;
  return !on_cuda || t.precision != Precision::FP32 || cp > 1;
}

struct DataConfig {
  DataSource source = DataSource::Synthetic;
  // Training and validation token files (unused by synthetic, which has both built in):
  // files or globs, concatenated in order (a glob's matches sorted).
  std::vector<std::string> path;
  std::vector<std::string> val_path;
};

struct CheckpointConfig {
  std::string dir = "checkpoints";
  int every = 0;       // save every N steps (0: only at the end)
  int keep = 3;        // newest N checkpoints kept
  std::string resume;  // "" (fresh start), "auto" (newest valid in dir), or a path
  // A fresh run's weights: a Hugging Face directory (GPT2LMHeadModel or
  // LlamaForCausalLM) or its model.safetensors ("": the arch's initialisation). A checkpoint to resume takes precedence.
  std::string init_from;
};

struct LoggingConfig {
  int every = 1;            // console/metrics line every N steps
  std::string metrics;      // JSON Lines file; "" disables
  std::string trace;        // Chrome-trace JSON file; "" disables
  std::vector<int> trace_steps;  // steps recorded in the trace
  LogLevel level = LogLevel::Info;
};

struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  TrainConfig train;
  DataConfig data;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  Device device = Device::Cpu;
  std::string source_path;     // file the config was read from (for messages)
  // The dotted keys whose values the file or a --set override gave (and the sections
  // present); every other key holds its default.
  std::set<std::string> given_keys;
};

// Loads `path`, applies each "dotted.key=yaml-value" override in order, decodes and
// validates. Throws InputError naming the file, line, key and reason on any problem.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// Decodes and validates YAML text (used by tests and by load_config).
Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {});

// The resolved configuration as YAML (stored in checkpoints and printed by check-config).
std::string to_yaml(const Config& config);

// Derived sizes used everywhere.
inline int padded_vocab(const ModelConfig& m, int multiple = 128) {
  return int((int64_t(m.vocab_size) + multiple - 1) / multiple * multiple);  // vocab <= 2^24
}
// The most ranks a layout may have (validated): beyond the largest GPU clusters built.
inline constexpr int kMaxWorldSize = 1 << 18;
inline int world_size(const Config& c) {  // validated: at most kMaxWorldSize
  return c.parallel.tp * c.parallel.cp * c.parallel.pp * c.parallel.dp;
}
// The ranks holding the same parameters, which sum their gradients (and ZeRO-1 shards
// the optimizer over): dp * cp.
inline int replicas(const ParallelConfig& p) { return p.dp * p.cp; }
inline int64_t tokens_per_step(const Config& c) {
  return int64_t(c.parallel.dp) * c.parallel.micro_batches * c.parallel.micro_batch_size *
         c.model.seq_len;
}

}  // namespace pptrain
