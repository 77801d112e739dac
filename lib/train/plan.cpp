// The run plan printed by `check-config`: what the run will be, before it starts.
#include <fmt/format.h>

#include "data/dataset.hpp"
#include "model/gpt.hpp"
#include "ops/ops.hpp"
#include "pipeline/executor.hpp"
#include "pipeline/simulator.hpp"
#include "train/session.hpp"
#include "train/trainer.hpp"

namespace pptrain {

namespace {
std::string mib(double bytes) { return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0)); }
}  // namespace

std::string describe_plan(const Config& c) {
  const ModelConfig& m = c.model;
  const ParamLayout layout = gpt_param_layout(m);
  const TrainData data = TrainData::open(c.data, m, c.train.seed);
  const auto val = load_validation_tokens(c.data, m, c.train.seed);
  // The backend the run would get on this machine, and its activation element size.
  const int gpus = c.device == "cpu" ? 0 : ops::cuda_device_count();
  const bool cuda = c.device == "cuda" || (c.device == "auto" && gpus > 0);
  const DType act_type = cuda && c.train.precision != "fp32" ? DType::BF16 : DType::F32;
  const double arena = double(layout.total_floats()) * sizeof(float);
  // The forward's weight copy, when it is not the fp32 master itself.
  const double copy = act_type == DType::F32 ? 0.0 : double(layout.total_floats()) * 2;
  double acts =
      gpt_activation_floats(m, c.parallel.micro_batch_size) * double(dtype_size(act_type));
  if (act_type == DType::BF16 && c.train.attention == "fused") {
    // The fused attention keeps one fp32 logsumexp per row instead of the T*T probabilities.
    const double rows = double(m.n_layer) * c.parallel.micro_batch_size * m.n_head * m.seq_len;
    acts -= rows * m.seq_len * 2;
    acts += rows * 4;
  }
  const double flops_token = gpt_flops_per_token(m);
  const int64_t tokens = tokens_per_step(c);
  const auto& p = c.parallel;
  std::string out;
  auto line = [&out](const std::string& key, const std::string& value) {
    out += fmt::format("{:<13}{}\n", key, value);
  };
  line("config", c.source_path);
  line("model", fmt::format("GPT-2, {} layers, {} heads, d_model {}, seq_len {}, vocab {} "
                            "(padded to {})",
                            m.n_layer, m.n_head, m.d_model, m.seq_len, m.vocab_size,
                            padded_vocab(m)));
  line("parameters", fmt::format("{} ({:.2f} M)", layout.hf_param_count(),
                                 double(layout.hf_param_count()) / 1e6));
  line("layout", fmt::format("tp {} x pp {} x dp {} = {} rank(s), schedule {}", p.tp, p.pp, p.dp,
                             world_size(c), p.schedule));
  check_schedule(c);
  const ScheduleKind kind = parse_schedule(p.schedule);
  std::string split;
  for (const auto& [b, e] : split_layers(m.n_layer, p.pp * p.virtual_stages, p.layers_per_stage))
    split += (split.empty() ? "" : ",") + std::to_string(e - b);
  line("pipeline", fmt::format("layers per virtual stage [{}]; theoretical bubble {:.3f}; at most "
                               "{} micro-batch activation set(s) alive on stage 0",
                               split,
                               theoretical_bubble(kind, p.pp, p.micro_batches, p.virtual_stages,
                                                  message_mode(c, cuda), planned_costs(c)),
                               activation_bound(kind, p.pp, 0, p.micro_batches, p.virtual_stages)));
  // Stage 0 of tensor-parallel rank 0: the busiest rank for weights and activations.
  const ParamLayout rank0 = gpt_param_layout(
      m, pipeline_partition(m, placement_of(c), 0, p.tp, 0, p.layers_per_stage));
  const double rank_arena = double(rank0.total_floats()) * sizeof(float);
  int stage0_layers = 0;
  for (const ChunkSpec& ch : pipeline_partition(m, placement_of(c), 0, 1, 0, p.layers_per_stage).chunks)
    stage0_layers += ch.layer_end - ch.layer_begin;
  // A set holds one chunk: 1/v of the stage's layers.
  const double rank_acts = acts * stage0_layers / p.virtual_stages / m.n_layer / p.tp *
                           activation_bound(kind, p.pp, 0, p.micro_batches, p.virtual_stages);
  const double optim = 2 * rank_arena / (p.zero == 1 ? p.dp : 1);
  line("per rank", fmt::format("rank 0 (stage 0): weights {}, gradients {}, optimizer state {}, "
                               "activations about {}",
                               mib(rank_arena), mib(rank_arena), mib(optim), mib(rank_acts)));
  line("batch", fmt::format("{} micro-batch(es) x {} sequence(s) x {} tokens = {} tokens per step",
                            p.micro_batches, p.micro_batch_size, m.seq_len, tokens));
  line("FLOPs", fmt::format("{:.4g} per token, {:.4g} per step ({} steps: {:.4g} in all)",
                            flops_token, flops_token * double(tokens), c.train.steps,
                            flops_token * double(tokens) * c.train.steps));
  line("memory", fmt::format("whole model: weights {}{}, gradients {}, optimizer state {}, "
                             "activations {} (one micro-batch); total {}",
                             mib(arena), copy > 0 ? " + bf16 copy " + mib(copy) : "", mib(arena),
                             mib(2 * arena), mib(acts), mib(4 * arena + copy + acts)));
  line("optimizer", fmt::format("AdamW lr {} -> {} ({}, {} warmup steps), weight decay {}, "
                                "grad clip {}",
                                c.train.lr, c.train.min_lr, c.train.lr_schedule,
                                c.train.warmup_steps, c.train.weight_decay, c.train.grad_clip));
  line("data", data.describe());
  line("validation", val.empty() ? std::string("none")
                                 : fmt::format("{} tokens, {} windows", val.size(),
                                               validation_windows(val.size(), m.seq_len)));
  line("checkpoints", c.checkpoint.dir.empty()
                          ? std::string("disabled")
                          : fmt::format("{} every {} steps, keep {}, resume '{}'", c.checkpoint.dir,
                                        c.checkpoint.every, c.checkpoint.keep, c.checkpoint.resume));
  line("device", fmt::format("{}{}{}, {} activations{}", c.device == "auto" ? "auto -> " : "",
                             cuda ? "cuda" : "cpu",
                             cuda ? fmt::format(" ({} GPU(s) visible here)", gpus) : "",
                             dtype_name(act_type),
                             c.train.attention == "fused" ? ", fused attention" : ""));
  return out;
}

}  // namespace pptrain
