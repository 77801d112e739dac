// resolve_resume ("", "auto", explicit paths) and every way a checkpoint can be
// corrupt or mismatched, each an InputError naming the file and the reason.
#include <nlohmann/json.hpp>

#include "checkpoint/dir_lock.hpp"
#include "fixture.hpp"

namespace pptrain::ckpt_test {
namespace {

TEST_F(CheckpointTest, ResolveEmptyAndAutoWithoutCheckpoints) {
  EXPECT_EQ(resolve_resume(dir_, ""), "");
  EXPECT_EQ(resolve_resume(dir_, "auto"), "");  // dir does not exist
  fs::create_directories(dir_);
  EXPECT_EQ(resolve_resume(dir_, "auto"), "");  // empty dir
}

TEST_F(CheckpointTest, ResolveAutoAndExplicitPaths) {
  Arenas a(layout_);
  a.fill(1);
  save(layout_, a, 5);
  save(layout_, a, 9);
  EXPECT_EQ(resolve_resume(dir_, "auto"), step_path(9));
  EXPECT_EQ(resolve_resume(dir_, step_path(5)), step_path(5));        // a step dir
  EXPECT_EQ(resolve_resume(dir_, step_path(5) + "/"), step_path(5));  // trailing slash
  EXPECT_EQ(resolve_resume("elsewhere", dir_), step_path(9));         // a root: follows latest
  // `latest` is authoritative even when a higher step exists.
  spit(dir_ + "/latest", "step_00000005\n");
  EXPECT_EQ(resolve_resume(dir_, "auto"), step_path(5));
  EXPECT_EQ(resolve_resume(dir_, dir_), step_path(5));
}

TEST_F(CheckpointTest, ResolveAutoSkipsInvalidCheckpoints) {
  Arenas a(layout_);
  a.fill(2);
  save(layout_, a, 1);
  save(layout_, a, 2);
  save(layout_, a, 3);
  // The newest is corrupt: auto falls back to the next one.
  flip_byte(step_path(3) + "/optimizer.safetensors",
            fs::file_size(step_path(3) + "/optimizer.safetensors") - 3);
  EXPECT_EQ(resolve_resume(dir_, "auto"), step_path(2));
  // Without a (valid) latest, step dirs are scanned newest first.
  fs::remove(dir_ + "/latest");
  EXPECT_EQ(resolve_resume(dir_, "auto"), step_path(2));
  spit(dir_ + "/latest", "../../etc\n");
  EXPECT_EQ(resolve_resume(dir_, "auto"), step_path(2));
  fs::remove(step_path(2) + "/meta.json");
  EXPECT_EQ(resolve_resume(dir_, "auto"), step_path(1));
  fs::remove_all(step_path(1));
  EXPECT_EQ(resolve_resume(dir_, "auto"), "");
}

TEST_F(CheckpointTest, ResolveExplicitInvalidPathsAreInputErrors) {
  const std::string nowhere = (root_ / "nowhere").string();
  expect_input_error([&] { resolve_resume(dir_, nowhere); }, nowhere, "no such checkpoint");
  fs::create_directories(root_ / "plain");
  const std::string plain = (root_ / "plain").string();
  expect_input_error([&] { resolve_resume(dir_, plain); }, plain, "not a checkpoint");
  Arenas a(layout_);
  save(layout_, a, 4);
  flip_byte(step_path(4) + "/model.safetensors",
            fs::file_size(step_path(4) + "/model.safetensors") - 5);
  expect_input_error([&] { resolve_resume(dir_, step_path(4)); }, step_path(4), "checksum");
  expect_input_error([&] { resolve_resume("", dir_); }, step_path(4), "checksum");
  spit(dir_ + "/latest", "garbage\n");
  expect_input_error([&] { resolve_resume("", dir_); }, dir_ + "/latest", "step_<N>");
}

// Loads step `s` into fresh arenas.
void load_into(const ParamLayout& layout, const std::string& step) {
  Arenas b(layout);
  load_checkpoint(step, layout, b.p.data(), b.m.data(), b.v.data());
}

TEST_F(CheckpointTest, CorruptFilesAreInputErrors) {
  Arenas a(layout_);
  a.fill(3);
  const std::string s = save(layout_, a, 1, 0);
  auto fresh = [&] {  // rewrite the checkpoint after each corruption
    fs::remove_all(s);
    save(layout_, a, 1, 0);
  };
  auto load = [&] { load_into(layout_, s); };
  const std::string model = s + "/model.safetensors", optim = s + "/optimizer.safetensors";
  const std::string meta = s + "/meta.json";

  flip_byte(model, fs::file_size(model) - 1);
  expect_input_error(load, model, "checksum mismatch");
  fresh();
  fs::resize_file(model, fs::file_size(model) - 10);
  expect_input_error(load, model, "truncated");
  fresh();
  fs::resize_file(optim, 5);
  expect_input_error(load, optim, "too short");
  fresh();
  fs::remove(meta);
  expect_input_error(load, meta, "cannot open");
  fresh();
  write_meta(s, "{\"format_version\": 1,");
  expect_input_error(load, meta, "not valid JSON");
  fresh();
  auto j = nlohmann::json::parse(slurp(meta));
  j["format_version"] = 3;
  write_meta(s, j.dump());
  expect_input_error(load, meta, "format_version 3 is not supported");
  fresh();
  j = nlohmann::json::parse(slurp(meta));
  j["files"].erase("optimizer.safetensors");
  write_meta(s, j.dump());
  expect_input_error(load, meta, "no size and checksum recorded for optimizer.safetensors");
  fresh();
  // meta.json is sealed by meta.sum: an edit, or a lost seal, makes the checkpoint invalid.
  j = nlohmann::json::parse(slurp(meta));
  j["step"] = 2;
  spit(meta, j.dump());
  expect_input_error(load, meta, "does not match its checksum in meta.sum");
  write_meta(s, j.dump());  // even sealed, the step must be the directory's
  expect_input_error(load, meta, "step 2 disagrees with the directory name step_00000001");
  fresh();
  fs::remove(s + "/meta.sum");
  expect_input_error(load, s + "/meta.sum", "cannot open");
  fresh();
  fs::remove(model);
  expect_input_error(load, model, "cannot open");
  expect_input_error([&] { load_into(layout_, dir_ + "/step_00000077"); }, "step_00000077",
                     "no such checkpoint directory");
}

TEST_F(CheckpointTest, MismatchedModelsAreInputErrorsAndLeaveArenasAlone) {
  // A checkpoint lacking one tensor (saved with a layout without it).
  ParamLayout partial;
  for (const auto& e : layout_.entries())
    if (e.name != "transformer.h.1.ln_2.bias") partial.add(e.name, e.shape, e.decay, e.hf_shape);
  Arenas a(partial), b(layout_);
  a.fill(4);
  b.set_all(3.0f);
  const std::string s = save(partial, a, 1);
  expect_input_error([&] { load_checkpoint(s, layout_, b.p.data(), b.m.data(), b.v.data()); },
                     s + "/model.safetensors", "tensor transformer.h.1.ln_2.bias is missing");
  for (std::size_t i = 0; i < b.p.size(); ++i) ASSERT_EQ(b.p[i], 3.0f) << i;  // untouched

  // Loading into a model with fewer layers finds tensors it does not expect.
  const ParamLayout one_layer = param_layout(small_model(16, 1));
  Arenas full(layout_);
  full.fill(5);
  const std::string t = save(layout_, full, 2);
  expect_input_error([&] { load_into(one_layer, t); }, t + "/model.safetensors",
                     "unexpected tensor transformer.h.1.");

  // A different d_model: the first tensor already has the wrong shape.
  const ParamLayout wide = param_layout(small_model(32));
  expect_input_error([&] { load_into(wide, t); }, t + "/model.safetensors",
                     "transformer.wte.weight has shape [100, 16], expected [100, 32]");
}

}  // namespace
// One run per directory: a second lock is refused naming the holder, and the lock goes
// with its holder. flock locks belong to an open file, so one process can play both runs.
TEST_F(CheckpointTest, DirLockIsExclusiveAndNamesTheHolder) {
  {
    const CheckpointDirLock first(dir_);
    EXPECT_TRUE(fs::is_directory(dir_));
    expect_input_error([&] { CheckpointDirLock second(dir_); }, dir_,
                       "in use by another run (host ");
    expect_input_error([&] { CheckpointDirLock second(dir_); }, dir_,
                       ", pid " + std::to_string(::getpid()) + ")");
  }
  EXPECT_NO_THROW(CheckpointDirLock again(dir_));
  fs::create_directories(fs::path(dir_) / "latest");
  expect_input_error([&] { CheckpointDirLock odd(dir_); }, dir_, "latest is a directory");
}

}  // namespace pptrain::ckpt_test
