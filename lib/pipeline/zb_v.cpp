// The ZB-V list scheduler. Time advances in ticks; F, B and W take their planned times,
// rounded to sixteenths of the longest (all one tick in the paper's T_F = T_B = T_W
// case); messages are free. Whenever a stage is free it runs a BackwardInput whose
// gradient has arrived or a Forward whose input has arrived while it holds fewer than
// zb_v_set_limit sets (one policy prefers the B, the critical path; the other the F,
// which fills the pipeline sooner), else the oldest pending BackwardWeight; with none of
// these it idles for one tick. Bs and Fs of a chunk go in micro-batch order; among ready
// ones the deeper virtual stage goes first. The order kept is the policy's whose last
// stage finishes first (the B-first one on a tie).
#include "pipeline/zb_v.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <stdexcept>
#include <string>

namespace pptrain {

int zb_v_set_limit(int pp) { return 2 * pp; }

namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

class ListScheduler {
 public:
  ListScheduler(int pp, int m, const StageCosts& planned, bool backward_first)
      : pp_(pp), m_(m), backward_first_(backward_first), placement_(PlacementKind::V, pp, 2),
        forward_done_(size_t(m * 2 * pp), kNever),
        backward_done_(forward_done_), stages_(size_t(pp)), orders_(size_t(pp)) {
    const double longest =
        std::max({planned.forward, planned.backward_input, planned.backward_weight});
    auto ticks = [&](double t) { return std::max(1.0, std::round(16 * t / longest)); };
    ticks_[0] = ticks(planned.forward);
    ticks_[1] = ticks(planned.backward_input);
    ticks_[2] = ticks(planned.backward_weight);
  }

  // All times are whole ticks: each tick, every free stage starts what it may (what ends
  // at this tick is already known).
  std::vector<std::vector<Action>> run() {
    const int actions = m_ * 2 * 3;
    const int last_tick = actions * pp_ * 16;  // far past any schedule that makes progress
    for (int tick = 0, finished = 0; finished < pp_; ++tick) {
      if (tick > last_tick) throw std::logic_error("zb-v scheduler: no stage can go on");
      finished = 0;
      for (int s = 0; s < pp_; ++s) {
        Stage& st = stages_[size_t(s)];
        if (int(orders_[size_t(s)].size()) == actions) ++finished;
        else if (st.clock <= tick && !step(s, tick)) st.clock = tick + 1;
      }
    }
    for (const Stage& st : stages_) makespan_ = std::max(makespan_, st.clock);
    return std::move(orders_);
  }
  double makespan() const { return makespan_; }

 private:
  struct Stage {
    double clock = 0;
    int alive = 0;
    int next_forward[2] = {0, 0}, next_backward[2] = {0, 0};
    std::deque<Action> weights;  // Bs done, Ws pending, oldest first
  };

  double& at(std::vector<double>& t, int mb, int vs) { return t[size_t(mb * 2 * pp_ + vs)]; }

  // When (mb, chunk)'s next F or B on stage s may start; kNever if not yet known.
  double forward_ready(int s, int chunk) {
    const Stage& st = stages_[size_t(s)];
    const int mb = st.next_forward[chunk];
    if (mb >= m_) return kNever;
    const int vs = placement_.virtual_stage(s, chunk);
    return vs == 0 ? 0.0 : at(forward_done_, mb, vs - 1);
  }
  double backward_ready(int s, int chunk) {
    const Stage& st = stages_[size_t(s)];
    const int mb = st.next_backward[chunk];
    if (mb >= m_) return kNever;
    const int vs = placement_.virtual_stage(s, chunk);
    const double own = at(forward_done_, mb, vs);
    const double grad = vs == 2 * pp_ - 1 ? own : at(backward_done_, mb, vs + 1);
    return std::max(own, grad);
  }

  // Starts one action on stage s at time `now` if one may start; false otherwise.
  bool step(int s, double now) {
    Stage& st = stages_[size_t(s)];
    if (backward_first_ ? try_backward(s, now) || try_forward(s, now)
                        : try_forward(s, now) || try_backward(s, now))
      return true;
    if (st.weights.empty()) return false;
    const Action w = st.weights.front();
    st.weights.pop_front();
    --st.alive;
    return run(s, now, w);
  }
  bool try_backward(int s, double now) {
    Stage& st = stages_[size_t(s)];
    for (int chunk : {1, 0}) {
      if (backward_ready(s, chunk) > now) continue;
      const int mb = st.next_backward[chunk]++;
      at(backward_done_, mb, placement_.virtual_stage(s, chunk)) = now + ticks(Op::BackwardInput);
      st.weights.push_back({Op::BackwardWeight, mb, chunk});
      return run(s, now, {Op::BackwardInput, mb, chunk});
    }
    return false;
  }
  bool try_forward(int s, double now) {
    Stage& st = stages_[size_t(s)];
    if (st.alive >= zb_v_set_limit(pp_)) return false;
    for (int chunk : {1, 0}) {
      if (forward_ready(s, chunk) > now) continue;
      const int mb = st.next_forward[chunk]++;
      at(forward_done_, mb, placement_.virtual_stage(s, chunk)) = now + ticks(Op::Forward);
      ++st.alive;
      return run(s, now, {Op::Forward, mb, chunk});
    }
    return false;
  }

  bool run(int s, double now, const Action& a) {
    orders_[size_t(s)].push_back(a);
    stages_[size_t(s)].clock = now + ticks(a.op);
    return true;
  }

  double ticks(Op op) const {
    return ticks_[op == Op::Forward ? 0 : op == Op::BackwardInput ? 1 : 2];
  }

  int pp_, m_;
  bool backward_first_;
  double makespan_ = 0;
  Placement placement_;
  double ticks_[3];  // F, B, W
  std::vector<double> forward_done_, backward_done_;  // finish times by (mb, virtual stage)
  std::vector<Stage> stages_;
  std::vector<std::vector<Action>> orders_;
};

}  // namespace

std::vector<std::vector<Action>> zb_v_compute_order(int pp, int micro_batches,
                                                    const StageCosts& planned) {
  if (pp < 1 || micro_batches < 1)
    throw std::invalid_argument("zb-v: pp and micro_batches must be >= 1");
  if (!(planned.forward > 0 && planned.backward_input > 0 && planned.backward_weight > 0))
    throw std::invalid_argument("zb-v: the planned F, B and W times must be > 0");
  ListScheduler backward_first(pp, micro_batches, planned, true);
  ListScheduler forward_first(pp, micro_batches, planned, false);
  auto b = backward_first.run();
  auto f = forward_first.run();
  return forward_first.makespan() < backward_first.makespan() ? f : b;
}

}  // namespace pptrain
