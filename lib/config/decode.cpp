// Converting between the YAML tree and Config: strict scalar decoding (no silent
// float-to-int, string-to-number, bool-to-number or number-to-bool conversions) and
// to_yaml.
#include <charconv>
#include <cmath>
#include <limits>
#include <system_error>
#include <type_traits>

#include <yaml-cpp/yaml.h>

#include "config/config_detail.hpp"
#include "core/error.hpp"

namespace pptrain::config_detail {
namespace {

bool is_quoted(const YAML::Node& n) { return n.Tag() == "!"; }

// Strict numbers: the whole text must be the number; a leading '+' is allowed.
template <typename T>
bool parse_number(std::string s, T& out) {
  if (s.size() > 1 && s[0] == '+' && s[1] != '-') s.erase(0, 1);
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, out);
  if (ec != std::errc() || ptr != end) return false;
  if constexpr (std::is_floating_point_v<T>) return std::isfinite(out);
  return true;
}

class Decoder {
 public:
  explicit Decoder(Origins& origins) : origins_(origins) {}

  // Remembers the value's line (an empty value has none: its key's line is used),
  // then decodes it into the field.
  void field(const std::string& key, const YAML::Node& node, FieldRef ref,
             const YAML::Mark& key_mark) {
    YAML::Mark mark = node.IsNull() ? key_mark : node.Mark();
    if (!mark.is_null()) origins_.value_line[key] = mark.line + 1;
    std::visit([&](auto* out) { decode(key, node, *out); }, ref);
  }

 private:
  [[noreturn]] void wrong(const std::string& key, const YAML::Node& node,
                          const char* expected) {
    fail_key(origins_, key, std::string("expected ") + expected + ", got " + describe(node));
  }

  // A plain (unquoted) scalar's text, or a type error.
  const std::string& number_text(const std::string& key, const YAML::Node& node,
                                 const char* expected) {
    if (!node.IsScalar() || is_quoted(node)) wrong(key, node, expected);
    return node.Scalar();
  }

  // YAML 1.2's core booleans only: true or false (no yes/no/on/off, no 0/1).
  void decode(const std::string& key, const YAML::Node& node, bool& out) {
    const std::string& text = number_text(key, node, "true or false");
    if (text == "true" || text == "True" || text == "TRUE") out = true;
    else if (text == "false" || text == "False" || text == "FALSE") out = false;
    else wrong(key, node, "true or false");
  }
  void decode(const std::string& key, const YAML::Node& node, int& out) {
    long long v = 0;
    if (!parse_number(number_text(key, node, "an integer"), v)) wrong(key, node, "an integer");
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
      fail_key(origins_, key, "integer out of range, got " + describe(node));
    out = int(v);
  }
  void decode(const std::string& key, const YAML::Node& node, uint64_t& out) {
    unsigned long long v = 0;
    const char* expected = "a non-negative integer";
    if (!parse_number(number_text(key, node, expected), v)) wrong(key, node, expected);
    out = v;
  }
  void decode(const std::string& key, const YAML::Node& node, double& out) {
    if (!parse_number(number_text(key, node, "a number"), out)) wrong(key, node, "a number");
  }
  void decode(const std::string& key, const YAML::Node& node, std::string& out) {
    if (node.IsNull()) out.clear();  // `key:` with no value means ""
    else if (node.IsScalar()) out = node.Scalar();
    else wrong(key, node, "a string");
    if (out.size() > kMaxStringBytes)
      fail_key(origins_, key, "is " + std::to_string(out.size()) + " bytes, more than the " +
                                  std::to_string(kMaxStringBytes) + " allowed (" +
                                  describe(node) + ")");
  }
  // A list of layer counts, or `auto`.
  void decode(const std::string& key, const YAML::Node& node, LayerSplit& out) {
    out = LayerSplit{};
    if (node.IsScalar() && !is_quoted(node) && node.Scalar() == "auto") {
      out.automatic = true;
      return;
    }
    if (!node.IsNull() && !node.IsSequence()) wrong(key, node, "a list of integers or auto");
    decode(key, node, out.counts);
  }
  // Paths: one string (empty: none), or a list of strings.
  void decode(const std::string& key, const YAML::Node& node, std::vector<std::string>& out) {
    out.clear();
    if (node.IsNull()) return;
    if (node.IsScalar()) {
      std::string one;
      decode(key, node, one);
      if (!one.empty()) out.push_back(one);
      return;
    }
    if (!node.IsSequence()) wrong(key, node, "a string or a list of strings");
    for (std::size_t i = 0; i < node.size(); ++i) {
      const std::string item = key + "[" + std::to_string(i) + "]";
      if (!node[i].IsScalar() || node[i].Scalar().empty()) wrong(item, node[i], "a path");
      std::string one;
      field(item, node[i], &one, node[i].Mark());
      out.push_back(one);
    }
  }
  // One of the enum's names (a plain or quoted scalar).
  template <Choice E>
  void decode(const std::string& key, const YAML::Node& node, E& out) {
    const std::string name = node.IsScalar() ? node.Scalar() : std::string();
    if (!node.IsNull() && !node.IsScalar()) wrong(key, node, "a string");
    const std::optional<E> value = parse_choice<E>(name);
    if (!value)
      fail_key(origins_, key, "must be one of " + join_names(names_of<E>()) + " (got '" +
                                  abbreviated(name) + "')");
    out = *value;
  }
  template <typename T>
  void decode(const std::string& key, const YAML::Node& node, std::vector<T>& out) {
    out.clear();
    if (node.IsNull()) return;
    if (!node.IsSequence())
      wrong(key, node, std::is_same_v<T, int> ? "a list of integers" : "a list of numbers");
    for (std::size_t i = 0; i < node.size(); ++i) {
      std::string item = key + "[" + std::to_string(i) + "]";
      T v = 0;
      field(item, node[i], &v, node[i].Mark());
      out.push_back(v);
    }
  }

