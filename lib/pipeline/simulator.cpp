// Discrete-time simulation of all stages' steps: each stage runs its steps in order; a
// posted batch waits until the counterpart of each of its messages is posted.
#include "pipeline/simulator.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace pptrain {
namespace {

enum class Kind { Activation, Gradient };
const char* kind_name(Kind k) { return k == Kind::Activation ? "activation" : "gradient"; }

// What has happened to one (microbatch, chunk) on one stage.
struct Unit {
  bool received_input = false, forward = false, sent_output = false;
  bool received_grad = false, backward = false, sent_grad = false, weight = false;
};

struct StageState {
  size_t next = 0;  // index of the next step to run
  double clock = 0, busy = 0;
  bool posted = false;  // the current step is a batch whose messages are posted
  double post_time = 0;
  int alive = 0, awaiting_backward = 0;
  int peak_alive = 0, peak_awaiting = 0;
  std::vector<Unit> units;  // index microbatch * v + chunk
};

// One message as its sender and its receiver name it.
struct Message {
  int microbatch, chunk;  // the receiver's
  Kind kind;
  bool operator==(const Message&) const = default;
};
std::string to_string(const Message& m) {
  return std::string(kind_name(m.kind)) + " of (mb " + std::to_string(m.microbatch) +
         ", chunk " + std::to_string(m.chunk) + ")";
}

// Where a message of a batch sits, and where its counterpart sits.
struct Slot {
  int stage;
  size_t step, action;
};

class Simulation {
 public:
  // chunk_costs: each virtual stage's F, B and W times; p2p: a message's time.
  Simulation(const std::vector<std::vector<Step>>& steps, const Placement& placement, int m,
             MessageMode mode, std::vector<StageCosts> chunk_costs, double p2p)
      : steps_(steps), placement_(placement), pp_(placement.pp()), m_(m), v_(placement.chunks()),
        mode_(mode), chunk_costs_(std::move(chunk_costs)), p2p_(p2p), stages_(size_t(pp_)) {
    if (int(chunk_costs_.size()) != placement.virtual_stages())
      throw std::invalid_argument("simulate: needs one cost per virtual stage");
    for (auto& s : stages_) s.units.resize(size_t(m * v_));
    match_messages();
  }

  SimulationResult run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (int s = 0; s < pp_; ++s)
        while (!finished(s) && advance(s)) progress = true;
      for (int s = 0; s < pp_; ++s)
        if (!finished(s) && complete_batch(s)) progress = true;
    }
    report_deadlock();
    report_missing();
    // Sends still leaving when a stage's list ends are waited for there.
    for (const auto& [slot, t] : matched_at_) {
      StageState& st = stages_[size_t(std::get<0>(slot))];
      st.clock = std::max(st.clock, t);
    }
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
  bool finished(int s) const { return stages_[size_t(s)].next >= steps_[size_t(s)].size(); }
  const Step& current(int s) const { return steps_[size_t(s)][stages_[size_t(s)].next]; }

  static std::string describe(const Step& step) {
    if (step.kind == Step::Compute || step.kind == Step::LocalCopy) return to_string(step.actions[0]);
    std::string out = step.kind == Step::PostSends ? "post {" : "{";
    const size_t open = out.size();
    for (const Action& a : step.actions) out += (out.size() > open ? ", " : "") + to_string(a);
    return out + "}";
  }
  std::string where(int s, size_t step) const {
    return "stage " + std::to_string(s) + ", step " + std::to_string(step) + " " +
           describe(steps_[size_t(s)][step]);
  }
  [[noreturn]] void fail(int s, size_t step, const std::string& problem) const {
    throw std::logic_error("pipeline schedule: " + where(s, step) + ": " + problem);
  }
  void require(bool ok, int s, const std::string& problem) const {
    if (!ok) fail(s, stages_[size_t(s)].next, problem);
  }

  const StageCosts& cost(int s, int chunk) const {
    return chunk_costs_[size_t(placement_.virtual_stage(s, chunk))];
  }

