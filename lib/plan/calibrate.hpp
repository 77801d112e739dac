// `pptrain plan --calibrate`: this machine's CPU rates, measured, as a cluster file the
// planner reads (device: a map with cpu: true).
#pragma once
#include <string>

#include "comm/comm.hpp"
#include "plan/cluster.hpp"

namespace pptrain {

// Collective over a two-rank world: rank 0 measures one-thread fp32 GEMMs (a large and
// a small one: the peak and gemm_half_dim), the rate of elementwise work (the slowest of
// an add, a LayerNorm and a GELU, per byte the time model counts) and the cost of a
// tiny op; both ranks time messages between them (8 bytes and 4 MiB: latency and
// bandwidth). One node of `ranks_per_node` ranks. Takes a few seconds.
Cluster calibrate_cpu(comm::World& world, int ranks_per_node);

// The cluster as a YAML file pptrain plan --cluster reads back.
std::string cluster_yaml(const Cluster& cluster, const std::string& comment);

}  // namespace pptrain
