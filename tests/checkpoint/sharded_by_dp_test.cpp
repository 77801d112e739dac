// ZeRO-1 checkpoints: every data-parallel rank writes the moments of its own arena ranges,
// which cut tensors anywhere; the loader reassembles them into any layout, and refuses
// a checkpoint whose runs leave a gap or overlap.
#include "sharded_fixture.hpp"

namespace pptrain::ckpt_test {
namespace {

using Ranges = std::vector<std::pair<std::size_t, std::size_t>>;

// Data-parallel rank d's ranges of an arena of `total` floats: blocks d and d + dp of
// 2 * dp equal blocks (the last one shorter), as ZeRO-1 gives each rank a block of every
// bucket.
Ranges rank_ranges(std::size_t total, int dp, int d) {
  const std::size_t block = (total + 2 * std::size_t(dp) - 1) / (2 * std::size_t(dp));
  Ranges out;
  for (int k : {d, d + dp}) {
    const std::size_t b = std::min(total, std::size_t(k) * block), e = std::min(total, b + block);
    if (b < e) out.emplace_back(b, e);
  }
  return out;
}

class ShardedByDpTest : public ShardedTest {
 protected:
  // A (tp, pp, dp) ZeRO-1 save at `step`; `ranges_of(layout, d)` gives rank d's ranges.
  template <class RangesOf>
  std::string save_by_dp(int tp, int pp, int dp, int64_t step, uint64_t seed, RangesOf ranges_of) {
    const std::string tmp = create_temp_step_dir(dir_, step);
    std::vector<FileRecord> files;
    write_positions(tmp, tp, pp, seed, files,
                    [&](int t, int s, const ParamLayout& layout, const Arenas& a) {
                      for (int d = 0; d < dp; ++d) {
                        const Ranges ranges = ranges_of(layout, d);
                        std::vector<float> m, v;  // packed range after range
                        for (const auto& [b, e] : ranges) {
                          m.insert(m.end(), a.m.data() + b, a.m.data() + e);
                          v.insert(v.end(), a.v.data() + b, a.v.data() + e);
                        }
                        files.push_back(
                            write_optimizer_ranges(tmp, t, s, d, layout, ranges, m.data(), v.data()));
                      }
                    });
    return commit_step_dir(dir_, 0, files, {tp, pp, dp, true}, meta_at(step));
  }
  std::string save_by_dp(int tp, int pp, int dp, int64_t step, uint64_t seed) {
    return save_by_dp(tp, pp, dp, step, seed, [dp](const ParamLayout& l, int d) {
      return rank_ranges(l.total_floats(), dp, d);
    });
  }
};

TEST_F(ShardedByDpTest, EachDataParallelRankWritesItsRanges) {
  const std::string step = save_by_dp(2, 2, 3, 4, 9);
  const auto meta = read_meta(step);
  EXPECT_EQ(meta["layout"], (nlohmann::json{{"tp", 2}, {"pp", 2}, {"dp", 3}, {"optimizer_by_dp", true}}));
  EXPECT_EQ(meta["files"].size(), 4u + 12u);
  EXPECT_TRUE(fs::exists(step + "/optimizer-tp1-pp0-dp2.safetensors"));
  EXPECT_FALSE(fs::exists(step + "/optimizer-tp1-pp0.safetensors"));
  // A run of a tensor: 1-D, named by its first element, its place recorded.
  const auto f = SafetensorsFile::read(step + "/optimizer-tp0-pp0-dp0.safetensors");
  const auto slicing = nlohmann::json::parse(f.metadata().at(kSlicingMetadataKey));
  const auto& wte = slicing.at("transformer.wte.weight.exp_avg@0");
  EXPECT_EQ(wte["tensor"], "transformer.wte.weight.exp_avg");
  EXPECT_EQ(wte["local_shape"], (nlohmann::json{128, 16}));
  EXPECT_EQ(wte["flat_range"][0], 0);
  EXPECT_EQ(f.shape("transformer.wte.weight.exp_avg@0"),
            (std::vector<int64_t>{wte["flat_range"][1].get<int64_t>()}));
}

TEST_F(ShardedByDpTest, LoadsIntoAnyLayout) {
  const std::string step = save_by_dp(2, 2, 3, 4, 9);
  expect_loads(step, partition(model_, 1, 0, 1, 0), 9);  // one rank
  expect_loads(step, partition(model_, 2, 1, 2, 1), 9);  // the same layout
  expect_loads(step, partition(model_, 2, 0, 1, 0), 9);  // no tp
  expect_loads(step, partition(model_, 1, 0, 2, 0), 9);  // no pp
}

TEST_F(ShardedByDpTest, GapsAndOverlapsAreInputErrors) {
  // Two elements of a tensor are in no rank's ranges.
  std::string step = save_by_dp(1, 1, 2, 1, 3, [](const ParamLayout& l, int d) {
    const std::size_t hole = l.at("transformer.h.0.attn.c_attn.weight").offset + 5;
    Ranges out;
    for (const auto& [b, e] : rank_ranges(l.total_floats(), 2, d)) {
      if (b < hole && hole + 2 <= e) {
        out.emplace_back(b, hole);
        out.emplace_back(hole + 2, e);
      } else {
        out.emplace_back(b, e);
      }
    }
    return out;
  });
  expect_input_error([&] { expect_loads(step, partition(model_, 1, 0, 1, 0), 3); }, step,
                     "are in no optimizer file");
  // Both ranks write the whole arena: every element twice.
  step = save_by_dp(1, 1, 2, 2, 3, [](const ParamLayout& l, int) {
    return Ranges{{0, l.total_floats()}};
  });
  expect_input_error([&] { expect_loads(step, partition(model_, 1, 0, 1, 0), 3); }, step,
                     "is stored twice");
  // A rank's file left out of meta.json.
  step = save_by_dp(1, 1, 2, 3, 3);
  auto j = read_meta(step);
  j["files"].erase("optimizer-tp0-pp0-dp1.safetensors");
  write_meta(step, j.dump());
  expect_input_error([&] { expect_loads(step, partition(model_, 1, 0, 1, 0), 3); },
                     step + "/meta.json", "optimizer-tp0-pp0-dp1.safetensors is not listed");
}

}  // namespace
}  // namespace pptrain::ckpt_test
