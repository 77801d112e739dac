// Tests for --set overrides, the to_yaml round trip, reading files, and that
// docs/config.md lists every key with its true default.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "config/config_detail.hpp"
#include "config_compare.hpp"
#include "core/error.hpp"

namespace pptrain {
namespace {

namespace fs = std::filesystem;

const char* kBase = "model:\n  n_layer: 4\ntrain:\n  steps: 10\n  lr: 0.01\n";

TEST(ConfigOverride, ReplacesExistingScalar) {
  Config c = parse_config(kBase, "b.yaml", {"model.n_layer=6", "train.lr=1e-3"});
  EXPECT_EQ(c.model.n_layer, 6);
  EXPECT_EQ(c.train.lr, 1e-3);
  EXPECT_EQ(c.train.steps, 10);  // siblings untouched
}

TEST(ConfigOverride, AddsMissingKeyAndMissingSection) {
  Config c = parse_config(kBase, "b.yaml",
                          {"train.warmup_steps=0", "checkpoint.resume=auto", "device=auto"});
  EXPECT_EQ(c.train.warmup_steps, 0);
  EXPECT_EQ(c.train.steps, 10);
  EXPECT_EQ(c.checkpoint.resume, "auto");
  EXPECT_EQ(c.checkpoint.keep, CheckpointConfig{}.keep);
  EXPECT_EQ(c.device, Device::Auto);
  EXPECT_EQ(c.model.n_layer, 4);
}

TEST(ConfigOverride, WorksOnEmptyFileAndEmptySection) {
  Config c = parse_config("", "e.yaml", {"model.n_layer=3"});
  EXPECT_EQ(c.model.n_layer, 3);
  c = parse_config("model:\n", "e.yaml", {"model.n_head=4"});
  EXPECT_EQ(c.model.n_head, 4);
}

TEST(ConfigOverride, ValueIsYaml) {
  Config c = parse_config(kBase, "b.yaml",
                          {"logging.trace_steps=[3,4]", "data.path='a b.bin'", "train.seed=7"});
  EXPECT_EQ(c.logging.trace_steps, (std::vector<int>{3, 4}));
  EXPECT_EQ(c.data.path, std::vector<std::string>{"a b.bin"});
  EXPECT_EQ(c.train.seed, 7u);
  c = parse_config("checkpoint:\n  resume: auto\n", "b.yaml", {"checkpoint.resume="});
  EXPECT_EQ(c.checkpoint.resume, "");  // an empty value clears a string
}

TEST(ConfigOverride, WholeSectionReplacesIt) {
  Config c = parse_config(kBase, "b.yaml", {"train={steps: 3}"});
  EXPECT_EQ(c.train.steps, 3);
  EXPECT_EQ(c.train.lr, TrainConfig{}.lr);  // the file's lr went with the old section
  EXPECT_EQ(c.model.n_layer, 4);
}

TEST(ConfigOverride, LaterOverrideWins) {
  Config c = parse_config(kBase, "b.yaml", {"train.steps=1", "train.steps=2"});
  EXPECT_EQ(c.train.steps, 2);
}

TEST(ConfigOverride, DoesNotWriteThroughYamlAlias) {
  Config c = parse_config("train:\n  lr: &x 0.01\n  min_lr: *x\n", "a.yaml", {"train.lr=0.02"});
  EXPECT_EQ(c.train.lr, 0.02);
  EXPECT_EQ(c.train.min_lr, 0.01);
}

Config non_default_config() {
  Config c;
  // Every model key off its default: a llama with grouped-query attention (6 query heads
  // on 3 key/value heads, tp 3 below).
  c.model = {5, 6, 96, 17, 50257, Arch::Llama, 3, 258, 500000.5, 1e-6, true};
  c.parallel.micro_batches = 8;
  c.parallel.micro_batch_size = 3;
  c.parallel.schedule = ScheduleKind::Interleaved;
  c.parallel.virtual_stages = 2;
  c.parallel.zero = 1;
  c.parallel.dp = 2;
  c.parallel.tp = 3;
  c.parallel.sequence_parallel = true;
  c.parallel.layers_per_stage.automatic = true;
  c.parallel.comm_timeout_s = 12.5;
  c.parallel.grad_bucket_mib = 0.1;
  c.train.memory_check = MemoryCheck::Warn;
  c.train.steps = 1234;
  c.train.lr = 0.1 + 0.2;  // 0.30000000000000004: needs all 17 digits
  c.train.min_lr = 1.0 / 3.0 * 1e-5;
  c.train.warmup_steps = 0;
  c.train.lr_schedule = LrSchedule::Constant;
  c.train.weight_decay = 0.0;
  c.train.grad_clip = 1e-300;
  c.train.beta1 = 0.1;
  c.train.beta2 = 0.9999999999999999;
  c.train.eps = 4.9e-324;  // smallest subnormal
  c.train.seed = 18446744073709551615ull;
  c.train.eval_every = 50;
  c.train.eval_batches = 9;
  c.train.threads = 3;
  c.train.precision = Precision::BF16;
  c.train.peak_tflops = 989.5;
  c.parallel.schedule_costs = {1, 1.07, 0.7000000000000001};
  c.parallel.message_mode = MessageModeChoice::Grouped;
  c.train.attention = Attention::Fused;
  c.data = {DataSource::Llmc, {"data/train: #1 \"x\".bin", "shard_*.bin"}, {"~"}};
  c.checkpoint = {"true", 100, 2, "123", "hf/gpt2"};
  c.logging = {7, "null", "", {0, 5, 10}, LogLevel::Warn};
  c.device = Device::Cuda;
  c.source_path = "rt.yaml";
  return c;
}

TEST(ConfigRoundTrip, ParseOfToYamlGivesSameConfig) {
  Config c = non_default_config();
  Config back = parse_config(to_yaml(c), "rt.yaml");
  expect_same_config(back, c);
  EXPECT_EQ(to_yaml(back), to_yaml(c));
}

TEST(ConfigRoundTrip, DefaultsRoundTripAndEveryKeyIsWritten) {
  Config defaults;
  defaults.source_path = "d.yaml";
  std::string text = to_yaml(defaults);
  expect_same_config(parse_config(text, "d.yaml"), defaults);
  for (const char* key : {"n_layer:", "micro_batch_size:", "eval_batches:", "val_path:",
                          "resume:", "trace_steps: []", "level:", "device: \"cpu\"",
                          "precision: \"auto\"", "peak_tflops: 0",
                          "attention: \"auto\""})
    EXPECT_NE(text.find(key), std::string::npos) << key << "\n" << text;
}

class ConfigFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("pptrain_config_test_" +
            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(ConfigFile, LoadsFileAndRecordsPath) {
  std::string path = (dir_ / "run.yaml").string();
  std::ofstream(path) << kBase;
  Config c = load_config(path, {"train.steps=11"});
  EXPECT_EQ(c.train.steps, 11);
  EXPECT_EQ(c.model.n_layer, 4);
  EXPECT_EQ(c.source_path, path);
}

TEST_F(ConfigFile, ErrorsNameTheFile) {
  std::string path = (dir_ / "bad.yaml").string();
  std::ofstream(path) << "model:\n  n_layer: 4\n  n_layers: 5\n";
  try {
    load_config(path);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ":3: unknown key 'model.n_layers' (did you mean 'model.n_layer'?)");
  }
}

// The encodings YAML 1.2 requires (section 5.2), detected from a byte-order mark: UTF-8,
// UTF-16 and UTF-32, either byte order. They read as the same config.
TEST_F(ConfigFile, UnicodeEncodingsWithAByteOrderMarkReadAlike) {
  const std::string text = "model:\n  n_layer: 3\ntrain:\n  lr: 2.0e-4\n";
  auto utf16 = [&](bool big) {
    std::string out = big ? "\xfe\xff" : "\xff\xfe";
    for (char ch : text) out += big ? std::string{'\0', ch} : std::string{ch, '\0'};
    return out;
  };
  std::string utf32 = "\xff\xfe";
  utf32 += std::string(2, '\0');
  for (char ch : text) utf32 += std::string{ch, '\0', '\0', '\0'};
  for (const std::string& bytes : {"\xef\xbb\xbf" + text, utf16(false), utf16(true), utf32}) {
    const std::string path = (dir_ / "enc.yaml").string();
    std::ofstream(path, std::ios::binary) << bytes;
    const Config c = load_config(path);
    EXPECT_EQ(c.model.n_layer, 3);
    EXPECT_EQ(c.train.lr, 2.0e-4);
  }
}

TEST_F(ConfigFile, SpecialFilesAndHugeFilesAreRefused) {
  const std::string fifo = (dir_ / "f.yaml").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    load_config(fifo);  // would block forever if it waited for a writer
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), fifo + ": not a regular file (a FIFO)");
  }
  const std::string big = (dir_ / "big.yaml").string();
  std::ofstream(big) << std::string(5u << 20, '#');
  EXPECT_THROW(load_config(big), InputError);
}

