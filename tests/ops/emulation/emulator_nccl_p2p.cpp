// The emulated NCCL's point-to-point operations. The k-th ncclSend from rank a to rank b
// of a communicator matches the k-th ncclRecv on b from a (tags carry the sequence
// number). Rendezvous: the send posts its descriptor and waits for the receive's answer,
// which comes only once the receive is running and has posted its data receive; then the
// data goes with MPI_Issend. So a send completes only when its receive has been posted,
// with no buffering, and a count or type mismatch is reported on both ranks.
#include <cstring>
#include <string>
#include <utility>

#include "emulator_nccl.hpp"

namespace pptrain_emu::nccl_emu {

namespace {

// A send's descriptor, and the receive's answer in the same form.
struct P2pHeader {
  std::uint64_t seq;
  std::uint64_t count;
  std::int32_t type;
  std::int32_t mismatch;  // in the answer: 1 when the receive does not match
};

std::string describe(const char* call, int rank, const char* direction, int peer, std::uint64_t seq,
                     std::uint64_t count, int type) {
  return "rank " + std::to_string(rank) + "'s " + call + " #" + std::to_string(seq + 1) + " " +
         direction + " rank " + std::to_string(peer) + " (count " + std::to_string(count) + ", " +
         type_name(static_cast<ncclDataType_t>(type)) + ")";
}

std::string mismatch_text(const Comm& c, const P2pHeader& send, int send_rank,
                          const P2pHeader& recv, int recv_rank) {
  return c.name + ": " +
         describe("ncclSend", send_rank, "to", recv_rank, send.seq, send.count, send.type) +
         " does not match " +
         describe("ncclRecv", recv_rank, "from", send_rank, recv.seq, recv.count, recv.type) +
         " (point-to-point operations match per peer in issue order, with the same count "
         "and type)";
}

bool same(const P2pHeader& a, const P2pHeader& b) {
  return a.seq == b.seq && a.count == b.count && a.type == b.type;
}

std::string op_text(const char* call, const char* direction, const Comm& c, int peer) {
  return std::string(call) + " " + direction + " rank " + std::to_string(peer) + " on " + c.name;
}

class SendOp final : public Op {
 public:
  SendOp(std::shared_ptr<Comm> comm, const void* buf, std::size_t count, ncclDataType_t type,
         int peer)
      : Op(comm, op_text("ncclSend", "to", *comm, peer)),
        buf_(buf),
        peer_(peer),
        mine_{comm->next_send[static_cast<std::size_t>(peer)]++, count, type, 0},
        bytes_(count * type_size(type)) {
    touches(buf, bytes_, false);
  }

 protected:
  void do_post() override {
    Comm& c = comm();
    const int to = c.world[static_cast<std::size_t>(peer_)];
    header_.send(&mine_, sizeof mine_, to, tag(c.slot, Channel::P2pHeader, mine_.seq), false);
    answer_ = answers_.recv(sizeof(P2pHeader), to, tag(c.slot, Channel::P2pAck, mine_.seq));
  }
  bool do_test() override {
    Comm& c = comm();
    if (stuck_) return false;
    if (!data_started_) {
      if (!answers_.test()) return false;
      P2pHeader theirs;
      std::memcpy(&theirs, answers_.buffer(answer_).data(), sizeof theirs);
      if (theirs.mismatch != 0 || !same(theirs, mine_)) {
        set_async_error(c, ncclInvalidUsage, mismatch_text(c, mine_, c.rank, theirs, peer_));
        stuck_ = true;
        return false;
      }
      data_.send(buf_, bytes_, c.world[static_cast<std::size_t>(peer_)],
                 tag(c.slot, Channel::P2pData, mine_.seq), true);
      data_started_ = true;
    }
    return data_.test() && header_.test();
  }
  void do_abandon() override {
    header_.abandon();
    answers_.abandon();
    data_.abandon();
  }

 private:
  const void* buf_;
  int peer_;
  P2pHeader mine_;
  std::size_t bytes_;
  Transfers header_, answers_, data_;
  std::size_t answer_ = 0;
  bool data_started_ = false, stuck_ = false;
};

class RecvOp final : public Op {
 public:
  RecvOp(std::shared_ptr<Comm> comm, void* buf, std::size_t count, ncclDataType_t type, int peer)
      : Op(comm, op_text("ncclRecv", "from", *comm, peer)),
        buf_(buf),
        peer_(peer),
        mine_{comm->next_recv[static_cast<std::size_t>(peer)]++, count, type, 0},
        bytes_(count * type_size(type)) {
    touches(buf, bytes_, true);
  }

 protected:
  void do_post() override {
    Comm& c = comm();
    header_ = headers_.recv(sizeof(P2pHeader), c.world[static_cast<std::size_t>(peer_)],
                            tag(c.slot, Channel::P2pHeader, mine_.seq));
  }
  bool do_test() override {
    Comm& c = comm();
    if (stuck_) return false;
    if (!data_posted_) {
      if (!headers_.test()) return false;
      P2pHeader theirs;
      std::memcpy(&theirs, headers_.buffer(header_).data(), sizeof theirs);
      const int from = c.world[static_cast<std::size_t>(peer_)];
      const int answer_tag = tag(c.slot, Channel::P2pAck, mine_.seq);
      if (!same(theirs, mine_)) {
        P2pHeader answer = mine_;
        answer.mismatch = 1;
        answers_.send(&answer, sizeof answer, from, answer_tag, false);
        set_async_error(c, ncclInvalidUsage, mismatch_text(c, theirs, peer_, mine_, c.rank));
        stuck_ = true;
        return false;
      }
      // The data receive is posted before the answer goes, so the send finds it.
      data_ = datas_.recv(bytes_, from, tag(c.slot, Channel::P2pData, mine_.seq));
      answers_.send(&mine_, sizeof mine_, from, answer_tag, false);
      data_posted_ = true;
    }
    if (!datas_.test() || !answers_.test()) return false;
    if (bytes_ != 0) std::memcpy(buf_, datas_.buffer(data_).data(), bytes_);
    return true;
  }
  void do_abandon() override {
    headers_.abandon();
    answers_.abandon();
    datas_.abandon();
  }

 private:
  void* buf_;
  int peer_;
  P2pHeader mine_;
  std::size_t bytes_;
  Transfers headers_, answers_, datas_;
  std::size_t header_ = 0, data_ = 0;
  bool data_posted_ = false, stuck_ = false;
};

}  // namespace

std::unique_ptr<Op> make_send(std::shared_ptr<Comm> comm, const void* buf, std::size_t count,
                              ncclDataType_t type, int peer) {
  return std::make_unique<SendOp>(std::move(comm), buf, count, type, peer);
}

std::unique_ptr<Op> make_recv(std::shared_ptr<Comm> comm, void* buf, std::size_t count,
                              ncclDataType_t type, int peer) {
  return std::make_unique<RecvOp>(std::move(comm), buf, count, type, peer);
}

}  // namespace pptrain_emu::nccl_emu
