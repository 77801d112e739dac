// save_checkpoint / load_checkpoint: file layout, bit-exact round trip, pruning,
// `latest`, replacing a step, and saves that fail without harming older checkpoints.
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.hpp"
#include "fixture.hpp"

namespace pptrain::ckpt_test {
namespace {

TEST_F(CheckpointTest, WritesHuggingFaceLayout) {
  Arenas a(layout_);
  a.fill(1);
  const std::string step = save(layout_, a, 12);
  EXPECT_EQ(step, step_path(12));
  EXPECT_TRUE(fs::is_regular_file(fs::path(step) / "meta.json"));

  const auto model = SafetensorsFile::read(step + "/model.safetensors");
  EXPECT_EQ(model.shape("transformer.wte.weight"), (std::vector<int64_t>{100, 16}));  // not 128
  EXPECT_EQ(model.shape("transformer.h.1.attn.c_attn.weight"), (std::vector<int64_t>{16, 48}));
  EXPECT_EQ(model.metadata().at("format"), "pt");  // transformers requires it
  std::vector<std::string> names;
  for (const auto& e : layout_.entries()) names.push_back(e.name);
  EXPECT_EQ(model.names(), names);

  const auto optim = SafetensorsFile::read(step + "/optimizer.safetensors");
  EXPECT_EQ(optim.names().size(), 2 * names.size());
  EXPECT_EQ(optim.shape("transformer.wte.weight.exp_avg_sq"), (std::vector<int64_t>{100, 16}));
  EXPECT_TRUE(optim.contains("transformer.ln_f.bias.exp_avg"));

  const auto meta = nlohmann::json::parse(slurp(step + "/meta.json"));
  EXPECT_EQ(meta["format_version"], 1);
  EXPECT_EQ(meta["step"], 12);
  EXPECT_EQ(meta["config_yaml"], "model:\n  d_model: 16\n");
  EXPECT_EQ(meta["train_state"]["cursor"], 84);
  EXPECT_EQ(meta["files"]["model.safetensors"]["checksum"].get<std::string>().size(), 16u);
  EXPECT_EQ(meta["files"]["optimizer.safetensors"]["bytes"],
            fs::file_size(step + "/optimizer.safetensors"));
  EXPECT_EQ(slurp(dir_ + "/latest"), "step_00000012\n");
}

TEST_F(CheckpointTest, RoundTripIsBitExactAndZeroesPaddedRows) {
  Arenas a(layout_), b(layout_);
  a.fill(2);
  b.set_all(7.0f);
  const std::string step = save(layout_, a, 3);
  const CheckpointMeta meta = load_checkpoint(step, layout_, b.p.data(), b.m.data(), b.v.data());
  EXPECT_EQ(meta.step, 3);
  EXPECT_EQ(meta.config_yaml, meta_at(3).config_yaml);
  EXPECT_EQ(meta.train_state, meta_at(3).train_state);
  for (const auto& e : layout_.entries()) {
    for (auto [src, dst] : {std::pair{&a.p, &b.p}, {&a.m, &b.m}, {&a.v, &b.v}}) {
      EXPECT_EQ(std::memcmp(src->data() + e.offset, dst->data() + e.offset, e.hf_numel() * 4), 0)
          << e.name;
      for (std::size_t i = e.hf_numel(); i < e.numel; ++i)
        ASSERT_EQ((*dst)[e.offset + i], 0.0f) << e.name << " padded element " << i;
    }
  }
  const auto& wte = layout_.at("transformer.wte.weight");
  EXPECT_EQ(wte.numel - wte.hf_numel(), 28u * 16u);  // there were padded rows to zero
}

TEST_F(CheckpointTest, WeightsOnlyLoadDoesNotReadOptimizerFile) {
  Arenas a(layout_), b(layout_);
  a.fill(3);
  const std::string step = save(layout_, a, 1);
  fs::remove(step + "/optimizer.safetensors");
  load_checkpoint(step, layout_, b.p.data(), nullptr, nullptr);
  const auto& e = layout_.at("transformer.h.0.mlp.c_fc.weight");
  EXPECT_EQ(std::memcmp(a.p.data() + e.offset, b.p.data() + e.offset, e.numel * 4), 0);
  EXPECT_THROW(load_checkpoint(step, layout_, b.p.data(), b.m.data(), b.v.data()), InputError);
}

TEST_F(CheckpointTest, KeepPrunesOldestAndLatestNamesNewest) {
  Arenas a(layout_);
  a.fill(4);
  for (int s = 1; s <= 5; ++s) save(layout_, a, s * 10, /*keep=*/2);
  EXPECT_FALSE(fs::exists(step_path(30)));
  EXPECT_TRUE(fs::exists(step_path(40)));
  EXPECT_TRUE(fs::exists(step_path(50)));
  EXPECT_EQ(slurp(dir_ + "/latest"), "step_00000050\n");
  save(layout_, a, 45, 2);  // among the newest two: 40 goes
  EXPECT_FALSE(fs::exists(step_path(40)));
  // Saving an older step (a resumed run) keeps it even though it is not among the newest.
  save(layout_, a, 42, 2);
  EXPECT_TRUE(fs::exists(step_path(42)));
  EXPECT_EQ(slurp(dir_ + "/latest"), "step_00000042\n");
  // keep <= 0 keeps everything; no temp or renamed-away dirs linger.
  save(layout_, a, 60, 0);
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(dir_)) entries.push_back(e.path().filename());
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"latest", "step_00000042", "step_00000045",
                                               "step_00000050", "step_00000060"}));
}

