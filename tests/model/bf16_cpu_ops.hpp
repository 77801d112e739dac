// Test backends built on the CPU reference, each storing Act arrays (activations, weight
// copy, logits) its own way:
// - bf16 storage, as the CUDA backend's bf16 mode stores them. Each op widens its Act
//   inputs to fp32, runs the CPU op, and rounds its Act outputs to bf16 (to nearest
//   even). It lets the model's mixed-precision plumbing (separate weight copy, refresh
//   after updates, fp32 master/gradients/moments) run and be tested without a GPU.
// - fp32 storage with every Act output of an op moved one ulp up (towards +inf): the
//   kind of difference another GEMM's summation order makes, for showing that the
//   backend comparisons' bounds admit rounding changes (checked_step.hpp).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "ops/cpu/cpu_ops.hpp"

namespace pptrain::test_support {

uint16_t to_bf16(float x);
float from_bf16(uint16_t b);

std::unique_ptr<ops::Ops> make_bf16_cpu_ops();
std::unique_ptr<ops::Ops> make_one_ulp_up_cpu_ops();

}  // namespace pptrain::test_support
