// The emulated NCCL's collectives. Every rank sends its call's descriptor (sequence
// number, collective, count, type, op, root) to every other rank; a rank whose peers
// disagree sets the communicator's error, prints one line naming both calls and never
// finishes. Otherwise the data goes straight to the ranks that need it, and each rank
// computes its result itself, reducing in rank order (emulator_nccl_reduce.cpp), so
// results are deterministic and equal on every rank.
#include <cstring>
#include <string>
#include <utility>

#include "emulator_nccl.hpp"

namespace pptrain_emu::nccl_emu {

namespace {

struct CollDesc {
  std::uint64_t seq;
  std::uint64_t count;
  std::int32_t kind, type, op, root;
};

bool has_op(Coll kind) {
  return kind == Coll::AllReduce || kind == Coll::Reduce || kind == Coll::ReduceScatter;
}
bool has_root(Coll kind) { return kind == Coll::Broadcast || kind == Coll::Reduce; }

std::string call_text(const CollDesc& d) {
  const auto kind = static_cast<Coll>(d.kind);
  std::string text = std::string(coll_name(kind)) + "(count " + std::to_string(d.count) + ", " +
                     type_name(static_cast<ncclDataType_t>(d.type));
  if (has_op(kind)) text += std::string(", ") + op_name(static_cast<ncclRedOp_t>(d.op));
  if (has_root(kind)) text += ", root " + std::to_string(d.root);
  return text + ")";
}

bool same(const CollDesc& a, const CollDesc& b) {
  if (a.seq != b.seq || a.kind != b.kind || a.count != b.count || a.type != b.type) return false;
  const auto kind = static_cast<Coll>(a.kind);
  return (!has_op(kind) || a.op == b.op) && (!has_root(kind) || a.root == b.root);
}

class CollOp final : public Op {
 public:
  CollOp(std::shared_ptr<Comm> comm, const CollArgs& args)
      : Op(comm, std::string(coll_name(args.kind)) + " on " + comm->name),
        a_(args),
        mine_{comm->next_coll++,
              args.count,
              static_cast<std::int32_t>(args.kind),
              static_cast<std::int32_t>(args.type),
              static_cast<std::int32_t>(args.op),
              args.root},
        block_(args.count * type_size(args.type)),
        at_(static_cast<std::size_t>(comm->nranks), kNone) {
    const std::size_t n = static_cast<std::size_t>(comm->nranks);
    const bool root = comm->rank == args.root;
    switch (args.kind) {
      case Coll::AllReduce: touches(args.send, block_, false), touches(args.recv, block_, true); break;
      case Coll::AllGather: touches(args.send, block_, false), touches(args.recv, n * block_, true); break;
      case Coll::ReduceScatter: touches(args.send, n * block_, false), touches(args.recv, block_, true); break;
      case Coll::Broadcast:
        if (root) touches(args.send, block_, false);
        touches(args.recv, block_, true);
        break;
      case Coll::Reduce:
        touches(args.send, block_, false);
        if (root) touches(args.recv, block_, true);
        break;
    }
  }

 protected:
  void do_post() override {
    Comm& c = comm();
    desc_at_.assign(static_cast<std::size_t>(c.nranks), kNone);
    for (int r = 0; r < c.nranks; ++r) {
      if (r == c.rank) continue;
      const int peer = c.world[static_cast<std::size_t>(r)];
      const int t = tag(c.slot, Channel::CollDesc, mine_.seq);
      descs_.send(&mine_, sizeof mine_, peer, t, false);
      desc_at_[static_cast<std::size_t>(r)] = descs_.recv(sizeof(CollDesc), peer, t);
    }
  }
  bool do_test() override {
    if (stuck_) return false;
    if (!data_posted_) {
      if (!descs_.test()) return false;
      if (!descriptors_agree()) {
        stuck_ = true;
        return false;
      }
      post_data();
      data_posted_ = true;
    }
    if (!datas_.test()) return false;
    finish();
    return true;
  }
  void do_abandon() override {
    descs_.abandon();
    datas_.abandon();
  }

 private:
  static constexpr std::size_t kNone = ~std::size_t(0);

