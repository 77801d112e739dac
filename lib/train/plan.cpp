// The run plan printed by `check-config`: what the run will be, before it starts.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "data/dataset.hpp"
#include "model/gpt.hpp"
#include "ops/ops.hpp"
#include "pipeline/executor.hpp"
#include "pipeline/simulator.hpp"
#include "train/memory_plan.hpp"
#include "train/session.hpp"
#include "train/trainer.hpp"

namespace pptrain {

namespace {
std::string mib(double bytes) { return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0)); }
double to_mib(double bytes) { return bytes / (1024.0 * 1024.0); }
}  // namespace

std::string describe_plan_json(const Config& c, const std::vector<std::string>& auto_sets) {
  const bool cuda = runs_on_cuda(c);
  check_schedule(c);
  const RankMemory r = predict_peak_memory(c, backend_traits(c, cuda));
  nlohmann::json j = {
      {"config", c.source_path},
      {"world_size", world_size(c)},
      {"device", cuda ? "cuda" : "cpu"},
      {"recompute", name_of(c.train.recompute)},
      {"recompute_layers", c.train.recompute_layers},
      {"sequence_parallel", c.parallel.sequence_parallel},
      {"schedule", name_of(c.parallel.schedule)},
      {"layout", {{"tp", c.parallel.tp}, {"cp", c.parallel.cp}, {"pp", c.parallel.pp},
                  {"dp", c.parallel.dp},
                  {"virtual_stages", c.parallel.virtual_stages},
                  {"micro_batch_size", c.parallel.micro_batch_size},
                  {"micro_batches", c.parallel.micro_batches}, {"zero", c.parallel.zero}}},
      {"layout_auto", auto_sets},
      {"heaviest_rank", {{"stage", r.stage}, {"tp_rank", r.tp_rank}}},
      {"predicted_peak_memory_mib", to_mib(r.total())},
      {"memory_mib",
       {{"weights", to_mib(r.weights)},
        {"gradients", to_mib(r.gradients)},
        {"weight_copy", to_mib(r.weight_copy)},
        {"optimizer", to_mib(r.optimizer)},
        {"checkpoint_gather", to_mib(r.checkpoint_gather)},
        {"activations", to_mib(r.activations)},
        {"workspace", to_mib(r.workspace)},
        {"ring_buffers", to_mib(r.ring_buffers)},
        {"backend_scratch", to_mib(r.backend_scratch)}}},
      {"state_bytes_per_parameter", r.state_bytes_per_parameter()},
      {"parameters", param_layout(c.model).hf_param_count()},
      {"tokens_per_step", tokens_per_step(c)},
      {"flops_per_token", flops_per_token(c.model)}};
  return j.dump(2) + "\n";
}

