// The planner's kernel traffic (plan/kernel_traffic.hpp) against what the CUDA emulator
// counts: pptrain-emulated writes a table of its launch sites; one layer's share of one
// step is the table of (L + 1 layers) - (L layers), each over (3 steps) - (2 steps), so
// that start-up, the head, the embedding and the other steps cancel. Every launch, byte
// and tensor-core instruction of the layer's products, attention and other kernels must
// be the model's (the optimizer's share of the layer, priced per parameter, is left out).
// The head is the step at 2 layers less two layers' share, the embedding's kernels left
// out (what they move depends on which tokens occur).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "plan/kernel_traffic.hpp"

namespace pptrain {
namespace {

struct Counted {
  double launches = 0, read = 0, written = 0, mma = 0;
};
using Table = std::map<std::string, Counted>;  // by kind: products, attention, kernels

// The kind of a launch site ("file:line launcher"), or "" for what is left out: the
// optimizer's (priced per parameter) and the embedding's. The loss's mean is the head's.
std::string kind_of(const std::string& site) {
  if (site.rfind("cublasLtMatmul", 0) == 0) return "products";
  if (site.rfind("flash_attention", 0) == 0) return "attention";
  if (site.rfind("embedding.cu", 0) == 0) return "";
  if (site.rfind("optimizer.cu", 0) == 0) return site.ends_with(" add_mean") ? "kernels" : "";
  return "kernels";
}

Table run(const std::string& config, const std::vector<std::string>& sets, int layers, int steps,
          const std::filesystem::path& dir) {
  const auto table = dir / ("table_" + std::to_string(layers) + "_" + std::to_string(steps) + ".md");
  std::string cmd = "PPTRAIN_EMULATED_GPUS=1 PPTRAIN_EMULATED_KERNEL_TABLE=" + table.string() + " " +
                    PPTRAIN_EMULATED_BINARY + " --config " + config;
  for (const std::string& s : sets) cmd += " --set " + s;
  cmd += " --set model.n_layer=" + std::to_string(layers) + " --set train.steps=" +
         std::to_string(steps) + " > " + (dir / "log.txt").string() + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  Table t;
  std::ifstream in(table);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells;
    std::stringstream row(line);
    for (std::string cell; std::getline(row, cell, '|');) cells.push_back(cell);
    // "| site | launches | read | written | shared read | shared written | mma |"
    if (cells.size() != 8 || cells[2].find_first_not_of(" 0123456789") != std::string::npos)
      continue;
    const std::string& cell = cells[1];
    const std::size_t first = cell.find_first_not_of(' '), last = cell.find_last_not_of(' ');
    const std::string kind = kind_of(cell.substr(first, last + 1 - first));
    if (kind.empty()) continue;
    Counted& c = t[kind];
    c.launches += std::stod(cells[2]), c.read += std::stod(cells[3]);
    c.written += std::stod(cells[4]), c.mma += std::stod(cells[7]);
  }
  return t;
}

// One layer's share of one step, and the head's, by kind.
struct Shares {
  Table layer, head;
};
Shares layer_step(const std::string& config, const std::vector<std::string>& sets,
                  const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("pptrain_kernel_traffic_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Table t[2][2];  // [layers - 2][steps - 2]
  for (int l = 0; l < 2; ++l)
    for (int s = 0; s < 2; ++s) t[l][s] = run(config, sets, 2 + l, 2 + s, dir);
  std::filesystem::remove_all(dir);
  Shares out;
  for (const char* kind : {"products", "attention", "kernels"}) {
    auto get = [&](int l, int s) { return t[l][s][kind]; };
    auto layer = [&](double Counted::*f) {
      return (get(1, 1).*f - get(1, 0).*f) - (get(0, 1).*f - get(0, 0).*f);
    };
    auto head = [&](double Counted::*f) { return get(0, 1).*f - get(0, 0).*f - 2 * layer(f); };
    out.layer[kind] = {layer(&Counted::launches), layer(&Counted::read), layer(&Counted::written),
                       layer(&Counted::mma)};
    out.head[kind] = {head(&Counted::launches), head(&Counted::read), head(&Counted::written),
                      head(&Counted::mma)};
  }
  return out;
}

void expect_counted(const Table& counted, const LayerTraffic& model, const std::string& what) {
  const auto sum = [&](Traffic PassTraffic::*kind) {
    return model.forward.*kind + model.backward_input.*kind + model.backward_weight.*kind;
  };
  const std::map<std::string, Traffic> predicted = {{"products", sum(&PassTraffic::products)},
                                                    {"attention", sum(&PassTraffic::attention)},
                                                    {"kernels", sum(&PassTraffic::kernels)}};
  for (const auto& [kind, p] : predicted) {
    const Counted& c = counted.at(kind);
    EXPECT_EQ(c.launches, p.launches) << what << ", " << kind;
    EXPECT_EQ(c.read, p.read) << what << ", " << kind;
    EXPECT_EQ(c.written, p.written) << what << ", " << kind;
    EXPECT_EQ(c.mma, p.mma) << what << ", " << kind;
  }
}

const std::vector<std::string> kCommon = {
    "device=cuda",        "train.precision=bf16",      "parallel.micro_batches=1",
    "checkpoint.dir=",    "train.eval_every=0",        "train.eval_batches=1",
    "logging.metrics=",   "parallel.micro_batch_size=2", "model.seq_len=128"};

TEST(KernelTraffic, Gpt2LayerIsWhatTheEmulatorCounts) {
  std::vector<std::string> sets = kCommon;
  sets.push_back("model.d_model=128");
  const Shares counted =
      layer_step(std::string(PPTRAIN_SOURCE_DIR) + "/configs/tiny.yaml", sets, "gpt2");
  LayerShape s;
  s.B = 2, s.T = 128, s.C = 128, s.heads = s.kv_heads = 4, s.hs = 32, s.ffn = 4 * 128;
  expect_counted(counted.layer, layer_traffic(s), "layer");
  expect_counted(counted.head, head_traffic(2, 128, 128, 256, 256, false, 2), "head");
}

TEST(KernelTraffic, LlamaLayerIsWhatTheEmulatorCounts) {
  const Shares counted =
      layer_step(std::string(PPTRAIN_SOURCE_DIR) + "/configs/llama-tiny.yaml", kCommon, "llama");
  LayerShape s;
  s.B = 2, s.T = 128, s.C = 64, s.heads = 4, s.kv_heads = 2, s.hs = 16, s.ffn = 192;
  s.llama = true;
  expect_counted(counted.layer, layer_traffic(s), "layer");
  expect_counted(counted.head, head_traffic(2, 128, 64, 256, 256, true, 2), "head");
}

}  // namespace
}  // namespace pptrain
