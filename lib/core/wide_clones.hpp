// PPTRAIN_WIDE_CLONES: a function compiled for AVX-512, AVX2 and baseline x86-64, the
// version chosen at load time. The wider vectors run the same IEEE operations (the
// libraries using it compile without contraction into FMAs: -ffp-contract=off), so every
// machine computes the same bits.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PPTRAIN_WIDE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PPTRAIN_WIDE_CLONES
#endif
