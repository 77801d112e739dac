// Helpers shared by the model tests.
#pragma once
#include <cstdint>
#include <vector>

#include "core/random.hpp"

namespace pptrain::test_support {

// n token ids in [0, vocab), a pure function of key.
inline std::vector<int32_t> tokens(int n, int vocab, uint64_t key) {
  std::vector<int32_t> t(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    t[std::size_t(i)] = int32_t(mix64(key + uint64_t(i)) % uint64_t(vocab));
  return t;
}

}  // namespace pptrain::test_support
