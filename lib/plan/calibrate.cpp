// Measuring the CPU backend's rates and MPI between two local ranks.
#include "plan/calibrate.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "ops/ops.hpp"

namespace pptrain {

namespace {

using Clock = std::chrono::steady_clock;

// The fastest of `repeats` runs of f, in seconds (the least disturbed by other load).
template <class F>
double fastest(int repeats, F&& f) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

double gemm_rate(ops::Ops& ops, int n) {  // FLOP/s of an n x n x n product
  ops::Buffer a(ops, std::size_t(n) * n * 4), b(ops, std::size_t(n) * n * 4), c(ops, std::size_t(n) * n * 4);
  a.zero();
  b.zero();
  const int calls = std::max(1, (1 << 27) / (n * n * n));  // about 0.1 GFLOP per timing
  const double s = fastest(5, [&] {
    for (int i = 0; i < calls; ++i) ops.gemm(false, false, n, n, n, 1.0f, a.act(), b.act(), 0.0f, c.act());
  });
  return 2.0 * n * n * n * calls / s;
}

// Seconds of one round trip of `bytes` between ranks 0 and 1.
double round_trip(comm::World& world, std::size_t bytes) {
  std::vector<char> buf(std::max<std::size_t>(bytes, 1));
  const int peer = 1 - world.rank();
  const int trips = bytes > 4096 ? 20 : 200;
  auto once = [&] {
    for (int i = 0; i < trips; ++i) {
      if (world.rank() == 0) {
        world.exchange({{comm::Transfer::Send, peer, buf.data(), bytes, 1}});
        world.exchange({{comm::Transfer::Recv, peer, buf.data(), bytes, 2}});
      } else {
        world.exchange({{comm::Transfer::Recv, peer, buf.data(), bytes, 1}});
        world.exchange({{comm::Transfer::Send, peer, buf.data(), bytes, 2}});
      }
    }
  };
  once();  // warm up
  return fastest(3, once) / trips;
}

}  // namespace

Cluster calibrate_cpu(comm::World& world, int ranks_per_node) {
  Cluster c;
  c.source = "calibrated";
  c.nodes = 1;
  c.gpus_per_node = ranks_per_node;
  c.device = device_preset("cpu");
  c.device.name = "cpu (calibrated)";
  const double ram = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  c.device.memory_gib = ram / double(1ull << 30) / ranks_per_node;
  // Messages first, while both ranks are here: latency from 8 bytes, bandwidth from 4 MiB.
  const double small = round_trip(world, 8), large = round_trip(world, 4 << 20);
  c.intra_node.latency_us = small / 2 * 1e6;
  c.intra_node.gbps = double(4 << 20) / std::max(large / 2 - small / 2, 1e-9) / 1e9;
  c.inter_node = c.intra_node;  // one node
  if (world.rank() != 0) return c;
  const std::unique_ptr<ops::Ops> cpu = ops::make_cpu_ops(1, false);
  const double big = gemm_rate(*cpu, 512), tiny = gemm_rate(*cpu, 32);
  c.device.gemm_efficiency = 1.0;  // peak: what the large product reaches
  c.device.peak_tflops = big / 1e12;
  c.device.gemm_half_dim = std::max(1.0, 32.0 * (big / tiny - 1.0));
  // Elementwise work at the rate of the model's own row ops, counted in the bytes the
  // time model counts: a LayerNorm and a GELU over 4 M floats move 2 x 16 MiB each, an
  // add 3 x 16 MiB; the slowest sets the rate (on one thread they are compute-bound).
  const int rows = 4096, cols = 1024;
  const std::size_t n = std::size_t(rows) * cols;
  ops::Buffer x(*cpu, n * 4), y(*cpu, n * 4), w(*cpu, cols * 4), stats(*cpu, rows * 8);
  x.zero();
  y.zero();
  w.zero();
  const double add = fastest(5, [&] { cpu->add(y.act(), x.act(), y.act(), n); }) / 3;
  const double norm = fastest(5, [&] {
    cpu->layernorm_forward(y.act(), stats.f32(), stats.f32() + rows, x.act(), w.act(), w.act(), rows, cols);
  }) / 2;
  const double gelu = fastest(5, [&] { cpu->gelu_forward(y.act(), x.act(), n); }) / 2;
  c.device.memory_efficiency = 1.0;
  c.device.hbm_gbps = double(n) * 4 / std::max({add, norm, gelu}) / 1e9;
  const double op = fastest(5, [&] {
    for (int i = 0; i < 1000; ++i) cpu->add(y.act(), x.act(), y.act(), 1);
  });
  c.device.launch_us = op / 1000 * 1e6;
  return c;
}

std::string cluster_yaml(const Cluster& c, const std::string& comment) {
  const DeviceSpec& d = c.device;
  return fmt::format(
      "# {}\nnodes: {}\ngpus_per_node: {}\ndevice:\n  memory_gib: {:.3g}\n  peak_tflops: {:.6g}\n"
      "  hbm_gbps: {:.6g}\n  gemm_efficiency: {:.3g}\n  gemm_half_dim: {:.4g}\n"
      "  memory_efficiency: {:.3g}\n  launch_us: {:.4g}\n  reserved_gib: {:.3g}\n  cpu: {}\n"
      "intra_node_gbps: {:.6g}\ninter_node_gbps: {:.6g}\n"
      "latency_us: {{intra_node: {:.4g}, inter_node: {:.4g}}}\n",
      comment, c.nodes, c.gpus_per_node, d.memory_gib, d.peak_tflops, d.hbm_gbps, d.gemm_efficiency,
      d.gemm_half_dim, d.memory_efficiency, d.launch_us, d.reserved_gib, d.cpu ? "true" : "false",
      c.intra_node.gbps, c.inter_node.gbps, c.intra_node.latency_us, c.inter_node.latency_us);
}

}  // namespace pptrain
