// Fuzz target for read_token_file. The first input byte picks the format (text, llmc,
// nanogpt) and a vocabulary size; the rest is the file. Reading must succeed or throw
// InputError; accepted tokens must equal a plain decoding of the file's bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.hpp"
#include "fuzz_common.hpp"

namespace {

constexpr const char* kFormats[] = {"text", "llmc", "nanogpt"};
// Small vocabularies make out-of-range tokens common; 1 and 0 are invalid sizes.
constexpr int kVocabs[] = {256, 300, 2, 50257, 65536, 1, 0, 1000};

// The tokens a file of `format` holds, decoded the obvious way (no checks).
std::vector<int32_t> plain_decode(const std::string& format, const uint8_t* p, std::size_t n) {
  std::vector<int32_t> out;
  if (format == "text") return std::vector<int32_t>(p, p + n);
  const std::size_t start = format == "llmc" ? 1024 : 0;
  for (std::size_t i = start; i + 1 < n; i += 2) out.push_back(int32_t(p[i] | p[i + 1] << 8));
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static const pptrain::fuzz::ScratchFile scratch("tokens");
  const std::string format = kFormats[data[0] % 3];
  const int vocab = kVocabs[(data[0] / 3) % 8];
  const uint8_t* file = data + 1;
  const std::size_t n = size - 1;
  const std::string& path = scratch.write(file, n);
  pptrain::fuzz::only_input_errors([&] {
    const std::vector<int32_t> tokens = pptrain::read_token_file(*pptrain::parse_choice<pptrain::DataSource>(format), path, vocab);
    pptrain::fuzz::expect(!tokens.empty(), format + ": accepted a file with no tokens");
    pptrain::fuzz::expect(tokens == plain_decode(format, file, n),
                          format + ": tokens differ from the file's bytes");
    for (int32_t t : tokens)
      pptrain::fuzz::expect(t >= 0 && t < vocab, format + ": token out of range accepted");
  });
  return 0;
}
