// pptrain-sgemm: the fp32 GEMM ceiling of this machine, measured with the same OpenBLAS
// (OpenMP build) and thread count pptrain's CPU backend uses. Benchmarks divide a run's
// model FLOP/s by this figure, measured in the same run. It runs the OpenBLAS kernels
// pptrain runs (ops/cpu/blas_kernels.hpp).
// Usage: pptrain-sgemm M N K THREADS [SECONDS]; prints "sgemm MxNxK THREADS threads:
// G GFLOP/s (OpenBLAS FAMILY)" (the best of repeated C = A @ B over about SECONDS,
// default 2).
#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ops/cpu/blas_kernels.hpp"

int main(int argc, char** argv) {
  if (pptrain::ops::request_better_blas_kernels()) execv("/proc/self/exe", argv);  // as pptrain
  if (argc < 5) {
    std::fprintf(stderr, "usage: pptrain-sgemm M N K THREADS [SECONDS]\n");
    return 2;
  }
  const int M = std::atoi(argv[1]), N = std::atoi(argv[2]), K = std::atoi(argv[3]);
  const int threads = std::atoi(argv[4]);
  const double budget = argc > 5 ? std::atof(argv[5]) : 2.0;
  if (M <= 0 || N <= 0 || K <= 0 || threads <= 0 || budget <= 0) {
    std::fprintf(stderr, "pptrain-sgemm: sizes, threads and seconds must be positive\n");
    return 2;
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  std::vector<float> a(size_t(M) * K, 0.5f), b(size_t(K) * N, 0.25f), c(size_t(M) * N);
  using Clock = std::chrono::steady_clock;
  double best = 1e30;
  const auto start = Clock::now();
  for (int rep = 0; rep < 3 || std::chrono::duration<double>(Clock::now() - start).count() < budget;
       ++rep) {
    const auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a.data(), K, b.data(), N,
                0.0f, c.data(), N);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s < best) best = s;
  }
  std::printf("sgemm %dx%dx%d %d threads: %.1f GFLOP/s (OpenBLAS %s)\n", M, N, K, threads,
              2.0 * M * N * K / best / 1e9, pptrain::ops::blas_coretype().c_str());
  return 0;
}
