// The planner's kernel traffic (plan/kernel_traffic.hpp) against what the CUDA emulator
// counts: pptrain-emulated writes a table of its launch sites; one layer's share of one
// step is the table of (L + 1 layers) - (L layers), each over (3 steps) - (2 steps), so
// that start-up, the head, the embedding and the other steps cancel. Every launch, byte
// and tensor-core instruction of the layer's products, attention and other kernels must
// be the model's (the optimizer's share of the layer, priced per parameter, is left out).
// The ends (head and embedding) are the step at 2 layers less two layers' share, the
// embedding table's gradient left out: what it moves depends on which tokens occur
// (norm_embedding_emulation_test checks it for known tokens). Under tensor parallelism
// the ranks' tables are summed: the ranks' layers are alike, and their vocabulary shards
// together read each target's logit and each token's row once.
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
// optimizer's (priced per parameter) and the embedding table's gradient. The loss's mean
// is the head's.
std::string kind_of(const std::string& site) {
  if (site.rfind("cublasLtMatmul batched", 0) == 0) return "attention";  // unfused: per head
  if (site.rfind("cublasLtMatmul", 0) == 0) return "products";
  if (site.rfind("flash_attention", 0) == 0 || site.rfind("attention.cu", 0) == 0)
    return "attention";
  if (site.ends_with(" launch_wte_backward")) return "";
  if (site.rfind("optimizer.cu", 0) == 0) return site.ends_with(" add_mean") ? "kernels" : "";
  return "kernels";
}

