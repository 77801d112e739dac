// Sharded checkpoints (format_version 2) saved in-process by fake tp/pp shards: the
// files and meta.json written, and loading into the whole model, the same layout and
// differently split layouts, from sharded and from single-file checkpoints.
#include "sharded_fixture.hpp"

namespace pptrain::ckpt_test {
namespace {

TEST_F(ShardedTest, WritesLocalSlicesUnderGlobalNamesAndMeta) {
  const std::string step = save_sharded(2, 2, 7, 1);
  EXPECT_EQ(step, step_path(7));
  EXPECT_EQ(slurp(dir_ + "/latest"), "step_00000007\n");
  EXPECT_FALSE(fs::exists(temp_step_dir(dir_, 7)));
  EXPECT_TRUE(fs::is_regular_file(step + "/config.json"));

  const auto meta = read_meta(step);
  EXPECT_EQ(meta["format_version"], 2);
  EXPECT_EQ(meta["layout"], (nlohmann::json{{"tp", 2}, {"pp", 2}, {"dp", 2}}));
  EXPECT_EQ(meta["step"], 7);
  EXPECT_EQ(meta["files"].size(), 8u);
  for (const auto& [name, rec] : meta["files"].items()) {
    EXPECT_EQ(rec["bytes"], fs::file_size(step + "/" + name)) << name;
    EXPECT_EQ(rec["checksum"].get<std::string>().size(), 16u);
  }

  // The first stage of tp rank 1: the vocab-parallel wte (128 of 256 padded rows) and
  // layer 0's slices; its slicing is recorded per tensor.
  const auto first = SafetensorsFile::read(step + "/model-tp1-pp0.safetensors");
  EXPECT_EQ(first.shape("transformer.wte.weight"), (std::vector<int64_t>{128, 16}));
  EXPECT_EQ(first.shape("transformer.h.0.attn.c_attn.weight"), (std::vector<int64_t>{16, 24}));
  EXPECT_FALSE(first.contains("transformer.h.1.ln_1.weight"));
  EXPECT_EQ(first.metadata().at("format"), "pt");
  const auto slicing = nlohmann::json::parse(first.metadata().at(kSlicingMetadataKey));
  EXPECT_EQ(slicing["transformer.h.0.attn.c_attn.weight"],
            (nlohmann::json{{"global_shape", {16, 48}}, {"split_dim", 1}, {"split_groups", 3},
                            {"shard", 1}, {"num_shards", 2}}));
  EXPECT_EQ(slicing["transformer.wte.weight"]["global_shape"], (nlohmann::json{100, 16}));
  EXPECT_EQ(slicing["transformer.wpe.weight"]["split_dim"], -1);
  // The last stage leaves out its tied copy of wte.
  const auto last = SafetensorsFile::read(step + "/model-tp0-pp1.safetensors");
  EXPECT_FALSE(last.contains("transformer.wte.weight"));
  EXPECT_TRUE(last.contains("transformer.ln_f.bias"));
  const auto optim = SafetensorsFile::read(step + "/optimizer-tp0-pp1.safetensors");
  EXPECT_EQ(optim.names().size(), 2 * last.names().size());
  EXPECT_EQ(optim.shape("transformer.h.1.mlp.c_fc.weight.exp_avg_sq"),
            (std::vector<int64_t>{16, 32}));
}

TEST_F(ShardedTest, LoadsIntoTheWholeModelAndAnyLayout) {
  const std::string step = save_sharded(2, 2, 3, 2);
  EXPECT_EQ(resolve_resume(dir_, "auto"), step);
  // The whole model on one rank (the plain overload), vocab padding zeroed.
  Arenas whole(layout_);
  whole.set_all(9.0f);
  EXPECT_EQ(load_checkpoint(step, layout_, whole.p.data(), whole.m.data(), whole.v.data()).step, 3);
  expect_slices(layout_, whole, 2);
  // The same layout, each position (the last stage's tied wte from the first stage).
  for (int s = 0; s < 2; ++s)
    for (int t = 0; t < 2; ++t) expect_loads(step, partition(model_, 2, s, 2, t), 2);
  // Split differently: tp 2 with no pipeline; pp 2 with no tensor parallelism.
  expect_loads(step, partition(model_, 1, 0, 2, 1), 2);
  expect_loads(step, partition(model_, 2, 1, 1, 0), 2);
  // Weights only.
  const ParamLayout l = param_layout(model_, partition(model_, 1, 0, 2, 0));
  Arenas b(l);
  load_checkpoint(step, layout_, l, b.p.data(), nullptr, nullptr);
  expect_slices(l, b, 2, /*moments=*/false);
}

TEST_F(ShardedTest, ReshardsBetweenTensorParallelSizes) {
  // Saved with tp 1 (wte whole but padded to 128 rows) and pp 2, loaded at tp 2.
  const std::string step = save_sharded(1, 2, 4, 3);
  expect_loads(step, partition(model_, 1, 0, 2, 0), 3);
  expect_loads(step, partition(model_, 2, 1, 2, 1), 3);
  expect_loads(step, whole_model(model_), 3);
}

TEST_F(ShardedTest, SingleFileCheckpointsLoadIntoSplitLayouts) {
  Arenas a(layout_);
  fill_slices(layout_, a, 4);
  const std::string step = save(layout_, a, 6);
  EXPECT_EQ(read_meta(step)["format_version"], 1);
  for (int s = 0; s < 2; ++s)
    for (int t = 0; t < 2; ++t) expect_loads(step, partition(model_, 2, s, 2, t), 4);
}

TEST_F(ShardedTest, CommitReplacesAStepAndPrunes) {
  save_sharded(2, 1, 10, 5, 2);
  Arenas a(layout_);
  fill_slices(layout_, a, 5);
  save(layout_, a, 20, 2);  // formats mix in one dir
  save_sharded(1, 2, 30, 6, 2);
  EXPECT_FALSE(fs::exists(step_path(10)));
  save_sharded(2, 2, 30, 7, 2);  // the same step again
  EXPECT_EQ(resolve_resume(dir_, "auto"), step_path(30));
  expect_loads(step_path(30), whole_model(model_), 7);
  EXPECT_EQ(read_meta(step_path(30))["layout"]["tp"], 2);
  EXPECT_TRUE(fs::exists(step_path(30) + "/model-tp1-pp1.safetensors"));
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(dir_)) entries.push_back(e.path().filename());
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"latest", "step_00000020", "step_00000030"}));
}

}  // namespace
}  // namespace pptrain::ckpt_test
