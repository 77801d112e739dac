// The NCCL entry points of a build without the CUDA backend.
#include <stdexcept>

#include "comm/nccl_comm.hpp"

namespace pptrain::comm {

bool nccl_built() { return false; }

void add_nccl_comms(Comms&, const RankGrid&, void*, HostWaitCounter*,
                    const std::vector<PipelineChannel>&) {
  throw std::runtime_error("this build of pptrain has no NCCL communicators (configure with the "
                           "CUDA toolkit and NCCL installed, PPTRAIN_CUDA=AUTO or ON)");
}

}  // namespace pptrain::comm