TEST_F(CheckpointTest, SavingTheSameStepAgainReplacesIt) {
  Arenas a(layout_), b(layout_), c(layout_);
  a.fill(5);
  b.fill(6);
  save(layout_, a, 8);
  save(layout_, b, 8);
  load_checkpoint(step_path(8), layout_, c.p.data(), c.m.data(), c.v.data());
  const auto& e = layout_.at("transformer.wpe.weight");
  EXPECT_EQ(std::memcmp(b.v.data() + e.offset, c.v.data() + e.offset, e.numel * 4), 0);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 2);
}

TEST_F(CheckpointTest, HasCheckpoints) {
  EXPECT_FALSE(has_checkpoints(dir_));  // does not exist
  fs::create_directories(fs::path(dir_) / ".tmp_step_00000001");
  spit(dir_ + "/latest", "step_00000001\n");
  EXPECT_FALSE(has_checkpoints(dir_));  // no step dir
  Arenas a(layout_);
  save(layout_, a, 1);
  EXPECT_TRUE(has_checkpoints(dir_));
}

TEST_F(CheckpointTest, FailedSaveLeavesPreviousCheckpointIntact) {
  Arenas a(layout_), b(layout_), c(layout_);
  a.fill(7);
  b.fill(8);
  save(layout_, a, 1);
  for (int64_t step : {2, 1}) {  // a new step, then replacing the existing one
    FileSizeLimit limit(4096);   // the model file is ~40 KB
    try {
      save(layout_, b, step);
      ADD_FAILURE() << "save succeeded despite the file size limit";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(step_path(2)));
  EXPECT_FALSE(fs::exists(fs::path(dir_) / ".tmp_step_00000002"));
  EXPECT_EQ(slurp(dir_ + "/latest"), "step_00000001\n");
  EXPECT_EQ(resolve_resume(dir_, "auto"), step_path(1));
  load_checkpoint(step_path(1), layout_, c.p.data(), c.m.data(), c.v.data());
  const auto& e = layout_.at("transformer.h.1.mlp.c_proj.weight");
  EXPECT_EQ(std::memcmp(a.m.data() + e.offset, c.m.data() + e.offset, e.numel * 4), 0);
}

TEST_F(CheckpointTest, SaveIntoAFileFails) {
  fs::create_directories(root_);
  spit(dir_, "not a directory");
  Arenas a(layout_);
  EXPECT_THROW(save(layout_, a, 1), std::runtime_error);
}

}  // namespace
}  // namespace pptrain::ckpt_test
