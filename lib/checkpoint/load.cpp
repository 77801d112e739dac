// Loading a step dir of either format into any layout: the stored tensors must be
// exactly the model's, then each of this layout's entries is assembled in its global
// form from the pieces that hold it and this layout's slice of it is taken.
#include <spdlog/spdlog.h>

#include <set>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/file_io.hpp"
#include "checkpoint/open_checkpoint.hpp"
#include "checkpoint/sharded.hpp"
#include "core/error.hpp"

namespace pptrain {

using namespace ckpt;

namespace ckpt {

void match_model(OpenCheckpoint& ck, Role role, const ParamLayout& whole,
                 const std::vector<std::string>& suffixes) {
  const auto& stored = ck.tensors[role];
  // A single-file checkpoint is named by its file, a sharded one by its dir.
  const std::string where = ck.format_version == kCheckpointFormatVersion
                                ? ck.files[role == kModel ? 0 : 1].file.path()
                                : ck.dir.string();
  std::set<std::string> expected;
  for (const ParamEntry& e : whole.entries()) {
    for (const std::string& suffix : suffixes) {
      const std::string name = e.name + suffix;
      auto it = stored.find(name);
      if (it == stored.end()) throw InputError(where + ": tensor " + name + " is missing");
      const Piece& p = it->second.front();
      if (p.slicing.hf_shape != e.hf_shape)
        ck.fail_in(p.file, "tensor " + name + " has shape " + shape_str(p.slicing.hf_shape) +
                               ", expected " + shape_str(e.hf_shape));
      expected.insert(name);
    }
  }
  for (const auto& [name, pieces] : stored)
    if (!expected.count(name))
      ck.fail_in(pieces.front().file,
                 "unexpected tensor " + name + " (the checkpoint is of a different model)");
}

void assemble_global(const OpenCheckpoint& ck, const std::vector<const Piece*>& pieces,
                     float* global) {
  std::vector<float> local;
  for (const Piece* p : pieces) {
    local.resize(p->slicing.numel);
    read_piece(ck, *p, local.data());
    slice_to_global(p->slicing, local.data(), global);
  }
}

}  // namespace ckpt

namespace {

bool same_slicing(const ParamEntry& a, const ParamEntry& b) {
  return a.split_dim == b.split_dim && a.split_groups == b.split_groups && a.shard == b.shard &&
         a.num_shards == b.num_shards && a.shape == b.shape;
}

// True when a piece is stored exactly as `e` holds it, with no padding: it can be copied
// straight into the arena.
bool holds_exactly(const ParamEntry& piece, const ParamEntry& e) {
  if (e.replicated()) return piece.replicated() && piece.shape == e.shape;
  const auto d = std::size_t(e.split_dim);
  return same_slicing(piece, e) && e.shape[d] * e.num_shards == e.hf_shape[d];
}

// One arena tensor to fill and the pieces it is assembled from.
struct Job {
  const ParamEntry* entry;
  std::string name;  // stored name: entry name + suffix
  float* arena;
  std::vector<const Piece*> pieces;
};

// Picks the fewest pieces for each job, preferring files already needed: the piece
// sliced exactly as the entry; else a whole piece; else one piece of every shard.
std::set<std::size_t> choose_pieces(const OpenCheckpoint& ck, std::vector<Job>& jobs,
                                    const std::vector<Role>& roles) {
  std::set<std::size_t> needed;
  std::vector<std::size_t> want_whole;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    Job& job = jobs[j];
    const auto& pieces = ck.tensors[roles[j]].at(job.name);
    for (const Piece& p : pieces)
      if (!job.entry->replicated() && same_slicing(p.slicing, *job.entry)) {
        job.pieces = {&p};
        break;
      }
    if (job.pieces.empty()) {
      bool has_whole = false;
      for (const Piece& p : pieces) has_whole = has_whole || p.slicing.replicated();
      if (has_whole) {
        want_whole.push_back(j);  // chosen below, once the other files are known
        continue;
      }
      std::set<int> shards;
      for (const Piece& p : pieces)
        if (shards.insert(p.slicing.shard).second) job.pieces.push_back(&p);
    }
    for (const Piece* p : job.pieces)
      for (std::size_t f : piece_files(*p)) needed.insert(f);
  }
  for (std::size_t j : want_whole) {
    const Piece* pick = nullptr;
    for (const Piece& p : ck.tensors[roles[j]].at(jobs[j].name))
      if (p.slicing.replicated() && (!pick || (needed.count(p.file) && !needed.count(pick->file))))
        pick = &p;
    jobs[j].pieces = {pick};
    for (std::size_t f : piece_files(*pick)) needed.insert(f);
  }
  return needed;
}

}  // namespace

CheckpointMeta load_checkpoint(const std::string& path, const ParamLayout& whole,
                               const ParamLayout& layout, float* params, float* exp_avg,
                               float* exp_avg_sq) {
  PPTRAIN_CHECK(params != nullptr, "load_checkpoint needs a parameter arena");
  PPTRAIN_CHECK((exp_avg == nullptr) == (exp_avg_sq == nullptr),
                "load both optimizer moments or neither");
  const bool with_optimizer = exp_avg != nullptr;
  OpenCheckpoint ck = open_checkpoint(path, with_optimizer, /*verify_all=*/false);
  match_model(ck, kModel, whole, {""});
  if (with_optimizer) match_model(ck, kOptimizer, whole, {".exp_avg", ".exp_avg_sq"});

  std::vector<Job> jobs;
  std::vector<Role> roles;
  for (const ParamEntry& e : layout.entries()) {
    PPTRAIN_CHECK(whole.contains(e.name) && whole.at(e.name).hf_shape == e.hf_shape,
                  "layout entry " + e.name + " is not a tensor of the whole model");
    auto add = [&](Role role, const char* suffix, float* arena) {
      jobs.push_back({&e, e.name + suffix, arena, {}});
      roles.push_back(role);
    };
    add(kModel, "", params);
    if (with_optimizer) {
      add(kOptimizer, ".exp_avg", exp_avg);
      add(kOptimizer, ".exp_avg_sq", exp_avg_sq);
    }
  }
  // Every file read is verified before anything is written to the arenas.
  const std::set<std::size_t> read = choose_pieces(ck, jobs, roles);
  for (std::size_t f : read) ck.files[f].verify();

  std::vector<float> global;
  for (const Job& job : jobs) {
    const ParamEntry& e = *job.entry;
    if (job.pieces.size() == 1 && holds_exactly(job.pieces[0]->slicing, e)) {
      read_piece(ck, *job.pieces[0], job.arena + e.offset);
      continue;
    }
    global.assign(e.hf_numel(), 0.0f);
    assemble_global(ck, job.pieces, global.data());
    slice_from_global(e, global.data(), job.arena + e.offset);
  }
  spdlog::debug("loaded checkpoint {} (step {}) from {} of its {} files", path, ck.meta.step,
                read.size(), ck.files.size());
  return ck.meta;
}

CheckpointMeta load_checkpoint(const std::string& path, const ParamLayout& layout, float* params,
                               float* exp_avg, float* exp_avg_sq) {
  CheckpointMeta meta = load_checkpoint(path, layout, layout, params, exp_avg, exp_avg_sq);
  spdlog::info("loaded checkpoint {} (step {})", path, meta.step);
  return meta;
}

}  // namespace pptrain
