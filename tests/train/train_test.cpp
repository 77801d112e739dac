// End-to-end trainer tests on tiny models: the loss falls, resume is bit-exact, eval
// reproduces the training run's validation loss.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "data/dataset.hpp"
#include "train/trainer.hpp"

namespace fs = std::filesystem;

namespace pptrain {
namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("pptrain_train_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

Config tiny(const fs::path& dir, int steps) {
  Config c;
  c.source_path = "test";
  c.model = {2, 2, 32, 16, 64};
  c.parallel.micro_batches = 2;
  c.parallel.micro_batch_size = 4;
  c.train.steps = steps;
  c.train.lr = 3e-3;
  c.train.min_lr = 3e-4;
  c.train.warmup_steps = 5;
  c.train.threads = 1;
  c.checkpoint.dir = (dir / "ckpt").string();
  c.logging.metrics = (dir / "metrics.jsonl").string();
  return c;
}

std::vector<nlohmann::json> read_metrics(const fs::path& path) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

TEST(Trainer, LossFallsWellBelowUniformGuess) {
  const fs::path dir = fresh_dir("loss");
  Config c = tiny(dir, 150);
  c.checkpoint.dir = "";
  const TrainResult r = train(c);
  EXPECT_EQ(r.steps_done, 150);
  const double uniform = std::log(double(c.model.vocab_size));
  const double floor = synthetic_entropy_nats(c.model);
  ASSERT_TRUE(r.last_val_loss.has_value());
  EXPECT_LT(r.last_loss, uniform - 1.0) << "entropy floor " << floor;
  EXPECT_LT(*r.last_val_loss, uniform - 1.0);
  EXPECT_GT(*r.last_val_loss, floor - 0.05);  // cannot beat the data's entropy
}

TEST(Trainer, ResumedRunIsBitIdentical) {
  const fs::path a = fresh_dir("resume_a"), b = fresh_dir("resume_b");
  Config whole = tiny(a, 12);
  whole.checkpoint.every = 6;
  train(whole);

  // The same run, interrupted after step 6: resume from a copy of that checkpoint.
  fs::create_directories(b / "ckpt");
  fs::copy(a / "ckpt" / "step_00000006", b / "ckpt" / "step_00000006",
           fs::copy_options::recursive);
  Config resumed = tiny(b, 12);
  resumed.checkpoint.every = 6;
  resumed.checkpoint.resume = (b / "ckpt" / "step_00000006").string();
  train(resumed);

  const auto ma = read_metrics(a / "metrics.jsonl"), mb = read_metrics(b / "metrics.jsonl");
  ASSERT_EQ(ma.size(), 12u);
  ASSERT_EQ(mb.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(mb[i]["step"], ma[6 + i]["step"]);
    EXPECT_EQ(mb[i]["loss"].get<double>(), ma[6 + i]["loss"].get<double>()) << "step " << 7 + i;
    EXPECT_EQ(mb[i]["grad_norm"].get<double>(), ma[6 + i]["grad_norm"].get<double>());
  }
  auto bytes = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes(a / "ckpt" / "step_00000012" / "model.safetensors"),
            bytes(b / "ckpt" / "step_00000012" / "model.safetensors"));
}

// The CPU backend's threads split rows, elements and column blocks, never a sum: the
// same run on 1 and on 3 threads gives the same bits. The shapes are big enough that
// every op takes its threaded path (several column blocks, several norm chunks).
TEST(Trainer, ThreadCountDoesNotChangeAnyBit) {
  for (const Attention attention : {Attention::Unfused, Attention::Fused}) {  // fused: blocked
    auto run = [&](int threads) {
      const fs::path dir =
          fresh_dir("threads_" + std::string(name_of(attention)) + std::to_string(threads));
      Config c = tiny(dir, 4);
      c.model = {2, 4, 192, 64, 256};
      c.train.threads = threads;
      c.train.attention = attention;
      train(c);
      return std::make_pair(read_metrics(dir / "metrics.jsonl"), dir);
    };
    const auto [one, dir1] = run(1);
    const auto [three, dir3] = run(3);
    ASSERT_EQ(one.size(), 4u);
    ASSERT_EQ(three.size(), 4u);
    for (std::size_t i = 0; i < one.size(); ++i) {
      EXPECT_EQ(one[i]["loss"].get<double>(), three[i]["loss"].get<double>())
          << name_of(attention) << " step " << i + 1;
      EXPECT_EQ(one[i]["grad_norm"].get<double>(), three[i]["grad_norm"].get<double>());
    }
    auto bytes = [](const fs::path& p) {
      std::ifstream in(p, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    EXPECT_EQ(bytes(dir1 / "ckpt" / "step_00000004" / "model.safetensors"),
              bytes(dir3 / "ckpt" / "step_00000004" / "model.safetensors"))
        << name_of(attention);
  }
}

TEST(Trainer, AutoResumeContinuesAnInterruptedRun) {
  const fs::path a = fresh_dir("auto_a"), b = fresh_dir("auto_b");
  Config whole = tiny(a, 8);
  train(whole);
  // A run that saved at step 4 and died before its step-8 checkpoint was complete:
  // the step-8 directory is gone and `latest` points at it; auto must fall back to 4.
  Config part = tiny(b, 8);
  part.checkpoint.every = 4;
  part.logging.metrics = "";
  train(part);
  fs::remove_all(b / "ckpt" / "step_00000008");
  std::ofstream(b / "ckpt" / "latest") << "step_00000008";
  Config resumed = part;
  resumed.checkpoint.resume = "auto";
  resumed.logging.metrics = (b / "metrics.jsonl").string();
  const TrainResult r = train(resumed);
  EXPECT_EQ(r.steps_done, 8);
  const auto ma = read_metrics(a / "metrics.jsonl"), mb = read_metrics(b / "metrics.jsonl");
  ASSERT_EQ(mb.size(), 4u);
  EXPECT_EQ(mb.back()["loss"].get<double>(), ma.back()["loss"].get<double>());
}

TEST(Trainer, FreshRunRefusesToOverwriteCheckpoints) {
  const fs::path dir = fresh_dir("overwrite");
  Config c = tiny(dir, 2);
  train(c);
  EXPECT_THROW(train(c), InputError);
  EXPECT_TRUE(fs::exists(dir / "ckpt" / "step_00000002" / "model.safetensors"));
}

TEST(Trainer, EvalReproducesTrainingValidationLoss) {
  const fs::path dir = fresh_dir("eval");
  Config c = tiny(dir, 10);
  const TrainResult r = train(c);
  ASSERT_TRUE(r.last_val_loss.has_value());
  Config e = c;
  e.checkpoint.resume = "auto";
  EXPECT_EQ(evaluate_checkpoint(e), *r.last_val_loss);
}

}  // namespace
}  // namespace pptrain
