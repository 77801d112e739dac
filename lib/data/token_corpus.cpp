// Token files kept open and read on demand: the formats' checks, the files' concatenation,
// globs.
#include "data/token_corpus.hpp"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <memory>

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

// One open file and where its tokens are: `count` little-endian tokens of `width` bytes
// (1 or 2) from byte `begin`. Read with pread, never mapped: a file truncated under the
// run is a short read, not a SIGBUS.
struct TokenCorpus::Shard {
  std::unique_ptr<InputFile> file;
  std::size_t begin = 0;
  std::size_t count = 0;
  int width = 1;

  // Tokens [first, first + n) into out; `bytes` is scratch.
  void read(std::size_t first, std::size_t n, int32_t* out,
            std::vector<unsigned char>& bytes) const {
    bytes.resize(n * std::size_t(width));
    file->read_at(bytes.data(), bytes.size(), begin + first * std::size_t(width));
    for (std::size_t i = 0; i < n; ++i)
      out[i] = width == 1 ? int32_t(bytes[i])
                          : int32_t(uint32_t(bytes[2 * i]) | uint32_t(bytes[2 * i + 1]) << 8);
  }
};

namespace {

// Position of the first token >= vocab_size in tokens[0, n), or n.
std::size_t first_out_of_vocab(const int32_t* tokens, std::size_t n, int vocab_size) {
  return std::size_t(std::find_if(tokens, tokens + n, [&](int32_t t) { return t >= vocab_size; }) -
                     tokens);
}

// "N bytes now, M when the run opened it" for a file whose size is no longer `opened`
// ("" when it is).
std::string size_now(const std::string& path, std::size_t opened) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "the file is gone";
  if (std::size_t(st.st_size) == opened) return "";
  return std::to_string(st.st_size) + " bytes now, " + std::to_string(opened) +
         " when the run opened it";
}

}  // namespace

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
  corpus.vocab_size_ = vocab_size;
  for (const std::string& path : paths) {
    if (source == DataSource::Synthetic) fail(path, "data.source synthetic reads no token file");
    if (source == DataSource::Text && vocab_size < 256) {
      fail(path, "data.source text makes one token per byte and needs model.vocab_size >= 256, "
                 "got " + std::to_string(vocab_size));
    }
    auto shard = std::make_shared<Shard>();
    shard->file = std::make_unique<InputFile>(path);
    const InputFile& file = *shard->file;
    const std::size_t size = file.size();
    if (size == 0) fail(path, "the file is empty");
    shard->width = source == DataSource::Text ? 1 : 2;
    shard->count = size / std::size_t(shard->width);
    if (source == DataSource::NanoGpt && size % 2 != 0)
      fail(path, "odd size " + std::to_string(size) + " bytes: a nanogpt token file holds uint16 tokens");
    if (source == DataSource::Llmc) {
      if (size < kLlmcHeaderBytes)
        fail(path, "too short for an llm.c token shard: " + std::to_string(size) +
                       " bytes, but the header alone is " + std::to_string(kLlmcHeaderBytes));
      unsigned char header[12];
      file.read_at(header, sizeof header, 0);
      const int32_t magic = le32(header), version = le32(header + 4), count = le32(header + 8);
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
      shard->begin = kLlmcHeaderBytes;
      shard->count = std::size_t(count);
    }
    // Every token in range, read in chunks of 1 Mi tokens.
    std::vector<unsigned char> bytes;
    std::vector<int32_t> tokens;
    for (std::size_t at = 0; at < shard->count; at += tokens.size()) {
      tokens.resize(std::min<std::size_t>(shard->count - at, std::size_t(1) << 20));
      shard->read(at, tokens.size(), tokens.data(), bytes);
      const std::size_t bad = first_out_of_vocab(tokens.data(), tokens.size(), vocab_size);
      if (bad < tokens.size())
        fail(path, "token " + std::to_string(tokens[bad]) + " at position " +
                       std::to_string(at + bad) + " is >= model.vocab_size " +
                       std::to_string(vocab_size));
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
  std::vector<unsigned char> bytes;
  for (std::size_t done = 0; done < n; ++s, at = 0) {
    const Shard& shard = *shards_[s];
    const std::size_t take = std::min(n - done, shard.count - at);
    const std::string& path = shard.file->path();
    try {
      shard.read(at, take, out + done, bytes);
    } catch (const InputError& e) {  // the file shrank, or the read failed
      const std::string now = size_now(path, shard.file->size());
      throw DataChanged(now.empty() ? e.what() + std::string(" during the run")
                                    : path + ": changed during the run: " + now);
    }
    const std::size_t bad = first_out_of_vocab(out + done, take, vocab_size_);
    if (bad < take)
      throw DataChanged(path + ": changed during the run: token " +
                        std::to_string(out[done + bad]) + " at position " +
                        std::to_string(at + bad) + " is >= model.vocab_size " +
                        std::to_string(vocab_size_));
    done += take;
  }
}

}  // namespace pptrain
