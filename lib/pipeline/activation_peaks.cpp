#include "pipeline/activation_peaks.hpp"

#include <algorithm>
#include <array>
#include <numeric>
#include <stdexcept>

#include "pipeline/executor.hpp"

namespace pptrain {

namespace {

// A model that computes nothing and allocates nothing: it counts the sets the executor
// asks for, and lends its parts and boundary arrays as GptModel does (gpt.cpp: the part
// kept until B at the forward, the gradient part at B, back at W or, fused, at the end of
// B; the output at the forward, the input gradient at B, a last chunk's output gradient
// at B; each boundary array at its first use unless a hop aliased it).
class CountingModel : public StageModel {
 public:
  CountingModel(const Placement& placement, int stage, std::vector<bool> fused)
      : fused_(std::move(fused)), ops_(ops::make_cpu_ops()) {
    const std::size_t v = std::size_t(placement.chunks());
    for (int c = 0; c < placement.chunks(); ++c)
      part_.chunks.push_back({0, 1, placement.is_first(stage, c), placement.is_last(stage, c)});
    peaks_ = {std::vector<int>(v), std::vector<int>(v), std::vector<int>(v), 0};
    until_b_.assign(v, 0);
    from_b_.assign(v, 0);
  }
  const ActivationPeaks& peaks() const { return peaks_; }

  const ModelPartition& partition() const override { return part_; }
  ops::Ops& backend() const override { return *ops_; }
  std::size_t micro_batch_tokens() const override { return 0; }

  std::unique_ptr<Set> new_set(int chunk) override {
    ++peaks_.sets[std::size_t(chunk)];
    auto s = std::make_unique<Counted>();
    s->chunk = chunk;
    return s;
  }
  void release_parts(Set& set) override {
    give_back(counted(set), UntilB);
    give_back(counted(set), FromB);
  }
  void release_boundaries(Set& set) override {
    for (int i = 0; i < 3; ++i) return_array(counted(set), i);
  }
  void return_boundary(Set& set, Slot s) override { return_array(counted(set), index(s)); }
  void output_into(Set& set, ops::Act*) override { counted(set).held[kOutput] = true; }
  void input_grad_into(Set& set, ops::Act*) override { counted(set).held[kInputGrad] = true; }
  ops::Act* input_buffer(Set& set) const override { return counted(set).address(); }
  ops::Act* output(Set& set) override { return array(counted(set), kOutput); }
  ops::Act* output_grad(Set& set) override { return array(counted(set), kOutputGrad); }
  ops::Act* input_grad(Set& set) override { return array(counted(set), kInputGrad); }
  std::size_t boundary_bytes() const override { return 0; }
  std::pair<std::size_t, std::size_t> message_part() const override { return {0, 0}; }
  void complete_message(ops::Act*) override {}

  float forward(int, Set& set, const int32_t*, const ops::Act*, const int32_t*, float,
                double*) override {
    Counted& s = counted(set);
    lend(s, UntilB);
    output(s);
    s.weight_done = false;
    return 0.0f;
  }
  void backward_input(int chunk, Set& set, const LayerFn&) override {
    Counted& s = counted(set);
    lend(s, FromB);
    input_grad(s);
    if (part_.chunks[std::size_t(chunk)].last) output_grad(s);  // from the head
    give_back(s, UntilB);
    if (fused_[std::size_t(chunk)]) {
      s.weight_done = true;
      give_back(s, FromB);
    }
  }
  void backward_weight(int, Set& set, const LayerFn&) override {
    Counted& s = counted(set);
    if (s.weight_done) return;
    s.weight_done = true;
    give_back(s, FromB);
  }
  const std::vector<float>& position_losses(const Set&) const override { return no_losses_; }

