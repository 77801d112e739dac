// The data-parallel gradient buckets: contiguous ranges of the gradient arena, each
// reduced by one collective that starts as soon as the bucket's last gradient of the
// step is queued. Gradients become final layer by layer from a chunk's last layer down
// (the last micro-batch's weight pass), then the chunk's own tensors (embeddings, final
// LayerNorm and head) once the whole chunk is done. So a bucket holds whole adjacent
// layers while they fit in the size bound, a larger layer is cut into pieces, and a
// chunk's embeddings and its head are buckets of their own.
//
// Under ZeRO-1 every bucket is split evenly over the data-parallel ranks: rank r owns
// block r of every bucket, and reduce-scatters and all-gathers it in place. The arena
// pads each layer and each chunk's embeddings and head to a multiple of
// group_floats() (ModelPartition::group_floats) so that every bucket splits evenly.
#pragma once
#include <cstddef>
#include <vector>

#include "config/config.hpp"
#include "model/param_layout.hpp"

namespace pptrain {

struct GradBucket {
  int chunk = 0;
  // The bucket is final after this layer's last weight pass of the step (its lowest
  // layer); -1: once the whole chunk is done.
  int layer = -1;
  std::size_t begin = 0, end = 0;  // arena floats [begin, end)
  std::size_t size() const { return end - begin; }
};

// ModelPartition::group_floats for a run: 64 * dp under ZeRO-1 (each block of a bucket
// 256-byte aligned), else 1 (no padding).
std::size_t group_floats(const ParallelConfig& p);

// The most floats of one bucket: parallel.grad_bucket_mib, rounded down to a multiple of
// `step` (64 floats, or group_floats under ZeRO), and at least one step.
std::size_t bucket_floats(const ParallelConfig& p);

// The buckets of a rank's arena (laid out by param_layout(model, part)), chunk by
// chunk in the order they become final: layers from the top down, then the chunk's head,
// then its embeddings. Together they cover the arena exactly once. Every bucket is at
// most max_floats long and, like the groups, a multiple of part.group_floats.
std::vector<GradBucket> plan_grad_buckets(const ParamLayout& layout, const ModelPartition& part,
                                          std::size_t max_floats);

}  // namespace pptrain
