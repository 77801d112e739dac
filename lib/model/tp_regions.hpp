// Megatron's tensor-parallel regions (Megatron-Core tensor_parallel/mappings.py) for a
// model written as explicit forward, input-gradient and weight-gradient passes. Every
// tensor-parallel collective of the model goes through one of two primitives, each the
// other's backward:
//   gather: the [N, width] rows a column-parallel linear (or the vocab-parallel head)
//           reads, from the rows this rank holds. Without sequence parallelism a rank
//           holds all N rows and this is Megatron's "copy" region: nothing to do. With it
//           a rank holds rows [first_row, first_row + rows_held) and this all-gathers.
//   reduce: partial sums [N, width] (out of a row-parallel linear, the vocab-parallel
//           embedding, or a column-parallel linear's input gradient) into the rows this
//           rank holds, summed over tp: an all-reduce in place, or a reduce-scatter.
// gather_rows() and reduce_rows() are their forms for a GEMM that reads or writes the rows
// block by block, so that the collective travels beside the GEMM's other blocks.
// The vocab-parallel cross-entropy's fp32 row statistics, and the all-gather that
// completes a pipeline message scattered over tp, are the other collectives.
// Rows are the flattened [batch * seq_len] token rows; under sequence parallelism rank r
// of the tp group holds the r-th contiguous block of N / tp of them.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>

#include "comm/comm.hpp"
#include "ops/ops.hpp"

namespace pptrain {

class TensorParallelRegions {
 public:
  // `tp` may be null when tp_size is 1 (then there is nothing to gather or reduce).
  // `beside`: gather() and reduce() with work to do meanwhile run their collective
  // beside that work, and gather_rows() and reduce_rows() go block by block, where the
  // group works beside compute (comm::Group::works_beside).
  TensorParallelRegions(comm::Group* tp, DType dtype, int tp_size, int tp_rank,
                        bool sequence_parallel, int rows, bool beside = false);

  bool sequence_parallel() const { return sp_; }
  bool sums() const { return tp_size_ > 1; }  // whether reduce() sums over ranks
  int rows() const { return rows_; }            // N: every token row of the micro-batch
  int rows_held() const { return rows_held_; }  // the rows LayerNorm and residuals run on
  int first_row() const { return first_row_; }  // the first held row's index in [0, N)

  // The full [N, width] array: `held` itself without SP; with SP, `full` after an
  // all-gather of every rank's held block (`held` may be this rank's block of `full`).
  const ops::Act* gather(const ops::Act* held, ops::Act* full, int width) const;
  // The same with `meanwhile` queued after the all-gather starts and before it is waited
  // for, as reduce() below does with its sum. `meanwhile` must not touch `full`.
  const ops::Act* gather(const ops::Act* held, ops::Act* full, int width,
                         const std::function<void()>& meanwhile) const;
  // Where a pass finds what gather() made earlier (the weight pass reading B's gathered
  // gradients): `held` without SP, `full` with it.
  const ops::Act* gathered(const ops::Act* held, const ops::Act* full) const {
    return sp_ ? full : held;
  }
  // Where partial sums that reduce() turns into `held` are written: `held` itself
  // without SP (the all-reduce is in place), `scratch` ([N, width]) with it.
  ops::Act* partial_target(ops::Act* held, ops::Act* scratch) const { return sp_ ? scratch : held; }
  // `held` = this rank's rows of the tp sum of `partial` (partial_target(held, ...)).
  void reduce(ops::Act* partial, ops::Act* held, int width) const;
  // The same with `meanwhile` queued after the sum starts and before it is waited for:
  // with `beside`, while it travels (on a device beside compute: Group::*_beside); else
  // after it. What is queued later follows both. `meanwhile` must not touch `partial` or
  // `held`.
  void reduce(ops::Act* partial, ops::Act* held, int width,
              const std::function<void()>& meanwhile) const;
  // Rows [first, first + count) of an [N, width] array, handed to the callbacks below.
  using RowsIn = std::function<void(int first, int count, const ops::Act* rows)>;
  using RowsOut = std::function<void(int first, int count, ops::Act* rows)>;
  // A product that reads gather(held, full, width) row by row: `consume` runs on all N
  // rows once they are gathered, or, beside, on this rank's own rows (from `held`) while
  // every rank's block is broadcast, then on each other block as it arrives. Later work
  // finds the gathered array where gathered(held, full) says.
  void gather_rows(const ops::Act* held, ops::Act* full, int width, const RowsIn& consume) const;
  // A product whose partial sums reduce(partial, held, width) sums: `produce` writes
  // all N rows of `partial` and then the sum runs, or, under SP beside, writes one
  // rank's block of rows at a time while the blocks before it are summed to the ranks
  // that hold them. (Without SP the sum is an all-reduce: t block all-reduces cost more
  // latency than they hide, by the time model.)
  void reduce_rows(ops::Act* partial, ops::Act* held, int width, const RowsOut& produce) const;
  // Row `index` of an [N, width] array of the activation dtype.
  const ops::Act* row(const ops::Act* a, int index, int width) const;
  ops::Act* row(ops::Act* a, int index, int width) const;
  // `data` holds tp blocks of `count` elements; this rank's block is filled: fill all.
  void all_gather_in_place(ops::Act* data, std::size_t count) const;
  // Sum or max of fp32 statistics over the tp group (every rank holds all n).
  void reduce_stats(float* data, std::size_t n, comm::ReduceOp op) const;

 private:
  comm::Group* tp_;
  DType dtype_;
  int tp_size_;
  bool sp_, beside_;
  int rows_, rows_held_, first_row_;
};

}  // namespace pptrain
