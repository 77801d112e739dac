// The launchers of lib/ops/cuda (kernels.hpp, flash_attention.hpp) as built for the CUDA
// emulator: the same declarations, in the namespace emulate_cu.cmake renames pptrain to.
#pragma once
#include "cuda_emulator.hpp"

#define pptrain pptrain_emulated
#include "ops/cuda/flash_attention.hpp"
#include "ops/cuda/kernels.hpp"
#undef pptrain

namespace pptrain::emulation_test {
namespace kern = ::pptrain_emulated::ops::cuda;
}  // namespace pptrain::emulation_test
