// Element types of backend arrays: fp32 (master weights, gradients, optimizer state,
// statistics, and everything on the CPU backend) and bf16 (the CUDA backend's
// activations and weight copy under train.precision: bf16).
#pragma once
#include <cstddef>
#include <cstdint>

namespace pptrain {

enum class DType : uint8_t { F32, BF16 };

constexpr std::size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
constexpr const char* dtype_name(DType t) { return t == DType::F32 ? "fp32" : "bf16"; }

}  // namespace pptrain