  // The other side of a message action: its stage, and the message it carries.
  std::pair<int, Message> peer_of(int s, size_t step, const Action& a) const {
    const bool ok = a.microbatch >= 0 && a.microbatch < m_ && a.chunk >= 0 && a.chunk < v_;
    if (!ok) fail(s, step, "microbatch or chunk out of range");
    const bool next = a.op == Op::SendForward || a.op == Op::RecvBackward;
    if (next && placement_.is_last(s, a.chunk))
      fail(s, step, to_string(a) + ": the last virtual stage has no next virtual stage");
    if (!next && placement_.is_first(s, a.chunk))
      fail(s, step, to_string(a) + ": the first virtual stage has no previous virtual stage");
    const ChunkLocation peer = message_peer(placement_, s, a);
    const Kind kind = (a.op == Op::SendForward || a.op == Op::RecvForward) ? Kind::Activation
                                                                           : Kind::Gradient;
    const int receiver_chunk = is_send(a.op) ? peer.chunk : a.chunk;
    return {peer.stage, {a.microbatch, receiver_chunk, kind}};
  }

  // (sender, receiver, kind): messages match in issue order within a channel. Grouped
  // and AsyncSends have one channel a pair of stages (kind -1); Channels one a kind.
  using Channel = std::tuple<int, int, int>;
  Channel channel_of(int from, int to, const Message& m) const {
    return {from, to, mode_ == MessageMode::Channels ? int(m.kind) : -1};
  }

  // Pairs every send with its receive by issue order per channel, as NCCL does, and
  // rejects lists whose two sides disagree; AsyncSends pairs by name, as MPI's tags do.
  void match_messages() {
    std::map<Channel, std::vector<std::pair<Slot, Message>>> sends, receives;
    for (int s = 0; s < pp_; ++s) {
      const auto& list = steps_[size_t(s)];
      for (size_t i = 0; i < list.size(); ++i) {
        const Step& step = list[i];
        if (step.actions.empty()) fail(s, i, "empty step");
        for (size_t j = 0; j < step.actions.size(); ++j) {
          const Action& a = step.actions[j];
          const bool message = step.kind == Step::Messages || step.kind == Step::PostSends;
          if ((step.kind == Step::Compute) != is_compute(a.op) || (!message && j > 0))
            fail(s, i, "a step mixes computation and messages");
          if (step.kind == Step::Compute) continue;
          const auto [peer, msg] = peer_of(s, i, a);
          if (!message) {
            if (peer != s || !is_send(a.op))
              fail(s, i, "a local copy must be a send to the same stage");
            continue;
          }
          if (peer == s)
            fail(s, i, to_string(a) + ": a message to its own stage (a neighbour on the same "
                                      "stage is a local copy, with no receive)");
          if (step.kind == Step::PostSends && !is_send(a.op))
            fail(s, i, to_string(a) + ": only sends can be posted without waiting");
          const Channel channel = channel_of(is_send(a.op) ? s : peer, is_send(a.op) ? peer : s, msg);
          (is_send(a.op) ? sends : receives)[channel].push_back({{s, i, j}, msg});
        }
      }
    }
    if (mode_ == MessageMode::AsyncSends) {  // MPI matches by tag: sort both sides by name
      auto by_name = [](const auto& x, const auto& y) {
        return std::tuple(x.second.microbatch, x.second.chunk, int(x.second.kind)) <
               std::tuple(y.second.microbatch, y.second.chunk, int(y.second.kind));
      };
      for (auto& [channel, list] : sends) std::stable_sort(list.begin(), list.end(), by_name);
      for (auto& [channel, list] : receives) std::stable_sort(list.begin(), list.end(), by_name);
    }
    for (auto& [channel, sent] : sends) {
      const auto [from, to, kind] = channel;
      const auto& got = receives[channel];
      for (size_t k = 0; k < sent.size(); ++k) {
        const auto& [slot, msg] = sent[k];
        if (k >= got.size())
          fail(from, slot.step, "stage " + std::to_string(from) + " sends the " + to_string(msg) +
                                    " that stage " + std::to_string(to) + " never receives");
        if (!(got[k].second == msg))
          fail(to, got[k].first.step,
               "message " + std::to_string(k) + " from stage " + std::to_string(from) +
                   " is the " + to_string(msg) + ", but this receive expects the " +
                   to_string(got[k].second) +
                   ": sender and receiver order their messages differently");
        partner_[key(slot)] = got[k].first;
        partner_[key(got[k].first)] = slot;
        if (mode_ == MessageMode::Channels && k > 0) {  // a channel completes in order
          before_[key(slot)] = sent[k - 1].first;
          before_[key(got[k].first)] = sent[k - 1].first;
        }
      }
    }
    for (auto& [channel, got] : receives) {
      const size_t sent = sends.count(channel) ? sends[channel].size() : 0;
      if (got.size() > sent) {
        const auto& [slot, msg] = got[sent];
        fail(slot.stage, slot.step, "receives the " + to_string(msg) + ", a message that stage " +
                                        std::to_string(std::get<0>(channel)) + " never sends");
      }
    }
  }
  static std::tuple<int, size_t, size_t> key(const Slot& s) { return {s.stage, s.step, s.action}; }

