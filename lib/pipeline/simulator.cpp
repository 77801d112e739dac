// Discrete-time simulation of all stages' action lists: each stage runs its list in
// order, blocking only in receives; messages wait in FIFO channels between stages.
#include "pipeline/simulator.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

namespace pptrain {
namespace {

enum class Kind { Activation, Gradient };

// A message in flight, named by the (microbatch, chunk) of its receiver.
struct Message {
  int microbatch, chunk;
  double sent_at;
};

// What has happened to one (microbatch, chunk) on one stage.
struct Unit {
  bool received_input = false, forward = false, sent_output = false;
  bool received_grad = false, backward = false, sent_grad = false, weight = false;
};

struct StageState {
  size_t next = 0;  // index of the next action to run
  double clock = 0, busy = 0;
  int alive = 0, awaiting_backward = 0;
  int peak_alive = 0, peak_awaiting = 0;
  std::vector<Unit> units;  // index microbatch * v + chunk
};

// Where a message of this action goes (sends) or comes from (receives).
struct Route {
  int peer;        // the other stage
  int peer_chunk;  // its chunk
  Kind kind;
};

class Simulation {
 public:
  Simulation(const std::vector<std::vector<Action>>& lists, int pp, int m, int v,
             const StageCosts& costs)
      : lists_(lists), pp_(pp), m_(m), v_(v), costs_(costs), stages_(size_t(pp)) {
    for (auto& s : stages_) s.units.resize(size_t(m * v));
  }

  SimulationResult run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (int s = 0; s < pp_; ++s)
        while (!finished(s) && try_step(s)) progress = true;
    }
    report_blocked();
    report_leftovers();
    SimulationResult r;
    for (const auto& st : stages_) {
      r.makespan = std::max(r.makespan, st.clock);
      r.busy.push_back(st.busy);
      r.peak_activations.push_back(st.peak_alive);
      r.peak_awaiting_backward.push_back(st.peak_awaiting);
    }
    if (r.makespan > 0) {
      for (double b : r.busy) r.bubble += 1.0 - b / r.makespan;
      r.bubble /= pp_;
    }
    return r;
  }

 private:
  bool finished(int s) const { return stages_[size_t(s)].next >= lists_[size_t(s)].size(); }
  const Action& current(int s) const { return lists_[size_t(s)][stages_[size_t(s)].next]; }

  [[noreturn]] void fail(int s, const std::string& problem) const {
    throw std::logic_error("pipeline schedule: stage " + std::to_string(s) + ", action " +
                           std::to_string(stages_[size_t(s)].next) + " " +
                           to_string(current(s)) + ": " + problem);
  }
  void require(bool ok, int s, const std::string& problem) const {
    if (!ok) fail(s, problem);
  }

  // The neighbour an action talks to: sends go to the next (activation) or previous
  // (gradient) virtual stage, receives come from the previous or the next.
  Route route(int s, const Action& a) const {
    const bool to_next = a.op == Op::SendForward || a.op == Op::RecvBackward;
    const Kind kind = (a.op == Op::SendForward || a.op == Op::RecvForward) ? Kind::Activation
                                                                           : Kind::Gradient;
    if (to_next) {
      require(!is_last_virtual_stage(pp_, s, a.chunk, v_), s,
              "the last virtual stage has no next virtual stage");
      return {(s + 1) % pp_, s == pp_ - 1 ? a.chunk + 1 : a.chunk, kind};
    }
    require(!is_first_virtual_stage(s, a.chunk), s,
            "the first virtual stage has no previous virtual stage");
    return {(s + pp_ - 1) % pp_, s == 0 ? a.chunk - 1 : a.chunk, kind};
  }

  std::deque<Message>& channel(int from, int to, Kind kind) {
    return channels_[{from, to, int(kind)}];
  }

  // Runs the current action of stage s; false when it is a receive that must wait.
  bool try_step(int s) {
    StageState& st = stages_[size_t(s)];
    const Action& a = current(s);
    require(a.microbatch >= 0 && a.microbatch < m_ && a.chunk >= 0 && a.chunk < v_, s,
            "microbatch or chunk out of range");
    Unit& u = st.units[size_t(a.microbatch * v_ + a.chunk)];
    const double scale = 1.0 / v_;
    switch (a.op) {
      case Op::RecvForward:
        require(!u.received_input, s, "duplicated");
        if (!receive(s, a)) return false;
        u.received_input = true;
        break;
      case Op::Forward:
        require(!u.forward, s, "duplicated");
        require(is_first_virtual_stage(s, a.chunk) || u.received_input, s,
                "Forward before its RecvForward");
        u.forward = true;
        st.peak_alive = std::max(st.peak_alive, ++st.alive);
        st.peak_awaiting = std::max(st.peak_awaiting, ++st.awaiting_backward);
        compute(st, costs_.forward * scale);
        break;
      case Op::SendForward:
        require(!u.sent_output, s, "duplicated");
        require(u.forward, s, "SendForward before its Forward");
        send(s, a);
        u.sent_output = true;
        break;
      case Op::RecvBackward:
        require(!u.received_grad, s, "duplicated");
        require(u.forward, s, "RecvBackward before its Forward");
        if (!receive(s, a)) return false;
        u.received_grad = true;
        break;
      case Op::BackwardInput:
        require(!u.backward, s, "duplicated");
        require(u.forward, s, "BackwardInput before its Forward");
        require(is_last_virtual_stage(pp_, s, a.chunk, v_) || u.received_grad, s,
                "BackwardInput before its RecvBackward");
        u.backward = true;
        --st.awaiting_backward;
        compute(st, costs_.backward_input * scale);
        break;
      case Op::SendBackward:
        require(!u.sent_grad, s, "duplicated");
        require(u.backward, s, "SendBackward before its BackwardInput");
        send(s, a);
        u.sent_grad = true;
        break;
      case Op::BackwardWeight:
        require(!u.weight, s, "duplicated");
        require(u.backward, s, "BackwardWeight before its BackwardInput");
        u.weight = true;
        --st.alive;
        compute(st, costs_.backward_weight * scale);
        break;
    }
    ++st.next;
    return true;
  }

