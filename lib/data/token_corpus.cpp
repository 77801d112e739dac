// Opening token files as mappings: the formats' checks, the files' concatenation, globs.
#include "data/token_corpus.hpp"

#include <glob.h>
#include <sys/mman.h>

#include <algorithm>

#include "core/error.hpp"
#include "core/input_file.hpp"

namespace pptrain {

namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;
constexpr std::size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw InputError(path + ": " + problem);
}

int32_t le32(const unsigned char* b) {
  return int32_t(uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 |
                 uint32_t(b[3]) << 24);
}

bool is_glob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

}  // namespace

// One mapped file and where its tokens are: `count` little-endian tokens of `width`
// bytes (1 or 2) at `tokens`.
struct TokenCorpus::Shard {
  void* map = nullptr;
  std::size_t map_bytes = 0;
  const unsigned char* tokens = nullptr;
  std::size_t count = 0;
  int width = 1;
  ~Shard() {
    if (map) munmap(map, map_bytes);
  }
  int32_t at(std::size_t i) const {
    return width == 1 ? int32_t(tokens[i])
                      : int32_t(uint32_t(tokens[2 * i]) | uint32_t(tokens[2 * i + 1]) << 8);
  }
};

std::vector<std::string> expand_data_paths(const std::vector<std::string>& entries,
                                           const std::string& key) {
  std::vector<std::string> files;
  for (const std::string& entry : entries) {
    if (!is_glob(entry)) {
      files.push_back(entry);
      continue;
    }
    glob_t g{};
    const int rc = ::glob(entry.c_str(), GLOB_ERR, nullptr, &g);
    std::vector<std::string> matched(g.gl_pathv, g.gl_pathv + g.gl_pathc);
    globfree(&g);
    if (rc != 0 || matched.empty()) fail(entry, key + ": the glob matches no file");
    std::sort(matched.begin(), matched.end());
    files.insert(files.end(), matched.begin(), matched.end());
  }
  return files;
}

TokenCorpus TokenCorpus::open(DataSource source, const std::vector<std::string>& paths,
                              int vocab_size) {
  TokenCorpus corpus;
  for (const std::string& path : paths) {
    if (source == DataSource::Synthetic) fail(path, "data.source synthetic reads no token file");
    if (source == DataSource::Text && vocab_size < 256) {
      fail(path, "data.source text makes one token per byte and needs model.vocab_size >= 256, "
                 "got " + std::to_string(vocab_size));
    }
    const InputFile file(path);
    const std::size_t size = file.size();
    if (size == 0) fail(path, "the file is empty");
    auto shard = std::make_shared<Shard>();
    shard->map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
    if (shard->map == MAP_FAILED) {
      shard->map = nullptr;
      fail(path, "cannot map the file into memory");
    }
    shard->map_bytes = size;
    const auto* bytes = static_cast<const unsigned char*>(shard->map);
    shard->tokens = bytes;
    shard->width = source == DataSource::Text ? 1 : 2;
    shard->count = size / std::size_t(shard->width);
    if (source == DataSource::NanoGpt && size % 2 != 0)
      fail(path, "odd size " + std::to_string(size) + " bytes: a nanogpt token file holds uint16 tokens");
    if (source == DataSource::Llmc) {
      if (size < kLlmcHeaderBytes)
        fail(path, "too short for an llm.c token shard: " + std::to_string(size) +
                       " bytes, but the header alone is " + std::to_string(kLlmcHeaderBytes));
      const int32_t magic = le32(bytes), version = le32(bytes + 4), count = le32(bytes + 8);
      if (magic != kLlmcMagic)
        fail(path, "bad magic " + std::to_string(magic) + " (expected " +
                       std::to_string(kLlmcMagic) + " for an llm.c token shard)");
      if (version != kLlmcVersion)
        fail(path, "unsupported llm.c shard version " + std::to_string(version) + " (expected " +
                       std::to_string(kLlmcVersion) + ": uint16 tokens)");
      if (count < 0) fail(path, "negative token count " + std::to_string(count) + " in header");
      const std::size_t expected = kLlmcHeaderBytes + 2 * std::size_t(count);
      const std::string declared = "the header declares " + std::to_string(count) + " tokens (" +
                                   std::to_string(expected) + " bytes in all)";
      if (size < expected)
        fail(path, "truncated: " + declared + " but the file has " + std::to_string(size) + " bytes");
      if (size > expected)
        fail(path, std::to_string(size - expected) + " trailing bytes: " + declared +
                       " but the file has " + std::to_string(size) + " bytes");
      if (count == 0) fail(path, "the shard holds no tokens");
      shard->tokens = bytes + kLlmcHeaderBytes;
      shard->count = std::size_t(count);
    }
    for (std::size_t i = 0; i < shard->count; ++i) {
      const int32_t t = shard->at(i);
      if (t >= vocab_size)
        fail(path, "token " + std::to_string(t) + " at position " + std::to_string(i) +
                       " is >= model.vocab_size " + std::to_string(vocab_size));
    }
    corpus.first_.push_back(corpus.size_);
    corpus.size_ += shard->count;
    corpus.shards_.push_back(std::move(shard));
  }
  return corpus;
}

void TokenCorpus::copy(std::size_t start, std::size_t n, int32_t* out) const {
  PPTRAIN_CHECK(start + n <= size_, "token range past the corpus");
  // The shard holding `start`: the last one whose first token is at or before it.
  std::size_t s = std::size_t(std::upper_bound(first_.begin(), first_.end(), start) - first_.begin()) - 1;
  std::size_t at = start - first_[s];
  for (std::size_t i = 0; i < n; ++i, ++at) {
    while (at >= shards_[s]->count) at -= shards_[s++]->count;
    out[i] = shards_[s]->at(at);
  }
}

}  // namespace pptrain
