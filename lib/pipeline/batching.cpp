// batch_messages: places every message of the stages' action lists into a numbered round
// (see schedule.hpp for the rule and why it cannot deadlock).
#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

#include "pipeline/schedule.hpp"

namespace pptrain {
namespace {

// Start times of every compute action on the nominal clock: each stage runs its computes
// in list order, each taking its chunk's share of one unit, as soon as the stage is free
// and what it needs has ended. A message is available once the compute before its send
// in the sender's list has ended (a send listed after W waits for W).
class NominalClock {
 public:
  NominalClock(const std::vector<std::vector<Action>>& lists, const Placement& placement)
      : placement_(placement) {
    const int pp = placement.pp();
    std::vector<std::vector<Action>> computes(static_cast<size_t>(pp));
    size_t total = 0;
    for (int s = 0; s < pp; ++s) {
      const Action* before = nullptr;
      for (const Action& a : lists[size_t(s)]) {
        if (is_compute(a.op)) {
          computes[size_t(s)].push_back(a);
          before = &a;
        } else if (is_send(a.op) && before) {
          sent_after_[message_key(placement, s, a)] = key(s, *before);
        }
      }
      total += computes[size_t(s)].size();
    }
    const double share = 1.0 / placement.chunks();
    std::vector<size_t> next(size_t(pp), 0);
    std::vector<double> free(size_t(pp), 0.0);
    for (size_t placed = 0; placed < total;) {
      const size_t before = placed;
      for (int s = 0; s < pp; ++s) {
        while (next[size_t(s)] < computes[size_t(s)].size()) {
          const Action& a = computes[size_t(s)][next[size_t(s)]];
          const std::optional<double> ready = ready_at(s, a);
          if (!ready) break;
          const double start = std::max(free[size_t(s)], *ready);
          free[size_t(s)] = start + share;
          times_[key(s, a)] = {start, free[size_t(s)]};
          ++next[size_t(s)];
          ++placed;
        }
      }
      if (placed == before)
        throw std::logic_error("pipeline schedule: the stages' lists cannot run even with "
                               "free messages (an action waits for one that never comes)");
    }
  }

  double start(int s, const Action& a) const { return times_.at(key(s, a)).first; }

 private:
  using Key = std::tuple<int, int, int, int>;  // stage, op, microbatch, chunk
  static Key key(int s, const Action& a) { return {s, int(a.op), a.microbatch, a.chunk}; }

  std::optional<double> end(const Key& k) const {
    const auto it = times_.find(k);
    if (it == times_.end()) return std::nullopt;
    return it->second.second;
  }
  // When the message that (stage s, receive `receive` of a's unit) needs is sent.
  std::optional<double> arrival(int s, Op receive, const Action& a) const {
    const auto it = sent_after_.find(message_key(placement_, s, {receive, a.microbatch, a.chunk}));
    if (it == sent_after_.end()) return std::nullopt;
    return end(it->second);
  }
  // When what `a` on stage s needs has ended or arrived; nullopt while not yet known.
  std::optional<double> ready_at(int s, const Action& a) const {
    auto later = [](std::optional<double> x, std::optional<double> y) -> std::optional<double> {
      if (!x || !y) return std::nullopt;
      return std::max(*x, *y);
    };
    switch (a.op) {
      case Op::Forward:
        return placement_.is_first(s, a.chunk) ? 0.0 : arrival(s, Op::RecvForward, a);
      case Op::BackwardInput: {
        const auto own = end(key(s, {Op::Forward, a.microbatch, a.chunk}));
        return placement_.is_last(s, a.chunk) ? own : later(own, arrival(s, Op::RecvBackward, a));
      }
      default:
        return end(key(s, {Op::BackwardInput, a.microbatch, a.chunk}));
    }
  }

  Placement placement_;
  std::map<Key, std::pair<double, double>> times_;  // start, end
  std::map<MessageKey, Key> sent_after_;  // message -> the compute its send follows
};

// AsyncSends: the lists as they are, sends and receives grouped where consecutive.
std::vector<std::vector<Step>> in_list_order(const std::vector<std::vector<Action>>& lists,
                                             const Placement& placement) {
  std::vector<std::vector<Step>> out(lists.size());
  for (size_t s = 0; s < lists.size(); ++s) {
    for (const Action& a : lists[s]) {
      const Step::Kind kind = is_compute(a.op)                         ? Step::Compute
                              : is_local_send(placement, int(s), a)    ? Step::LocalCopy
                              : is_send(a.op)                          ? Step::PostSends
                                                                       : Step::Messages;
      std::vector<Step>& steps = out[s];
      const bool joins = (kind == Step::PostSends || kind == Step::Messages) && !steps.empty() &&
                         steps.back().kind == kind;
      if (joins) steps.back().actions.push_back(a);
      else steps.push_back({kind, {a}});
    }
  }
  return out;
}

}  // namespace

std::vector<std::vector<Step>> batch_messages(const std::vector<std::vector<Action>>& lists,
                                              const Placement& placement, MessageMode mode) {
  const int pp = placement.pp();
  if (int(lists.size()) != pp)
    throw std::invalid_argument("batch_messages: got " + std::to_string(lists.size()) +
                                " lists for pp = " + std::to_string(pp));
  if (sends_in_background(mode)) return in_list_order(lists, placement);
  const NominalClock clock(lists, placement);
  std::vector<std::vector<Step>> out(static_cast<size_t>(pp));
  for (int s = 0; s < pp; ++s) {
    // Round -> the messages of that round, by their name.
    std::map<double, std::map<MessageKey, Action>> rounds;
    std::map<std::tuple<int, int, int>, Action> local_after;  // producer -> its local copy
    for (const Action& a : lists[size_t(s)]) {
      if (is_compute(a.op)) continue;
      const ChunkLocation peer = message_peer(placement, s, a);
      const bool forward = a.op == Op::SendForward || a.op == Op::RecvForward;
      const Op consumer = forward ? Op::Forward : Op::BackwardInput;
      if (is_send(a.op) && peer.stage == s) {
        local_after[{int(consumer), a.microbatch, a.chunk}] = a;
        continue;
      }
      const double round = is_send(a.op) ? clock.start(peer.stage, {consumer, a.microbatch, peer.chunk})
                                      : clock.start(s, {consumer, a.microbatch, a.chunk});
      rounds[round][message_key(placement, s, a)] = a;
    }
    // Each round's batch goes before the first compute that starts at or after it.
    std::vector<Step>& steps = out[size_t(s)];
    auto flush_until = [&](double tick) {
      while (!rounds.empty() && rounds.begin()->first <= tick) {
        Step batch{Step::Messages, {}};
        for (const auto& [name, a] : rounds.begin()->second) batch.actions.push_back(a);
        steps.push_back(std::move(batch));
        rounds.erase(rounds.begin());
      }
    };
    for (const Action& a : lists[size_t(s)]) {
      if (!is_compute(a.op)) continue;
      flush_until(clock.start(s, a));
      steps.push_back({Step::Compute, {a}});
      const auto copy = local_after.find({int(a.op), a.microbatch, a.chunk});
      if (copy != local_after.end()) steps.push_back({Step::LocalCopy, {copy->second}});
    }
    flush_until(std::numeric_limits<double>::infinity());
  }
  return out;
}

}  // namespace pptrain
