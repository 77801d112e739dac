// TrainData (random windows of a token file, or synthetic chain sequences, keyed by
// (seed, step, index)) and the validation tokens.
#include "data/dataset.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.hpp"
#include "core/random.hpp"

namespace pptrain {
namespace {

constexpr int64_t kSyntheticValidationWindows = 64;

// Separate draw streams: validation keys never coincide with training keys.
uint64_t train_stream(uint64_t seed) {
  return hash_words(seed, hash_string("pptrain.data.train"));
}
uint64_t validation_stream(uint64_t seed) {
  return hash_words(seed, hash_string("pptrain.data.validation"));
}

void check_source_and_model(const DataConfig& data, const ModelConfig& model) {
  if (model.vocab_size < 2) {
    throw InputError("model.vocab_size must be >= 2, got " + std::to_string(model.vocab_size));
  }
  if (model.seq_len < 1) {
    throw InputError("model.seq_len must be >= 1, got " + std::to_string(model.seq_len));
  }
}

// Synthetic data comes from no file: a path set for it is a mistake worth reporting.
void check_synthetic_paths(const DataConfig& data) {
  if (!data.path.empty()) {
    throw InputError("data.path: must be empty for data.source synthetic (got \"" +
                     data.path.front() + "\")");
  }
  if (!data.val_path.empty()) {
    throw InputError("data.val_path: must be empty for data.source synthetic, which has a "
                     "built-in validation stream (got \"" + data.val_path.front() + "\")");
  }
}

// "FILE" or "FILE and N more": the files of an entry list, for messages.
std::string files_text(const std::vector<std::string>& files) {
  return files.size() == 1 ? files.front()
                           : files.front() + " and " + std::to_string(files.size() - 1) + " more";
}

void check_long_enough(const std::string& path, std::size_t n, int seq_len) {
  if (n < std::size_t(seq_len) + 1) {
    throw InputError(path + ": holds " + std::to_string(n) + " tokens, fewer than seq_len+1 = " +
                     std::to_string(seq_len + 1));
  }
}

}  // namespace

TrainData TrainData::open(const DataConfig& data, const ModelConfig& model, uint64_t seed) {
  check_source_and_model(data, model);
  TrainData d;
  d.source_ = data.source;
  d.seq_len_ = model.seq_len;
  d.stream_ = train_stream(seed);
  if (data.source == DataSource::Synthetic) {
    check_synthetic_paths(data);
    d.chain_.emplace(model.vocab_size, seed);
    return d;
  }
  if (data.path.empty()) {
    throw InputError("data.path: required for data.source " + std::string(name_of(data.source)));
  }
  const std::vector<std::string> files = expand_data_paths(data.path, "data.path");
  d.path_ = files_text(files);
  d.corpus_.emplace(TokenCorpus::open(data.source, files, model.vocab_size));
  check_long_enough(d.path_, d.corpus_->size(), model.seq_len);
  return d;
}

void TrainData::sequence(int64_t step, int64_t index, int32_t* out) const {
  PPTRAIN_CHECK(step >= 0 && index >= 0, "sequence keys are 0-based");
  if (chain_) {
    chain_->sample(stream_, step, index, seq_len_ + 1, out);
    return;
  }
  // Window starts 0 .. n-seq_len-1 all leave room for seq_len+1 tokens.
  // The files' concatenation, in order: a window may span two files.
  const uint64_t starts = corpus_->size() - std::size_t(seq_len_);
  const uint64_t offset = hash_words(stream_, uint64_t(step), uint64_t(index)) % starts;
  corpus_->copy(offset, std::size_t(seq_len_) + 1, out);
}

std::string TrainData::describe() const {
  if (chain_) {
    char line[160];
    std::snprintf(line, sizeof line,
                  "synthetic: Markov chain over %d tokens, %d successors each, entropy %.3f "
                  "nats/token (ln vocab = %.3f)",
                  chain_->vocab_size(), chain_->fanout(), chain_->entropy_nats(),
                  std::log(double(chain_->vocab_size())));
    return line;
  }
  const std::size_t files = corpus_->num_files();
  return std::string(name_of(source_)) + " " + path_ + ": " + std::to_string(corpus_->size()) +
         " tokens in " + std::to_string(files) + (files == 1 ? " file" : " files");
}

std::vector<int32_t> load_validation_tokens(const DataConfig& data, const ModelConfig& model,
                                            uint64_t seed) {
  check_source_and_model(data, model);
  if (data.source == DataSource::Synthetic) {
    check_synthetic_paths(data);
    MarkovChain chain(model.vocab_size, seed);
    const int window = model.seq_len + 1;
    std::vector<int32_t> tokens(std::size_t(kSyntheticValidationWindows) * window);
    for (int64_t w = 0; w < kSyntheticValidationWindows; ++w) {
      chain.sample(validation_stream(seed), 0, w, window, tokens.data() + w * window);
    }
    return tokens;
  }
  if (data.val_path.empty()) return {};
  const std::vector<std::string> files = expand_data_paths(data.val_path, "data.val_path");
  const TokenCorpus corpus = TokenCorpus::open(data.source, files, model.vocab_size);
  std::vector<int32_t> tokens(corpus.size());
  corpus.copy(0, tokens.size(), tokens.data());
  check_long_enough(files_text(files), tokens.size(), model.seq_len);
  return tokens;
}

int64_t validation_windows(std::size_t num_tokens, int seq_len) {
  PPTRAIN_CHECK(seq_len >= 1, "seq_len must be positive");
  return int64_t(num_tokens / (std::size_t(seq_len) + 1));
}

double synthetic_entropy_nats(const ModelConfig& model) {
  return MarkovChain::entropy_nats(model.vocab_size);
}

}  // namespace pptrain
