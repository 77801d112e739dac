// Included first by every file compiled for the emulated CUDA backend (the rewritten
// lib/ops/cuda sources, emulate_cu.cmake; the reused CUDA test files, CMakeLists.txt),
// before that file renames the namespace pptrain to pptrain_emulated. The real headers
// the CUDA backend shares with the rest of the code base (dtypes, checks, the Ops
// interface) are included here, under their own name, so the rename's #pragma once
// copies are never made; the using-directives let the renamed code reach them. So the
// emulated CudaOps derives from the real pptrain::ops::Ops and the tests compare it
// with the real CPU backend through that one interface, while everything that is the
// CUDA backend's own (namespace pptrain::ops::cuda, CudaOps, make_cuda_ops,
// cuda_device_count, cuda_backend_built, cuda_check) has a distinct emulated copy that
// never meets the real one at link time. A test file may include further real headers
// before this one (its wrapper's PRE list in CMakeLists.txt).
#pragma once
#include <memory>

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/random.hpp"
#include "cuda_emulator.hpp"
#include "ops/ops.hpp"

namespace pptrain_emulated {
using namespace ::pptrain;  // NOLINT
namespace ops {
using namespace ::pptrain::ops;  // NOLINT
// The emulated backend's entry points (cuda_ops.cpp): its own, as ops.hpp declares
// the real ones.
bool cuda_backend_built();
int cuda_device_count();
std::unique_ptr<Ops> make_cuda_ops(int device, DType compute, bool flash_attention = false);
}  // namespace ops
}  // namespace pptrain_emulated