  static void compute(StageState& st, double cost) {
    st.clock += cost;
    st.busy += cost;
  }

  void send(int s, const Action& a) {
    const Route r = route(s, a);
    const double now = stages_[size_t(s)].clock;
    channel(s, r.peer, r.kind).push_back({a.microbatch, r.peer_chunk, now});
  }

  bool receive(int s, const Action& a) {
    const Route r = route(s, a);
    auto& queue = channel(r.peer, s, r.kind);
    if (queue.empty()) return false;
    const Message msg = queue.front();
    require(msg.microbatch == a.microbatch && msg.chunk == a.chunk, s,
            "the oldest message from stage " + std::to_string(r.peer) +
                " on this channel is for (mb " + std::to_string(msg.microbatch) + ", chunk " +
                std::to_string(msg.chunk) + "): the sender's and receiver's orders differ");
    queue.pop_front();
    StageState& st = stages_[size_t(s)];
    st.clock = std::max(st.clock, msg.sent_at + costs_.p2p);
    return true;
  }

  // True when stage `from`'s remaining list still sends what receive `a` on `to` expects.
  bool will_send(int from, int to, const Action& a) const {
    const Route want = route(to, a);
    const auto& list = lists_[size_t(from)];
    for (size_t i = stages_[size_t(from)].next; i < list.size(); ++i) {
      const Action& b = list[i];
      if (b.op != Op::SendForward && b.op != Op::SendBackward) continue;
      if (b.microbatch != a.microbatch) continue;
      const bool next = b.op == Op::SendForward;
      if (next && is_last_virtual_stage(pp_, from, b.chunk, v_)) continue;
      if (!next && is_first_virtual_stage(from, b.chunk)) continue;
      const Route got = route(from, b);
      if (got.peer == to && got.peer_chunk == a.chunk && got.kind == want.kind) return true;
    }
    return false;
  }

  // After the run: unfinished stages all wait in receives. Either some message is never
  // sent, or the stages wait on each other (deadlock).
  void report_blocked() const {
    std::string waits;
    for (int s = 0; s < pp_; ++s) {
      if (finished(s)) continue;
      const Route r = route(s, current(s));
      if (!will_send(r.peer, s, current(s)))
        fail(s, "waits for a message that stage " + std::to_string(r.peer) + " never sends");
      waits += (waits.empty() ? "" : "; ") + std::string("stage ") + std::to_string(s) +
               " waits at action " + std::to_string(stages_[size_t(s)].next) + " " +
               to_string(current(s)) + " for stage " + std::to_string(r.peer);
    }
    if (!waits.empty()) throw std::logic_error("pipeline schedule: deadlock: " + waits);
  }

  // After a complete run: no message left unreceived, no action missing.
  void report_leftovers() const {
    for (const auto& [key, queue] : channels_) {
      if (queue.empty()) continue;
      const auto [from, to, kind] = key;
      const Message& msg = queue.front();
      throw std::logic_error(
          "pipeline schedule: stage " + std::to_string(from) + " sends the " +
          (kind == int(Kind::Activation) ? "activation" : "gradient") + " of (mb " +
          std::to_string(msg.microbatch) + ", chunk " + std::to_string(msg.chunk) +
          ") that stage " + std::to_string(to) + " never receives");
    }
    for (int s = 0; s < pp_; ++s) {
      for (int mb = 0; mb < m_; ++mb) {
        for (int c = 0; c < v_; ++c) {
          const Unit& u = stages_[size_t(s)].units[size_t(mb * v_ + c)];
          const char* missing = !u.forward ? "Forward" : !u.backward ? "BackwardInput"
                                : !u.weight ? "BackwardWeight" : nullptr;
          if (missing)
            throw std::logic_error("pipeline schedule: stage " + std::to_string(s) +
                                   " never runs " + missing + "(mb " + std::to_string(mb) +
                                   ", chunk " + std::to_string(c) + ")");
        }
      }
    }
  }

  const std::vector<std::vector<Action>>& lists_;
  int pp_, m_, v_;
  StageCosts costs_;
  std::vector<StageState> stages_;
  std::map<std::tuple<int, int, int>, std::deque<Message>> channels_;
};

}  // namespace

SimulationResult simulate_lists(const std::vector<std::vector<Action>>& lists, int pp,
                                int micro_batches, int virtual_stages,
                                const StageCosts& costs) {
  if (pp < 1 || micro_batches < 1 || virtual_stages < 1)
    throw std::invalid_argument(
        "simulate_lists: pp, micro_batches and virtual_stages must be >= 1");
  if (int(lists.size()) != pp)
    throw std::invalid_argument("simulate_lists: got " + std::to_string(lists.size()) +
                                " action lists for pp = " + std::to_string(pp));
  return Simulation(lists, pp, micro_batches, virtual_stages, costs).run();
}

SimulationResult simulate(ScheduleKind kind, int pp, int micro_batches, int virtual_stages,
                          const StageCosts& costs) {
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < pp; ++s)
    lists.push_back(build_schedule(kind, pp, s, micro_batches, virtual_stages));
  return simulate_lists(lists, pp, micro_batches, virtual_stages, costs);
}

double theoretical_bubble(ScheduleKind kind, int pp, int micro_batches, int virtual_stages) {
  return simulate(kind, pp, micro_batches, virtual_stages).bubble;
}

}  // namespace pptrain
