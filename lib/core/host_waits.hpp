// Counts the host's waits on a device: every stream, event or device synchronisation and
// every blocking copy. A device backend owns one (ops::Ops::host_waits) and the code that
// waits on its device counts into it: the backend itself and its NCCL communicators.
#pragma once
#include <atomic>
#include <cstdint>

namespace pptrain {

class HostWaitCounter {
 public:
  void add() { count_.fetch_add(1, std::memory_order_relaxed); }
  std::int64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::int64_t> count_{0};
};

}  // namespace pptrain
