// Reads whole token files into int32 tokens (the formats are checked by TokenCorpus).
#include "data/dataset.hpp"
#include "data/token_corpus.hpp"

namespace pptrain {

std::vector<int32_t> read_token_file(DataSource source, const std::string& path,
                                     int vocab_size) {
  const TokenCorpus corpus = TokenCorpus::open(source, {path}, vocab_size);
  std::vector<int32_t> tokens(corpus.size());
  corpus.copy(0, tokens.size(), tokens.data());
  return tokens;
}

}  // namespace pptrain