  // Runs compute steps and local copies, and posts batches; false when the stage is
  // waiting in a posted batch.
  bool advance(int s) {
    StageState& st = stages_[size_t(s)];
    const Step& step = current(s);
    if (step.kind == Step::Messages || step.kind == Step::PostSends) {
      if (st.posted) return false;
      for (size_t j = 0; j < step.actions.size(); ++j) {
        post(s, step.actions[j]);
        posted_at_[key({s, st.next, j})] = st.clock;
      }
      if (step.kind == Step::PostSends) {  // completes in the background
        ++st.next;
        return true;
      }
      st.posted = true;
      st.post_time = st.clock;
      return true;
    }
    const Action& a = step.actions[0];
    require(a.microbatch >= 0 && a.microbatch < m_ && a.chunk >= 0 && a.chunk < v_, s,
            "microbatch or chunk out of range");
    Unit& u = unit(s, a);
    const StageCosts& c = cost(s, a.chunk);
    switch (a.op) {
      case Op::Forward:
        require(!u.forward, s, "duplicated");
        require(placement_.is_first(s, a.chunk) || u.received_input, s,
                "Forward before its input arrived");
        u.forward = true;
        st.peak_alive = std::max(st.peak_alive, ++st.alive);
        st.peak_awaiting = std::max(st.peak_awaiting, ++st.awaiting_backward);
        compute(st, c.forward);
        break;
      case Op::BackwardInput:
        require(!u.backward, s, "duplicated");
        require(u.forward, s, "BackwardInput before its Forward");
        require(placement_.is_last(s, a.chunk) || u.received_grad, s,
                "BackwardInput before its output gradient arrived");
        u.backward = true;
        --st.awaiting_backward;
        compute(st, c.backward_input);
        break;
      case Op::BackwardWeight:
        require(!u.weight, s, "duplicated");
        require(u.backward, s, "BackwardWeight before its BackwardInput");
        u.weight = true;
        --st.alive;
        compute(st, c.backward_weight);
        break;
      default: {  // a local copy
        post(s, a);
        const ChunkLocation peer = message_peer(placement_, s, a);
        Unit& to = st.units[size_t(a.microbatch * v_ + peer.chunk)];
        bool& arrived = a.op == Op::SendForward ? to.received_input : to.received_grad;
        require(!arrived, s, "duplicated");
        arrived = true;
        break;
      }
    }
    ++st.next;
    return true;
  }

  Unit& unit(int s, const Action& a) {
    return stages_[size_t(s)].units[size_t(a.microbatch * v_ + a.chunk)];
  }

