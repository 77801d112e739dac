#include "model/ring_attention.hpp"

#include <memory>
#include <utility>

#include "core/error.hpp"

namespace pptrain {

namespace {
// The ring's message tags. A ring's peers share a pipeline stage, so no pipeline message
// ever passes between them; the tags only keep the block and its gradient apart.
constexpr int kBlockTag = 30001, kGradTag = 30002;
}  // namespace

RingAttention::RingAttention(ops::Ops& ops, ContextRing ring, int B, int C, int NH, int NKV)
    : ops_(ops),
      ring_(std::move(ring)),
      B_(B),
      C_(C),
      NH_(NH),
      NKV_(NKV),
      W_(C + 2 * (C / NH) * NKV),
      Wkv_(W_ - C),
      len_(ring_.split.piece_len()),
      dt_(ops.compute_dtype()),
      block_bytes_(buffer_bytes(B, ring_.split.local_len(), NKV, C / NH, dt_) / kBuffers),
      piece_state_bytes_(ops::attention_state_bytes(true, dt_, B, len_, NH)) {
  PPTRAIN_CHECK(ring_.world && int(ring_.ranks.size()) == ring_.split.cp &&
                    ring_.split.pieces() == 2,
                "ring attention needs cp > 1 ranks and the world to reach them");
  for (auto* set : {blocks_, grads_})
    for (int i = 0; i < 2; ++i) set[i] = ops::Buffer(ops, block_bytes_, "a ring attention block");
  arriving_ = ops::Buffer(ops, block_bytes_, "a ring attention block");
  own_ = ops::Buffer(ops, block_bytes_, "a ring attention block");
}

int RingAttention::next() const { return ring_.ranks[std::size_t((ring_.split.rank + 1) % ring_.split.cp)]; }
int RingAttention::previous() const {
  return ring_.ranks[std::size_t((ring_.split.rank + ring_.split.cp - 1) % ring_.split.cp)];
}

ops::Act* RingAttention::rows(ops::Act* a, int p, int width) const {
  return ops::advance(a, std::size_t(p) * B_ * len_ * width, dt_);
}
const ops::Act* RingAttention::rows(const ops::Act* a, int p, int width) const {
  return ops::advance(a, std::size_t(p) * B_ * len_ * width, dt_);
}
void* RingAttention::state_of(void* state, int p) const {
  return static_cast<std::byte*>(state) + std::size_t(p) * piece_state_bytes_;
}
const void* RingAttention::state_of(const void* state, int p) const {
  return static_cast<const std::byte*>(state) + std::size_t(p) * piece_state_bytes_;
}

std::unique_ptr<comm::PendingOp> RingAttention::pass_on(const ops::Act* held, int s) {
  if (s + 1 == ring_.split.cp) return nullptr;  // the last step: every block has been seen
  return ring_.world->exchange_start(
      {{comm::Transfer::Send, next(), const_cast<ops::Act*>(held), block_bytes_, kBlockTag},
       {comm::Transfer::Recv, previous(), blocks_[s % 2].get(), block_bytes_, kBlockTag}});
}

// MPI moves a started transfer only inside its calls: a test between the host's pieces
// of work lets the block travel while the attention runs. A device's exchange needs none
// (an event query).
void RingAttention::progress(comm::PendingOp* pass) {
  if (pass) pass->test();
}

ops::Ops::SeqPiece RingAttention::queries(const ops::Act* qkv, int p) const {
  return {rows(qkv, p, W_), ring_.split.first(p, ring_.split.rank), len_};
}

ops::Ops::SeqPiece RingAttention::keys(const ops::Act* block, int p, int owner) const {
  return {rows(block, p, Wkv_), ring_.split.first(p, owner), len_};
}

// Pieces are whole blocks of positions: piece p's queries see all of piece k's keys when
// that piece comes first, the causal half when it is the same piece, none when it comes
// after (that step is skipped: its output would keep what it holds, its gradients 0).
bool RingAttention::sees(int p, int k, int owner) const {
  return ring_.split.first(k, owner) <= ring_.split.first(p, ring_.split.rank);
}

const ops::Act* RingAttention::own_block(const ops::Act* qkv) {
  ops_.copy_columns(own_.act(), Wkv_, 0, qkv, W_, C_, B_ * ring_.split.local_len(), Wkv_);
  return own_.act();
}

void RingAttention::forward(ops::Act* out, void* state, const ops::Act* qkv) {
  const int cp = ring_.split.cp, r = ring_.split.rank;
  const ops::Act* held = own_block(qkv);  // at step s, the block of rank r - s
  for (int s = 0; s < cp; ++s) {
    const int owner = (r - s + cp) % cp;
    std::unique_ptr<comm::PendingOp> pass = pass_on(held, s);
    for (int p = 0; p < 2; ++p) {
      // Step 0 starts from the diagonal, where every query sees at least itself.
      const int order[2] = {s == 0 ? p : 0, s == 0 ? 1 - p : 1};
      for (int k : order)
        if (sees(p, k, owner))
          ops_.ring_attention_forward_step(rows(out, p, C_), state_of(state, p), queries(qkv, p),
                                           keys(held, k, owner), B_, C_, NH_, NKV_,
                                           s == 0 && k == p);
      progress(pass.get());
    }
    if (pass) {
      pass->wait_in_queue();  // a device's stream waits; the host goes on
      held = blocks_[s % 2].act();
    }
  }
}

void RingAttention::backward(ops::Act* dqkv, const ops::Act* dout, const ops::Act* qkv,
                             const ops::Act* out, const void* state) {
  const int cp = ring_.split.cp, r = ring_.split.rank;
  const int rows_held = B_ * ring_.split.local_len();
  ops_.fill_zero(dqkv, std::size_t(rows_held) * W_ * dtype_size(dt_));
  const ops::Act* held = own_block(qkv);
  // The gradient of the held block that earlier ranks added to arrives while this rank
  // works out its own part (grads_[s % 2], zeroed), is added at the step's end, and the
  // sum travels on with the block.
  std::unique_ptr<comm::PendingOp> grad_pass;
  for (int s = 0; s < cp; ++s) {
    const int owner = (r - s + cp) % cp;
    ops::Act* mine = grads_[s % 2].act();
    ops_.fill_zero(mine, block_bytes_);
    std::unique_ptr<comm::PendingOp> block_pass = pass_on(held, s);
    for (int p = 0; p < 2; ++p) {
      for (int k = 0; k < 2; ++k)
        if (sees(p, k, owner))
          ops_.ring_attention_backward_step(rows(dqkv, p, W_), rows(mine, k, Wkv_),
                                            rows(dout, p, C_), rows(out, p, C_),
                                            state_of(state, p), queries(qkv, p),
                                            keys(held, k, owner), B_, C_, NH_, NKV_);
      progress(block_pass.get());
      progress(grad_pass.get());
    }
    if (grad_pass) {
      grad_pass->wait_in_queue();
      ops_.add(mine, mine, arriving_.act(), block_bytes_ / dtype_size(dt_));
    }
    // After the last step the gradient reaches the block's owner: this rank gets its own.
    grad_pass = ring_.world->exchange_start(
        {{comm::Transfer::Send, next(), mine, block_bytes_, kGradTag},
         {comm::Transfer::Recv, previous(), arriving_.get(), block_bytes_, kGradTag}});
    if (block_pass) {
      block_pass->wait_in_queue();
      held = blocks_[s % 2].act();
    }
  }
  grad_pass->wait_in_queue();
  // The q parts of dqkv hold this rank's query gradients, the returned block its k|v
  // gradients.
  ops_.copy_columns(dqkv, W_, C_, arriving_.act(), Wkv_, 0, rows_held, Wkv_);
}

}  // namespace pptrain
