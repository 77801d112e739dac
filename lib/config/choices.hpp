// The config keys whose value is one of a fixed set of names, as enums, each with its one
// name table (value i is names[i]). The decoder, its "must be one of" messages, to_yaml,
// docs/config.md's check and the fuzz dictionary's check all read these tables; code
// past the decoder compares enums, never strings. Header only: the pure libraries below
// config (the pipeline schedules) use the enums too.
#pragma once
#include <concepts>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

namespace pptrain {

enum class ScheduleKind { GPipe, OneFOneB, Interleaved, ZeroBubbleH1, ZeroBubbleV };
enum class MessageModeChoice { Auto, Grouped, AsyncSends, Channels };
enum class Precision { Auto, BF16, FP32 };
enum class Attention { Auto, Unfused, Fused };
enum class Recompute { None, Selective, Full };
enum class OnNonfinite { Stop, Skip };
enum class MemoryCheck { Error, Warn, Off };
enum class LrSchedule { Cosine, Linear, Constant };
enum class DataSource { Synthetic, Text, Llmc, NanoGpt };
enum class LogLevel { Debug, Info, Warn, Error };
enum class Device { Cpu, Auto, Cuda };
enum class LayoutChoice { Manual, Auto };
enum class Arch { Gpt2, Llama };

template <class E>
struct ChoiceNames;  // specialised below: static constexpr std::string_view names[]
template <>
struct ChoiceNames<ScheduleKind> {
  static constexpr std::string_view names[] = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"};
};
template <>
struct ChoiceNames<MessageModeChoice> {
  static constexpr std::string_view names[] = {"auto", "grouped", "async-sends", "channels"};
};
template <>
struct ChoiceNames<Precision> {
  static constexpr std::string_view names[] = {"auto", "bf16", "fp32"};
};
template <>
struct ChoiceNames<Attention> {
  static constexpr std::string_view names[] = {"auto", "unfused", "fused"};
};
template <>
struct ChoiceNames<Recompute> {
  static constexpr std::string_view names[] = {"none", "selective", "full"};
};
template <>
struct ChoiceNames<OnNonfinite> {
  static constexpr std::string_view names[] = {"stop", "skip"};
};
template <>
struct ChoiceNames<MemoryCheck> {
  static constexpr std::string_view names[] = {"error", "warn", "off"};
};
template <>
struct ChoiceNames<LrSchedule> {
  static constexpr std::string_view names[] = {"cosine", "linear", "constant"};
};
template <>
struct ChoiceNames<DataSource> {
  static constexpr std::string_view names[] = {"synthetic", "text", "llmc", "nanogpt"};
};
template <>
struct ChoiceNames<LogLevel> {
  static constexpr std::string_view names[] = {"debug", "info", "warn", "error"};
};
template <>
struct ChoiceNames<LayoutChoice> {
  static constexpr std::string_view names[] = {"manual", "auto"};
};
template <>
struct ChoiceNames<Arch> {
  static constexpr std::string_view names[] = {"gpt2", "llama"};
};
template <>
struct ChoiceNames<Device> {
  static constexpr std::string_view names[] = {"cpu", "auto", "cuda"};
};

// An enum with a name table.
template <class E>
concept Choice = std::is_enum_v<E> && requires { ChoiceNames<E>::names; };

template <Choice E>
constexpr std::span<const std::string_view> names_of() {
  return ChoiceNames<E>::names;
}

template <Choice E>
constexpr std::string_view name_of(E value) {
  return names_of<E>()[static_cast<std::size_t>(value)];
}

// The value named `name`, or nothing.
template <Choice E>
constexpr std::optional<E> parse_choice(std::string_view name) {
  const auto names = names_of<E>();
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<E>(i);
  return std::nullopt;
}

// "a, b, c": the names, for messages.
inline std::string join_names(std::span<const std::string_view> names) {
  std::string out;
  for (std::string_view n : names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

}  // namespace pptrain
