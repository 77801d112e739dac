// Counts a backend's live allocations, for Ops::peak_memory_bytes: the bytes held now
// and the most held at once. Not thread-safe: backends allocate from one thread.
#pragma once
#include <algorithm>
#include <cstddef>
#include <unordered_map>

namespace pptrain::ops {

class MemoryTracker {
 public:
  // `extra`: bytes the backend holds outside these allocations (workspaces) right now.
  void added(void* p, std::size_t bytes, std::size_t extra = 0) {
    sizes_[p] = bytes;
    held_ += bytes;
    note(extra);
  }
  void removed(void* p) {
    if (auto it = sizes_.find(p); it != sizes_.end()) {
      held_ -= it->second;
      sizes_.erase(it);
    }
  }
  void note(std::size_t extra) { peak_ = std::max(peak_, held_ + extra); }
  std::size_t held() const { return held_; }
  std::size_t peak() const { return peak_; }
  const std::unordered_map<void*, std::size_t>& live() const { return sizes_; }

 private:
  std::unordered_map<void*, std::size_t> sizes_;
  std::size_t held_ = 0, peak_ = 0;
};

}  // namespace pptrain::ops
