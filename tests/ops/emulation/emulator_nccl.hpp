// Internal to the emulated NCCL (include/nccl.h): a communicator's state, the MPI tags
// reserved for the emulation, messages in flight with the buffers they own, the
// operations that the streams' work items progress, and error reporting.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nccl.h"

namespace pptrain_emu::nccl_emu {

using namespace pptrain_emu::nccl;  // NOLINT: the API's names

// ---- tags: [kTagBase, 2 * kTagBase) of MPI_COMM_WORLD is the emulation's ----
// A tag is (slot, channel, sequence number modulo 2^kSeqBits). A slot names a
// communicator between its members (slot 0: creation); it is never reused in a process,
// so a message abandoned by an abort can never match a later communicator's receive.
enum class Channel : int {
  Join = 0,       // a member registers with the creator of the id
  Reply = 1,      // the creator answers with the member table
  P2pHeader = 2,  // a send's descriptor
  P2pAck = 3,     // the receive's answer: posted, or a mismatch
  P2pData = 4,
  CollDesc = 5,  // every rank's descriptor of a collective
  CollData = 6,
};
inline constexpr int kSeqBits = 11, kChannelBits = 3, kSlotBits = 8;
inline constexpr int kTagBase = 1 << (kSeqBits + kChannelBits + kSlotBits);
inline constexpr int kMaxSlot = (1 << kSlotBits) - 1;
int tag(int slot, Channel channel, std::uint64_t seq);

// True when MPI is initialised and not yet finalised.
bool mpi_usable();
int world_rank();

// ---- errors ----
// Records the text for ncclGetLastError and returns rc.
ncclResult_t fail(ncclResult_t rc, const std::string& text);
// fail() and one line on stderr naming this process's world rank.
ncclResult_t fail_loudly(ncclResult_t rc, const std::string& text);
const char* last_error_text();
const char* type_name(ncclDataType_t type);
const char* op_name(ncclRedOp_t op);
std::size_t type_size(ncclDataType_t type);  // 0 for an unknown type

class Op;

struct Comm {
  std::string name;  // "communicator W.N": made from the N-th id of world rank W
  int rank = 0, nranks = 0, device = 0, slot = 0;
  std::vector<int> world;  // world ranks by NCCL rank
  ncclResult_t async_error = ncclSuccess;
  std::string error;  // the text of the first asynchronous error
  bool aborted = false, destroyed = false;
  std::uint64_t next_coll = 0;
  std::vector<std::uint64_t> next_send, next_recv;  // by peer: matched in issue order
  std::vector<Op*> live;                            // posted and not finished
  int queued = 0;                                   // queued and not finished
};
// Sets the communicator's asynchronous error (the first one stays) and says it loudly.
void set_async_error(Comm& comm, ncclResult_t rc, const std::string& text);

// Messages in flight with the buffers they use: a send copies its data first, a receive
// lands in a buffer of its own, so user memory is touched only when an operation
// finishes. Messages above 1 GiB go as several messages with the same tag (MPI keeps
// their order).
class Transfers {
 public:
  Transfers() = default;
  Transfers(const Transfers&) = delete;
  Transfers& operator=(const Transfers&) = delete;
  ~Transfers();  // abandons what is still in flight

  // synchronous: MPI_Issend, complete only once the receive is posted.
  void send(const void* data, std::size_t bytes, int world_peer, int tag, bool synchronous);
  // Returns the index of the buffer the message will be in.
  std::size_t recv(std::size_t bytes, int world_peer, int tag);
  const std::vector<std::byte>& buffer(std::size_t index) const { return *buffers_[index]; }
  bool test();  // all complete
  // Cancels receives and lets sends go; buffers MPI may still use stay alive for the
  // rest of the process.
  void abandon();

