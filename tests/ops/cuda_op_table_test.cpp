// The op table (op_table.hpp) on the CUDA backend, fp32 and bf16; skips without a device.
#include "op_table.hpp"

namespace pptrain::ops::testing {
namespace {

Backend cuda(DType t) {
  return {std::string("cuda_") + dtype_name(t), [t]() -> std::unique_ptr<Ops> {
            return cuda_device_count() > 0 ? make_cuda_ops(0, t) : nullptr;
          }};
}

INSTANTIATE_TEST_SUITE_P(Cuda, OpTableTest,
                         ::testing::ValuesIn(op_table({cuda(DType::F32), cuda(DType::BF16)})),
                         op_table_name);

}  // namespace
}  // namespace pptrain::ops::testing
