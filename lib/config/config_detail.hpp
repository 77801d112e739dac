// Internals shared by the config decoder (config.cpp) and validator (validate.cpp):
// the table of known keys, and where each key's value came from for error messages.
#pragma once
#include <map>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "config/config.hpp"

namespace YAML {
class Node;
}

namespace pptrain::config_detail {

// A pointer to the Config member a key decodes into; its type selects the decoder.
using FieldRef = std::variant<bool*, int*, uint64_t*, double*, std::string*, std::vector<int>*,
                              std::vector<double>*, std::vector<std::string>*, LayerSplit*, ScheduleKind*, MessageModeChoice*,
                              Precision*, Attention*, Recompute*, OnNonfinite*, MemoryCheck*, LrSchedule*,
                              DataSource*, LogLevel*, Device*, LayoutChoice*, Arch*>;

// One known key. `section` is empty for top-level scalars (only `device`).
struct Field {
  const char* section;
  const char* key;
  FieldRef (*ref)(Config&);
};

// Every key, in the order to_yaml writes them (sections in their struct order).
std::span<const Field> fields();

// The names a choice key takes (names_of its enum); empty for other keys.
std::span<const std::string_view> choice_names(const FieldRef& ref);

// The section names, in order.
std::span<const char* const> sections();

// "section.key", or just "key" for top-level scalars.
std::string dotted(const Field& f);

// Where values came from: a line of the config file or a `--set` override.
struct Origins {
  std::string file;
  std::vector<std::string> override_keys;  // dotted keys of the overrides, in order
  std::map<std::string, int> value_line;   // dotted key -> 1-based line of its value
  std::map<std::string, int> section_line; // section -> 1-based line of its key

  // "FILE:LINE", "--set KEY" or "FILE": the place to blame for `key`'s value.
  std::string where(const std::string& key) const;
};

// Throws InputError "WHERE: KEY: reason" for `key`.
[[noreturn]] void fail_key(const Origins& origins, const std::string& key,
                           const std::string& reason);

// Decodes every known key present under `root` into a Config (defaults elsewhere);
// records value lines in `origins`. Throws InputError on a wrong type.
Config decode(const YAML::Node& root, Origins& origins);

// A node for messages: "'abc'", "quoted string '5'", "a map", "a list", "an empty value".
std::string describe(const YAML::Node& node);

// Checks every value rule; throws InputError naming the offending key's origin.
void validate(const Config& config, const Origins& origins);

}  // namespace pptrain::config_detail
