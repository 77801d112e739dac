// Cluster files and the device presets.
#include "plan/cluster.hpp"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <map>
#include <set>

#include "core/error.hpp"
#include "core/input_file.hpp"

namespace pptrain {

namespace {

struct Preset {
  DeviceSpec device;
  LinkSpec intra, inter;
};

// Vendors' datasheet numbers (dense, no sparsity); links per GPU per direction: NVLink's
// total bandwidth halved, one InfiniBand NIC per GPU. docs/design.md lists the sources.
const std::map<std::string, Preset>& presets() {
  static const std::map<std::string, Preset> table = [] {
    std::map<std::string, Preset> t;
    auto gpu = [](const char* name, double mem, double tflops, double hbm, double eff) {
      DeviceSpec d;
      d.name = name;
      d.memory_gib = mem;
      d.peak_tflops = tflops;
      d.hbm_gbps = hbm;
      d.gemm_efficiency = eff;
      return d;
    };
    t["a100-40gb"] = {gpu("a100-40gb", 40, 312, 1555, 0.85), {300, 3}, {25, 8}};
    t["a100-80gb"] = {gpu("a100-80gb", 80, 312, 2039, 0.85), {300, 3}, {25, 8}};
    t["h100-sxm"] = {gpu("h100-sxm", 80, 989, 3350, 0.8), {450, 3}, {50, 8}};
    t["h200"] = {gpu("h200", 141e9 / double(1ull << 30), 989, 4800, 0.8), {450, 3}, {50, 8}};
    DeviceSpec cpu;  // one rank of a small machine; calibrate for real numbers
    cpu.name = "cpu";
    cpu.memory_gib = 8;
    cpu.peak_tflops = 0.1;
    cpu.hbm_gbps = 10;
    cpu.gemm_efficiency = 0.9;
    cpu.gemm_half_dim = 32;
    cpu.memory_efficiency = 0.5;
    cpu.launch_us = 2;
    cpu.reserved_gib = 0;
    cpu.cpu = true;
    t["cpu"] = {cpu, {5, 5}, {1.25, 30}};
    return t;
  }();
  return table;
}

const Preset& preset(const std::string& name, const std::string& where) {
  const auto it = presets().find(name);
  if (it == presets().end()) {
    std::string names;
    for (const auto& [n, p] : presets()) names += (names.empty() ? "" : ", ") + n;
    throw InputError(where + "device: unknown preset '" + name + "' (known: " + names + ")");
  }
  return it->second;
}

// Reads one positive number, or fails naming the key.
double positive(const YAML::Node& node, const std::string& key, const std::string& source) {
  double v = 0;
  try {
    v = node.as<double>();
  } catch (const YAML::Exception&) {
    throw InputError(source + ": " + key + ": expected a number");
  }
  if (!(std::isfinite(v) && v > 0))
    throw InputError(source + ": " + key + ": must be > 0");
  return v;
}

void check_keys(const YAML::Node& map, const std::set<std::string>& known, const std::string& prefix,
                const std::string& source) {
  for (const auto& kv : map) {
    const std::string key = kv.first.as<std::string>();
    if (!known.count(key)) throw InputError(source + ": " + prefix + key + ": unknown key");
  }
}

}  // namespace

std::vector<std::string> device_preset_names() {
  std::vector<std::string> out;
  for (const auto& [n, p] : presets()) out.push_back(n);
  return out;
}
DeviceSpec device_preset(const std::string& name) { return preset(name, "").device; }
LinkSpec preset_intra_node(const std::string& name) { return preset(name, "").intra; }
LinkSpec preset_inter_node(const std::string& name) { return preset(name, "").inter; }

Cluster parse_cluster(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw InputError(source + ": YAML syntax error: " + e.msg);
  }
  if (!root.IsMap()) throw InputError(source + ": a cluster file is a map of keys");
  check_keys(root, {"nodes", "gpus_per_node", "device", "intra_node_gbps", "inter_node_gbps",
                    "latency_us"}, "", source);
  Cluster c;
  c.source = source;
  for (const char* key : {"nodes", "gpus_per_node"}) {
    const double v = root[key] ? positive(root[key], key, source) : 1.0;
    if (v != std::floor(v) || v > 1 << 20) throw InputError(source + ": " + key + ": must be a whole number");
    (std::string(key) == "nodes" ? c.nodes : c.gpus_per_node) = int(v);
  }
  const YAML::Node dev = root["device"];
  if (!dev) throw InputError(source + ": device: required (a preset name or a map)");
  std::string base = "h100-sxm";
  if (dev.IsScalar()) {
    base = dev.as<std::string>();
    c.device = preset(base, source + ": ").device;
  } else if (dev.IsMap()) {
    check_keys(dev, {"preset", "memory_gib", "peak_tflops", "hbm_gbps", "gemm_efficiency",
                     "gemm_half_dim", "memory_efficiency", "launch_us", "reserved_gib", "cpu"},
               "device.", source);
    if (dev["preset"]) base = dev["preset"].as<std::string>();
    c.device = preset(base, source + ": ").device;
    if (!dev["preset"]) {
      for (const char* need : {"memory_gib", "peak_tflops", "hbm_gbps"})
        if (!dev[need]) throw InputError(source + ": device." + need + ": required without a preset");
      c.device.name = "custom";
    }
    auto set = [&](const char* key, double& field) {
      if (dev[key]) field = positive(dev[key], std::string("device.") + key, source);
    };
    set("memory_gib", c.device.memory_gib);
    set("peak_tflops", c.device.peak_tflops);
    set("hbm_gbps", c.device.hbm_gbps);
    set("gemm_efficiency", c.device.gemm_efficiency);
    set("gemm_half_dim", c.device.gemm_half_dim);
    set("memory_efficiency", c.device.memory_efficiency);
    set("launch_us", c.device.launch_us);
    if (dev["reserved_gib"]) c.device.reserved_gib = dev["reserved_gib"].as<double>();
    if (dev["cpu"]) c.device.cpu = dev["cpu"].as<bool>();
    for (double e : {c.device.gemm_efficiency, c.device.memory_efficiency})
      if (e > 1) throw InputError(source + ": device: efficiencies are shares of peak, at most 1");
  } else {
    throw InputError(source + ": device: expected a preset name or a map");
  }
  const Preset& p = preset(base, source + ": ");
  c.intra_node = p.intra;
  c.inter_node = p.inter;
  if (root["intra_node_gbps"]) c.intra_node.gbps = positive(root["intra_node_gbps"], "intra_node_gbps", source);
  if (root["inter_node_gbps"]) c.inter_node.gbps = positive(root["inter_node_gbps"], "inter_node_gbps", source);
  if (const YAML::Node lat = root["latency_us"]) {
    if (!lat.IsMap()) throw InputError(source + ": latency_us: expected {intra_node: US, inter_node: US}");
    check_keys(lat, {"intra_node", "inter_node"}, "latency_us.", source);
    if (lat["intra_node"]) c.intra_node.latency_us = positive(lat["intra_node"], "latency_us.intra_node", source);
    if (lat["inter_node"]) c.inter_node.latency_us = positive(lat["inter_node"], "latency_us.inter_node", source);
  }
  return c;
}

Cluster load_cluster(const std::string& path) {
  const InputFile file(path, "cluster file");
  return parse_cluster(file.read_all(1 << 20), path);
}

}  // namespace pptrain
