// Loading a run configuration: read the file, parse YAML, reject unknown keys, apply
// `--set key=value` overrides to the YAML tree, then decode (decode.cpp) and validate
// (validate.cpp). Also holds the table of known keys and the error-location helpers.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <set>
#include <sstream>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "config/config.hpp"
#include "config/config_detail.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"

namespace pptrain {
namespace config_detail {

#define PPTRAIN_FIELD(sec, name) \
  Field { #sec, #name, [](Config& c) -> FieldRef { return &c.sec.name; } }

std::span<const Field> fields() {
  static const Field table[] = {
      PPTRAIN_FIELD(model, arch),
      PPTRAIN_FIELD(model, n_layer),        PPTRAIN_FIELD(model, n_head),
      PPTRAIN_FIELD(model, n_kv_head),
      PPTRAIN_FIELD(model, d_model),        PPTRAIN_FIELD(model, ffn_hidden),
      PPTRAIN_FIELD(model, seq_len),
      PPTRAIN_FIELD(model, vocab_size),     PPTRAIN_FIELD(model, rope_theta),
      PPTRAIN_FIELD(model, norm_eps),       PPTRAIN_FIELD(model, tie_embeddings),     PPTRAIN_FIELD(parallel, layout),
      PPTRAIN_FIELD(parallel, tp),          PPTRAIN_FIELD(parallel, cp),
      PPTRAIN_FIELD(parallel, pp),          PPTRAIN_FIELD(parallel, dp),
      PPTRAIN_FIELD(parallel, micro_batches), PPTRAIN_FIELD(parallel, micro_batch_size),
      PPTRAIN_FIELD(parallel, schedule),    PPTRAIN_FIELD(parallel, virtual_stages),
      PPTRAIN_FIELD(parallel, zero),        PPTRAIN_FIELD(parallel, sequence_parallel),
      PPTRAIN_FIELD(parallel, layers_per_stage),
      PPTRAIN_FIELD(parallel, schedule_costs), PPTRAIN_FIELD(parallel, message_mode),
      PPTRAIN_FIELD(parallel, comm_timeout_s), PPTRAIN_FIELD(parallel, overlap),
      PPTRAIN_FIELD(parallel, grad_bucket_mib),
      PPTRAIN_FIELD(train, steps),
      PPTRAIN_FIELD(train, lr),             PPTRAIN_FIELD(train, min_lr),
      PPTRAIN_FIELD(train, warmup_steps),   PPTRAIN_FIELD(train, lr_schedule),
      PPTRAIN_FIELD(train, weight_decay),   PPTRAIN_FIELD(train, grad_clip),
      PPTRAIN_FIELD(train, beta1),          PPTRAIN_FIELD(train, beta2),
      PPTRAIN_FIELD(train, eps),            PPTRAIN_FIELD(train, seed),
      PPTRAIN_FIELD(train, eval_every),     PPTRAIN_FIELD(train, eval_batches),
      PPTRAIN_FIELD(train, threads),        PPTRAIN_FIELD(train, on_nonfinite),
      PPTRAIN_FIELD(train, max_nonfinite),  PPTRAIN_FIELD(train, precision),
      PPTRAIN_FIELD(train, peak_tflops),    PPTRAIN_FIELD(train, attention),
      PPTRAIN_FIELD(train, recompute),      PPTRAIN_FIELD(train, recompute_layers),
      PPTRAIN_FIELD(train, memory_check),   PPTRAIN_FIELD(train, cuda_graph),
      PPTRAIN_FIELD(data, source),
      PPTRAIN_FIELD(data, path),            PPTRAIN_FIELD(data, val_path),
      PPTRAIN_FIELD(checkpoint, dir),       PPTRAIN_FIELD(checkpoint, every),
      PPTRAIN_FIELD(checkpoint, keep),      PPTRAIN_FIELD(checkpoint, resume),
      PPTRAIN_FIELD(checkpoint, init_from),
      PPTRAIN_FIELD(logging, every),        PPTRAIN_FIELD(logging, metrics),
      PPTRAIN_FIELD(logging, trace),        PPTRAIN_FIELD(logging, trace_steps),
      PPTRAIN_FIELD(logging, level),
      Field{"", "device", [](Config& c) -> FieldRef { return &c.device; }},
  };
  return table;
}
#undef PPTRAIN_FIELD

std::span<const char* const> sections() {
  static const char* const names[] = {"model", "parallel", "train",
                                      "data", "checkpoint", "logging"};
  return names;
}

std::string dotted(const Field& f) {
  return *f.section ? std::string(f.section) + "." + f.key : std::string(f.key);
}

std::string Origins::where(const std::string& key) const {
  for (auto it = override_keys.rbegin(); it != override_keys.rend(); ++it)
    if (key == *it || key.starts_with(*it + ".") || key.starts_with(*it + "["))
      return "--set " + abbreviated(*it);
  if (auto it = value_line.find(key); it != value_line.end())
    return file + ":" + std::to_string(it->second);
  // The key is absent: blame its section.
  if (auto dot = key.find('.'); dot != std::string::npos) {
    std::string section = key.substr(0, dot);
    if (auto it = section_line.find(section); it != section_line.end())
      return file + ":" + std::to_string(it->second);
    for (const std::string& o : override_keys)
      if (o.starts_with(section + ".")) return "--set " + abbreviated(o);
  }
  return file;
}

void fail_key(const Origins& origins, const std::string& key, const std::string& reason) {
  throw InputError(origins.where(key) + ": " + key + ": " + reason);
}

}  // namespace config_detail

namespace {
using namespace config_detail;

bool is_section(const std::string& name) {
  return std::ranges::find(sections(), name) != sections().end();
}

bool is_field(const std::string& key) {
  return std::ranges::any_of(fields(), [&](const Field& f) { return dotted(f) == key; });
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// "unknown key 'K'", with the closest known key when it is close enough to be a typo
// (or when the same name exists in another section).
std::string unknown_key(const std::string& key) {
  std::vector<std::string> known(sections().begin(), sections().end());
  for (const Field& f : fields()) known.push_back(dotted(f));
  std::string leaf = key.substr(key.rfind('.') + 1);  // npos + 1 == 0
  std::string best;
  std::size_t best_d = std::string::npos;
  for (const std::string& k : known) {
    std::size_t d = edit_distance(key, k);
    if (k.substr(k.rfind('.') + 1) == leaf) d = std::min<std::size_t>(d, 1);
    if (d < best_d) best_d = d, best = k;
  }
  std::string msg = "unknown key '" + abbreviated(key) + "'";
  if (best_d <= 2 || best_d * 3 <= key.size()) msg += " (did you mean '" + best + "'?)";
  return msg;
}

std::string at_line(const std::string& file, const YAML::Mark& mark) {
  return mark.is_null() ? file : file + ":" + std::to_string(mark.line + 1);
}

// A config is a few KiB; anything over this is not one (and is never read whole).
constexpr std::size_t kMaxConfigBytes = 4u << 20;

std::string read_file(const std::string& path) {
  return InputFile(path, "config file").read_all(kMaxConfigBytes);
}

// Where each document of a YAML stream starts, and the mark of its root node. Used to
// parse the documents without building them: after a stray token (e.g. a lone ',')
// yaml-cpp 0.7's LoadAll loops forever, adding empty documents that all start there.
class DocumentMarks : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts, roots;

  void OnDocumentStart(const YAML::Mark& m) override { starts.push_back(m); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                const std::string&) override { node(m); }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override { node(m); }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override { node(m); }
  void OnMapEnd() override {}

 private:
  void node(const YAML::Mark& m) {
    if (roots.size() < starts.size()) roots.push_back(m);
  }
};

// Parses the text as exactly one YAML document; `locate` turns a mark into the
// "where" of an error message.
YAML::Node load_document(const std::string& text,
                         const std::function<std::string(const YAML::Mark&)>& locate) {
  DocumentMarks marks;
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    while (marks.starts.size() < 3 && parser.HandleNextDocument(marks)) {
      const std::size_t n = marks.starts.size();
      if (n < 2 || marks.starts[n - 1].pos != marks.starts[n - 2].pos) continue;
      const std::size_t pos = std::size_t(marks.starts[n - 1].pos);  // the parser is stuck
      std::string what = "unexpected token";
      if (pos < text.size() && std::isgraph(static_cast<unsigned char>(text[pos])))
        what = "unexpected '" + text.substr(pos, 1) + "'";
      throw YAML::ParserException(marks.starts[n - 1], what);
    }
    if (marks.starts.size() > 1)
      throw InputError(locate(marks.roots.size() > 1 ? marks.roots[1] : marks.starts[1]) +
                       ": only one YAML document is allowed");
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw InputError(locate(e.mark) + ": YAML syntax error: " + e.msg);
  }
}

// Parses the text into one YAML document whose top level is a map (empty: no keys).
YAML::Node load_root(const std::string& text, const std::string& file) {
  const YAML::Node doc =
      load_document(text, [&](const YAML::Mark& m) { return at_line(file, m); });
  if (doc.IsNull()) return YAML::Node(YAML::NodeType::Map);
  if (!doc.IsMap())
    throw InputError(at_line(file, doc.Mark()) +
                     ": the top level must be a map of sections (model, train, ...)");
  return doc;
}

// Rejects unknown and duplicate keys in a map. `prefix` is "" at the top level. Errors
// name the file's line, or `override_where` ("--set ...") for a map given in an override.
void check_keys(const YAML::Node& map, const std::string& prefix, const std::string& file,
                const std::string& override_where = "") {
  std::set<std::string> seen;
  for (const auto& kv : map) {
    const YAML::Node& k = kv.first;
    std::string loc = override_where.empty() ? at_line(file, k.Mark()) : override_where;
    if (!k.IsScalar()) throw InputError(loc + ": keys must be plain names");
    std::string key = prefix.empty() ? k.Scalar() : prefix + "." + k.Scalar();
    if (!seen.insert(key).second) throw InputError(loc + ": " + key + ": duplicate key");
    if (prefix.empty() && is_section(key)) {
      if (kv.second.IsMap()) check_keys(kv.second, key, file, override_where);
    } else if (!is_field(key)) {
      throw InputError(loc + ": " + unknown_key(key));
    }
  }
}

struct Override {
  std::string text;  // as given, for messages
  std::vector<std::string> path;
  YAML::Node value;
};

Override parse_override(const std::string& text) {
  std::string where = "--set " + abbreviated(text);
  auto eq = text.find('=');
  if (eq == std::string::npos)
    throw InputError(where + ": expected KEY=VALUE, e.g. train.lr=3e-4");
  std::string key = text.substr(0, eq);
  key.erase(0, key.find_first_not_of(" \t"));
  key.erase(key.find_last_not_of(" \t") + 1);
  if (key.empty()) throw InputError(where + ": the key before '=' is empty");
  Override o{text, {}, {}};
  for (std::size_t start = 0;;) {
    std::size_t dot = key.find('.', start);
    o.path.push_back(key.substr(start, dot - start));
    if (o.path.back().empty())
      throw InputError(where + ": malformed key '" + abbreviated(key) + "'");
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (!is_section(key) && !is_field(key)) throw InputError(where + ": " + unknown_key(key));
  // The same single-document check as a file: trailing junk is an error, not dropped.
  o.value = load_document(text.substr(eq + 1), [&](const YAML::Mark&) {
    return where + ": invalid YAML value";
  });
  if (is_section(key) && o.value.IsMap()) check_keys(o.value, key, "", where);
  return o;
}

// Sets root[path...] = value, creating missing sections. Keys are removed before they
// are re-added so that a node shared through a YAML alias is never written through.
void apply_override(YAML::Node& root, const Override& o, const Origins& origins) {
  YAML::Node node = root;  // a handle; reset() moves it, assignment would overwrite
  for (std::size_t i = 0; i + 1 < o.path.size(); ++i) {
    const std::string& name = o.path[i];
    YAML::Node child = static_cast<const YAML::Node&>(node)[name];  // no insertion
    if (!child.IsDefined() || child.IsNull()) {
      node.remove(name);
      node[name] = YAML::Node(YAML::NodeType::Map);
    } else if (!child.IsMap()) {  // e.g. `train: 5` in the file, then --set train.lr=...
      std::string loc = origins.where(name);
      if (loc == origins.file) loc = at_line(origins.file, child.Mark());
      throw InputError(loc + ": " + name + ": expected a map of keys, got " + describe(child) +
                       " (while applying --set " + abbreviated(o.text) + ")");
    }
    node.reset(node[name]);
  }
  node.remove(o.path.back());
  node[o.path.back()] = o.value;
}

// The keys whose default depends on the model: n_kv_head and ffn_hidden when 0 (left
// out), tie_embeddings when left out (llama's is false).
void resolve_arch_defaults(ModelConfig& m, const Origins& origins) {
  if (m.n_kv_head == 0) m.n_kv_head = m.n_head;
  if (m.ffn_hidden == 0) m.ffn_hidden = default_ffn_hidden(m.arch, m.d_model);
  if (!origins.value_line.count("model.tie_embeddings")) m.tie_embeddings = m.arch == Arch::Gpt2;
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides) {
  YAML::Node root = load_root(yaml_text, source_name);
  check_keys(root, "", source_name);
  Origins origins;
  origins.file = source_name;
  for (const std::string& text : overrides) {
    Override o = parse_override(text);
    apply_override(root, o, origins);
    std::string key = o.path[0];
    for (std::size_t i = 1; i < o.path.size(); ++i) key += "." + o.path[i];
    origins.override_keys.push_back(key);
  }
  Config config = decode(root, origins);
  resolve_arch_defaults(config.model, origins);
  validate(config, origins);
  config.source_path = source_name;
  for (const auto& [key, line] : origins.value_line) config.given_keys.insert(key);
  return config;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_config(read_file(path), path, overrides);
}

}  // namespace pptrain
