// pptrain-sgemm: the fp32 GEMM rate of this machine, C = A @ B (row-major, no transposes),
// with the thread count pptrain's CPU backend uses, measured by one of two libraries:
// - openblas (the default): the OpenBLAS (OpenMP build) kernels pptrain would run
//   (ops/cpu/blas_kernels.hpp);
// - pptrain: the CPU backend's own blocked GEMM (ops/cpu/cpu_gemm.hpp), the best
//   micro-kernel this CPU runs.
// Benchmarks divide a run's model FLOP/s by the ceiling measured in the same run.
// Usage: pptrain-sgemm M N K THREADS [SECONDS [LIBRARY]]; prints "sgemm MxNxK THREADS
// threads: G GFLOP/s (OpenBLAS FAMILY)" or "(pptrain KERNEL)" (the best of repeated
// products over about SECONDS, default 2).
#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ops/cpu/blas_kernels.hpp"
#include "ops/cpu/cpu_gemm.hpp"

int main(int argc, char** argv) {
  if (pptrain::ops::request_better_blas_kernels()) execv("/proc/self/exe", argv);  // as pptrain
  if (argc < 5) {
    std::fprintf(stderr, "usage: pptrain-sgemm M N K THREADS [SECONDS [openblas|pptrain]]\n");
    return 2;
  }
  const int M = std::atoi(argv[1]), N = std::atoi(argv[2]), K = std::atoi(argv[3]);
  const int threads = std::atoi(argv[4]);
  const double budget = argc > 5 ? std::atof(argv[5]) : 2.0;
  const std::string library = argc > 6 ? argv[6] : "openblas";
  if (M <= 0 || N <= 0 || K <= 0 || threads <= 0 || budget <= 0) {
    std::fprintf(stderr, "pptrain-sgemm: sizes, threads and seconds must be positive\n");
    return 2;
  }
  if (library != "openblas" && library != "pptrain") {
    std::fprintf(stderr, "pptrain-sgemm: the library is openblas or pptrain, not '%s'\n",
                 library.c_str());
    return 2;
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  std::vector<float> a(size_t(M) * K, 0.5f), b(size_t(K) * N, 0.25f), c(size_t(M) * N);
  namespace cpu = pptrain::ops::cpu;
  cpu::GemmWorkspace workspace;
  std::function<void()> product;
  std::string name;
  if (library == "openblas") {
    product = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a.data(), K,
                  b.data(), N, 0.0f, c.data(), N);
    };
    name = "OpenBLAS " + pptrain::ops::blas_coretype();
  } else {
    const cpu::GemmArgs args{false, false, M, N, K, 1.0f, a.data(), K, b.data(), N,
                             0.0f, c.data(), N};
    product = [&] { cpu::gemm(args, workspace); };
    name = std::string("pptrain ") + cpu::gemm_kernel_name(cpu::best_gemm_kernel());
  }
  using Clock = std::chrono::steady_clock;
  double best = 1e30;
  const auto start = Clock::now();
  for (int rep = 0; rep < 3 || std::chrono::duration<double>(Clock::now() - start).count() < budget;
       ++rep) {
    const auto t0 = Clock::now();
    product();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s < best) best = s;
  }
  std::printf("sgemm %dx%dx%d %d threads: %.1f GFLOP/s (%s)\n", M, N, K, threads,
              2.0 * M * N * K / best / 1e9, name.c_str());
  return 0;
}
