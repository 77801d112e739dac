// Fuzz target for the YAML config loader. The input is YAML text, optionally followed
// by NUL-separated `--set` overrides ("yaml\0train.lr=3\0model.n_head=4"). parse_config
// must succeed or throw InputError; a config it accepts must survive a to_yaml round
// trip unchanged.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "fuzz_common.hpp"

namespace {

constexpr std::size_t kMaxOverrides = 8;

void check_round_trip(const pptrain::Config& config) {
  const std::string yaml = pptrain::to_yaml(config);
  pptrain::Config again;
  try {
    again = pptrain::parse_config(yaml, "round-trip.yaml");
  } catch (const std::exception& e) {
    pptrain::fuzz::finding("to_yaml output does not parse back: " + std::string(e.what()) +
                           "\n--- to_yaml ---\n" + yaml);
  }
  pptrain::fuzz::expect(pptrain::to_yaml(again) == yaml,
                        "to_yaml round trip changed the config:\n" + yaml + "--- became ---\n" +
                            pptrain::to_yaml(again));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::size_t end = input.find('\0');
  const std::string yaml = input.substr(0, end);
  std::vector<std::string> overrides;
  while (end != std::string::npos && overrides.size() < kMaxOverrides) {
    const std::size_t next = input.find('\0', end + 1);
    overrides.push_back(input.substr(end + 1, next == std::string::npos ? next : next - end - 1));
    end = next;
  }
  pptrain::fuzz::only_input_errors([&] {
    const pptrain::Config config = pptrain::parse_config(yaml, "fuzz.yaml", overrides);
    check_round_trip(config);
  });
  return 0;
}
