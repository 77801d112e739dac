// Private helpers: naming and listing the step_<N> directories of a checkpoint root.
#pragma once
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pptrain::ckpt {

inline std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

// The step number of a name "step_<digits>", or nullopt.
inline std::optional<int64_t> parse_step_name(std::string_view name) {
  constexpr std::string_view prefix = "step_";
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return {};
  std::string_view digits = name.substr(prefix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return {};
  int64_t step = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size()) return {};
  return step;
}

// (step, path) of every step_<N> directory in `root`, newest first; empty if `root`
// does not exist or cannot be listed.
inline std::vector<std::pair<int64_t, std::filesystem::path>> list_step_dirs(
    const std::filesystem::path& root) {
  std::vector<std::pair<int64_t, std::filesystem::path>> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    auto step = parse_step_name(it->path().filename().string());
    std::error_code type_ec;
    if (step && it->is_directory(type_ec)) out.emplace_back(*step, it->path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace pptrain::ckpt
