#include "train/grad_buckets.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"
#include "optim/adamw.hpp"

namespace pptrain {

namespace {
constexpr std::size_t kAlignFloats = 64;  // the arena's 256-byte entry alignment

// A group of the layout (ParamLayout::Group) with its end.
struct Group {
  int chunk, layer;
  std::size_t begin, end;
};

// The groups in arena order; each ends where the next begins (the last at the arena end).
std::vector<Group> arena_groups(const ParamLayout& layout) {
  std::vector<Group> groups;
  for (const ParamLayout::Group& g : layout.groups()) groups.push_back({g.chunk, g.layer, g.begin, 0});
  for (std::size_t g = 0; g < groups.size(); ++g)
    groups[g].end = g + 1 < groups.size() ? groups[g + 1].begin : layout.total_floats();
  return groups;
}
}  // namespace

std::size_t group_floats(const ParallelConfig& p) {
  return zero_shards(p) ? kAlignFloats * std::size_t(replicas(p)) : 1;
}

std::size_t bucket_floats(const ParallelConfig& p) {
  const std::size_t step = std::max(kAlignFloats, group_floats(p));
  const auto wanted = std::size_t(p.grad_bucket_mib * 1024.0 * 1024.0 / sizeof(float));
  return std::max(step, wanted / step * step);
}

std::vector<GradBucket> plan_grad_buckets(const ParamLayout& layout, const ModelPartition& part,
                                          std::size_t max_floats) {
  PPTRAIN_CHECK(max_floats >= 1 && max_floats % part.group_floats == 0,
                "bucket size must be a multiple of the group size");
  const std::vector<Group> groups = arena_groups(layout);
  std::vector<GradBucket> buckets;
  // Cuts a group too large for one bucket into pieces from its start.
  const auto pieces = [&](const Group& g) {
    for (std::size_t b = g.begin; b < g.end; b += max_floats)
      buckets.push_back({g.chunk, g.layer, b, std::min(g.end, b + max_floats)});
  };
  for (int c = 0; c < int(part.chunks.size()); ++c) {
    std::vector<const Group*> layers, own;
    for (const Group& g : groups)
      if (g.chunk == c) (g.layer >= 0 ? layers : own).push_back(&g);
    // Layers from the top down: the next lower layer joins the open bucket while it fits.
    bool open = false;
    for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
      const Group& g = **it;
      if (open && buckets.back().end - g.begin <= max_floats) {
        buckets.back().begin = g.begin;
        buckets.back().layer = g.layer;
      } else if (g.end - g.begin <= max_floats) {
        buckets.push_back({c, g.layer, g.begin, g.end});
        open = true;
      } else {
        pieces(g);
        open = false;
      }
    }
    // The head (after the layers in the arena) and then the embeddings (before them).
    std::sort(own.begin(), own.end(), [](const Group* a, const Group* b) { return a->begin > b->begin; });
    for (const Group* g : own) pieces(*g);
  }
  for (const GradBucket& b : buckets)
    PPTRAIN_CHECK(b.size() % part.group_floats == 0, "a gradient bucket does not split evenly");
  return buckets;
}

}  // namespace pptrain
