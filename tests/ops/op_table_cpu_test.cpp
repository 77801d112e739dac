// The op table (op_table.hpp) on the CPU backend with bf16 storage (tests/model).
#include "bf16_cpu_ops.hpp"
#include "op_table.hpp"

namespace pptrain::ops::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(
    Cpu, OpTableTest,
    ::testing::ValuesIn(op_table({{"bf16_cpu", test_support::make_bf16_cpu_ops}})), op_table_name);

}  // namespace
}  // namespace pptrain::ops::testing
