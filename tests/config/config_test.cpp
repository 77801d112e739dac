// Tests for the YAML config loader: a table of bad configs (message and line), good
// decoding, defaults, --set overrides, to_yaml round trip and file errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "config_compare.hpp"
#include "core/error.hpp"

namespace pptrain {
namespace {

// The InputError message of parse_config, or "" when it succeeds.
std::string error_of(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  try {
    parse_config(yaml, "x.yaml", sets);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

struct BadCase {
  const char* name;
  const char* yaml;
  std::vector<std::string> sets;
  const char* where;    // expected location: "x.yaml:LINE", "x.yaml" or "--set ..."
  const char* message;  // expected substring after the location
};

const BadCase kBadCases[] = {
    // Syntax and shape.
    {"syntax", "model:\n  n_layer: 2\n  n_head: : 3\n", {}, "x.yaml:3", "YAML syntax error"},
    {"syntax_eof", "model:\n  n_layer: [1, 2\n", {}, "x.yaml:3", "YAML syntax error"},
    {"top_list", "- 1\n- 2\n", {}, "x.yaml:1", "top level must be a map"},
    {"two_docs", "model: {}\n---\ntrain: {}\n", {}, "x.yaml:3", "only one YAML document"},
    {"section_scalar", "model: {}\ntrain: 5\n", {}, "x.yaml:2",
     "train: expected a map of keys, got '5'"},
    // Unknown and duplicate keys.
    {"unknown_key", "model:\n  n_layers: 4\n", {}, "x.yaml:2",
     "unknown key 'model.n_layers' (did you mean 'model.n_layer'?)"},
    {"unknown_section", "model: {}\ntrian:\n  lr: 0.1\n", {}, "x.yaml:2",
     "unknown key 'trian' (did you mean 'train'?)"},
    {"wrong_section", "model:\n  lr: 0.1\n", {}, "x.yaml:2",
     "unknown key 'model.lr' (did you mean 'train.lr'?)"},
    {"unknown_far", "zzzzzz: 1\n", {}, "x.yaml:1", "unknown key 'zzzzzz'"},
    {"duplicate", "train:\n  lr: 0.1\n  lr: 0.2\n", {}, "x.yaml:3", "train.lr: duplicate key"},
    // Wrong types.
    {"int_word", "train:\n  steps: abc\n", {}, "x.yaml:2",
     "train.steps: expected an integer, got 'abc'"},
    {"int_float", "model:\n  n_layer: 2.5\n", {}, "x.yaml:2", "expected an integer, got '2.5'"},
    {"int_bool", "train:\n  steps: true\n", {}, "x.yaml:2", "expected an integer, got 'true'"},
    {"int_quoted", "train:\n  steps: \"5\"\n", {}, "x.yaml:2",
     "expected an integer, got quoted string '5'"},
    {"int_empty", "train:\n  steps:\n  lr: 0.1\n", {}, "x.yaml:2", "got an empty value"},
    {"int_range", "train:\n  steps: 99999999999\n", {}, "x.yaml:2", "out of range"},
    {"layers_word", "parallel:\n  layers_per_stage: even\n", {}, "x.yaml:2",
     "parallel.layers_per_stage: expected a list of integers or auto, got 'even'"},
    {"bool_word", "parallel:\n  tp: 2\n  sequence_parallel: yes\n", {}, "x.yaml:3",
     "parallel.sequence_parallel: expected true or false, got 'yes'"},
    {"bool_number", "parallel:\n  tp: 2\n  sequence_parallel: 1\n", {}, "x.yaml:3",
     "expected true or false, got '1'"},
    {"bool_quoted", "parallel:\n  tp: 2\n  sequence_parallel: \"true\"\n", {}, "x.yaml:3",
     "expected true or false, got quoted string 'true'"},
    {"sp_without_tp", "parallel:\n  sequence_parallel: true\n", {}, "x.yaml:2",
     "parallel.sequence_parallel: true needs parallel.tp > 1"},
    {"sp_rows", "model:\n  n_head: 4\n  seq_len: 5\nparallel:\n  tp: 4\n  micro_batch_size: 1\n"
     "  sequence_parallel: true\n", {}, "x.yaml:7",
     "true needs micro_batch_size * model.seq_len divisible by parallel.tp (got 1 * 5 token rows, tp=4)"},
    {"seed_negative", "train:\n  seed: -1\n", {}, "x.yaml:2", "expected a non-negative integer"},
    {"double_word", "train:\n  lr: fast\n", {}, "x.yaml:2", "train.lr: expected a number, got 'fast'"},
    {"double_bool", "train:\n  lr: yes\n", {}, "x.yaml:2", "expected a number, got 'yes'"},
    {"double_inf", "train:\n  grad_clip: inf\n", {}, "x.yaml:2", "expected a number, got 'inf'"},
    {"map_for_int", "model:\n  n_head:\n    a: 1\n", {}, "x.yaml:3",
     "model.n_head: expected an integer, got a map"},
    {"list_for_string", "data:\n  source: [a]\n", {}, "x.yaml:2", "expected a string, got a list"},
    {"list_scalar", "logging:\n  trace_steps: 3\n", {}, "x.yaml:2",
     "expected a list of integers, got '3'"},
    {"list_item", "logging:\n  trace_steps:\n    - 1\n    - x\n", {}, "x.yaml:4",
     "logging.trace_steps[1]: expected an integer, got 'x'"},
    // Impossible values: model.
    {"n_layer_0", "model:\n  n_layer: 0\n", {}, "x.yaml:2", "model.n_layer: must be >= 1 (got 0)"},
    {"n_head_0", "model:\n  n_head: 0\n", {}, "x.yaml:2", "model.n_head: must be >= 1"},
    {"d_model_div", "model:\n  n_head: 3\n  d_model: 64\n", {}, "x.yaml:3",
     "model.d_model: must be divisible by model.n_head"},
    {"d_model_absent", "\nmodel:\n  n_head: 3\n", {}, "x.yaml:2", "model.d_model: must be divisible"},
    {"seq_len_0", "model:\n  seq_len: 0\n", {}, "x.yaml:2", "model.seq_len: must be >= 1"},
    {"vocab_1", "model:\n  vocab_size: 1\n", {}, "x.yaml:2", "model.vocab_size: must be >= 2"},
    // Parallel.
    {"tp_3", "parallel:\n  tp: 3\n", {}, "x.yaml:2",
     "parallel.tp: must divide model.n_head (got tp=3, n_head=2)"},
    {"pp_4", "parallel:\n  pp: 4\n", {}, "x.yaml:2",
     "parallel.pp: pp * virtual_stages = 4 is more than model.n_layer = 2"},
    {"layers_count", "parallel:\n  pp: 2\n  layers_per_stage: [2]\n", {}, "x.yaml:3",
     "parallel.layers_per_stage: needs pp * virtual_stages = 2 entries (got 1)"},
    {"layers_sum", "parallel:\n  pp: 2\n  layers_per_stage: [2, 1]\n", {}, "x.yaml:3",
     "parallel.layers_per_stage: must sum to model.n_layer = 2 (got 3)"},
    {"layers_zero", "model:\n  n_layer: 2\nparallel:\n  pp: 2\n  layers_per_stage: [2, 0]\n", {},
     "x.yaml:5", "parallel.layers_per_stage: entries must be >= 1 (got 0)"},
    {"zero_needs_dp", "parallel:\n  zero: 1\n", {}, "x.yaml:2", "parallel.zero: 1 shards"},
    {"timeout_0", "parallel:\n  comm_timeout_s: 0\n", {}, "x.yaml:2",
     "parallel.comm_timeout_s: must be > 0"},
    {"bucket_0", "parallel:\n  grad_bucket_mib: 0\n", {}, "x.yaml:2",
     "parallel.grad_bucket_mib: must be > 0"},
    {"dp_0", "parallel:\n  dp: 0\n", {}, "x.yaml:2", "parallel.dp: must be >= 1 (got 0)"},
    {"micro_batches_0", "parallel:\n  micro_batches: 0\n", {}, "x.yaml:2", "must be >= 1"},
    {"mbs_0", "parallel:\n  micro_batch_size: 0\n", {}, "x.yaml:2", "must be >= 1"},
    {"virtual_0", "parallel:\n  virtual_stages: 0\n", {}, "x.yaml:2", "must be >= 1"},
    {"schedule", "parallel:\n  schedule: pipedream\n", {}, "x.yaml:2",
     "parallel.schedule: must be one of gpipe, 1f1b, interleaved, zb-h1, zb-v (got 'pipedream')"},
    {"zero_2", "parallel:\n  zero: 2\n", {}, "x.yaml:2", "parallel.zero: must be 0 or 1"},
    // Train.
    {"steps_neg", "train:\n  steps: -1\n", {}, "x.yaml:2", "train.steps: must be >= 0"},
    {"lr_0", "train:\n  lr: 0\n  min_lr: 0\n", {}, "x.yaml:2", "train.lr: must be > 0"},
    {"min_lr_gt", "train:\n  lr: 1e-4\n  min_lr: 1e-3\n", {}, "x.yaml:3",
     "train.min_lr: must be <= train.lr"},
    {"min_lr_neg", "train:\n  min_lr: -1e-5\n", {}, "x.yaml:2", "train.min_lr: must be >= 0"},
    {"warmup_neg", "train:\n  warmup_steps: -5\n", {}, "x.yaml:2", "must be >= 0"},
    {"lr_schedule", "train:\n  lr_schedule: step\n", {}, "x.yaml:2",
     "must be one of cosine, linear, constant (got 'step')"},
    {"wd_neg", "train:\n  weight_decay: -0.1\n", {}, "x.yaml:2", "train.weight_decay: must be >= 0"},
    {"clip_neg", "train:\n  grad_clip: -1\n", {}, "x.yaml:2", "train.grad_clip: must be >= 0"},
    {"beta1_1", "train:\n  beta1: 1.0\n", {}, "x.yaml:2", "train.beta1: must be in [0, 1)"},
    {"beta2_neg", "train:\n  beta2: -0.1\n", {}, "x.yaml:2", "train.beta2: must be in [0, 1)"},
    {"eps_0", "train:\n  eps: 0\n", {}, "x.yaml:2", "train.eps: must be > 0"},
    {"eval_every", "train:\n  eval_every: -1\n", {}, "x.yaml:2", "train.eval_every: must be >= 0"},
    {"eval_batches", "train:\n  eval_batches: -1\n", {}, "x.yaml:2", "must be >= 0"},
    {"threads", "train:\n  threads: -2\n", {}, "x.yaml:2", "train.threads: must be >= 0"},
    {"precision", "train:\n  precision: fp16\n", {}, "x.yaml:2",
     "train.precision: must be one of auto, bf16, fp32 (got 'fp16')"},
    {"attention", "train:\n  attention: flash\n", {}, "x.yaml:2",
     "train.attention: must be one of auto, unfused, fused (got 'flash')"},
    {"fused_in_fp32", "train:\n  attention: fused\n  precision: fp32\ndevice: cuda\n", {}, "x.yaml:2",
     "train.attention: fused on a CUDA device needs bf16 (got device cuda, precision fp32)"},
    {"bf16_on_cpu", "train:\n  precision: bf16\ndevice: cpu\n", {}, "x.yaml:2",
     "train.precision: bf16 needs device cuda or auto"},
    {"graph_on_cpu", "train:\n  cuda_graph: true\ndevice: cpu\n", {}, "x.yaml:2",
     "train.cuda_graph: needs device cuda or auto (got device cpu)"},
    {"bf16_default_device", "", {"train.precision=bf16"}, "--set train.precision",
     "train.precision: bf16 needs device cuda or auto; the CPU backend computes in fp32 (got "
     "device cpu)"},
    {"peak_neg", "train:\n  peak_tflops: -1\n", {}, "x.yaml:2",
     "train.peak_tflops: must be >= 0 (got -1)"},
    {"peak_word", "train:\n  peak_tflops: h100\n", {}, "x.yaml:2",
     "train.peak_tflops: expected a number, got 'h100'"},
    // Data, checkpoint, logging, device.
    {"source", "data:\n  source: csv\n", {}, "x.yaml:2",
     "must be one of synthetic, text, llmc, nanogpt (got 'csv')"},
    {"path_missing", "data:\n  source: llmc\n", {}, "x.yaml:1",
     "data.path: is required when data.source is 'llmc'"},
    {"path_empty", "data:\n  source: nanogpt\n  path: \"\"\n", {}, "x.yaml:3",
     "data.path: is required"},
    {"text_vocab", "model:\n  vocab_size: 100\ndata:\n  source: text\n  path: a.txt\n", {},
     "x.yaml:2", "model.vocab_size: must be >= 256 for data.source 'text'"},
    {"ckpt_every", "checkpoint:\n  every: -1\n", {}, "x.yaml:2", "checkpoint.every: must be >= 0"},
    {"ckpt_keep", "checkpoint:\n  keep: 0\n", {}, "x.yaml:2", "checkpoint.keep: must be >= 1"},
    {"log_every", "logging:\n  every: 0\n", {}, "x.yaml:2", "logging.every: must be >= 1"},
    {"log_level", "logging:\n  level: verbose\n", {}, "x.yaml:2",
     "must be one of debug, info, warn, error (got 'verbose')"},
    {"trace_neg", "logging:\n  trace_steps: [1, -2]\n", {}, "x.yaml:2",
     "logging.trace_steps: entries must be >= 0 (got -2 at index 1)"},
    {"device", "train:\n  steps: 1\ndevice: tpu\n", {}, "x.yaml:3",
     "device: must be one of cpu, auto, cuda (got 'tpu')"},
    // Overrides.
    {"set_no_eq", "", {"train.lr"}, "--set train.lr", "expected KEY=VALUE"},
    {"set_empty_key", "", {"=5"}, "--set =5", "the key before '=' is empty"},
    {"set_bad_key", "", {"train..lr=1"}, "--set train..lr=1", "malformed key"},
    {"set_unknown", "", {"train.stepz=5"}, "--set train.stepz=5",
     "unknown key 'train.stepz' (did you mean 'train.steps'?)"},
    {"set_unknown_child", "", {"train={stepz: 1}"}, "--set train={stepz: 1}",
     "unknown key 'train.stepz'"},
    {"set_bad_yaml", "", {"logging.trace_steps=[1,"}, "--set logging.trace_steps=[1,",
     "invalid YAML value"},
    {"set_trailing_junk", "", {"logging.trace_steps=[1,2], 3"},
     "--set logging.trace_steps=[1,2], 3", "invalid YAML value: YAML syntax error: unexpected ','"},
    {"set_value", "train:\n  lr: 0.1\n", {"train.lr=-1"}, "--set train.lr",
     "train.lr: must be > 0 (got -1)"},
    {"set_type", "", {"model.n_layer=abc"}, "--set model.n_layer",
     "model.n_layer: expected an integer, got 'abc'"},
    {"set_section", "", {"train={lr: 0}"}, "--set train", "train.lr: must be > 0"},
    {"set_into_scalar", "model: {}\ntrain: 5\n", {"train.lr=1"}, "x.yaml:2",
     "train: expected a map of keys, got '5'"},
    {"set_created_section", "", {"data.source=llmc"}, "--set data.source",
     "data.path: is required"},
    {"set_last_wins", "", {"train.lr=-1", "train.lr=0.5", "train.min_lr=1"},
     "--set train.min_lr", "must be <= train.lr"},
};

class BadConfig : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadConfig, FailsWithLocatedOneLineMessage) {
  const BadCase& c = GetParam();
  std::string msg = error_of(c.yaml, c.sets);
  ASSERT_FALSE(msg.empty()) << "expected an InputError";
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_EQ(msg.rfind(std::string(c.where) + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find(c.message), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(Table, BadConfig, ::testing::ValuesIn(kBadCases),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

TEST(ConfigErrors, NoSuggestionForFarKeys) {
  std::string msg = error_of("zzzzzz: 1\n");
  EXPECT_EQ(msg.find("did you mean"), std::string::npos) << msg;
}

TEST(ConfigDecode, AllKeys) {
  Config c = parse_config(R"(
model: {n_layer: 3, n_head: 4, d_model: 48, seq_len: 16, vocab_size: 300}
parallel:
  micro_batches: 5
  micro_batch_size: 2
  schedule: zb-h1
  virtual_stages: 2
  zero: 1
  dp: 2
  tp: 2
  sequence_parallel: true
  layers_per_stage: auto
train:
  steps: 7
  lr: 3e-4
  min_lr: 0
  warmup_steps: 2
  lr_schedule: linear
  weight_decay: 0
  grad_clip: 0.5
  beta1: 0.8
  beta2: 0.99
  eps: 1.0e-6
  seed: 18446744073709551615
  eval_every: 3
  eval_batches: 4
  threads: 2
  precision: bf16
  peak_tflops: 756.5
data: {source: text, path: train.txt, val_path: [val_0.txt, val_1.txt]}
checkpoint: {dir: ckpt, every: 5, keep: 1, resume: auto}
logging:
  every: 2
  metrics: m.jsonl
  trace: t.json
  trace_steps:
    - 3
    - 4
  level: debug
device: auto
)",
                          "good.yaml");
  EXPECT_EQ(c.model.n_layer, 3);
  EXPECT_EQ(c.model.n_head, 4);
  EXPECT_EQ(c.model.d_model, 48);
  EXPECT_EQ(c.model.seq_len, 16);
  EXPECT_EQ(c.model.vocab_size, 300);
  EXPECT_EQ(c.parallel.micro_batches, 5);
  EXPECT_EQ(c.parallel.micro_batch_size, 2);
  EXPECT_EQ(c.parallel.schedule, ScheduleKind::ZeroBubbleH1);
  EXPECT_EQ(c.parallel.virtual_stages, 2);
  EXPECT_EQ(c.parallel.zero, 1);
  EXPECT_TRUE(c.parallel.sequence_parallel);
  EXPECT_TRUE(c.parallel.layers_per_stage.automatic);
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.train.lr, 3e-4);
  EXPECT_EQ(c.train.min_lr, 0.0);
  EXPECT_EQ(c.train.warmup_steps, 2);
  EXPECT_EQ(c.train.lr_schedule, LrSchedule::Linear);
  EXPECT_EQ(c.train.weight_decay, 0.0);
  EXPECT_EQ(c.train.grad_clip, 0.5);
  EXPECT_EQ(c.train.beta1, 0.8);
  EXPECT_EQ(c.train.beta2, 0.99);
  EXPECT_EQ(c.train.eps, 1e-6);
  EXPECT_EQ(c.train.seed, 18446744073709551615ull);
  EXPECT_EQ(c.train.eval_every, 3);
  EXPECT_EQ(c.train.eval_batches, 4);
  EXPECT_EQ(c.train.threads, 2);
  EXPECT_EQ(c.train.precision, Precision::BF16);
  EXPECT_EQ(c.train.peak_tflops, 756.5);
  EXPECT_EQ(c.data.source, DataSource::Text);
  EXPECT_EQ(c.data.path, std::vector<std::string>{"train.txt"});
  EXPECT_EQ(c.data.val_path, (std::vector<std::string>{"val_0.txt", "val_1.txt"}));
  EXPECT_EQ(c.checkpoint.dir, "ckpt");
  EXPECT_EQ(c.checkpoint.every, 5);
  EXPECT_EQ(c.checkpoint.keep, 1);
  EXPECT_EQ(c.checkpoint.resume, "auto");
  EXPECT_EQ(c.logging.every, 2);
  EXPECT_EQ(c.logging.metrics, "m.jsonl");
  EXPECT_EQ(c.logging.trace, "t.json");
  EXPECT_EQ(c.logging.trace_steps, (std::vector<int>{3, 4}));
  EXPECT_EQ(c.logging.level, LogLevel::Debug);
  EXPECT_EQ(c.device, Device::Auto);
  EXPECT_EQ(c.source_path, "good.yaml");
}

TEST(ConfigDecode, DefaultsWhenSectionsAbsentOrEmpty) {
  for (const char* text : {"", "# only a comment\n", "model:\ntrain: {}\n"}) {
    Config c = parse_config(text, "d.yaml");
    Config defaults;
    defaults.source_path = "d.yaml";
    expect_same_config(c, defaults);
  }
  // A partly filled section keeps the defaults of its other keys.
  Config c = parse_config("train:\n  steps: 3\n", "d.yaml");
  EXPECT_EQ(c.train.steps, 3);
  EXPECT_EQ(c.train.lr, TrainConfig{}.lr);
  EXPECT_EQ(c.train.lr_schedule, LrSchedule::Cosine);
}

TEST(ConfigDecode, PrecisionAndPeak) {
  Config d = parse_config("", "p.yaml");
  EXPECT_EQ(d.train.precision, Precision::Auto);
  EXPECT_EQ(d.train.peak_tflops, 0.0);
  // bf16 is refused only where the device is certainly the CPU.
  for (const char* device : {"auto", "cuda"})
    EXPECT_EQ(parse_config("", "p.yaml", {"train.precision=bf16", std::string("device=") + device})
                  .train.precision,
              Precision::BF16);
  for (const char* precision : {"auto", "fp32"})
    EXPECT_EQ(parse_config("", "p.yaml", {std::string("train.precision=") + precision}).device,
              Device::Cpu);
  EXPECT_EQ(parse_config("train: {peak_tflops: 989}\n", "p.yaml").train.peak_tflops, 989.0);
}

TEST(ConfigDecode, NullStringMeansEmpty) {
  Config c = parse_config("checkpoint:\n  resume:\n  dir: ~\n", "n.yaml");
  EXPECT_EQ(c.checkpoint.resume, "");
  EXPECT_EQ(c.checkpoint.dir, "");
}

}  // namespace
}  // namespace pptrain
