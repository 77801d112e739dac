// Training and validation tokens: token files (text, llm.c shards, nanoGPT dumps; one or
// many, memory-mapped) and the built-in synthetic corpus. Which tokens a training sequence holds is
// a pure function of (seed, step, index), so resume and every parallel layout agree.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "data/synthetic.hpp"
#include "data/token_corpus.hpp"

namespace pptrain {

// Reads a whole token file of format `source` (text = raw bytes, one token per byte;
// llmc = llm.c shard: header of 256 int32 little-endian with magic 20240520, version 1,
// token count, then that many uint16 tokens; nanogpt = raw uint16 little-endian tokens).
// Checks every token < vocab_size. Throws InputError naming the file and the problem.
std::vector<int32_t> read_token_file(DataSource source, const std::string& path,
                                     int vocab_size);

// The training token stream. Sequence (step, index) is a pure function of
// (seed, step, index): a resumed run reads exactly what an uninterrupted run would,
// and a data-parallel layout reads the same global sequences.
class TrainData {
 public:
  // Maps data.path's files (globs expanded) or builds the synthetic chain. InputError.
  static TrainData open(const DataConfig& data, const ModelConfig& model, uint64_t seed);

  TrainData(TrainData&&) = default;
  TrainData& operator=(TrainData&&) = default;
  TrainData(const TrainData&) = delete;  // a file's tokens can be large
  TrainData& operator=(const TrainData&) = delete;

  // Writes seq_len+1 tokens: the index-th sequence of step `step` (both 0-based).
  void sequence(int64_t step, int64_t index, int32_t* out) const;
  // One line, e.g. "llmc data/train_000001.bin and 9 more: 104857600 tokens in 10 files".
  std::string describe() const;

  int seq_len() const { return seq_len_; }
  bool synthetic() const { return chain_.has_value(); }
  std::size_t num_tokens() const { return corpus_ ? corpus_->size() : 0; }  // 0: synthetic

 private:
  TrainData() = default;

  DataSource source_ = DataSource::Synthetic;
  std::string path_;                   // the files, for the log
  int seq_len_ = 0;
  uint64_t stream_ = 0;                // key of this run's training draws
  std::optional<TokenCorpus> corpus_;  // file sources, mapped
  std::optional<MarkovChain> chain_;   // synthetic source
};

// Validation tokens: data.val_path's files (globs expanded) read whole when it is set
// (an InputError if it holds fewer than seq_len+1 tokens); for the synthetic source, a
// built-in held-out stream of 64 * (seq_len + 1) tokens: 64 windows drawn from the
// training chain with keys training never uses; otherwise empty.
std::vector<int32_t> load_validation_tokens(const DataConfig& data, const ModelConfig& model,
                                            uint64_t seed);

// Number of consecutive non-overlapping windows of seq_len+1 tokens (last partial dropped);
// window w is tokens[w*(seq_len+1) .. w*(seq_len+1)+seq_len].
int64_t validation_windows(std::size_t num_tokens, int seq_len);

// The synthetic corpus's entropy rate in nats per token: the lowest expected loss any
// model can reach on it (same for every seed). Compare with ln(vocab_size).
double synthetic_entropy_nats(const ModelConfig& model);

}  // namespace pptrain
