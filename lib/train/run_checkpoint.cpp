// The multi-rank choreography of sharded saves: rank 0 makes the temp dir; the
// writers (dp rank 0 of each (tp, pp) position, and under ZeRO-1 every dp rank for the
// optimizer state) write their shards; rank 0 commits.
// After each phase every rank learns whether all went well, so all fail together.
#include "train/run_checkpoint.hpp"

#include <spdlog/spdlog.h>

#include <stdexcept>
#include <vector>

#include "checkpoint/init_from.hpp"
#include "checkpoint/sharded.hpp"
#include "optim/adamw.hpp"

namespace pptrain {

namespace {

// Per-rank slot of the record exchange: (bytes, checksum high, checksum low) of the
// model file, then of the optimizer file. Doubles hold 32-bit halves exactly.
constexpr std::size_t kSlot = 6;

void put(double* slot, const FileRecord& f) {
  slot[0] = double(f.bytes);
  slot[1] = double(f.checksum >> 32);
  slot[2] = double(f.checksum & 0xffffffffull);
}

FileRecord get(const double* slot, std::string name) {
  return {std::move(name), uint64_t(slot[0]),
          (uint64_t(slot[1]) << 32) | uint64_t(slot[2])};
}

// Unless every rank's `ok` holds, throws on every rank the reason (`error`) of the
// lowest failing rank, so that whichever rank ends the job reports the real cause.
void agree(Session& s, bool ok, const std::string& error) {
  comm::Group& all = *s.comms.all;
  const std::string why = error.substr(0, 4096);
  std::vector<double> lengths(std::size_t(all.size()), 0.0);  // 1 + length; 0: no failure
  if (!ok) lengths[std::size_t(all.rank())] = double(why.size()) + 1.0;
  all.all_reduce(lengths.data(), lengths.size(), comm::ReduceOp::Sum);
  int root = 0;
  while (root < all.size() && lengths[std::size_t(root)] == 0.0) ++root;
  if (root == all.size()) return;
  // The message travels as one float per byte (exact) through the float broadcast.
  std::vector<float> bytes(std::size_t(lengths[std::size_t(root)]) - 1, 0.0f);
  if (all.rank() == root)
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = float(uint8_t(why[i]));
  all.broadcast(bytes.data(), bytes.size(), root);
  std::string text;
  for (float b : bytes) text += char(uint8_t(b));
  if (all.rank() != root)
    text += " (on rank " + std::to_string(all.world_ranks()[std::size_t(root)]) + ")";
  throw std::runtime_error(text);
}

}  // namespace

std::string save_run_checkpoint(Session& s, const float* params, const SavedMoments& moments,
                                const CheckpointMeta& meta) {
  const auto& ck = s.cfg.checkpoint;
  if (s.grid.world_size() == 1)
    return save_checkpoint(ck.dir, ck.keep, s.model.layout(), params, moments.exp_avg,
                           moments.exp_avg_sq, meta);
  const bool root = s.rank == 0;
  const bool by_dp = zero_shards(s.cfg.parallel);
  std::string error;

  // 1. Rank 0 creates the temp dir; agreeing on the outcome is the barrier after it.
  if (root) try {
      create_temp_step_dir(ck.dir, meta.step);
    } catch (const std::exception& e) {
      error = e.what();
    }
  agree(s, error.empty(), error);

  // 2. The writers write and fsync their shards (replica 0 of each (tp, pp) position
  // its model file; it, or under ZeRO-1 every replica, its optimizer file: the replicas
  // are the dp * cp ranks of the position); every writer's records reach every rank.
  const int world = s.grid.world_size();
  std::vector<double> slots(std::size_t(world) * kSlot, 0.0);
  double* slot = slots.data() + std::size_t(s.rank) * kSlot;
  try {
    const std::string tmp = temp_step_dir(ck.dir, meta.step);
    const ParamLayout& layout = s.model.layout();
    const int replica = s.grid.replica(s.rank);
    if (replica == 0) put(slot, write_model_shard(tmp, s.coord.tp, s.coord.pp, layout, params));
    if (by_dp)
      put(slot + 3, write_optimizer_ranges(tmp, s.coord.tp, s.coord.pp, replica, layout,
                                           *moments.ranges, moments.exp_avg, moments.exp_avg_sq));
    else if (replica == 0)
      put(slot + 3, write_optimizer_shard(tmp, s.coord.tp, s.coord.pp, layout, moments.exp_avg,
                                          moments.exp_avg_sq));
  } catch (const std::exception& e) {
    error = "saving checkpoint " + step_dir_path(ck.dir, meta.step) + " failed: " + e.what();
  }
  s.comms.all->all_reduce(slots.data(), slots.size(), comm::ReduceOp::Sum);
  try {
    agree(s, error.empty(), error);
  } catch (...) {
    if (root) discard_temp_step_dir(ck.dir, meta.step);
    throw;
  }
  std::vector<FileRecord> files;
  for (int r = 0; r < world; ++r) {
    const RankCoord c = s.grid.coord(r);
    const int replica = s.grid.replica(r);
    const double* at = slots.data() + std::size_t(r) * kSlot;
    if (replica == 0) files.push_back(get(at, shard_file_name("model", c.tp, c.pp)));
    if (by_dp)
      files.push_back(get(at + 3, optimizer_dp_file_name(c.tp, c.pp, replica)));
    else if (replica == 0)
      files.push_back(get(at + 3, shard_file_name("optimizer", c.tp, c.pp)));
  }

  // 3. Rank 0 writes meta.json and installs the step dir.
  if (root) try {
      commit_step_dir(ck.dir, ck.keep, files,
                      {s.grid.tp(), s.grid.pp(), s.grid.replicas(), by_dp}, meta);
    } catch (const std::exception& e) {
      error = e.what();
    }
  agree(s, error.empty(), error);
  return step_dir_path(ck.dir, meta.step);
}

CheckpointMeta load_run_checkpoint(Session& s, const std::string& path, float* params,
                                   float* exp_avg, float* exp_avg_sq) {
  CheckpointMeta meta = load_checkpoint(path, param_layout(s.cfg.model), s.model.layout(),
                                        params, exp_avg, exp_avg_sq);
  if (s.logs()) spdlog::info("loaded checkpoint {} (step {})", path, meta.step);
  return meta;
}

void init_from_hf(Session& s, float* params) {
  const InitFromResult r =
      load_hf_weights(s.cfg.checkpoint.init_from, s.cfg.model, s.model.layout(), params);
  if (!s.logs()) return;
  std::string notes;
  for (const std::string& n : r.notes) notes += "; " + n;
  spdlog::info("initialised from {}{}", r.file, notes);
}

}  // namespace pptrain
