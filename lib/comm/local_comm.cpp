// One-rank communicators for single-process runs: every group has one member, so
// collectives copy or do nothing, and the world only exchanges with itself.
#include <algorithm>
#include <cstring>
#include <cstdio>
#include <cstdlib>

#include "comm/comm.hpp"
#include "core/error.hpp"

namespace pptrain::comm {
namespace {

class DonePending final : public PendingOp {
 public:
  void wait() override {}
  bool test() override { return true; }
};

class LocalGroup final : public Group {
 public:
  explicit LocalGroup(std::string name) : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::vector<int>& world_ranks() const override { return members_; }

  void all_reduce(float*, std::size_t, ReduceOp) override {}
  void all_reduce(void*, std::size_t, DType) override {}
  void all_reduce(double*, std::size_t, ReduceOp) override {}
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count,
                      DType dtype) override {
    if (send != recv) std::memcpy(recv, send, recv_count * dtype_size(dtype));
  }
  void all_gather(const void* send, void* recv, std::size_t send_count, DType dtype) override {
    if (send != recv) std::memcpy(recv, send, send_count * dtype_size(dtype));
  }
  void broadcast(float*, std::size_t, int root) override {
    PPTRAIN_CHECK(root == 0, "broadcast on " + name_ + ": root " + std::to_string(root) +
                                 " is not a member");
  }
  std::unique_ptr<PendingOp> all_reduce_start(float*, std::size_t) override {
    return std::make_unique<DonePending>();
  }
  std::unique_ptr<PendingOp> reduce_scatter_start(float*, std::size_t) override {
    return std::make_unique<DonePending>();
  }
  std::unique_ptr<PendingOp> all_gather_start(void*, std::size_t, DType) override {
    return std::make_unique<DonePending>();
  }

 private:
  std::string name_;
  std::vector<int> members_{0};
};

class LocalWorld final : public World {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }

  // Every receive takes the first unused send of the same tag; anything left unmatched
  // would hang a real job, so it is an error here.
  void exchange(const std::vector<Transfer>& batch) override {
    std::vector<bool> used(batch.size(), false);
    for (const Transfer& t : batch)
      PPTRAIN_CHECK(t.peer == 0, "exchange: peer " + std::to_string(t.peer) +
                                     " is not a world rank (one-rank run)");
    for (const Transfer& r : batch) {
      if (r.kind != Transfer::Recv) continue;
      auto it = std::find_if(batch.begin(), batch.end(), [&](const Transfer& s) {
        return s.kind == Transfer::Send && s.tag == r.tag && !used[static_cast<std::size_t>(&s - batch.data())];
      });
      PPTRAIN_CHECK(it != batch.end(), "exchange: receive with tag " + std::to_string(r.tag) +
                                           " has no matching send");
      PPTRAIN_CHECK(it->bytes == r.bytes, "exchange: send and receive sizes differ for tag " +
                                              std::to_string(r.tag));
      used[static_cast<std::size_t>(it - batch.begin())] = true;
      std::memcpy(r.data, it->data, r.bytes);
    }
    for (std::size_t i = 0; i < batch.size(); ++i)
      PPTRAIN_CHECK(batch[i].kind == Transfer::Recv || used[i],
                    "exchange: send with tag " + std::to_string(batch[i].tag) +
                        " has no matching receive");
  }
  std::unique_ptr<PendingOp> exchange_start(const std::vector<Transfer>& batch) override {
    exchange(batch);
    return std::make_unique<DonePending>();
  }
  void barrier() override {}
  [[noreturn]] void abort(const std::string& message, int exit_code) override {
    std::fprintf(stderr, "pptrain: rank 0: %s\n", message.c_str());
    std::fflush(nullptr);
    std::_Exit(exit_code);
  }
};

}  // namespace

Comms make_local_comms() {
  Comms comms;
  comms.world = std::make_unique<LocalWorld>();
  comms.all = std::make_unique<LocalGroup>("world");
  comms.tp = std::make_unique<LocalGroup>("tp(dp=0,pp=0)");
  comms.dp = std::make_unique<LocalGroup>("dp(tp=0,pp=0)");
  comms.pp = std::make_unique<LocalGroup>("pp(tp=0,dp=0)");
  comms.embedding = std::make_unique<LocalGroup>("embedding(tp=0,dp=0)");
  return comms;
}

}  // namespace pptrain::comm