 private:
  enum Part { UntilB, FromB };
  static constexpr int kOutput = 0, kOutputGrad = 1, kInputGrad = 2;
  struct Counted : Set {
    int chunk = 0;
    bool parts[2] = {false, false};
    bool held[3] = {false, false, false};  // the array is there: lent or aliased
    bool lent[3] = {false, false, false};
    bool weight_done = false;
    // A distinct non-null address for the executor's messages, never read.
    ops::Act* address() { return reinterpret_cast<ops::Act*>(this); }
  };
  static Counted& counted(Set& set) { return static_cast<Counted&>(set); }
  static int index(Slot s) {
    switch (s) {
      case Slot::output: return kOutput;
      case Slot::output_grad: return kOutputGrad;
      case Slot::input_grad: return kInputGrad;
      default: throw std::logic_error("not a boundary slot");
    }
  }
  void lend(Counted& s, Part p) {
    if (std::exchange(s.parts[p], true)) return;
    std::vector<int>& now = p == UntilB ? until_b_ : from_b_;
    std::vector<int>& most = p == UntilB ? peaks_.until_b : peaks_.from_b;
    const std::size_t c = std::size_t(s.chunk);
    most[c] = std::max(most[c], ++now[c]);
  }
  void give_back(Counted& s, Part p) {
    if (std::exchange(s.parts[p], false)) --(p == UntilB ? until_b_ : from_b_)[std::size_t(s.chunk)];
  }
  ops::Act* array(Counted& s, int i) {
    if (!std::exchange(s.held[i], true)) {
      s.lent[i] = true;
      peaks_.boundaries = std::max(peaks_.boundaries, ++arrays_);
    }
    return s.address();
  }
  void return_array(Counted& s, int i) {
    if (std::exchange(s.lent[i], false)) --arrays_;
    s.held[i] = false;
  }

  ModelPartition part_;
  std::vector<bool> fused_;
  std::unique_ptr<ops::Ops> ops_;  // the executor's marks only
  ActivationPeaks peaks_;
  std::vector<int> until_b_, from_b_;  // lent now, per chunk
  int arrays_ = 0;                     // boundary arrays lent now
  const std::vector<float> no_losses_;
};

// Messages that go nowhere and are complete at once.
class NullWorld : public comm::World {
 public:
  explicit NullWorld(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  void exchange(const std::vector<comm::Transfer>&) override {}
  std::unique_ptr<comm::PendingOp> exchange_start(const std::vector<comm::Transfer>&) override {
    return std::make_unique<Done>();
  }
  void barrier() override {}
  [[noreturn]] void abort(const std::string& message, int) override {
    throw std::logic_error("activation_peaks: " + message);
  }

 private:
  struct Done : comm::PendingOp {
    void wait() override {}
    bool test() override { return true; }
  };
  int size_;
};

}  // namespace

ActivationPeaks activation_peaks(const std::vector<Step>& steps, const Placement& placement,
                                 int stage, const std::vector<bool>& fused,
                                 const std::vector<std::size_t>& reusable) {
  CountingModel model(placement, stage, fused);
  NullWorld world(placement.pp());
  std::vector<int> ranks(std::size_t(placement.pp()));
  std::iota(ranks.begin(), ranks.end(), 0);
  std::vector<std::vector<Step>> all(ranks.size());
  all[std::size_t(stage)] = steps;
  int micro_batches = 0;  // each forward of chunk 0
  for (const Step& s : steps)
    for (const Action& a : s.actions)
      if (s.kind == Step::Compute && a.op == Op::Forward && a.chunk == 0) ++micro_batches;
  std::vector<std::size_t> from = reusable;  // none given: each set from its own sends' step
  if (from.empty())
    for (std::size_t i = 0; i < steps.size(); ++i) from.push_back(i);
  PipelineExecutor executor(model, world, ranks, placement, std::move(all), stage, micro_batches,
                            std::move(from));
  executor.train_step([](int, int32_t*, int32_t*) {}, 1.0f, nullptr);
  return model.peaks();
}

}  // namespace pptrain
