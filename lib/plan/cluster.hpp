// The machine `pptrain plan` plans for: how many nodes and devices, what each device
// computes and holds, and the links between devices. Read from a YAML cluster file
// naming a device preset or giving its numbers.
#pragma once
#include <string>
#include <vector>

namespace pptrain {

struct DeviceSpec {
  std::string name = "custom";
  double memory_gib = 80;        // device memory
  double peak_tflops = 989;      // dense bf16 (fp32 for cpu)
  double hbm_gbps = 3350;        // memory bandwidth, GB/s
  // Efficiency terms of the time model (docs/design.md, "The planner's time model").
  double gemm_efficiency = 0.8;  // share of peak a large GEMM reaches
  double gemm_half_dim = 128;    // a GEMM whose smallest dimension is this reaches half of it
  double memory_efficiency = 0.8;  // share of hbm_gbps elementwise ops reach
  double launch_us = 5;          // fixed cost of one kernel (or CPU op)
  double reserved_gib = 2;       // held outside pptrain's count: CUDA context, libraries
  bool cpu = false;              // fp32 activations (the CPU backend), else bf16
};

struct LinkSpec {
  double gbps = 0;        // per device, per direction, GB/s
  double latency_us = 0;  // per message or collective step
};

struct Cluster {
  std::string source;     // the file, for messages
  int nodes = 1;
  int gpus_per_node = 1;  // ranks per node on the CPU
  DeviceSpec device;
  LinkSpec intra_node, inter_node;
  int world() const { return nodes * gpus_per_node; }
};

// The presets' names: a100-40gb, a100-80gb, h100-sxm, h200, cpu.
std::vector<std::string> device_preset_names();
// A preset with its default links; InputError naming it when unknown.
DeviceSpec device_preset(const std::string& name);
LinkSpec preset_intra_node(const std::string& name);
LinkSpec preset_inter_node(const std::string& name);

// Parses a cluster file's text:
//   nodes: 2
//   gpus_per_node: 8
//   device: h100-sxm            # or a map: {memory_gib, peak_tflops, hbm_gbps, ...}
//   intra_node_gbps: 450        # optional: the preset's by default
//   inter_node_gbps: 50
//   latency_us: {intra_node: 3, inter_node: 8}   # optional
// InputError "SOURCE: KEY: reason" for an unknown key, a wrong type or a bad value.
Cluster parse_cluster(const std::string& yaml_text, const std::string& source);
Cluster load_cluster(const std::string& path);

}  // namespace pptrain
