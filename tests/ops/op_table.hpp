// The op table: one case per op of ops::Ops, run on every backend a test binary has and
// compared with the CPU reference (the shape of ggml's test-backend-ops). A case draws
// its inputs, makes its arrays through an OpRun and calls the op; the framework runs it
// once on the backend under test and once on the CPU, with the same inputs (every Act
// input rounded to the tested compute dtype on both), and compares each output it made
// (all_close, with the output's tolerance for that dtype). Adding an op is adding its
// case to op_cases.cpp; each test binary lists its backends (INSTANTIATE_TEST_SUITE_P
// with op_table()): the bf16-storage CPU backend in test_ops, CUDA in test_ops_cuda
// (skipped without a device), the emulated CUDA backend in test_backend_emulation.
#pragma once
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "ops/ops.hpp"

namespace pptrain::ops::testing {

// Relative tolerances of one output (to its largest reference magnitude), by the tested
// compute dtype.
struct Tolerance {
  double fp32, bf16;
};

// One run of a case on one backend: the case's arrays in that backend's memory.
class OpRun {
 public:
  OpRun(Ops& backend, DType inputs) : ops(backend), inputs_(inputs) {}
  Ops& ops;

  // n normal values times scale from seed, rounded to the tested dtype.
  std::vector<float> randn(std::size_t n, uint64_t seed, float scale = 1.0f) const;
  // Inputs (an Act array gets the host values rounded to the tested dtype).
  const Act* act(const std::vector<float>& host);
  const float* f32(const std::vector<float>& host);
  const int32_t* i32(const std::vector<int32_t>& host);
  const double* f64(const std::vector<double>& host);
  void* scratch(std::size_t bytes);  // not compared
  // Outputs, compared after the case: written by the op (they start as NaN, so an
  // element left unwritten fails) or updated by it (they start as `host`).
  Act* act_out(const std::string& name, std::size_t n, Tolerance tol);
  Act* act_inout(const std::string& name, const std::vector<float>& host, Tolerance tol);
  float* f32_out(const std::string& name, std::size_t n, Tolerance tol);
  float* f32_inout(const std::string& name, const std::vector<float>& host, Tolerance tol);
  double* f64_inout(const std::string& name, const std::vector<double>& host, Tolerance tol);

  struct Result {
    std::string name;
    std::vector<float> values;
    double tol;
  };
  // Every output's values (as fp32) and tolerance, in the order the case made them.
  std::vector<Result> results();

 private:
  Buffer& upload(const void* host, std::size_t bytes);
  struct Output {
    std::string name;
    const Buffer* buffer;
    std::size_t n;
    enum class Elem { F32, Act, F64 } elem;
    Tolerance tol;
  };
  DType inputs_;
  std::deque<Buffer> buffers_;  // a deque: outputs_ points into it
  std::vector<Output> outputs_;
};

struct OpCase {
  std::string name;  // letters, digits and '_'
  std::function<void(OpRun&)> run;
};
// The table (op_cases.cpp).
const std::vector<OpCase>& op_cases();

// A backend under test; make() returns null where this machine lacks it (the test skips).
struct Backend {
  std::string name;
  std::function<std::unique_ptr<Ops>()> make;
};

struct OpTableParam {
  Backend backend;
  OpCase op;
};
inline void PrintTo(const OpTableParam& p, std::ostream* os) {
  *os << p.op.name << " on " << p.backend.name;
}
// Every case on every one of `backends`, and the test names ("<backend>_<case>").
std::vector<OpTableParam> op_table(const std::vector<Backend>& backends);
std::string op_table_name(const ::testing::TestParamInfo<OpTableParam>& info);

// TEST_P(OpTableTest, MatchesCpu) is in op_table.cpp; a binary instantiates it.
class OpTableTest : public ::testing::TestWithParam<OpTableParam> {};

}  // namespace pptrain::ops::testing
