#include "train/session.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "comm/launcher.hpp"
#include "comm/nccl_comm.hpp"
#include "core/error.hpp"
#include "data/dataset.hpp"
#include "optim/adamw.hpp"
#include "pipeline/schedule.hpp"
#include "train/grad_buckets.hpp"
#include "train/memory_check.hpp"
#include "train/memory_plan.hpp"

namespace pptrain {

int visible_gpus(const Config& config) {
  return config.device == Device::Cpu ? 0 : ops::cuda_device_count();  // the CPU never asks
}

bool runs_on_cuda(const Config& config) {
  return config.device == Device::Cuda || (config.device == Device::Auto && visible_gpus(config) > 0);
}

std::unique_ptr<ops::Ops> make_backend(const Config& config, int local_rank) {
  const BackendTraits traits = backend_traits(config, runs_on_cuda(config));  // the plan's too
  if (!traits.device_memory) {
    if (config.train.precision == Precision::BF16)
      throw InputError(config.source_path +
                       ": train.precision: bf16 needs a CUDA device, and device: auto found none");
    return ops::make_cpu_ops(config.train.threads, traits.logsumexp_attention);
  }
  const int gpus = visible_gpus(config);
  if (!ops::cuda_backend_built())
    throw InputError(config.source_path +
                     ": device: cuda, but this build has no CUDA backend (it was built without "
                     "the CUDA toolkit); use device: cpu or auto");
  if (gpus == 0)
    throw InputError(config.source_path +
                     ": device: cuda, but no CUDA device is visible; use device: cpu or auto");
  return ops::make_cuda_ops(local_rank % gpus, traits.compute, traits.logsumexp_attention);
}

void check_schedule(const Config& c) {
  const auto& p = c.parallel;
  const std::string why = schedule_constraint_error(p.schedule, p.pp,
                                                    p.micro_batches, p.virtual_stages);
  if (!why.empty()) throw InputError(c.source_path + ": parallel.schedule: " + why);
}

Placement placement_of(const Config& c) {
  return schedule_placement(c.parallel.schedule, c.parallel.pp,
                            c.parallel.virtual_stages);
}

ModelPartition rank_partition(const Config& c, int stage, int tp_rank) {
  ModelPartition part = pipeline_partition(c.model, placement_of(c), stage, c.parallel.tp, tp_rank,
                                           c.parallel.layers_per_stage);
  part.group_floats = group_floats(c.parallel);
  return part;
}

MessageMode message_mode(const Config& c, bool device_memory) {
  const MessageModeChoice mode = c.parallel.message_mode;
  if (mode == MessageModeChoice::Grouped) return MessageMode::Grouped;
  if (mode == MessageModeChoice::AsyncSends) {
    if (device_memory)
      throw InputError(c.source_path + ": parallel.message_mode: async-sends needs CPU ranks "
                                       "(a send on NCCL holds its stream until received); use "
                                       "grouped or auto");
    return MessageMode::AsyncSends;
  }
  if (mode == MessageModeChoice::Channels) return MessageMode::Channels;
  if (!device_memory) return MessageMode::AsyncSends;
  return c.parallel.overlap ? MessageMode::Channels : MessageMode::Grouped;
}

StageCosts planned_costs(const Config& c) {
  const std::vector<double>& t = c.parallel.schedule_costs;
  return {t.at(0), t.at(1), t.at(2), 0};
}

ActivationPolicy activation_policy(const Config& c) {
  ActivationPolicy p;
  p.recompute = c.train.recompute;
  p.recompute_layers = c.train.recompute_layers;
  p.sequence_parallel = c.parallel.sequence_parallel;
  p.weight_follows_input = weight_follows_input(c.parallel.schedule);
  p.overlap_tensor_parallel = c.parallel.overlap && c.parallel.tp > 1;
  return p;
}

RankGrid make_grid(const Config& c) {
  const auto& p = c.parallel;
  return RankGrid(GridSizes{p.tp, p.cp, p.dp, p.pp}, placement_of(c).head_stage(),
                  c.model.tie_embeddings);
}

namespace {
comm::Comms make_comms(const Config& c, const RankGrid& grid) {
  check_schedule(c);
  if (grid.world_size() == 1) return comm::make_local_comms();
  return comm::make_mpi_comms(grid, c.parallel.comm_timeout_s);
}

// The backend on this rank's device; a multi-rank run on GPUs also gets its NCCL
// communicators here (they need the device chosen first).
// Then, before anything of the model is allocated, the memory check.
std::unique_ptr<ops::Ops> make_rank_backend(const Config& c, const RankGrid& grid,
                                            comm::Comms& comms) {
  const comm::LaunchInfo launch = comm::detect_launcher();
  auto ops = make_backend(c, launch.local_rank);
  if (ops->device_memory() && grid.world_size() > 1) {
    std::vector<comm::PipelineChannel> channels;
    if (message_mode(c, true) == MessageMode::Channels)
      channels = pipeline_channels(placement_of(c), grid.all_pp_groups());
    comm::add_nccl_comms(comms, grid, ops->native_stream(), ops->host_waits(), channels);
  }
  check_memory(c, comms, *ops, launch.under_launcher ? launch.local_size : 1);
  return ops;
}
}  // namespace

Session::Session(const Config& config)
    : cfg(config),
      grid(make_grid(config)),
      comms(make_comms(config, grid)),
      rank(comms.world->rank()),
      coord(grid.coord(rank)),
      split{config.parallel.cp, coord.cp, config.model.seq_len},
      ops(make_rank_backend(config, grid, comms)),
      owned_model(make_model(config.model, config.parallel.micro_batch_size, *ops,
                             rank_partition(config, coord.pp, coord.tp), comms.tp_for_model(),
                             activation_policy(config),
                             optimizer_holds_master(config.parallel, ops->compute_dtype())
                                 ? Model::Master::InOptimizer
                                 : Model::Master::InModel,
                             ContextRing{split, &comms.ring_for_model(), grid.cp_group(rank)})),
      model(*owned_model),
      executor(model, comms.pipeline_for_model(), grid.pp_group(rank), config.parallel.schedule,
               coord.pp, config.parallel.micro_batches, config.parallel.virtual_stages,
               message_mode(config, ops->device_memory()), planned_costs(config)) {}

// A checkpoint of another model whose tensors happen to fit (n_head, or the arch's
// other settings, change no shape) must not be resumed.
void check_same_model(const Config& cfg, const CheckpointMeta& meta, const std::string& path) {
  const ModelConfig saved = parse_config(meta.config_yaml, path + "/meta.json").model;
  const ModelConfig& m = cfg.model;
  const auto settings = [](const ModelConfig& x) {
    return std::vector<std::pair<const char*, std::string>>{
        {"arch", std::string(name_of(x.arch))},    {"n_layer", fmt::format("{}", x.n_layer)},
        {"n_head", fmt::format("{}", x.n_head)},   {"n_kv_head", fmt::format("{}", kv_heads(x))},
        {"d_model", fmt::format("{}", x.d_model)}, {"ffn_hidden", fmt::format("{}", ffn_width(x))},
        {"seq_len", fmt::format("{}", x.seq_len)}, {"vocab_size", fmt::format("{}", x.vocab_size)},
        {"rope_theta", fmt::format("{}", x.rope_theta)},
        {"norm_eps", fmt::format("{}", x.norm_eps)},
        {"tie_embeddings", fmt::format("{}", x.tie_embeddings)}};
  };
  const auto ours = settings(m), theirs = settings(saved);
  std::string differ;
  for (std::size_t i = 0; i < ours.size(); ++i)
    if (ours[i].second != theirs[i].second)
      differ += fmt::format("{}model.{} {} there, {} in the config", differ.empty() ? "" : "; ",
                            ours[i].first, theirs[i].second, ours[i].second);
  if (!differ.empty())
    throw InputError(path + ": checkpoint of another model (" + differ + ")");
}

double share(Session& s, double value, bool contributes) {
  double v = contributes ? value : 0.0;
  s.comms.all->all_reduce(&v, 1, comm::ReduceOp::Sum);
  return v;
}

double validation_loss(Session& s, const std::vector<int32_t>& tokens, int max_batches) {
  const int B = s.cfg.parallel.micro_batch_size, T = s.cfg.model.seq_len;
  int64_t windows = validation_windows(tokens.size(), T);
  if (max_batches > 0) windows = std::min<int64_t>(windows, int64_t(max_batches) * B);
  PPTRAIN_CHECK(windows > 0, "validation data holds no whole window");
  const int batches = int((windows + B - 1) / B);
  // A partial last batch repeats its first window in the unused rows; only the real
  // rows are counted. A context-parallel rank holds its pieces of each window (s.split)
  // and sums their losses; the cp ranks' sums add up to the window's.
  auto fill = [&](int mb, int32_t* in, int32_t* tg) {
    const int64_t first = int64_t(mb) * B;
    const int rows = int(std::min<int64_t>(B, windows - first));
    for (int b = 0; b < B; ++b) {
      const int32_t* w = tokens.data() + (first + (b < rows ? b : 0)) * (T + 1);
      s.split.take(w, B, b, in);
      s.split.take(w + 1, B, b, tg);
    }
  };
  std::vector<float> losses;
  s.executor.evaluate(batches, fill, &losses);
  const std::size_t batch_rows = std::size_t(B) * s.split.local_len();
  double sum = 0;
  for (int64_t w = 0; w < windows && !losses.empty(); ++w)
    for (int p = 0; p < s.split.pieces(); ++p)
      for (int t = 0; t < s.split.piece_len(); ++t)
        sum += losses[std::size_t(w / B) * batch_rows + s.split.row(B, int(w % B), p, t)];
  const bool holder = s.head_stage() && s.coord.tp == 0 && s.coord.dp == 0;
  return share(s, sum / (double(windows) * T), holder);
}

}  // namespace pptrain
