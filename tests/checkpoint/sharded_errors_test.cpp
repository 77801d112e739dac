// Sharded checkpoints that are damaged, incomplete or of another model: each an
// InputError naming the file (or dir) and the reason; failed saves leave nothing.
#include "checkpoint/file_io.hpp"
#include "checkpoint/safetensors.hpp"
#include "sharded_fixture.hpp"

namespace pptrain::ckpt_test {
namespace {

void load_whole(const ParamLayout& layout, const std::string& step) {
  Arenas b(layout);
  load_checkpoint(step, layout, b.p.data(), b.m.data(), b.v.data());
}

TEST_F(ShardedTest, CorruptShardsAreCaught) {
  save_sharded(2, 2, 1, 1);
  const std::string step = save_sharded(2, 2, 2, 2);
  const std::string optim = step + "/optimizer-tp1-pp1.safetensors";
  flip_byte(optim, fs::file_size(optim) - 3);
  expect_input_error([&] { load_whole(layout_, step); }, optim, "checksum mismatch");
  expect_input_error([&] { resolve_resume(dir_, step); }, optim, "checksum mismatch");
  EXPECT_EQ(resolve_resume(dir_, "auto"), step_path(1));
  // A layout that reads none of the damaged file still loads (only files read are
  // verified; resolve_resume verifies them all).
  expect_loads(step, partition(model_, 2, 0, 2, 0), 2);
  // A header edit that still parses is reported as corruption, not as a model mismatch.
  const std::string model = step + "/model-tp0-pp1.safetensors";
  std::string bytes = slurp(model);
  const auto at = bytes.find("[16,16]");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 7, "[16,32]");
  spit(model, bytes);
  expect_input_error([&] { load_whole(layout_, step); }, model, "checksum mismatch");
}

TEST_F(ShardedTest, MissingShardsAreInputErrors) {
  std::string step = save_sharded(2, 2, 1, 1);
  const std::string lost = step + "/model-tp1-pp0.safetensors";
  fs::remove(lost);
  expect_input_error([&] { load_whole(layout_, step); }, lost, "cannot open");
  EXPECT_EQ(resolve_resume(dir_, "auto"), "");

  // Left out of meta.json as well.
  step = save_sharded(2, 2, 2, 1);
  auto j = read_meta(step);
  j["files"].erase("model-tp1-pp0.safetensors");
  write_meta(step, j.dump());
  expect_input_error([&] { load_whole(layout_, step); }, step + "/meta.json",
                     "model-tp1-pp0.safetensors is not listed");
  // A layout claiming fewer shards than its files' slicing needs.
  step = save_sharded(2, 1, 3, 1);
  j = read_meta(step);
  j["layout"]["tp"] = 1;
  j["files"].erase("model-tp1-pp0.safetensors");
  j["files"].erase("optimizer-tp1-pp0.safetensors");
  write_meta(step, j.dump());
  expect_input_error([&] { load_whole(layout_, step); }, step, "shard 1 of 2 is missing");
  // Files that are no shard of the layout are refused, not followed.
  j = read_meta(save_sharded(1, 1, 4, 1));
  j["files"]["../../model-tp0-pp0.safetensors"] = j["files"]["model-tp0-pp0.safetensors"];
  write_meta(step_path(4), j.dump());
  expect_input_error([&] { load_whole(layout_, step_path(4)); }, step_path(4) + "/meta.json",
                     "which is no shard of its layout");
}

// A tp=1 pp=1 sharded checkpoint whose model file carries `slicing` as its record.
std::string save_with_slicing(const std::string& dir, const ParamLayout& layout, const Arenas& a,
                              const std::optional<nlohmann::json>& slicing,
                              const CheckpointMeta& step_meta) {
  const std::string tmp = create_temp_step_dir(dir, 1);
  std::vector<TensorView> tensors;
  for (const auto& e : layout.entries())
    tensors.push_back({e.name, e.shape, a.p.data() + e.offset});
  std::map<std::string, std::string> meta{{"format", "pt"}};
  if (slicing) meta[kSlicingMetadataKey] = slicing->dump();
  const auto w = ckpt::write_safetensors_durable(tmp + "/model-tp0-pp0.safetensors", tensors, meta);
  std::vector<FileRecord> files{{"model-tp0-pp0.safetensors", w.bytes, w.checksum},
                                write_optimizer_shard(tmp, 0, 0, layout, a.m.data(), a.v.data())};
  return commit_step_dir(dir, 0, files, {1, 1, 1}, step_meta);
}

TEST_F(ShardedTest, BadSlicingRecordsAreInputErrors) {
  Arenas a(layout_);
  fill_slices(layout_, a, 3);
  std::string step = save_with_slicing(dir_, layout_, a, std::nullopt, meta_at(1));
  const std::string file = step + "/model-tp0-pp0.safetensors";
  expect_input_error([&] { load_whole(layout_, step); }, file, "no pptrain.slicing record");

  const auto optim = SafetensorsFile::read(step + "/optimizer-tp0-pp0.safetensors");
  const auto good = nlohmann::json::parse(optim.metadata().at(kSlicingMetadataKey));
  nlohmann::json slicing;
  for (const auto& e : layout_.entries()) slicing[e.name] = good[e.name + ".exp_avg"];
  auto with = [&](const std::string& name, const nlohmann::json& record) {
    nlohmann::json s = slicing;
    if (record.is_null()) s.erase(name); else s[name] = record;
    fs::remove_all(step);
    return save_with_slicing(dir_, layout_, a, s, meta_at(1));
  };
  step = with("transformer.wpe.weight", nullptr);
  expect_input_error([&] { load_whole(layout_, step); }, file,
                     "tensor transformer.wpe.weight has no slicing record");
  step = with("transformer.wpe.weight", {{"global_shape", {16, 16}}, {"split_dim", 0},
                                         {"split_groups", 1}, {"shard", 0}, {"num_shards", 1}});
  expect_input_error([&] { load_whole(layout_, step); }, file, "do not tile");
  step = with("transformer.wpe.weight", {{"global_shape", {8, 16}}, {"split_dim", 0}});
  expect_input_error([&] { load_whole(layout_, step); }, file, "no valid split_groups");
  // The sound record loads.
  step = with("transformer.wpe.weight", slicing["transformer.wpe.weight"]);
  expect_loads(step, whole_model(model_), 3);
}

TEST_F(ShardedTest, OtherModelsAreInputErrorsAndLeaveArenasAlone) {
  const std::string step = save_sharded(2, 2, 1, 1);
  const ParamLayout one_layer = param_layout(small_model(16, 1));
  expect_input_error([&] { load_whole(one_layer, step); }, step + "/model-tp",
                     "unexpected tensor transformer.h.1.");
  const ParamLayout wide = param_layout(small_model(32));
  Arenas b(wide);
  b.set_all(3.0f);
  expect_input_error([&] { load_checkpoint(step, wide, b.p.data(), b.m.data(), b.v.data()); },
                     step + "/model-tp",
                     "transformer.wte.weight has shape [100, 16], expected [100, 32]");
  for (std::size_t i = 0; i < b.p.size(); ++i) ASSERT_EQ(b.p[i], 3.0f) << i;
}

TEST_F(ShardedTest, FailedShardWritesLeaveThePreviousCheckpoint) {
  save_sharded(2, 1, 1, 1);
  const std::string tmp = create_temp_step_dir(dir_, 2);
  const ParamLayout layout = param_layout(model_, partition(model_, 1, 0, 2, 1));
  Arenas a(layout);
  {
    FileSizeLimit limit(4096);  // the shard is ~20 KB
    try {
      write_model_shard(tmp, 1, 0, layout, a.p.data());
      ADD_FAILURE() << "write succeeded despite the file size limit";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("model-tp1-pp0.safetensors"), std::string::npos);
    }
  }
  EXPECT_FALSE(fs::exists(tmp + "/model-tp1-pp0.safetensors"));
  discard_temp_step_dir(dir_, 2);
  EXPECT_FALSE(fs::exists(tmp));
  // A commit listing a file no writer left there fails and removes the temp dir.
  create_temp_step_dir(dir_, 2);
  const FileRecord written = write_model_shard(tmp, 0, 0, layout, a.p.data());
  try {
    commit_step_dir(dir_, 0, {written, {"model-tp1-pp0.safetensors", 10, 0}}, {2, 1, 1},
                    meta_at(2));
    ADD_FAILURE() << "commit succeeded without every file";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("model-tp1-pp0.safetensors is missing"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_FALSE(fs::exists(step_path(2)));
  EXPECT_EQ(slurp(dir_ + "/latest"), "step_00000001\n");
  EXPECT_EQ(resolve_resume(dir_, "auto"), step_path(1));
}

}  // namespace
}  // namespace pptrain::ckpt_test
