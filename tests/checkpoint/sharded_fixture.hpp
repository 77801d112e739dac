// Shared by the sharded-checkpoint tests: partitions of the small test model, arenas
// whose every element is a function of (tensor, global index), and a sharded save made
// in-process by writing each (tp, pp) position's files through the library's pieces.
#pragma once
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.hpp"
#include "checkpoint/sharded.hpp"
#include "fixture.hpp"

namespace pptrain::ckpt_test {

// Stage `stage` of `pp` (layers split evenly), tensor-parallel shard tp_rank of tp_size.
inline ModelPartition partition(const ModelConfig& m, int pp, int stage, int tp_size,
                                int tp_rank) {
  ModelPartition p;
  const int per = m.n_layer / pp;
  p.chunks.push_back({stage * per, (stage + 1) * per, stage == 0, stage == pp - 1});
  p.tp_size = tp_size;
  p.tp_rank = tp_rank;
  p.tied_copy_on_last = pp > 1;
  return p;
}

// Element gi of the global tensor `name` in arena `which` (0 params, 1 and 2 moments).
inline float global_value(uint64_t seed, int which, const std::string& name, int64_t gi) {
  const double x =
      standard_normal(hash_words(seed, uint64_t(which), hash_string(name), uint64_t(gi)));
  return float(which == 2 ? x * x * 1e-6 : which == 1 ? x * 1e-3 : x);
}

// Fills a layout's arenas with its slices of the global tensors of `seed` (padding 0).
inline void fill_slices(const ParamLayout& layout, Arenas& a, uint64_t seed) {
  a.set_all(-1.0f);  // alignment gaps keep this: never compared
  for (const ParamEntry& e : layout.entries()) {
    int which = 0;
    for (float* arena : {a.p.data(), a.m.data(), a.v.data()}) {
      const int w = which++;
      fill_from_global(e, [&](int64_t gi) { return global_value(seed, w, e.name, gi); },
                       arena + e.offset);
    }
  }
}

// Every entry of `layout` in `got` equals its slice of the global tensors of `seed`
// (padding 0), bit for bit; `moments` false skips the optimizer arenas.
inline void expect_slices(const ParamLayout& layout, const Arenas& got, uint64_t seed,
                          bool moments = true) {
  Arenas want(layout);
  fill_slices(layout, want, seed);
  for (const ParamEntry& e : layout.entries()) {
    for (auto [w, g] : {std::pair{&want.p, &got.p}, {&want.m, &got.m}, {&want.v, &got.v}}) {
      if (!moments && w != &want.p) continue;
      ASSERT_EQ(std::memcmp(w->data() + e.offset, g->data() + e.offset, e.numel * 4), 0)
          << e.name << (w == &want.p ? "" : w == &want.m ? " exp_avg" : " exp_avg_sq");
    }
  }
}

class ShardedTest : public CheckpointTest {
 protected:
  ModelConfig model_ = small_model();  // n_head 2: tp 1 or 2; 2 layers: pp 1 or 2

  // Each (tp, pp) position's model file in `tmp`, then what write_optimizer(t, s, layout,
  // arenas) adds to `files` for its optimizer state.
  template <class WriteOptimizer>
  void write_positions(const std::string& tmp, int tp, int pp, uint64_t seed,
                       std::vector<FileRecord>& files, WriteOptimizer write_optimizer) {
    for (int s = 0; s < pp; ++s)
      for (int t = 0; t < tp; ++t) {
        const ParamLayout layout = param_layout(model_, partition(model_, pp, s, tp, t));
        Arenas a(layout);
        fill_slices(layout, a, seed);
        files.push_back(write_model_shard(tmp, t, s, layout, a.p.data()));
        write_optimizer(t, s, layout, a);
      }
  }
  // Writes the shard files of a (tp, pp) run at `step` into the temp dir and commits.
  std::string save_sharded(int tp, int pp, int64_t step, uint64_t seed, int keep = 0) {
    const std::string tmp = create_temp_step_dir(dir_, step);
    std::vector<FileRecord> files;
    write_positions(tmp, tp, pp, seed, files,
                    [&](int t, int s, const ParamLayout& layout, const Arenas& a) {
                      files.push_back(write_optimizer_shard(tmp, t, s, layout, a.m.data(), a.v.data()));
                    });
    CheckpointMeta meta = meta_at(step);
    meta.extra_files["config.json"] = hf_config(model_);
    return commit_step_dir(dir_, keep, files, {tp, pp, 2}, meta);
  }
  // Loads `step` into the layout of `part` (weights and moments) and checks every slice.
  void expect_loads(const std::string& step, const ModelPartition& part, uint64_t seed) {
    const ParamLayout layout = param_layout(model_, part);
    Arenas b(layout);
    b.set_all(5.0f);
    const CheckpointMeta meta = load_checkpoint(step, param_layout(model_), layout, b.p.data(),
                                                b.m.data(), b.v.data());
    EXPECT_EQ(meta.train_state, meta_at(meta.step).train_state);
    expect_slices(layout, b, seed);
  }
  nlohmann::json read_meta(const std::string& step) {
    return nlohmann::json::parse(slurp(step + "/meta.json"));
  }
};

}  // namespace pptrain::ckpt_test