std::string describe_plan(const Config& c, const std::vector<std::string>& auto_sets) {
  const ModelConfig& m = c.model;
  const ParamLayout layout = param_layout(m);
  const TrainData data = TrainData::open(c.data, m, c.train.seed);
  const auto val = load_validation_tokens(c.data, m, c.train.seed);
  const int gpus = visible_gpus(c);
  const bool cuda = runs_on_cuda(c);
  const BackendTraits traits = backend_traits(c, cuda);
  const DType act_type = traits.compute;
  const double arena = double(layout.total_floats()) * sizeof(float);
  // The forward's weight copy, when it is not the fp32 master itself.
  const double copy = act_type == DType::F32 ? 0.0 : double(layout.total_floats()) * 2;
  const double flops_token = flops_per_token(m);
  const int64_t tokens = tokens_per_step(c);
  const auto& p = c.parallel;
  std::string out;
  auto line = [&out](const std::string& key, const std::string& value) {
    out += fmt::format("{:<13}{}\n", key, value);
  };
  line("config", c.source_path);
  const std::string llama =
      m.arch == Arch::Llama
          ? fmt::format(", {} kv heads, ffn {}, {} head", kv_heads(m), ffn_width(m),
                        m.tie_embeddings ? "tied" : "untied")
          : "";
  line("model", fmt::format("{}, {} layers, {} heads{}, d_model {}, seq_len {}, vocab {} "
                            "(padded to {})",
                            m.arch == Arch::Llama ? "Llama" : "GPT-2", m.n_layer, m.n_head, llama,
                            m.d_model, m.seq_len, m.vocab_size, padded_vocab(m)));
  line("parameters", fmt::format("{} ({:.2f} M)", layout.hf_param_count(),
                                 double(layout.hf_param_count()) / 1e6));
  line("layout", fmt::format("tp {}{} x pp {} x dp {} = {} rank(s), schedule {}{}", p.tp,
                             p.cp > 1 ? fmt::format(" x cp {}", p.cp) : std::string(), p.pp, p.dp,
                             world_size(c), name_of(p.schedule),
                             p.sequence_parallel ? ", sequence parallel" : ""));
  if (!auto_sets.empty()) {
    std::string sets;
    for (const std::string& s : auto_sets) sets += (sets.empty() ? "--set " : " --set ") + s;
    line("", "chosen by parallel.layout: auto, the same as " + sets);
  }
  check_schedule(c);
  const ScheduleKind kind = p.schedule;
  std::string split;
  for (const auto& [b, e] : split_layers(m.n_layer, p.pp * p.virtual_stages, p.layers_per_stage))
    split += (split.empty() ? "" : ",") + std::to_string(e - b);
  line("pipeline", fmt::format("layers per virtual stage [{}]{}; theoretical bubble {:.3f}; at "
                               "most {} micro-batch activation set(s) alive on stage 0",
                               split, p.layers_per_stage.automatic ? " (auto: balanced by the planner's cost model)" : "",
                               theoretical_bubble(kind, p.pp, p.micro_batches, p.virtual_stages,
                                                  message_mode(c, cuda), planned_costs(c)),
                               activation_bound(kind, p.pp, 0, p.micro_batches, p.virtual_stages)));
  const RankMemory r = predict_peak_memory(c, traits);
  line("recompute", fmt::format("{}{}", name_of(c.train.recompute),
                                c.train.recompute != Recompute::None && c.train.recompute_layers > 0
                                    ? fmt::format(" (first {} layer(s) of each chunk)",
                                                  c.train.recompute_layers)
                                    : std::string()));
  line("peak memory", fmt::format("{} predicted on the heaviest rank (stage {}, tp rank {}): "
                                  "weights {}, gradients {}{}, optimizer state {}{}{}, "
                                  "activations {}, workspace {}{}{}",
                                  mib(r.total()), r.stage, r.tp_rank, mib(r.weights),
                                  mib(r.gradients),
                                  r.weight_copy > 0 ? ", bf16 copy " + mib(r.weight_copy) : "",
                                  mib(r.optimizer),
                                  r.weights == 0 ? " (with the fp32 master weights)" : "",
                                  r.checkpoint_gather > 0
                                      ? ", gathered while saving " + mib(r.checkpoint_gather)
                                      : "",
                                  mib(r.activations), mib(r.workspace),
                                  r.ring_buffers > 0 ? ", ring buffers " + mib(r.ring_buffers) : "",
                                  r.backend_scratch > 0
                                      ? ", the backend's workspace and scratch " +
                                            mib(r.backend_scratch)
                                      : ""));
  line("batch", fmt::format("{} micro-batch(es) x {} sequence(s) x {} tokens = {} tokens per step",
                            p.micro_batches, p.micro_batch_size, m.seq_len, tokens));
  line("FLOPs", fmt::format("{:.4g} per token, {:.4g} per step ({} steps: {:.4g} in all)",
                            flops_token, flops_token * double(tokens), c.train.steps,
                            flops_token * double(tokens) * c.train.steps));
  line("memory", fmt::format("whole model: weights {}{}, gradients {}, optimizer state {}",
                             mib(arena), copy > 0 ? " + bf16 copy " + mib(copy) : "", mib(arena),
                             mib(2 * arena)));
  line("optimizer", fmt::format("AdamW lr {} -> {} ({}, {} warmup steps), weight decay {}, "
                                "grad clip {}",
                                c.train.lr, c.train.min_lr, name_of(c.train.lr_schedule),
                                c.train.warmup_steps, c.train.weight_decay, c.train.grad_clip));
  line("data", data.describe());
  line("validation", val.empty() ? std::string("none")
                                 : fmt::format("{} tokens, {} windows", val.size(),
                                               validation_windows(val.size(), m.seq_len)));
  line("checkpoints", c.checkpoint.dir.empty()
                          ? std::string("disabled")
                          : fmt::format("{} every {} steps, keep {}, resume '{}'", c.checkpoint.dir,
                                        c.checkpoint.every, c.checkpoint.keep, c.checkpoint.resume));
  line("device", fmt::format("{}{}{}, {} activations{}", c.device == Device::Auto ? "auto -> " : "",
                             cuda ? "cuda" : "cpu",
                             cuda ? fmt::format(" ({} GPU(s) visible here)", gpus) : "",
                             dtype_name(act_type),
                             traits.logsumexp_attention ? ", fused attention" : ""));
  out += "activations  one micro-batch's buffers (a layer, then the head), as kept under this "
         "config:\n" + describe_activation_table(activation_shape(c, traits), activation_policy(c));
  return out;
}

}  // namespace pptrain
