// The built-in synthetic corpus: a fixed, seed-dependent sparse Markov chain over the
// vocabulary. Every token has min(4, vocab) distinct successors, taken with probabilities
// 0.50, 0.25, 0.15, 0.10 (the first `fanout` of them, renormalised). The chain's entropy
// rate is therefore exactly that of those probabilities: 1.208 nats per token for
// vocab >= 4 (ln 256 = 5.545), 0.981 for vocab 3, 0.637 for vocab 2. No model can beat
// it; a tiny transformer gets well below ln(vocab) quickly by learning the bigram table.
// Successor ids are drawn with density falling like 1/sqrt(id), so token frequencies are
// skewed, as in real text, and the unigram statistics give a first easy gain.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

namespace pptrain {

class MarkovChain {
 public:
  static constexpr int kMaxFanout = 4;

  // The chain for `vocab_size` (>= 2) tokens; its structure depends only on `seed`.
  MarkovChain(int vocab_size, uint64_t seed);

  // Writes `length` tokens of sequence (step, index) of the draw stream `stream`: a
  // uniform start token, then transitions, each a pure function of its key.
  void sample(uint64_t stream, int64_t step, int64_t index, int length, int32_t* out) const;

  int vocab_size() const { return vocab_size_; }
  int fanout() const { return fanout_; }
  // The j-th successor of `token` (j < fanout), in order of falling probability.
  int32_t successor(int32_t token, int j) const { return successors_[token * fanout_ + j]; }
  // Entropy rate in nats per token.
  double entropy_nats() const;
  static double entropy_nats(int vocab_size);

 private:
  int vocab_size_;
  int fanout_;
  std::array<double, kMaxFanout> cumulative_{};  // cumulative transition probabilities
  std::vector<int32_t> successors_;              // vocab_size x fanout
};

}  // namespace pptrain