  bool descriptors_agree() {
    Comm& c = comm();
    for (int r = 0; r < c.nranks; ++r) {
      if (r == c.rank) continue;
      CollDesc theirs;
      std::memcpy(&theirs, descs_.buffer(desc_at_[static_cast<std::size_t>(r)]).data(),
                  sizeof theirs);
      if (same(theirs, mine_)) continue;
      set_async_error(c, ncclInvalidUsage,
                      c.name + ": collective #" + std::to_string(mine_.seq + 1) +
                          " differs between ranks: rank " + std::to_string(c.rank) + " calls " +
                          call_text(mine_) + " but rank " + std::to_string(r) + " calls " +
                          call_text(theirs) +
                          " (every rank calls the same collectives in the same order, with "
                          "the same count, type, op and root)");
      return false;
    }
    return true;
  }

  const std::byte* send_at(std::size_t block_index) const {
    return static_cast<const std::byte*>(a_.send) + block_index * block_;
  }
  void snapshot(const std::byte* from) { own_.assign(from, from + block_); }
  void send_to(int r, const std::byte* data) {
    Comm& c = comm();
    datas_.send(data, block_, c.world[static_cast<std::size_t>(r)],
                tag(c.slot, Channel::CollData, mine_.seq), false);
  }
  void recv_from(int r) {
    Comm& c = comm();
    at_[static_cast<std::size_t>(r)] = datas_.recv(block_, c.world[static_cast<std::size_t>(r)],
                                                   tag(c.slot, Channel::CollData, mine_.seq));
  }
  const std::byte* block_of(int r) const {
    return r == comm_rank() ? own_.data() : datas_.buffer(at_[static_cast<std::size_t>(r)]).data();
  }
  int comm_rank() const { return comm_ptr()->rank; }

  // Reads this rank's input now, as the stream reaches the operation.
  void post_data() {
    const Comm& c = comm();
    const int me = c.rank, n = c.nranks;
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      switch (a_.kind) {
        case Coll::AllReduce:
        case Coll::AllGather:
          send_to(r, send_at(0));
          recv_from(r);
          break;
        case Coll::ReduceScatter:
          send_to(r, send_at(static_cast<std::size_t>(r)));
          recv_from(r);
          break;
        case Coll::Broadcast:
          if (me == a_.root) send_to(r, send_at(0));
          if (r == a_.root) recv_from(r);
          break;
        case Coll::Reduce:
          if (me == a_.root) recv_from(r);
          if (r == a_.root) send_to(r, send_at(0));
          break;
      }
    }
    const bool has_input = a_.kind != Coll::Broadcast || me == a_.root;
    if (has_input)
      snapshot(send_at(a_.kind == Coll::ReduceScatter ? static_cast<std::size_t>(me) : 0));
  }

  // Writes the result: the inputs are all copies, so any overlap with them is harmless.
  void finish() {
    const Comm& c = comm();
    auto* out = static_cast<std::byte*>(a_.recv);
    if (a_.kind == Coll::Broadcast) {
      if (block_ != 0) std::memcpy(out, block_of(a_.root), block_);
      return;
    }
    if (a_.kind == Coll::Reduce && c.rank != a_.root) return;
    std::vector<const std::byte*> inputs;
    for (int r = 0; r < c.nranks; ++r) inputs.push_back(block_of(r));
    if (a_.kind != Coll::AllGather) {
      reduce(a_.type, a_.op, inputs, out, a_.count);
      return;
    }
    if (block_ == 0) return;
    for (std::size_t r = 0; r < inputs.size(); ++r)
      std::memcpy(out + r * block_, inputs[r], block_);
  }

  CollArgs a_;
  CollDesc mine_;
  std::size_t block_;            // bytes of one rank's block
  std::vector<std::size_t> at_;  // by rank: the Transfers buffer of its block
  std::vector<std::size_t> desc_at_;
  std::vector<std::byte> own_;  // this rank's block, read when the data phase starts
  Transfers descs_, datas_;
  bool data_posted_ = false, stuck_ = false;
};

}  // namespace

const char* coll_name(Coll kind) {
  switch (kind) {
    case Coll::AllReduce: return "ncclAllReduce";
    case Coll::Broadcast: return "ncclBroadcast";
    case Coll::Reduce: return "ncclReduce";
    case Coll::AllGather: return "ncclAllGather";
    case Coll::ReduceScatter: return "ncclReduceScatter";
  }
  return "unknown collective";
}

std::unique_ptr<Op> make_collective(std::shared_ptr<Comm> comm, const CollArgs& args) {
  return std::make_unique<CollOp>(std::move(comm), args);
}

}  // namespace pptrain_emu::nccl_emu
