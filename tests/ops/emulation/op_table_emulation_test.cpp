// The op table (tests/ops/op_table.hpp) on the emulated CUDA backend, fp32 and bf16.
#include "emulated_namespace.hpp"
#include "op_table.hpp"

namespace pptrain::ops::testing {
namespace {

Backend emulated_cuda(DType t) {
  return {std::string("emulated_cuda_") + dtype_name(t),
          [t] { return ::pptrain_emulated::ops::make_cuda_ops(0, t); }};
}

INSTANTIATE_TEST_SUITE_P(EmulatedCuda, OpTableTest,
                         ::testing::ValuesIn(op_table({emulated_cuda(DType::F32),
                                                       emulated_cuda(DType::BF16)})),
                         op_table_name);

}  // namespace
}  // namespace pptrain::ops::testing
