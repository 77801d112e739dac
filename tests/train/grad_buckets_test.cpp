// The gradient buckets: they tile the arena, respect the size bound and the ZeRO split,
// and each is final exactly when its last layer (or its chunk) is.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "train/grad_buckets.hpp"

namespace pptrain {
namespace {

ModelConfig model() {
  ModelConfig m;
  m.n_layer = 6;
  m.n_head = 4;
  m.d_model = 64;
  m.seq_len = 32;
  m.vocab_size = 100;
  return m;
}

// Chunks of layers [0,2) + [2,4) + [4,6) on one rank, the first and last holding the
// embeddings and the head.
ModelPartition three_chunks(std::size_t group) {
  ModelPartition p;
  p.chunks = {{0, 2, true, false}, {2, 4, false, false}, {4, 6, false, true}};
  p.group_floats = group;
  return p;
}

std::size_t layer_begin(const ParamLayout& l, int layer) {
  return l.at("transformer.h." + std::to_string(layer) + ".ln_1.weight").offset;
}

// Every arena element is in exactly one bucket, every bucket fits the bound, splits
// evenly into `group`, and lies inside its chunk's layers (or the chunk's own tensors).
void expect_tiling(const ParamLayout& layout, const std::vector<GradBucket>& buckets,
                   std::size_t max_floats, std::size_t group) {
  std::vector<int> covered(layout.total_floats(), 0);
  for (const GradBucket& b : buckets) {
    EXPECT_LE(b.size(), max_floats);
    EXPECT_GT(b.size(), 0u);
    EXPECT_EQ(b.size() % group, 0u);
    EXPECT_EQ(b.begin % 64, 0u);
    for (std::size_t i = b.begin; i < b.end; ++i) ++covered[i];
  }
  EXPECT_TRUE(std::all_of(covered.begin(), covered.end(), [](int c) { return c == 1; }));
}

TEST(GradBuckets, LayersShareABucketWhileTheyFitAndAreFinalWithTheLowest) {
  const ModelPartition part = three_chunks(1);
  const ParamLayout layout = param_layout(model(), part);
  const std::size_t layer = layer_begin(layout, 1) - layer_begin(layout, 0);
  const std::size_t max = (2 * layer + 63) / 64 * 64;  // two layers, not three
  const auto buckets = plan_grad_buckets(layout, part, max);
  expect_tiling(layout, buckets, max, 1);
  // Chunk 0: layers 1 and 0 together (final with layer 0), then the embeddings.
  ASSERT_EQ(buckets.size(), 5u);
  EXPECT_EQ(buckets[0].chunk, 0);
  EXPECT_EQ(buckets[0].layer, 0);
  EXPECT_EQ(buckets[0].begin, layer_begin(layout, 0));
  EXPECT_EQ(buckets[0].end, layer_begin(layout, 2));
  EXPECT_EQ(buckets[1].layer, -1);
  EXPECT_EQ(buckets[1].begin, 0u);
  EXPECT_EQ(buckets[2].layer, 2);
  // The last chunk: its layers, then the head (ln_f and wte) on its own.
  EXPECT_EQ(buckets[3].layer, 4);
  EXPECT_EQ(buckets[4].chunk, 2);
  EXPECT_EQ(buckets[4].layer, -1);
  EXPECT_EQ(buckets[4].begin, layout.at("transformer.ln_f.weight").offset);
  EXPECT_EQ(buckets[4].end, layout.total_floats());
}

TEST(GradBuckets, LayersLargerThanTheBoundAreCutIntoPieces) {
  const ModelPartition part = three_chunks(1);
  const ParamLayout layout = param_layout(model(), part);
  const std::size_t max = 64 * 20;  // smaller than a layer and than the embeddings
  const auto buckets = plan_grad_buckets(layout, part, max);
  expect_tiling(layout, buckets, max, 1);
  // Layer 5's pieces come first (the top layer of the last chunk is final first), each
  // final with layer 5.
  int pieces_of_5 = 0;
  for (const GradBucket& b : buckets)
    if (b.layer == 5) {
      ++pieces_of_5;
      EXPECT_GE(b.begin, layer_begin(layout, 5));
    }
  EXPECT_GT(pieces_of_5, 1);
}

TEST(GradBuckets, ZeroPadsGroupsSoThatEveryBucketSplitsEvenly) {
  for (int dp : {2, 3, 8}) {
    ParallelConfig p;
    p.zero = 1;
    p.dp = dp;
    p.grad_bucket_mib = 0.01;  // 2621 floats: below 64 * dp for dp 8
    const std::size_t group = group_floats(p);
    EXPECT_EQ(group, 64u * std::size_t(dp));
    const std::size_t max = bucket_floats(p);
    EXPECT_EQ(max % group, 0u);
    EXPECT_GE(max, group);
    const ModelPartition part = three_chunks(group);
    const ParamLayout layout = param_layout(model(), part);
    EXPECT_EQ(layout.total_floats() % group, 0u);
    for (int l = 0; l < 6; ++l) EXPECT_EQ(layer_begin(layout, l) % group, 0u) << dp;
    expect_tiling(layout, plan_grad_buckets(layout, part, max), max, group);
  }
  ParallelConfig plain;
  plain.dp = 4;
  EXPECT_EQ(group_floats(plain), 1u);  // no ZeRO: no padding
  EXPECT_EQ(bucket_floats(plain), 25u * 1024 * 1024 / 4);
}

TEST(GradBuckets, AWholeModelInTheDefaultBoundIsThreeBuckets) {
  const ParamLayout layout = param_layout(model());
  ParallelConfig p;
  const auto buckets = plan_grad_buckets(layout, whole_model(model()), bucket_floats(p));
  ASSERT_EQ(buckets.size(), 3u);  // the layers, the head, the embeddings
  EXPECT_EQ(buckets[0].layer, 0);
  EXPECT_EQ(buckets[1].begin, layout.at("transformer.ln_f.weight").offset);
  EXPECT_EQ(buckets[2].begin, 0u);
}

}  // namespace
}  // namespace pptrain
