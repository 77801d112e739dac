// Context parallelism's attention core: each rank holds two pieces of every sequence
// (topology/sequence_split.hpp), and the key/value blocks (the k|v columns of q|k|v, the
// queries stay) go round the ring of cp ranks.
// At step s rank r holds the block of rank r - s and runs its own queries against it
// with the blocked attention's steps (online softmax, merged by log-sum-exp); the next
// block is already on its way meanwhile (a nonblocking exchange). The backward sends
// each block round again with its key/value gradient, which every rank adds to; after
// cp steps the gradient of a block reaches its owner. The gradient travels while the
// next rank works out its own part of it, so neither transfer waits for the other's
// compute. On a device the exchanges run on a stream of their own (Comms::ring_for_model).
#pragma once
#include <memory>
#include <vector>

#include "comm/comm.hpp"
#include "ops/ops.hpp"
#include "topology/sequence_split.hpp"

namespace pptrain {

// Where a rank's ring runs: its sequence split, the world it sends through and the world
// rank of each cp rank (the ring's order). cp == 1: no ring.
struct ContextRing {
  SequenceSplit split;
  comm::World* world = nullptr;
  std::vector<int> ranks;
  bool active() const { return split.cp > 1; }
};

class RingAttention {
 public:
  // C, NH, NKV: the query width and the query and key/value heads this rank holds (its
  // tensor-parallel shard); B sequences of split.local_len() rows each.
  RingAttention(ops::Ops& ops, ContextRing ring, int B, int C, int NH, int NKV);

  // out [rows, C] and the state (the rows' log-sum-exps, per piece) from qkv [rows, W],
  // rows piece-major: the whole-sequence attention of this rank's rows.
  void forward(ops::Act* out, void* state, const ops::Act* qkv);
  // dqkv [rows, W] (overwritten) from dout and what forward gave.
  void backward(ops::Act* dqkv, const ops::Act* dout, const ops::Act* qkv, const ops::Act* out,
                const void* state);

  // Bytes of the buffers a ring holds, each of B sequences' `rows` rows of k|v (kv_heads
  // heads of head_size, twice): this rank's own block, two arriving blocks, this rank's
  // part of the held block's gradient and of the previous one's (still leaving), and the
  // arriving gradient.
  static constexpr int kBuffers = 6;
  static std::size_t buffer_bytes(int B, int rows, int kv_heads, int head_size, DType dtype) {
    return kBuffers * std::size_t(B) * std::size_t(rows) * std::size_t(2 * kv_heads * head_size) *
           dtype_size(dtype);
  }

 private:
  // Piece p of this rank's queries (q|k|v rows), and of the k|v block of rank `owner`.
  ops::Ops::SeqPiece queries(const ops::Act* qkv, int p) const;
  ops::Ops::SeqPiece keys(const ops::Act* block, int p, int owner) const;
  // Whether any query of this rank's piece p sees a key of piece k of owner's block.
  bool sees(int p, int k, int owner) const;
  // This rank's own k|v block, from the k|v columns of qkv.
  const ops::Act* own_block(const ops::Act* qkv);
  // At step s: sends `held` on to the next rank and receives the previous rank's block
  // into blocks_[s % 2]; null at the last step.
  std::unique_ptr<comm::PendingOp> pass_on(const ops::Act* held, int s);
  static void progress(comm::PendingOp* pass);
  ops::Act* rows(ops::Act* a, int p, int width) const;
  const ops::Act* rows(const ops::Act* a, int p, int width) const;
  void* state_of(void* state, int p) const;
  const void* state_of(const void* state, int p) const;
  int next() const;
  int previous() const;

  ops::Ops& ops_;
  ContextRing ring_;
  int B_, C_, NH_, NKV_, W_, Wkv_, len_;
  DType dt_;
  std::size_t block_bytes_, piece_state_bytes_;
  ops::Buffer own_, blocks_[2], grads_[2], arriving_;
};

}  // namespace pptrain
