// OpenBLAS's kernel family: the choice and the re-exec (see blas_kernels.hpp).
#include "ops/cpu/blas_kernels.hpp"

#include <cstdlib>
#include <string_view>

extern "C" char* openblas_get_corename(void);

namespace pptrain::ops {
namespace {

// OpenBLAS's older Intel families, by the instruction sets their kernels use.
int generation(std::string_view family) {
  for (std::string_view sse : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom"})
    if (family == sse) return 0;
  if (family == "Sandybridge") return 1;
  if (family == "Haswell") return 2;
  return -1;  // a newer family, or not one of these
}

}  // namespace

CpuIsa this_cpu_isa() {
  CpuIsa isa;
#if defined(__x86_64__)
  __builtin_cpu_init();
  isa.avx = __builtin_cpu_supports("avx");
  isa.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  isa.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vl");
#endif
  return isa;
}

std::string better_blas_coretype(const std::string& chosen, const CpuIsa& isa) {
  const int have = generation(chosen);
  if (have < 0) return {};
  const int best = isa.avx512 ? 3 : isa.avx2_fma ? 2 : isa.avx ? 1 : 0;
  if (best <= have) return {};
  return best == 3 ? "SkylakeX" : best == 2 ? "Haswell" : "Sandybridge";
}

std::string blas_coretype() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

bool request_better_blas_kernels() {
  if (std::getenv("OPENBLAS_CORETYPE")) return false;  // the user's choice, or done
  const std::string family = better_blas_coretype(blas_coretype(), this_cpu_isa());
  return !family.empty() && setenv("OPENBLAS_CORETYPE", family.c_str(), 1) == 0;
}

}  // namespace pptrain::ops