TEST_F(ConfigFile, MissingFileOrDirectory) {
  std::string missing = (dir_ / "nope.yaml").string();
  try {
    load_config(missing);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              missing + ": cannot open config file: No such file or directory");
  }
  EXPECT_THROW(load_config(dir_.string()), InputError);  // a directory is unreadable
}

// Every key to_yaml writes appears in docs/config.md as "| `section.key` | type | `default` |".
TEST(ConfigDocs, ListEveryKeyWithItsDefault) {
  std::ifstream in(std::string(PPTRAIN_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md missing";
  std::stringstream docs;
  docs << in.rdbuf();
  std::istringstream yaml(to_yaml(Config{}));
  std::string line, section;
  int keys = 0;
  while (std::getline(yaml, line)) {
    if (line.empty() || line.back() == ':') {  // "section:" opens a map
      section = line.substr(0, line.size() - (line.empty() ? 0 : 1));
      continue;
    }
    bool nested = line.starts_with("  ");
    std::string body = nested ? line.substr(2) : line;
    std::string key = body.substr(0, body.find(':'));
    std::string value = body.substr(body.find(':') + 2);
    if (value.size() > 2 && value.front() == '"') value = value.substr(1, value.size() - 2);
    std::string dotted = nested ? section + "." + key : key;
    std::string row = "| `" + dotted + "` |";
    auto at = docs.str().find(row);
    ASSERT_NE(at, std::string::npos) << "docs/config.md lacks " << dotted;
    std::string rest = docs.str().substr(at + row.size());
    rest = rest.substr(rest.find('|') + 1);  // skip the type column
    EXPECT_TRUE(rest.starts_with(" `" + value + "` |")) << dotted << " default should be `"
                                                        << value << "`";
    ++keys;
  }
  EXPECT_EQ(keys, 65);
}

std::string read_source_file(const std::string& relative) {
  std::ifstream in(std::string(PPTRAIN_SOURCE_DIR) + "/" + relative);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Each choice key's row in docs/config.md names every value of its enum's name table,
// and the fuzz dictionary holds every key and every name.
TEST(ConfigDocs, ChoiceNamesComeFromTheTables) {
  const std::string docs = read_source_file("docs/config.md");
  const std::string dict = read_source_file("fuzz/config.dict");
  int choice_keys = 0;
  for (const config_detail::Field& f : config_detail::fields()) {
    const std::string dotted = config_detail::dotted(f);
    EXPECT_NE(dict.find("\"" + std::string(f.key) + "\""), std::string::npos)
        << "fuzz/config.dict lacks " << f.key;
    Config c;
    const auto names = config_detail::choice_names(f.ref(c));
    if (names.empty()) continue;
    ++choice_keys;
    const auto at = docs.find("| `" + dotted + "` |");
    ASSERT_NE(at, std::string::npos) << dotted;
    const std::string row = docs.substr(at, docs.find('\n', at) - at);
    for (std::string_view name : names) {
      EXPECT_NE(row.find("`" + std::string(name) + "`"), std::string::npos)
          << "docs/config.md's row of " << dotted << " lacks `" << name << "`";
      EXPECT_NE(dict.find("\"" + std::string(name) + "\""), std::string::npos)
          << "fuzz/config.dict lacks " << name;
    }
  }
  EXPECT_EQ(choice_keys, 13);
}

TEST(ConfigDocs, ExampleIsValid) {
  std::ifstream in(std::string(PPTRAIN_SOURCE_DIR) + "/docs/config.md");
  std::stringstream docs;
  docs << in.rdbuf();
  std::string text = docs.str();
  auto start = text.find("```yaml\n");
  ASSERT_NE(start, std::string::npos);
  start += 8;
  std::string example = text.substr(start, text.find("```", start) - start);
  Config c = parse_config(example, "example.yaml");
  EXPECT_EQ(c.data.source, DataSource::Text);
  EXPECT_EQ(c.logging.trace_steps, (std::vector<int>{10, 11}));
}

}  // namespace
}  // namespace pptrain