  // What posting a message needs: a send's data exists, a receive's buffer is free.
  void post(int s, const Action& a) {
    Unit& u = unit(s, a);
    switch (a.op) {
      case Op::SendForward:
        require(u.forward && !u.sent_output, s,
                u.sent_output ? "duplicated SendForward" : "SendForward before its Forward");
        u.sent_output = true;
        break;
      case Op::SendBackward:
        require(u.backward && !u.sent_grad, s,
                u.sent_grad ? "duplicated SendBackward" : "SendBackward before its BackwardInput");
        u.sent_grad = true;
        break;
      case Op::RecvForward:
        require(!u.received_input && !u.forward, s,
                u.forward ? "RecvForward after its Forward" : "duplicated RecvForward");
        break;
      case Op::RecvBackward:
        require(u.forward && !u.received_grad, s,
                u.forward ? "duplicated RecvBackward" : "RecvBackward before its Forward");
        break;
      default: break;
    }
  }

  static void compute(StageState& st, double cost) {
    st.clock += cost;
    st.busy += cost;
  }

  // Matches the messages of stage s's posted batch whose counterparts are posted, and
  // completes the batch once all of its messages are matched.
  bool complete_batch(int s) {
    StageState& st = stages_[size_t(s)];
    if (!st.posted) return false;
    bool progress = false, all = true;
    double t = st.post_time;
    for (size_t j = 0; j < current(s).actions.size(); ++j) {
      const auto mine = key({s, st.next, j});
      auto done = matched_at_.find(mine);
      if (done == matched_at_.end()) {
        const Slot& other = partner_.at(mine);
        const auto peer = posted_at_.find(key(other));
        // On a channel, the message before this one has completed.
        const auto before = before_.find(mine);
        const auto previous =
            before == before_.end() ? matched_at_.end() : matched_at_.find(key(before->second));
        if (peer == posted_at_.end() || (before != before_.end() && previous == matched_at_.end())) {
          all = false;
          continue;
        }
        double at = std::max(st.post_time, peer->second);
        if (previous != matched_at_.end()) at = std::max(at, previous->second);
        at += p2p_;
        done = matched_at_.emplace(mine, at).first;
        matched_at_.emplace(key(other), at);
        progress = true;
      }
      t = std::max(t, done->second);
    }
    if (!all) return progress;
    for (const Action& a : current(s).actions) {
      if (a.op == Op::RecvForward) unit(s, a).received_input = true;
      if (a.op == Op::RecvBackward) unit(s, a).received_grad = true;
    }
    st.clock = t;
    st.posted = false;
    ++st.next;
    return true;
  }

  // After the run every unfinished stage waits in a posted batch for a stage that has not
  // posted the counterpart of one of its messages: follow who waits for whom until a
  // stage repeats, and report that cycle.
  void report_deadlock() const {
    std::vector<int> waits_for(size_t(pp_), -1);
    std::vector<std::string> why(static_cast<size_t>(pp_));
    for (int s = 0; s < pp_; ++s) {
      if (finished(s)) continue;
      const auto& actions = current(s).actions;
      for (size_t j = 0; j < actions.size() && waits_for[size_t(s)] < 0; ++j) {
        const auto mine = key({s, stages_[size_t(s)].next, j});
        if (matched_at_.count(mine)) continue;
        const Slot& other = partner_.at(mine);
        waits_for[size_t(s)] = other.stage;
        why[size_t(s)] = to_string(actions[j]) + " is matched in its step " +
                         std::to_string(other.step) + " " +
                         describe(steps_[size_t(other.stage)][other.step]);
      }
    }
    int start = -1;
    for (int s = 0; s < pp_ && start < 0; ++s)
      if (waits_for[size_t(s)] >= 0) start = s;
    if (start < 0) return;
    std::vector<int> path;
    for (int s = start; std::find(path.begin(), path.end(), s) == path.end(); s = waits_for[size_t(s)])
      path.push_back(s);
    const int loop = waits_for[size_t(path.back())];
    std::string cycle;
    for (auto it = std::find(path.begin(), path.end(), loop); it != path.end(); ++it)
      cycle += (cycle.empty() ? "" : "; ") + where(*it, stages_[size_t(*it)].next) +
               " waits for stage " + std::to_string(waits_for[size_t(*it)]) + ": " +
               why[size_t(*it)];
    throw std::logic_error("pipeline schedule: deadlock: " + cycle);
  }

