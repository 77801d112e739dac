// Tests for lib/data: token file formats and their errors, deterministic training
// sequences, the synthetic chain and validation windows.
#include <gtest/gtest.h>

#include <algorithm>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "data/dataset.hpp"
#include "data/token_corpus.hpp"

namespace pptrain {
namespace {

namespace fs = std::filesystem;

// A fresh temp directory per test, removed afterwards.
class TokenFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() /
           ("pptrain_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    return path;
  }

  fs::path dir_;
};

void put_le(std::string& s, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
}

std::string uint16s(const std::vector<int32_t>& tokens) {
  std::string s;
  for (int32_t t : tokens) put_le(s, uint32_t(t), 2);
  return s;
}

std::string llmc_header(int32_t magic, int32_t version, int32_t count) {
  std::string s;
  put_le(s, uint32_t(magic), 4);
  put_le(s, uint32_t(version), 4);
  put_le(s, uint32_t(count), 4);
  s.resize(1024, '\0');
  return s;
}

std::string llmc(const std::vector<int32_t>& tokens) {
  return llmc_header(20240520, 1, int32_t(tokens.size())) + uint16s(tokens);
}

// Expects `fn` to throw an InputError whose message contains `path` and `reason`.
void expect_input_error(const std::function<void()>& fn, const std::string& path,
                        const std::string& reason) {
  try {
    fn();
    ADD_FAILURE() << "no InputError; expected one about " << reason;
  } catch (const InputError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(reason), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

ModelConfig model_with(int vocab, int seq_len) {
  ModelConfig m;
  m.vocab_size = vocab;
  m.seq_len = seq_len;
  return m;
}

DataConfig data_with(DataSource source, const std::string& path = "",
                     const std::string& val_path = "") {
  DataConfig d;
  d.source = source;
  if (!path.empty()) d.path = {path};
  if (!val_path.empty()) d.val_path = {val_path};
  return d;
}

std::vector<int32_t> seq(const TrainData& d, int64_t step, int64_t index) {
  std::vector<int32_t> out(std::size_t(d.seq_len()) + 1, -1);
  d.sequence(step, index, out.data());
  return out;
}

TEST_F(TokenFiles, ReadsEachFormat) {
  std::string text = "hello\n";
  text.push_back('\0');
  text.push_back(char(0xff));
  std::vector<int32_t> text_tokens = {'h', 'e', 'l', 'l', 'o', '\n', 0, 255};
  EXPECT_EQ(read_token_file(DataSource::Text, write("a.txt", text), 256), text_tokens);

  std::vector<int32_t> wide = {0, 1, 255, 256, 50256, 65535, 7};
  EXPECT_EQ(read_token_file(DataSource::Llmc, write("a.bin", llmc(wide)), 65536), wide);
  EXPECT_EQ(read_token_file(DataSource::NanoGpt, write("b.bin", uint16s(wide)), 65536), wide);
}

// A file that changes after it was opened and checked: truncated, or rewritten with a
// token out of range. Read on demand, the corpus names it (DataChanged, not SIGBUS).
TEST_F(TokenFiles, FileChangedUnderTheCorpusIsNamed) {
  std::vector<int32_t> ok(4000, 5);
  const std::string path = write("a.bin", llmc(ok));
  const TokenCorpus corpus = TokenCorpus::open(DataSource::Llmc, {path}, 256);
  std::vector<int32_t> out(100);
  corpus.copy(3900, 100, out.data());
  EXPECT_EQ(out, std::vector<int32_t>(100, 5));
  auto message = [&] {
    try {
      corpus.copy(3900, 100, out.data());
    } catch (const DataChanged& e) {
      return std::string(e.what());
    }
    return std::string("no DataChanged");
  };
  std::vector<int32_t> big = ok;
  big[3950] = 300;
  write("a.bin", llmc(big));  // same size, rewritten in place
  EXPECT_EQ(message(), path + ": changed during the run: token 300 at position 3950 is >= "
                              "model.vocab_size 256");
  fs::resize_file(path, 2048);
  EXPECT_EQ(message(), path + ": changed during the run: 2048 bytes now, 9024 when the run "
                              "opened it");
}

TEST_F(TokenFiles, BadFilesNameTheFileAndReason) {
  std::vector<int32_t> ok(40, 5);
  struct Case {
    DataSource source;
    std::string name, bytes, reason;
  };
  std::vector<int32_t> big = ok;
  big[17] = 300;
  std::vector<Case> cases = {
      {DataSource::Llmc, "magic.bin", llmc_header(123, 1, 40) + uint16s(ok),
       "bad magic 123 (expected 20240520 for an llm.c token shard)"},
      {DataSource::Llmc, "version.bin", llmc_header(20240520, 2, 40) + uint16s(ok), "version 2"},
      {DataSource::Llmc, "short.bin", llmc(ok).substr(0, 1024 + 79), "truncated"},
      {DataSource::Llmc, "trailing.bin", llmc(ok) + "xyz", "3 trailing bytes"},
      {DataSource::Llmc, "header.bin", std::string(100, 'x'), "too short for an llm.c token shard"},
      {DataSource::Llmc, "nothing.bin", llmc_header(20240520, 1, 0), "holds no tokens"},
      {DataSource::Llmc, "big.bin", llmc(big), "token 300 at position 17 is >= model.vocab_size 256"},
      {DataSource::NanoGpt, "odd.bin", uint16s(ok) + "x", "odd size 81 bytes"},
      {DataSource::NanoGpt, "big2.bin", uint16s(big), "token 300 at position 17 is >= model.vocab_size 256"},
      {DataSource::NanoGpt, "empty.bin", "", "empty"},
      {DataSource::Text, "empty.txt", "", "empty"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = write(c.name, c.bytes);
    expect_input_error([&] { read_token_file(c.source, path, 256); }, path, c.reason);
  }
  std::string missing = (dir_ / "missing.bin").string();
  expect_input_error([&] { read_token_file(DataSource::NanoGpt, missing, 256); }, missing,
                     "No such file or directory");
  expect_input_error([&] { read_token_file(DataSource::NanoGpt, dir_.string(), 256); }, dir_.string(),
                     "not a regular file");
  std::string txt = write("small_vocab.txt", "abc");
  expect_input_error([&] { read_token_file(DataSource::Text, txt, 100); }, txt, "model.vocab_size >= 256");
}

TEST_F(TokenFiles, TooShortForSeqLen) {
  std::string path = write("five.bin", uint16s({1, 2, 3, 4, 5}));
  expect_input_error([&] { TrainData::open(data_with(DataSource::NanoGpt, path), model_with(256, 8), 1); },
                     path, "holds 5 tokens, fewer than seq_len+1 = 9");
  expect_input_error(
      [&] { load_validation_tokens(data_with(DataSource::NanoGpt, path, path), model_with(256, 8), 1); },
      path, "holds 5 tokens, fewer than seq_len+1 = 9");
  // Exactly seq_len+1 tokens: the one window is the whole file.
  auto d = TrainData::open(data_with(DataSource::NanoGpt, path), model_with(256, 4), 1);
  EXPECT_EQ(seq(d, 3, 2), std::vector<int32_t>({1, 2, 3, 4, 5}));
}

TEST_F(TokenFiles, ConfigMistakes) {
  expect_input_error([] { TrainData::open(data_with(DataSource::Llmc), model_with(256, 8), 1); },
                     "data.path", "required");
  expect_input_error([] { TrainData::open(data_with(DataSource::Synthetic, "x"), model_with(256, 8), 1); },
                     "data.path", "synthetic");
  expect_input_error(
      [] { load_validation_tokens(data_with(DataSource::Synthetic, "", "v"), model_with(256, 8), 1); },
      "data.val_path", "synthetic");
}

// llm.c's layout: many shards, named by a glob or listed, read as their concatenation in
// sorted order: the same windows as one file holding all the tokens.
TEST_F(TokenFiles, ShardsAreTheirConcatenation) {
  std::vector<int32_t> all(3000);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = int32_t((i * 7) % 50000);
  const std::string one = write("all.bin", uint16s(all));
  std::vector<std::string> shards;
  for (int k = 0; k < 3; ++k) {  // 1000 tokens each, written out of order
    const int shard = (k + 1) % 3;
    std::vector<int32_t> part(all.begin() + shard * 1000, all.begin() + (shard + 1) * 1000);
    shards.push_back(write("fw_train_00000" + std::to_string(shard) + ".bin", llmc(part)));
  }
  const ModelConfig m = model_with(50000, 64);
  auto whole = TrainData::open(data_with(DataSource::NanoGpt, one), m, 9);
  DataConfig by_glob = data_with(DataSource::Llmc);
  by_glob.path = {(dir_ / "fw_train_*.bin").string()};
  DataConfig by_list = data_with(DataSource::Llmc);
  by_list.path = {(dir_ / "fw_train_000000.bin").string(), (dir_ / "fw_train_000001.bin").string(),
                  (dir_ / "fw_train_000002.bin").string()};
  auto globbed = TrainData::open(by_glob, m, 9), listed = TrainData::open(by_list, m, 9);
  EXPECT_EQ(globbed.num_tokens(), 3000u);
  EXPECT_NE(globbed.describe().find("3000 tokens in 3 files"), std::string::npos) << globbed.describe();
  bool spans_a_boundary = false;
  for (int64_t step = 0; step < 50; ++step)
    for (int64_t index = 0; index < 4; ++index) {
      const auto w = seq(whole, step, index);
      EXPECT_EQ(seq(globbed, step, index), w);
      EXPECT_EQ(seq(listed, step, index), w);
      const auto start = std::find(all.begin(), all.end(), w[0]) - all.begin();
      spans_a_boundary = spans_a_boundary || (start % 1000) > 1000 - 65;
    }
  EXPECT_TRUE(spans_a_boundary);  // some window crossed from one shard into the next
  by_glob.val_path = by_glob.path;
  EXPECT_EQ(load_validation_tokens(by_glob, m, 9), all);
  // A glob that matches nothing, and one bad shard among good ones, name the culprit.
  DataConfig none = data_with(DataSource::Llmc);
  none.path = {(dir_ / "nothing_*.bin").string()};
  expect_input_error([&] { TrainData::open(none, m, 9); }, none.path[0],
                     "data.path: the glob matches no file");
  const std::string bad = write("fw_train_000003.bin", llmc_header(7, 1, 2) + uint16s({1, 2}));
  expect_input_error([&] { TrainData::open(by_glob, m, 9); }, bad, "bad magic 7");
}

TEST_F(TokenFiles, FileSequencesAreDeterministicWindows) {
  std::vector<int32_t> tokens(5000);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i % 60000);
  std::string path = write("train.bin", llmc(tokens));
  const int seq_len = 16;
  auto a = TrainData::open(data_with(DataSource::Llmc, path), model_with(60000, seq_len), 42);
  auto b = TrainData::open(data_with(DataSource::Llmc, path), model_with(60000, seq_len), 42);
  auto other_seed = TrainData::open(data_with(DataSource::Llmc, path), model_with(60000, seq_len), 43);
  EXPECT_EQ(a.num_tokens(), 5000u);
  EXPECT_EQ(a.describe(), "llmc " + path + ": 5000 tokens in 1 file");
  std::set<int32_t> starts;
  int same_as_other_seed = 0;
  for (int64_t step = 0; step < 20; ++step) {
    for (int64_t index = 0; index < 8; ++index) {
      auto s = seq(a, step, index);
      EXPECT_EQ(s, seq(b, step, index));  // a resumed run reads the same
      for (int i = 0; i <= seq_len; ++i) ASSERT_EQ(s[i], s[0] + i);  // a contiguous window
      EXPECT_LE(s[0] + seq_len, 4999);
      starts.insert(s[0]);
      same_as_other_seed += s == seq(other_seed, step, index);
    }
  }
  EXPECT_GT(starts.size(), 150u);  // 160 draws from 4984 starts: nearly all distinct
  EXPECT_LT(same_as_other_seed, 3);
  EXPECT_NE(seq(a, 0, 0), seq(a, 1, 0));
  EXPECT_NE(seq(a, 0, 0), seq(a, 0, 1));
}

TEST_F(TokenFiles, ValidationFromFile) {
  std::vector<int32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5};
  std::string train = write("train.bin", uint16s(tokens));
  std::string val = write("val.bin", uint16s(tokens));
  EXPECT_EQ(load_validation_tokens(data_with(DataSource::NanoGpt, train, val), model_with(10, 4), 1), tokens);
  EXPECT_TRUE(load_validation_tokens(data_with(DataSource::NanoGpt, train), model_with(10, 4), 1).empty());
}

TEST(ValidationWindows, Arithmetic) {
  EXPECT_EQ(validation_windows(0, 4), 0);
  EXPECT_EQ(validation_windows(4, 4), 0);
  EXPECT_EQ(validation_windows(5, 4), 1);
  EXPECT_EQ(validation_windows(14, 4), 2);
  EXPECT_EQ(validation_windows(15, 4), 3);
  EXPECT_EQ(validation_windows(1000, 1), 500);
}

TEST(Synthetic, DeterministicAndKeyed) {
  auto model = model_with(256, 32);
  auto a = TrainData::open(data_with(DataSource::Synthetic), model, 7);
  auto b = TrainData::open(data_with(DataSource::Synthetic), model, 7);
  auto c = TrainData::open(data_with(DataSource::Synthetic), model, 8);
  EXPECT_TRUE(a.synthetic());
  EXPECT_EQ(a.num_tokens(), 0u);
  EXPECT_NE(a.describe().find("synthetic"), std::string::npos);
  for (int64_t step : {0, 1, 1000000}) {
    for (int64_t index : {0, 3}) {
      EXPECT_EQ(seq(a, step, index), seq(b, step, index));
      EXPECT_NE(seq(a, step, index), seq(c, step, index));
    }
  }
  EXPECT_NE(seq(a, 0, 0), seq(a, 1, 0));
  EXPECT_NE(seq(a, 0, 0), seq(a, 0, 1));
}

TEST(Synthetic, TokensInRangeForAnyVocab) {
  for (int vocab : {2, 3, 7, 50257}) {
    for (int seq_len : {1, 2, 64}) {
      SCOPED_TRACE("vocab " + std::to_string(vocab) + " seq_len " + std::to_string(seq_len));
      auto model = model_with(vocab, seq_len);
      auto d = TrainData::open(data_with(DataSource::Synthetic), model, 99);
      std::set<int32_t> seen;
      for (int64_t step = 0; step < 50; ++step) {
        auto s = seq(d, step, step % 3);
        ASSERT_EQ(s.size(), std::size_t(seq_len) + 1);
        for (int32_t t : s) {
          ASSERT_GE(t, 0);
          ASSERT_LT(t, vocab);
          seen.insert(t);
        }
      }
      if (vocab <= 7) {
        EXPECT_EQ(int(seen.size()), vocab);  // start tokens are uniform
      }
      auto val = load_validation_tokens(data_with(DataSource::Synthetic), model, 99);
      ASSERT_EQ(val.size(), std::size_t(64) * (seq_len + 1));
      for (int32_t t : val) ASSERT_TRUE(t >= 0 && t < vocab);
      EXPECT_LT(synthetic_entropy_nats(model), std::log(double(vocab)));
    }
  }
}

TEST(Synthetic, ValidationIsDeterministicAndHeldOut) {
  auto model = model_with(256, 32);
  const int window = model.seq_len + 1;
  auto val = load_validation_tokens(data_with(DataSource::Synthetic), model, 5);
  EXPECT_EQ(val, load_validation_tokens(data_with(DataSource::Synthetic), model, 5));
  EXPECT_NE(val, load_validation_tokens(data_with(DataSource::Synthetic), model, 6));
  ASSERT_EQ(validation_windows(val.size(), model.seq_len), 64);
  std::set<std::vector<int32_t>> train;
  auto d = TrainData::open(data_with(DataSource::Synthetic), model, 5);
  for (int64_t step = 0; step < 4; ++step) {
    for (int64_t index = 0; index < 64; ++index) train.insert(seq(d, step, index));
  }
  for (int w = 0; w < 64; ++w) {
    std::vector<int32_t> win(val.begin() + w * window, val.begin() + (w + 1) * window);
    EXPECT_EQ(train.count(win), 0u) << "window " << w;
  }
}

// The chain's structure is what a model can learn: every token has at most 4 successors,
// and the empirical next-token entropy matches the stated entropy, far below ln(vocab).
TEST(Synthetic, EntropyFarBelowUniform) {
  auto model = model_with(256, 64);
  auto d = TrainData::open(data_with(DataSource::Synthetic), model, 1234);
  std::map<int32_t, std::map<int32_t, int>> counts;
  int64_t total = 0;
  for (int64_t step = 0; step < 100; ++step) {
    for (int64_t index = 0; index < 8; ++index) {
      auto s = seq(d, step, index);
      for (int i = 0; i < model.seq_len; ++i) ++counts[s[i]][s[i + 1]];
      total += model.seq_len;
    }
  }
  double h = 0;
  for (const auto& [prev, next] : counts) {
    EXPECT_LE(next.size(), 4u) << "token " << prev;
    int n = 0;
    for (const auto& kv : next) n += kv.second;
    for (const auto& kv : next) h -= double(kv.second) / total * std::log(double(kv.second) / n);
  }
  const double stated = synthetic_entropy_nats(model);
  EXPECT_NEAR(stated, 1.208, 0.001);
  EXPECT_NEAR(h, stated, 0.05);
  EXPECT_LT(h, 0.3 * std::log(256.0));
  EXPECT_NEAR(synthetic_entropy_nats(model_with(2, 8)), 0.6365, 0.001);
  EXPECT_NEAR(synthetic_entropy_nats(model_with(3, 8)), 0.9810, 0.001);
}

}  // namespace
}  // namespace pptrain
