// The op table's runner (op_table.hpp): OpRun, the (backend, case) pairs and the one
// parameterised test that compares a backend with the CPU reference.
#include "op_table.hpp"

#include <algorithm>
#include <cmath>

#include "all_close.hpp"
#include "bf16_cpu_ops.hpp"
#include "ops_test_util.hpp"

namespace pptrain::ops::testing {

namespace {
std::vector<float> rounded_to(std::vector<float> v, DType t) {
  if (t == DType::BF16)
    for (float& x : v) x = test_support::from_bf16(test_support::to_bf16(x));
  return v;
}
}  // namespace

std::vector<float> OpRun::randn(std::size_t n, uint64_t seed, float scale) const {
  return rounded_to(testing::randn(n, seed, scale), inputs_);
}

Buffer& OpRun::upload(const void* host, std::size_t bytes) {
  Buffer& b = buffers_.emplace_back(ops, bytes);
  ops.upload(b.get(), host, bytes);
  return b;
}

const Act* OpRun::act(const std::vector<float>& host) {
  const std::vector<float> values = rounded_to(host, inputs_);
  const Buffer& staging = upload(values.data(), values.size() * sizeof(float));
  Buffer& b = buffers_.emplace_back(ops, values.size() * dtype_size(ops.compute_dtype()));
  ops.to_compute(b.act(), staging.f32(), values.size());
  return b.act();
}
const float* OpRun::f32(const std::vector<float>& host) {
  return upload(host.data(), host.size() * sizeof(float)).f32();
}
const int32_t* OpRun::i32(const std::vector<int32_t>& host) {
  return upload(host.data(), host.size() * sizeof(int32_t)).i32();
}
const double* OpRun::f64(const std::vector<double>& host) {
  return static_cast<const double*>(upload(host.data(), host.size() * sizeof(double)).get());
}
void* OpRun::scratch(std::size_t bytes) { return buffers_.emplace_back(ops, bytes).get(); }

Act* OpRun::act_out(const std::string& name, std::size_t n, Tolerance tol) {
  return act_inout(name, std::vector<float>(n, NAN), tol);
}
Act* OpRun::act_inout(const std::string& name, const std::vector<float>& host, Tolerance tol) {
  Act* p = const_cast<Act*>(act(host));
  outputs_.push_back({name, &buffers_.back(), host.size(), Output::Elem::Act, tol});
  return p;
}
float* OpRun::f32_out(const std::string& name, std::size_t n, Tolerance tol) {
  return f32_inout(name, std::vector<float>(n, NAN), tol);
}
float* OpRun::f32_inout(const std::string& name, const std::vector<float>& host, Tolerance tol) {
  Buffer& b = upload(host.data(), host.size() * sizeof(float));
  outputs_.push_back({name, &b, host.size(), Output::Elem::F32, tol});
  return b.f32();
}
double* OpRun::f64_inout(const std::string& name, const std::vector<double>& host, Tolerance tol) {
  Buffer& b = upload(host.data(), host.size() * sizeof(double));
  outputs_.push_back({name, &b, host.size(), Output::Elem::F64, tol});
  return static_cast<double*>(b.get());
}

std::vector<OpRun::Result> OpRun::results() {
  std::vector<Result> out;
  for (const Output& o : outputs_) {
    std::vector<float> values(o.n);
    if (o.elem == Output::Elem::F64) {
      std::vector<double> wide(o.n);
      ops.download(wide.data(), o.buffer->get(), o.n * sizeof(double));
      std::copy(wide.begin(), wide.end(), values.begin());
    } else {
      const bool act = o.elem == Output::Elem::Act;
      const Buffer staging(ops, o.n * sizeof(float));
      if (act) ops.to_float(staging.f32(), o.buffer->act(), o.n);
      ops.download(values.data(), act ? staging.get() : o.buffer->get(), o.n * sizeof(float));
    }
    out.push_back({o.name, std::move(values), inputs_ == DType::BF16 ? o.tol.bf16 : o.tol.fp32});
  }
  return out;
}

std::vector<OpTableParam> op_table(const std::vector<Backend>& backends) {
  std::vector<OpTableParam> table;
  for (const Backend& b : backends)
    for (const OpCase& c : op_cases()) table.push_back({b, c});
  return table;
}

std::string op_table_name(const ::testing::TestParamInfo<OpTableParam>& info) {
  return info.param.backend.name + "_" + info.param.op.name;
}

TEST_P(OpTableTest, MatchesCpu) {
  const auto& [backend, op] = GetParam();
  std::unique_ptr<Ops> tested = backend.make();
  if (!tested) GTEST_SKIP() << backend.name << " is not on this machine";
  std::unique_ptr<Ops> cpu = make_cpu_ops(1);
  OpRun want(*cpu, tested->compute_dtype()), got(*tested, tested->compute_dtype());
  op.run(want);
  op.run(got);
  const std::vector<OpRun::Result> w = want.results(), g = got.results();
  ASSERT_EQ(g.size(), w.size());
  for (std::size_t i = 0; i < w.size(); ++i)
    EXPECT_TRUE(test_support::all_close(g[i].values, w[i].values, g[i].tol)) << w[i].name;
}

}  // namespace pptrain::ops::testing
