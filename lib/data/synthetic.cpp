// The synthetic Markov chain: building its successor table from hashes and sampling
// sequences from it, each token a pure function of (stream, step, index, position).
#include "data/synthetic.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/random.hpp"

namespace pptrain {
namespace {

constexpr std::array<double, MarkovChain::kMaxFanout> kProbabilities = {0.50, 0.25, 0.15, 0.10};

int fanout_for(int vocab_size) { return std::min(vocab_size, MarkovChain::kMaxFanout); }

}  // namespace

MarkovChain::MarkovChain(int vocab_size, uint64_t seed)
    : vocab_size_(vocab_size), fanout_(fanout_for(vocab_size)) {
  PPTRAIN_CHECK(vocab_size >= 2, "the synthetic chain needs at least 2 tokens");
  double total = 0;
  for (int j = 0; j < fanout_; ++j) total += kProbabilities[j];
  double running = 0;
  for (int j = 0; j < fanout_; ++j) {
    running += kProbabilities[j] / total;
    cumulative_[j] = running;
  }
  cumulative_[fanout_ - 1] = 1.0;

  const uint64_t key = hash_words(seed, hash_string("pptrain.data.synthetic.chain"));
  successors_.resize(std::size_t(vocab_size) * fanout_);
  for (int32_t t = 0; t < vocab_size; ++t) {
    int32_t* succ = &successors_[std::size_t(t) * fanout_];
    for (int j = 0; j < fanout_; ++j) {
      // u^2 skews successor ids towards 0; probing keeps the successors distinct.
      double u = uniform01(hash_words(key, uint64_t(t), uint64_t(j)));
      auto c = std::min(int32_t(u * u * vocab_size), int32_t(vocab_size - 1));
      while (std::find(succ, succ + j, c) != succ + j) c = (c + 1) % vocab_size;
      succ[j] = c;
    }
  }
}

void MarkovChain::sample(uint64_t stream, int64_t step, int64_t index, int length,
                         int32_t* out) const {
  PPTRAIN_CHECK(step >= 0 && index >= 0 && length >= 1, "bad synthetic sequence request");
  auto key = [&](int position) {
    return hash_words(stream, uint64_t(step), uint64_t(index), uint64_t(position));
  };
  out[0] = int32_t(key(0) % uint64_t(vocab_size_));
  for (int p = 1; p < length; ++p) {
    double u = uniform01(key(p));
    int j = 0;
    while (j < fanout_ - 1 && u >= cumulative_[j]) ++j;
    out[p] = successor(out[p - 1], j);
  }
}

double MarkovChain::entropy_nats() const { return entropy_nats(vocab_size_); }

double MarkovChain::entropy_nats(int vocab_size) {
  int fanout = fanout_for(vocab_size);
  double total = 0;
  for (int j = 0; j < fanout; ++j) total += kProbabilities[j];
  double h = 0;
  for (int j = 0; j < fanout; ++j) {
    double p = kProbabilities[j] / total;
    h -= p * std::log(p);
  }
  return h;
}

}  // namespace pptrain
