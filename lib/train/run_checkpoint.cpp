#include "train/run_checkpoint.hpp"

#include <spdlog/spdlog.h>

#include <stdexcept>
#include <vector>

#include "core/aligned_buffer.hpp"

namespace pptrain {

namespace {
// Names of the tensors stage `stage` owns (its tied copy of wte excluded), in order.
std::vector<std::string> stage_tensors(const Session& s, int stage) {
  const auto& p = s.cfg.parallel;
  const ParamLayout layout = gpt_param_layout(
      s.cfg.model, pipeline_partition(s.cfg.model, p.pp, stage, p.virtual_stages, 1, 0,
                                      p.layers_per_stage));
  std::vector<std::string> names;
  for (const ParamEntry& e : layout.entries())
    if (!e.tied_copy) names.push_back(e.name);
  return names;
}

// Assembles arena `local` (this rank's layout) into `full` (the whole-model layout) on
// rank 0. Every rank walks the same (stage, tensor) sequence.
void gather(Session& s, const ParamLayout& full_layout, const float* local, float* full) {
  const ParamLayout& mine = s.model.layout();
  int tag = 0;
  for (int stage = 0; stage < s.grid.pp(); ++stage) {
    const int owner = s.grid.rank({0, 0, stage});
    const bool holder = s.coord.pp == stage && s.coord.dp == 0;
    for (const std::string& name : stage_tensors(s, stage)) {
      const ParamEntry& g = full_layout.at(name);
      tag = (tag + 1) % 32768;
      std::vector<float> global;
      if (holder) {
        const ParamEntry& e = mine.at(name);
        global.assign(g.hf_numel(), 0.0f);
        if (!e.replicated() || s.coord.tp == 0) slice_to_global(e, local + e.offset, global.data());
        if (s.grid.tp() > 1) s.comms.tp->all_reduce(global.data(), global.size(), comm::ReduceOp::Sum);
      }
      if (s.rank == 0 && owner == 0) {
        std::copy(global.begin(), global.end(), full + g.offset);
      } else if (s.rank == 0) {
        s.comms.world->exchange({{comm::Transfer::Recv, owner, full + g.offset, g.hf_numel(), tag}});
      } else if (s.rank == owner) {
        s.comms.world->exchange({{comm::Transfer::Send, 0, global.data(), global.size(), tag}});
      }
    }
  }
}

void scatter(const ParamLayout& full_layout, const float* full, const ParamLayout& mine,
             float* local) {
  for (const ParamEntry& e : mine.entries())
    slice_from_global(e, full + full_layout.at(e.name).offset, local + e.offset);
}
}  // namespace

std::string save_run_checkpoint(Session& s, const float* exp_avg, const float* exp_avg_sq,
                                const CheckpointMeta& meta) {
  const ParamLayout full_layout = gpt_param_layout(s.cfg.model);
  const bool root = s.rank == 0;
  AlignedBuffer<float> p(root ? full_layout.total_floats() : 0),
      m(root ? full_layout.total_floats() : 0), v(root ? full_layout.total_floats() : 0);
  gather(s, full_layout, s.model.params(), p.data());
  gather(s, full_layout, exp_avg, m.data());
  gather(s, full_layout, exp_avg_sq, v.data());
  std::string path, error;
  if (root) {
    try {
      path = save_checkpoint(s.cfg.checkpoint.dir, s.cfg.checkpoint.keep, full_layout, p.data(),
                             m.data(), v.data(), meta);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (share(s, error.empty() ? 0.0 : 1.0, root) != 0.0)
    throw std::runtime_error(root ? error : "rank 0 failed to save the checkpoint");
  return root ? path : s.cfg.checkpoint.dir;
}

CheckpointMeta load_run_checkpoint(Session& s, const std::string& path, float* exp_avg,
                                   float* exp_avg_sq) {
  const bool opt = exp_avg && exp_avg_sq;
  const ParamLayout full_layout = gpt_param_layout(s.cfg.model);
  AlignedBuffer<float> p(full_layout.total_floats());
  AlignedBuffer<float> m(opt ? full_layout.total_floats() : 0), v(opt ? full_layout.total_floats() : 0);
  CheckpointMeta meta = load_checkpoint(path, full_layout, p.data(), opt ? m.data() : nullptr,
                                        opt ? v.data() : nullptr);
  scatter(full_layout, p.data(), s.model.layout(), s.model.params());
  if (opt) {
    scatter(full_layout, m.data(), s.model.layout(), exp_avg);
    scatter(full_layout, v.data(), s.model.layout(), exp_avg_sq);
  }
  return meta;
}

}  // namespace pptrain
