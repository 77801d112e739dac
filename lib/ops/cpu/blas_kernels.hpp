// Which OpenBLAS kernels run. Built with DYNAMIC_ARCH, OpenBLAS picks its kernel family
// when it loads, from the CPU's model number; a release that does not know the model
// falls back to an older family. Debian 12's OpenBLAS 0.3.21 runs its Prescott (SSE3)
// kernels on Intel family 6 model 207, an AVX-512 CPU, at about an eighth of the sgemm
// rate of its SkylakeX kernels there (docs/performance.md). OPENBLAS_CORETYPE, read
// when the library loads, names the family; pptrain sets it when OpenBLAS's own choice
// is older than the CPU's instruction sets allow, and the user has not set it, and
// executes itself again.
#pragma once
#include <string>

namespace pptrain::ops {

// The instruction sets that decide which x86-64 OpenBLAS kernels can run.
struct CpuIsa {
  bool avx = false;
  bool avx2_fma = false;  // AVX2 and FMA3
  bool avx512 = false;    // AVX-512 F, CD, BW, DQ and VL
};
CpuIsa this_cpu_isa();

// The family to ask OpenBLAS for, given the one it chose: the newest of SkylakeX,
// Haswell and Sandybridge that `isa` runs, when `chosen` is an older Intel family of
// OpenBLAS's table (Prescott, Core2, Penryn, Dunnington, Nehalem, Atom, Sandybridge,
// Haswell); empty otherwise (its choice is as new, or another vendor's family).
std::string better_blas_coretype(const std::string& chosen, const CpuIsa& isa);

// The family OpenBLAS runs in this process ("Prescott", "SkylakeX", "Zen", ...).
std::string blas_coretype();

// When OPENBLAS_CORETYPE is unset and better_blas_coretype names a family: sets it and
// returns true. The caller then executes itself again, so that OpenBLAS loads with it
// (if that exec fails, the run goes on with OpenBLAS's own choice).
bool request_better_blas_kernels();

}  // namespace pptrain::ops
