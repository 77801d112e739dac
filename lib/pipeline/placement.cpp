#include "pipeline/placement.hpp"

#include <stdexcept>
#include <string>

namespace pptrain {

Placement::Placement(PlacementKind kind, int pp, int virtual_stages)
    : kind_(kind), pp_(pp), v_(virtual_stages) {
  if (pp < 1 || virtual_stages < 1)
    throw std::invalid_argument("placement: pp and virtual_stages must be >= 1");
}

int Placement::virtual_stage(int stage, int chunk) const {
  if (stage < 0 || stage >= pp_ || chunk < 0 || chunk >= v_)
    throw std::logic_error("placement: (stage " + std::to_string(stage) + ", chunk " +
                           std::to_string(chunk) + ") is outside the pipeline");
  const bool upwards = kind_ == PlacementKind::V && chunk % 2 == 1;
  return chunk * pp_ + (upwards ? pp_ - 1 - stage : stage);
}

ChunkLocation Placement::locate(int vs) const {
  if (vs < 0 || vs >= virtual_stages())
    throw std::logic_error("placement: virtual stage " + std::to_string(vs) +
                           " is outside the pipeline");
  const int chunk = vs / pp_, offset = vs % pp_;
  const bool upwards = kind_ == PlacementKind::V && chunk % 2 == 1;
  return {upwards ? pp_ - 1 - offset : offset, chunk};
}

ChunkLocation Placement::next(int stage, int chunk) const {
  if (is_last(stage, chunk)) throw std::logic_error("placement: the last virtual stage has no next");
  return locate(virtual_stage(stage, chunk) + 1);
}

ChunkLocation Placement::previous(int stage, int chunk) const {
  if (is_first(stage, chunk))
    throw std::logic_error("placement: the first virtual stage has no previous");
  return locate(virtual_stage(stage, chunk) - 1);
}

}  // namespace pptrain
