// The CUDA entry points of a build without the CUDA backend.
#include <stdexcept>

#include "ops/ops.hpp"

namespace pptrain::ops {

bool cuda_backend_built() { return false; }
int cuda_device_count() { return 0; }
CudaDeviceInfo cuda_device_info(int) { return {}; }
std::unique_ptr<Ops> make_cuda_ops(int, DType, bool) {
  throw std::runtime_error("this build of pptrain has no CUDA backend (configure with the CUDA "
                           "toolkit installed, PPTRAIN_CUDA=AUTO or ON)");
}

}  // namespace pptrain::ops