  // After a complete run: no action missing.
  void report_missing() const {
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

  const std::vector<std::vector<Step>>& steps_;
  Placement placement_;
  int pp_, m_, v_;
  MessageMode mode_;
  std::vector<StageCosts> chunk_costs_;  // per virtual stage
  double p2p_;
  std::vector<StageState> stages_;
  std::map<std::tuple<int, size_t, size_t>, Slot> partner_;
  // Channels: each end of a message -> the send of the message before it on its channel.
  std::map<std::tuple<int, size_t, size_t>, Slot> before_;
  std::map<std::tuple<int, size_t, size_t>, double> matched_at_;  // when each message matched
  std::map<std::tuple<int, size_t, size_t>, double> posted_at_;   // when each was posted
};

}  // namespace

SimulationResult simulate_steps(const std::vector<std::vector<Step>>& steps,
                                const Placement& placement, int micro_batches, MessageMode mode,
                                const StageCosts& costs,
                                const std::vector<int>& layers_per_virtual_stage) {
  if (micro_batches < 1) throw std::invalid_argument("simulate: micro_batches must be >= 1");
  if (int(steps.size()) != placement.pp())
    throw std::invalid_argument("simulate: got " + std::to_string(steps.size()) +
                                " stages' steps for pp = " + std::to_string(placement.pp()));
  return simulate_steps_timed(steps, placement, micro_batches, mode,
                              virtual_stage_costs(placement, costs, layers_per_virtual_stage),
                              costs.p2p);
}

std::vector<StageCosts> virtual_stage_costs(const Placement& placement, const StageCosts& costs,
                                            const std::vector<int>& layers) {
  const int n = placement.virtual_stages();
  // Each chunk's share of its stage's cost: its layers over the stage's mean.
  std::vector<double> share(size_t(n), 1.0 / placement.chunks());
  if (!layers.empty()) {
    if (int(layers.size()) != n)
      throw std::invalid_argument("simulate: layers_per_virtual_stage needs one count per "
                                  "virtual stage");
    const double total = std::accumulate(layers.begin(), layers.end(), 0.0);
    if (total <= 0) throw std::invalid_argument("simulate: the model has no layers");
    for (size_t k = 0; k < layers.size(); ++k) share[k] = layers[k] * placement.pp() / total;
  }
  std::vector<StageCosts> out;
  for (double f : share)
    out.push_back({costs.forward * f, costs.backward_input * f, costs.backward_weight * f, 0});
  return out;
}

SimulationResult simulate_steps_timed(const std::vector<std::vector<Step>>& steps,
                                      const Placement& placement, int micro_batches,
                                      MessageMode mode,
                                      const std::vector<StageCosts>& virtual_stage_costs,
                                      double p2p) {
  if (micro_batches < 1) throw std::invalid_argument("simulate: micro_batches must be >= 1");
  if (int(steps.size()) != placement.pp())
    throw std::invalid_argument("simulate: got " + std::to_string(steps.size()) +
                                " stages' steps for pp = " + std::to_string(placement.pp()));
  return Simulation(steps, placement, micro_batches, mode, virtual_stage_costs, p2p).run();
}

SimulationResult simulate(ScheduleKind kind, int pp, int micro_batches, int virtual_stages,
                          const StageCosts& costs,
                          const std::vector<int>& layers_per_virtual_stage, MessageMode mode,
                          const StageCosts& planned) {
  return simulate_steps(build_all_steps(kind, pp, micro_batches, virtual_stages, mode, planned),
                        schedule_placement(kind, pp, virtual_stages), micro_batches, mode, costs,
                        layers_per_virtual_stage);
}

double theoretical_bubble(ScheduleKind kind, int pp, int micro_batches, int virtual_stages,
                          MessageMode mode, const StageCosts& planned) {
  return simulate(kind, pp, micro_batches, virtual_stages, planned, {}, mode, planned).bubble;
}

}  // namespace pptrain
