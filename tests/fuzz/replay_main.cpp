// Replays saved fuzz inputs through a fuzz target's entry point in a normal build, so
// every seed and every past crash stays a regression test. Arguments are files or
// directories (read recursively, in sorted order); a missing directory is skipped. A
// bad input aborts inside the target, a hanging one is killed by an alarm (before a
// parser stuck in a loop eats the machine's memory); the run fails if no input is found.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

// Seconds one input may take; each takes milliseconds.
constexpr unsigned kSecondsPerInput = 3;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size);

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg = argv[i];
    if (fs::is_directory(arg)) {
      for (const auto& entry : fs::recursive_directory_iterator(arg))
        if (entry.is_regular_file()) inputs.push_back(entry.path());
    } else if (fs::exists(arg)) {
      inputs.push_back(arg);
    }
  }
  std::sort(inputs.begin(), inputs.end());
  if (inputs.empty()) {
    std::fprintf(stderr, "no fuzz inputs found in the given paths\n");
    return 1;
  }
  for (const fs::path& p : inputs) {
    std::ifstream in(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "cannot read %s\n", p.c_str());
      return 1;
    }
    std::fprintf(stderr, "replaying %s\n", p.c_str());
    ::alarm(kSecondsPerInput);  // SIGALRM's default action ends the process
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ::alarm(0);
  }
  std::printf("%zu inputs replayed without a finding\n", inputs.size());
  return 0;
}
