// Reads whole token files into int32 tokens: raw text bytes, llm.c shards (1 KiB header,
// then uint16 tokens) and nanoGPT dumps (raw uint16). The bytes are read straight into
// the result and widened in place, so a file is never held twice in memory.
#include "core/error.hpp"
#include "core/input_file.hpp"
#include "data/dataset.hpp"

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

// Reads `count` little-endian tokens of `width` bytes (1 or 2) starting at byte `offset`
// and checks each is < vocab_size.
std::vector<int32_t> read_tokens(const InputFile& file, const std::string& path, std::size_t offset,
                                 std::size_t count, int width, int vocab_size) {
  std::vector<int32_t> tokens(count);
  auto* bytes = reinterpret_cast<unsigned char*>(tokens.data());
  file.read_at(bytes, count * std::size_t(width), offset);
  // Widen back to front: token i's source bytes lie at or before its destination, and
  // every later destination has already been written.
  std::size_t first_bad = count;
  for (std::size_t i = count; i-- > 0;) {
    int32_t v = width == 1 ? int32_t(bytes[i])
                           : int32_t(uint32_t(bytes[2 * i]) | uint32_t(bytes[2 * i + 1]) << 8);
    tokens[i] = v;
    if (v >= vocab_size) first_bad = i;
  }
  if (first_bad < count) {
    fail(path, "token " + std::to_string(tokens[first_bad]) + " at position " +
                   std::to_string(first_bad) + " is >= model.vocab_size " +
                   std::to_string(vocab_size));
  }
  return tokens;
}

std::vector<int32_t> read_llmc(const InputFile& file, const std::string& path, int vocab_size) {
  const std::size_t size = file.size();
  if (size < kLlmcHeaderBytes) {
    fail(path, "too short for an llm.c token shard: " + std::to_string(size) +
                   " bytes, but the header alone is " + std::to_string(kLlmcHeaderBytes));
  }
  unsigned char header[kLlmcHeaderBytes];
  file.read_at(header, kLlmcHeaderBytes, 0);
  const int32_t magic = le32(header), version = le32(header + 4), count = le32(header + 8);
  if (magic != kLlmcMagic) {
    fail(path, "bad magic " + std::to_string(magic) + " (expected " +
                   std::to_string(kLlmcMagic) + " for an llm.c token shard)");
  }
  if (version != kLlmcVersion) {
    fail(path, "unsupported llm.c shard version " + std::to_string(version) + " (expected " +
                   std::to_string(kLlmcVersion) + ": uint16 tokens)");
  }
  if (count < 0) fail(path, "negative token count " + std::to_string(count) + " in header");
  const std::size_t expected = kLlmcHeaderBytes + 2 * std::size_t(count);
  const std::string declared = "the header declares " + std::to_string(count) + " tokens (" +
                               std::to_string(expected) + " bytes in all)";
  if (size < expected) {
    fail(path, "truncated: " + declared + " but the file has " + std::to_string(size) +
                   " bytes");
  }
  if (size > expected) {
    fail(path, std::to_string(size - expected) + " trailing bytes: " + declared +
                   " but the file has " + std::to_string(size) + " bytes");
  }
  if (count == 0) fail(path, "the shard holds no tokens");
  return read_tokens(file, path, kLlmcHeaderBytes, std::size_t(count), 2, vocab_size);
}

}  // namespace

std::vector<int32_t> read_token_file(DataSource source, const std::string& path,
                                     int vocab_size) {
  if (source == DataSource::Synthetic) fail(path, "data.source synthetic reads no token file");
  if (source == DataSource::Text && vocab_size < 256) {
    fail(path, "data.source text makes one token per byte and needs model.vocab_size >= 256, "
               "got " + std::to_string(vocab_size));
  }
  InputFile file(path);
  if (file.size() == 0) fail(path, "the file is empty");
  if (source == DataSource::Text) return read_tokens(file, path, 0, file.size(), 1, vocab_size);
  if (source == DataSource::NanoGpt) {
    if (file.size() % 2 != 0) {
      fail(path, "odd size " + std::to_string(file.size()) +
                     " bytes: a nanogpt token file holds uint16 tokens");
    }
    return read_tokens(file, path, 0, file.size() / 2, 2, vocab_size);
  }
  return read_llmc(file, path, vocab_size);
}

}  // namespace pptrain