// The tables of every rank of one run, summed.
Table run(const std::string& config, const std::vector<std::string>& sets, int ranks, int layers,
          int steps, const std::filesystem::path& dir) {
  const auto table = dir / ("table_" + std::to_string(layers) + "_" + std::to_string(steps) + ".md");
  std::string cmd = "PPTRAIN_EMULATED_GPUS=" + std::to_string(ranks) +
                    " PPTRAIN_EMULATED_KERNEL_TABLE=" + table.string() + " " +
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

// One layer's share of one step, and the ends', by kind, over `ranks` ranks.
struct Shares {
  Table layer, ends;
};
Shares layer_step(const std::string& config, const std::vector<std::string>& sets, int ranks,
                  const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("pptrain_kernel_traffic_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Table t[2][2];  // [layers - 2][steps - 2]
  for (int l = 0; l < 2; ++l)
    for (int s = 0; s < 2; ++s) t[l][s] = run(config, sets, ranks, 2 + l, 2 + s, dir);
  std::filesystem::remove_all(dir);
  Shares out;
  for (const char* kind : {"products", "attention", "kernels"}) {
    auto get = [&](int l, int s) { return t[l][s][kind]; };
    auto layer = [&](double Counted::*f) {
      return (get(1, 1).*f - get(1, 0).*f) - (get(0, 1).*f - get(0, 0).*f);
    };
    auto ends = [&](double Counted::*f) { return get(0, 1).*f - get(0, 0).*f - 2 * layer(f); };
    out.layer[kind] = {layer(&Counted::launches), layer(&Counted::read), layer(&Counted::written),
                       layer(&Counted::mma)};
    out.ends[kind] = {ends(&Counted::launches), ends(&Counted::read), ends(&Counted::written),
                      ends(&Counted::mma)};
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

LayerTraffic& operator+=(LayerTraffic& a, const LayerTraffic& b) {
  for (auto pass : {&LayerTraffic::forward, &LayerTraffic::backward_input,
                    &LayerTraffic::backward_weight}) {
    (a.*pass).products += (b.*pass).products;
    (a.*pass).attention += (b.*pass).attention;
    (a.*pass).kernels += (b.*pass).kernels;
  }
  return a;
}

// The ends on all t * cp ranks: each rank's head, and its embedding without the table's
// gradient, the tp ranks' shards holding N / t of the positions each (N together).
LayerTraffic ends_traffic(const HeadShape& h, double cp, bool positions) {
  EmbeddingShape m;
  m.B = h.B, m.T = h.T, m.C = h.C, m.rows = h.Vp / h.t, m.t = h.t, m.cp = cp, m.sp = h.sp;
  m.positions = positions, m.e = h.e;
  TokenCounts tokens;
  tokens.positions = h.B * h.T / h.t;
  LayerTraffic sum;
  for (int c = 0; c < int(cp); ++c)
    for (int rank = 0; rank < int(h.t); ++rank) {
      LayerTraffic one = head_traffic(h, rank);
      LayerTraffic embedding = embedding_traffic(m, tokens);
      embedding.backward_weight.kernels = embedding.backward_weight.kernels -
                                          embedding_table_grad(m, tokens);
      sum += one;
      sum += embedding;
    }
  return sum;
}

// A layer on all t * cp ranks.
LayerTraffic layers_traffic(LayerShape s) {
  LayerTraffic sum;
  for (int c = 0; c < int(s.cp); ++c) {
    s.rank = c;
    for (int rank = 0; rank < int(s.t); ++rank) sum += layer_traffic(s);
  }
  return sum;
}

const std::vector<std::string> kCommon = {
    "device=cuda",        "train.precision=bf16",      "parallel.micro_batches=1",
    "checkpoint.dir=",    "train.eval_every=0",        "train.eval_batches=1",
    "logging.metrics=",   "parallel.micro_batch_size=2"};

// The 2-layer GPT-2 of tiny.yaml at d_model 128 (4 heads of 32), T 128 (or 384 under cp:
// pieces of 96 rows, a tile and a part), B 2, bf16, on t tensor-parallel and cp
// context-parallel ranks, with the flash or the unfused attention.
void expect_gpt2(int t, bool sp, int cp, const std::string& name,
                 AttentionKernels attention = AttentionKernels::Flash) {
  const int T = cp == 1 ? 128 : 384;
  std::vector<std::string> sets = kCommon;
  if (attention == AttentionKernels::Unfused) sets.push_back("train.attention=unfused");
  sets.push_back("model.d_model=128");
  sets.push_back("model.seq_len=" + std::to_string(T));
  sets.push_back("parallel.tp=" + std::to_string(t));
  sets.push_back("parallel.cp=" + std::to_string(cp));
  sets.push_back(std::string("parallel.sequence_parallel=") + (sp ? "true" : "false"));
  const Shares counted =
      layer_step(std::string(PPTRAIN_SOURCE_DIR) + "/configs/tiny.yaml", sets, t * cp, name);
  LayerShape s;
  s.B = 2, s.T = T / cp, s.C = 128, s.heads = s.kv_heads = 4, s.hs = 32, s.ffn = 4 * 128;
  s.t = t, s.sp = sp, s.row_blocks = sp;  // parallel.overlap is on
  s.cp = cp, s.attention = attention;
  expect_counted(counted.layer, layers_traffic(s), "layer");
  HeadShape h;
  h.B = 2, h.T = T / cp, h.C = 128, h.V = 256, h.Vp = 256, h.t = t, h.sp = sp;
  expect_counted(counted.ends, ends_traffic(h, cp, true), "ends");
}

// llama-tiny.yaml: d_model 64, 4 query and 2 key/value heads of 16, SwiGLU 192 wide, T 128
// (or T given), with the flash or the unfused attention.
void expect_llama(int t, const std::string& name, int T = 128,
                  AttentionKernels attention = AttentionKernels::Flash) {
  std::vector<std::string> sets = kCommon;
  sets.push_back("model.seq_len=" + std::to_string(T));
  if (attention == AttentionKernels::Unfused) sets.push_back("train.attention=unfused");
  sets.push_back("parallel.tp=" + std::to_string(t));
  const Shares counted =
      layer_step(std::string(PPTRAIN_SOURCE_DIR) + "/configs/llama-tiny.yaml", sets, t, name);
  LayerShape s;
  s.B = 2, s.T = T, s.C = 64, s.heads = 4, s.kv_heads = 2, s.hs = 16, s.ffn = 192;
  s.t = t, s.llama = true, s.attention = attention;
  expect_counted(counted.layer, layers_traffic(s), "layer");
  HeadShape h;
  h.B = 2, h.T = T, h.C = 64, h.V = 256, h.Vp = 256, h.t = t, h.llama = true;
  expect_counted(counted.ends, ends_traffic(h, 1, false), "ends");
}

TEST(KernelTraffic, Gpt2LayerIsWhatTheEmulatorCounts) { expect_gpt2(1, false, 1, "gpt2"); }
TEST(KernelTraffic, LlamaLayerIsWhatTheEmulatorCounts) { expect_llama(1, "llama"); }
// Vocab-parallel heads and embeddings; the row-parallel products' bias and residual adds.
TEST(KernelTraffic, Gpt2TensorParallelWithSpIsWhatTheEmulatorCounts) {
  expect_gpt2(2, true, 1, "gpt2_tp2_sp");
}
TEST(KernelTraffic, LlamaTensorParallelIsWhatTheEmulatorCounts) { expect_llama(2, "llama_tp2"); }
// The unfused attention: the head splits and merges, the batched products, the causal
// softmax loading 16-byte packs (T 128) or single entries (T 100), key/value heads
// copied to and summed over their groups (llama).
TEST(KernelTraffic, Gpt2UnfusedAttentionIsWhatTheEmulatorCounts) {
  expect_gpt2(1, false, 1, "gpt2_unfused", AttentionKernels::Unfused);
}
TEST(KernelTraffic, LlamaUnfusedAttentionIsWhatTheEmulatorCounts) {
  expect_llama(1, "llama_unfused", 100, AttentionKernels::Unfused);
}
// Ring attention's piece pairs, its copies and adds; the positions added per piece.
TEST(KernelTraffic, Gpt2ContextParallelIsWhatTheEmulatorCounts) {
  expect_gpt2(1, false, 2, "gpt2_cp2");
}

}  // namespace
}  // namespace pptrain
