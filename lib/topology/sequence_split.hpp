// How a context-parallel rank holds its sequences. With cp == 1 a rank holds every
// position. Else each sequence is cut into 2 * cp equal pieces and rank r holds pieces r
// and 2cp-1-r (Megatron-Core's causal load balancing: under the causal mask each rank
// then has the same attention work). A micro-batch of B sequences is held piece-major,
// rows [piece][b][t], so that each piece of the micro-batch is one [B, len] block: what
// ring attention's steps take. Every per-token operation is indifferent to row order.
#pragma once
#include <algorithm>
#include <cstddef>

namespace pptrain {

struct SequenceSplit {
  int cp = 1, rank = 0, seq_len = 0;

  int pieces() const { return cp == 1 ? 1 : 2; }
  int piece_len() const { return cp == 1 ? seq_len : seq_len / (2 * cp); }
  int local_len() const { return pieces() * piece_len(); }  // positions held per sequence
  // Position in the whole sequence of the first row of `piece` held by cp rank `owner`.
  int first(int piece, int owner) const {
    if (cp == 1) return 0;
    return (piece == 0 ? owner : 2 * cp - 1 - owner) * piece_len();
  }
  int first(int piece) const { return first(piece, rank); }
  // Row of sequence b's position t of `piece` in a micro-batch of B sequences.
  std::size_t row(int B, int b, int piece, int t) const {
    return (std::size_t(piece) * std::size_t(B) + std::size_t(b)) * std::size_t(piece_len()) +
           std::size_t(t);
  }
  // Copies this rank's positions of sequence b (`sequence`: seq_len values) into their
  // rows of a micro-batch array of B sequences.
  template <typename T>
  void take(const T* sequence, int B, int b, T* micro_batch) const {
    for (int p = 0; p < pieces(); ++p)
      std::copy_n(sequence + first(p), piece_len(), micro_batch + row(B, b, p, 0));
  }
};

}  // namespace pptrain