 private:
  struct Pending {
    MPI_Request request;
    bool is_recv;
  };
  std::vector<Pending> pending_;
  std::vector<std::shared_ptr<std::vector<std::byte>>> buffers_;
};

// One NCCL operation of a work item: post() is called once, then test() until it returns
// true. An operation whose peers disagree sets the communicator's error and never
// finishes; one of an aborted communicator is abandoned without touching user memory.
class Op {
 public:
  explicit Op(std::shared_ptr<Comm> comm, std::string what);
  virtual ~Op();
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  void post();
  bool test();
  void abandon();  // idempotent
  // Tells the race detector which user memory the operation reads and writes, as
  // accesses of the running stream item (it may touch them any time until it completes).
  void note_touches() const;
  const std::string& what() const { return what_; }
  Comm& comm() { return *comm_; }
  const std::shared_ptr<Comm>& comm_ptr() const { return comm_; }

 protected:
  // Declares user memory the operation reads or writes (note_touches).
  void touches(const void* p, std::size_t bytes, bool writes) {
    if (p != nullptr && bytes != 0) touched_.push_back({p, bytes, writes});
  }
  virtual void do_post() = 0;
  virtual bool do_test() = 0;
  virtual void do_abandon() = 0;

 private:
  struct Touch {
    const void* p;
    std::size_t bytes;
    bool writes;
  };
  std::shared_ptr<Comm> comm_;
  std::string what_;
  std::vector<Touch> touched_;
  bool posted_ = false, finished_ = false;
};

// ---- the operations (emulator_nccl_p2p.cpp, emulator_nccl_coll.cpp) ----
std::unique_ptr<Op> make_send(std::shared_ptr<Comm> comm, const void* buf, std::size_t count,
                              ncclDataType_t type, int peer);
std::unique_ptr<Op> make_recv(std::shared_ptr<Comm> comm, void* buf, std::size_t count,
                              ncclDataType_t type, int peer);
enum class Coll : int { AllReduce = 1, Broadcast, Reduce, AllGather, ReduceScatter };
const char* coll_name(Coll kind);
struct CollArgs {
  Coll kind;
  const void* send;
  void* recv;
  std::size_t count;  // as the call's count argument (per rank for the gather/scatter)
  ncclDataType_t type;
  ncclRedOp_t op;  // ncclSum where the collective has none
  int root;        // 0 where the collective has none
};
std::unique_ptr<Op> make_collective(std::shared_ptr<Comm> comm, const CollArgs& args);

// ---- groups and work items (emulator_nccl_group.cpp) ----
// Makes an operation (taking its sequence numbers): once when it is queued, or at each
// launch of the graph that captured it.
using OpMaker = std::function<std::unique_ptr<Op>()>;
// Queues the operation on stream, or keeps it for the open group's ncclGroupEnd.
ncclResult_t submit(cudaStream_t stream, OpMaker make);
// fail(), and inside a group the group fails too (ncclGroupEnd returns the error).
ncclResult_t refuse(ncclResult_t rc, const std::string& text);

// ---- communicator handles (emulator_nccl_comm.cpp) ----
// Looks a handle up for `call`: an unknown, destroyed or aborted communicator, or one
// with an asynchronous error, is an error (its text is the last error).
ncclResult_t lookup(ncclComm_t handle, const char* call, std::shared_ptr<Comm>* out);

// ---- reductions (emulator_nccl_reduce.cpp) ----
// out[i] = inputs[0][i] op inputs[1][i] op ... in rank order: floating types accumulate
// in fp32 (fp64 for fp64) and round once to the element type; integers wrap; avg is the
// sum divided by the number of inputs; max and min propagate NaN.
void reduce(ncclDataType_t type, ncclRedOp_t op, const std::vector<const std::byte*>& inputs,
            std::byte* out, std::size_t count);

}  // namespace pptrain_emu::nccl_emu

namespace pptrain_emu::nccl {
// A handle is never freed: a destroyed or aborted one stays known, so using it again is a
// reported error instead of a use after free.
struct ncclComm {
  std::shared_ptr<nccl_emu::Comm> state;
};
}  // namespace pptrain_emu::nccl