  // Every string key is a name or a path: PATH_MAX bytes at most.
  static constexpr std::size_t kMaxStringBytes = 4096;
  Origins& origins_;
};

std::string format_double(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);  // shortest exact round trip
  return std::string(buf, res.ptr);
}

}  // namespace

std::span<const std::string_view> choice_names(const FieldRef& ref) {
  return std::visit(
      [](auto* v) -> std::span<const std::string_view> {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (Choice<T>) return names_of<T>();
        else return {};
      },
      ref);
}

std::string describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "an empty value";
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  return (is_quoted(node) ? "quoted string '" : "'") + abbreviated(node.Scalar()) + "'";
}

Config decode(const YAML::Node& root, Origins& origins) {
  const YAML::Node& top = root;  // const lookups never insert keys
  for (const auto& kv : top) {
    std::string name = kv.first.Scalar();
    if (!kv.first.Mark().is_null()) origins.section_line[name] = kv.first.Mark().line + 1;
    if (!kv.second.Mark().is_null()) origins.value_line[name] = kv.second.Mark().line + 1;
  }
  for (const char* section : sections()) {
    YAML::Node s = top[section];
    if (s.IsDefined() && !s.IsNull() && !s.IsMap())
      fail_key(origins, section, "expected a map of keys, got " + describe(s));
  }
  Config config;
  Decoder decoder(origins);
  for (const Field& f : fields()) {
    YAML::Node node = *f.section ? YAML::Node(top[f.section]) : top;
    if (!node.IsDefined() || !node.IsMap()) continue;  // section absent or empty
    for (const auto& kv : node)  // keys are unique: check_keys rejected duplicates
      if (kv.first.Scalar() == f.key) decoder.field(dotted(f), kv.second, f.ref(config),
                                                    kv.first.Mark());
  }
  return config;
}

}  // namespace pptrain::config_detail

namespace pptrain {

std::string to_yaml(const Config& config) {
  using namespace config_detail;
  Config c = config;  // the field table hands out non-const pointers
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string open;  // section whose map is being written
  for (const Field& f : fields()) {
    if (open != f.section) {
      if (!open.empty()) out << YAML::EndMap;
      open = f.section;
      if (!open.empty()) out << YAML::Key << open << YAML::Value << YAML::BeginMap;
    }
    out << YAML::Key << f.key << YAML::Value;
    std::visit(
        [&](auto* v) {
          using T = std::remove_pointer_t<decltype(v)>;
          if constexpr (std::is_same_v<T, bool>) {
            out << (*v ? "true" : "false");
          } else if constexpr (Choice<T>) {
            out << YAML::DoubleQuoted << std::string(name_of(*v));
          } else if constexpr (std::is_same_v<T, std::string>) {
            out << YAML::DoubleQuoted << *v;
          } else if constexpr (std::is_same_v<T, double>) {
            out << format_double(*v);
          } else if constexpr (std::is_same_v<T, std::vector<int>>) {
            out << YAML::Flow << YAML::BeginSeq;
            for (int x : *v) out << std::to_string(x);
            out << YAML::EndSeq;
          } else if constexpr (std::is_same_v<T, LayerSplit>) {
            if (v->automatic) {
              out << "auto";
            } else {
              out << YAML::Flow << YAML::BeginSeq;
              for (int x : v->counts) out << std::to_string(x);
              out << YAML::EndSeq;
            }
          } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
            if (v->size() == 1) {
              out << YAML::DoubleQuoted << v->front();
            } else if (v->empty()) {
              out << YAML::DoubleQuoted << "";
            } else {
              out << YAML::Flow << YAML::BeginSeq;
              for (const std::string& x : *v) out << YAML::DoubleQuoted << x;
              out << YAML::EndSeq;
            }
          } else if constexpr (std::is_same_v<T, std::vector<double>>) {
            out << YAML::Flow << YAML::BeginSeq;
            for (double x : *v) out << format_double(x);
            out << YAML::EndSeq;
          } else {
            out << std::to_string(*v);
          }
        },
        f.ref(c));
  }
  if (!open.empty()) out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace pptrain
