// sends_waitable_from: vector clocks over every stage's steps, following the messages.
#include "pipeline/send_waits.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

namespace pptrain {
namespace {

bool posts_messages(const Step& step) {
  return step.kind == Step::Messages || step.kind == Step::PostSends;
}

struct Slot {
  int stage;
  std::size_t step;
};

}  // namespace

std::vector<std::vector<std::size_t>> sends_waitable_from(const std::vector<std::vector<Step>>& steps,
                                                          const Placement& placement) {
  const int pp = placement.pp();
  if (int(steps.size()) != pp)
    throw std::invalid_argument("sends_waitable_from: needs one list of steps per stage");
  // Both ends of every message.
  std::map<MessageKey, Slot> sent, received;
  for (int s = 0; s < pp; ++s)
    for (std::size_t i = 0; i < steps[size_t(s)].size(); ++i)
      if (posts_messages(steps[size_t(s)][i]))
        for (const Action& a : steps[size_t(s)][i].actions)
          (is_send(a.op) ? sent : received)[message_key(placement, s, a)] = {s, i};
  auto other_end = [&](int s, const Action& a) {
    const auto& ends = is_send(a.op) ? received : sent;
    const auto it = ends.find(message_key(placement, s, a));
    if (it == ends.end())
      throw std::logic_error("sends_waitable_from: stage " + std::to_string(s) + ": " +
                             to_string(a) + " is never matched");
    return it->second;
  };

  // clock[s][q]: the last step of stage q that s's next step depends on (-1: none);
  // posted[s][i]: that clock when s posted message step i (empty until it has).
  std::vector<std::vector<int>> clock(size_t(pp), std::vector<int>(size_t(pp), -1));
  std::vector<std::vector<std::vector<int>>> posted(static_cast<std::size_t>(pp));
  for (int s = 0; s < pp; ++s) posted[size_t(s)].resize(steps[size_t(s)].size());
  std::vector<std::size_t> next(size_t(pp), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < pp; ++s) {
      const auto& list = steps[size_t(s)];
      std::vector<int>& now = clock[size_t(s)];
      while (next[size_t(s)] < list.size()) {
        const std::size_t i = next[size_t(s)];
        const Step& step = list[i];
        now[size_t(s)] = int(i);
        if (posts_messages(step)) posted[size_t(s)][i] = now;
        if (step.kind == Step::Messages) {  // completes once every other end is posted
          bool ready = true;
          for (const Action& a : step.actions) {
            const Slot end = other_end(s, a);
            ready = ready && !posted[size_t(end.stage)][end.step].empty();
          }
          if (!ready) break;
          for (const Action& a : step.actions) {
            const Slot end = other_end(s, a);
            const std::vector<int>& theirs = posted[size_t(end.stage)][end.step];
            for (int q = 0; q < pp; ++q)
              now[size_t(q)] = std::max(now[size_t(q)], theirs[size_t(q)]);
          }
        }
        ++next[size_t(s)];
        progress = true;
      }
    }
  }
  std::vector<std::vector<std::size_t>> waitable(static_cast<std::size_t>(pp));
  for (int s = 0; s < pp; ++s) {
    const auto& list = steps[size_t(s)];
    if (next[size_t(s)] < list.size())
      throw std::logic_error("sends_waitable_from: stage " + std::to_string(s) +
                             " cannot complete its steps (the simulator says why)");
    for (std::size_t i = 0; i < list.size(); ++i) {
      std::size_t from = i + 1;
      if (list[i].kind == Step::PostSends)
        for (const Action& a : list[i].actions) {
          const Slot end = other_end(s, a);  // the receiving batch, and what it waits on of s
          const int needs = posted[size_t(end.stage)][end.step][size_t(s)];
          from = std::max(from, std::size_t(needs + 1));
        }
      waitable[size_t(s)].push_back(from);
    }
  }
  return waitable;
}

}  // namespace pptrain
