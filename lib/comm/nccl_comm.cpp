// add_nccl_comms: the NCCL communicators of the rank grid, created at start-up on every
// rank in one fixed order (world, tp, dp, pp, embedding, cp ring, pipeline channels),
// each bootstrapped over the host world (its rank 0 makes the ncclUniqueId and sends it
// to the other members).
#include "comm/nccl_comm.hpp"

#include "comm/nccl_impl.hpp"
#include "core/error.hpp"

namespace pptrain::comm {

bool nccl_built() { return true; }

namespace {

// Start-up tags 0-5 bootstrap the grid's communicators; the channels' follow.
constexpr int kFirstChannelTag = 16;

// The NCCL twin of a host group: same name and members, which must be the grid's.
// `beside`: the group gets a stream of its own for its *_beside collectives.
std::unique_ptr<Group> twin(const std::shared_ptr<detail::NcclContext>& ctx, const Group& host,
                            const std::vector<int>& members, int tag, bool beside = false) {
  PPTRAIN_CHECK(host.world_ranks() == members,
                "add_nccl_comms: " + host.name() + " does not match the rank grid");
  ncclComm_t comm = ctx->add_comm(members, host.name(), tag);
  const detail::NcclOpInfo info{"start-up", host.name(), {detail::join_ranks(members), members}};
  return detail::make_nccl_group(ctx, comm, host.name(), members,
                                 beside ? ctx->new_stream(info) : nullptr);
}

}  // namespace

void add_nccl_comms(Comms& comms, const RankGrid& grid, void* compute_stream,
                    HostWaitCounter* host_waits,
                    const std::vector<PipelineChannel>& pipeline_channels) {
  PPTRAIN_CHECK(comms.world && comms.tp && comms.dp && comms.pp,
                "add_nccl_comms: the host communicators must exist first");
  PPTRAIN_CHECK(!comms.device, "add_nccl_comms: comms already has device communicators");
  World& host = *comms.world;
  const int rank = host.rank(), size = host.size();
  PPTRAIN_CHECK(grid.world_size() == size, "add_nccl_comms: the rank grid has " +
                                               std::to_string(grid.world_size()) +
                                               " ranks, the job " + std::to_string(size));
  const bool has_embedding = grid.embedding_group_index(rank) >= 0;
  PPTRAIN_CHECK(has_embedding == (comms.embedding != nullptr),
                "add_nccl_comms: the embedding group does not match the rank grid");

  auto ctx = std::make_shared<detail::NcclContext>(
      host, static_cast<cudaStream_t>(compute_stream), comms.timeout_s, host_waits);
  auto device = std::make_unique<DeviceComms>();
  device->world = detail::make_nccl_world(
      ctx, ctx->add_comm(detail::every_rank(size), "world", 0), size, detail::every_rank(size));
  device->tp = twin(ctx, *comms.tp, grid.tp_group(rank), 1, grid.tp() > 1);
  device->dp = twin(ctx, *comms.dp, grid.replica_group(rank), 2);
  device->pp = twin(ctx, *comms.pp, grid.pp_group(rank), 4);
  if (has_embedding) device->embedding = twin(ctx, *comms.embedding, grid.embedding_group(rank), 3);
  if (grid.cp() > 1) {
    const std::vector<int> ring = grid.cp_group(rank);
    const detail::NcclOpInfo info{"start-up", "cp ring", {detail::join_ranks(ring), ring}};
    device->ring = detail::make_nccl_world(ctx, ctx->add_comm(ring, "cp ring", 5), size, ring,
                                           ctx->new_stream(info));
  }
  // The channels last, each with its own tag, in the list's order: every rank creates
  // those it is in in the same global order, so no creation waits on a later one.
  std::vector<detail::ChannelLane> lanes;
  for (std::size_t i = 0; i < pipeline_channels.size(); ++i) {
    const PipelineChannel& c = pipeline_channels[i];
    if (c.from != rank && c.to != rank) continue;
    const std::vector<int> pair{c.from, c.to};
    const std::string name = "pipeline-channel-" + std::to_string(c.channel) + "(" +
                             std::to_string(c.from) + "->" + std::to_string(c.to) + ")";
    const detail::NcclOpInfo info{"start-up", name, {detail::join_ranks(pair), pair}};
    ncclComm_t comm = ctx->add_comm(pair, name, kFirstChannelTag + int(i));
    lanes.push_back({name, c.from == rank ? c.to : c.from, c.from == rank, c.channel, comm,
                     ctx->new_stream(info)});
  }
  if (!pipeline_channels.empty())
    device->pipeline = detail::make_nccl_channel_world(ctx, size, std::move(lanes));
  comms.device = std::move(device);
  comms.timeline->set_device(ctx);
}

}  // namespace pptrain::comm
