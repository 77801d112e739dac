// The two tensor-parallel primitives and their collectives.
#include "model/tp_regions.hpp"

#include <vector>

#include "core/error.hpp"

namespace pptrain {

TensorParallelRegions::TensorParallelRegions(comm::Group* tp, DType dtype, int tp_size,
                                             int tp_rank, bool sequence_parallel, int rows,
                                             bool beside)
    : tp_(tp),
      dtype_(dtype),
      tp_size_(tp_size),
      sp_(sequence_parallel),
      beside_(beside && tp && tp->works_beside()),
      rows_(rows),
      rows_held_(sequence_parallel ? rows / tp_size : rows),
      first_row_(sequence_parallel ? tp_rank * (rows / tp_size) : 0) {
  PPTRAIN_CHECK(tp_size == 1 || (tp && tp->size() == tp_size), "tp group mismatch");
  PPTRAIN_CHECK(!sequence_parallel || (tp_size > 1 && rows % tp_size == 0),
                "sequence parallelism needs tp > 1 and token rows divisible by tp");
}

const ops::Act* TensorParallelRegions::gather(const ops::Act* held, ops::Act* full,
                                              int width) const {
  if (!sp_) return held;
  tp_->all_gather(held, full, std::size_t(rows_held_) * std::size_t(width), dtype_);
  return full;
}

const ops::Act* TensorParallelRegions::gather(const ops::Act* held, ops::Act* full, int width,
                                              const std::function<void()>& meanwhile) const {
  if (!sp_ || !beside_) {
    const ops::Act* gathered = gather(held, full, width);
    if (meanwhile) meanwhile();
    return gathered;
  }
  auto gathering = tp_->all_gather_beside(held, full, std::size_t(rows_held_) * std::size_t(width), dtype_);
  if (meanwhile) meanwhile();
  if (gathering) gathering->wait_in_queue();
  return full;
}

void TensorParallelRegions::reduce(ops::Act* partial, ops::Act* held, int width) const {
  if (tp_size_ == 1) return;
  if (!sp_) {
    PPTRAIN_CHECK(partial == held, "without sequence parallelism the tp sum is in place");
    tp_->all_reduce(held, std::size_t(rows_) * std::size_t(width), dtype_);
    return;
  }
  tp_->reduce_scatter(partial, held, std::size_t(rows_held_) * std::size_t(width), dtype_);
}

void TensorParallelRegions::reduce(ops::Act* partial, ops::Act* held, int width,
                                   const std::function<void()>& meanwhile) const {
  if (!beside_ || tp_size_ == 1) {
    reduce(partial, held, width);
    if (meanwhile) meanwhile();
    return;
  }
  std::unique_ptr<comm::PendingOp> sum;
  if (!sp_) {
    PPTRAIN_CHECK(partial == held, "without sequence parallelism the tp sum is in place");
    sum = tp_->all_reduce_beside(held, std::size_t(rows_) * std::size_t(width), dtype_);
  } else {
    sum = tp_->reduce_scatter_beside(partial, held, std::size_t(rows_held_) * std::size_t(width),
                                     dtype_);
  }
  if (meanwhile) meanwhile();
  if (sum) sum->wait_in_queue();
}

void TensorParallelRegions::gather_rows(const ops::Act* held, ops::Act* full, int width,
                                        const RowsIn& consume) const {
  if (!sp_ || !beside_) {
    consume(0, rows_, gather(held, full, width));
    return;
  }
  const std::size_t count = std::size_t(rows_held_) * std::size_t(width);
  std::vector<std::unique_ptr<comm::PendingOp>> blocks;
  for (int j = 0; j < tp_size_; ++j) {
    ops::Act* block = row(full, j * rows_held_, width);
    blocks.push_back(tp_->broadcast_beside(held, block, count, dtype_, j));
  }
  consume(first_row_, rows_held_, held);
  const int me = tp_->rank();
  for (int j = 0; j < tp_size_; ++j) {
    blocks[std::size_t(j)]->wait_in_queue();
    if (j != me) consume(j * rows_held_, rows_held_, row(full, j * rows_held_, width));
  }
}

void TensorParallelRegions::reduce_rows(ops::Act* partial, ops::Act* held, int width,
                                        const RowsOut& produce) const {
  if (!sp_ || !beside_) {
    produce(0, rows_, partial);
    reduce(partial, held, width);
    return;
  }
  // Block j is rank j's rows, summed into that rank's `held`.
  const std::size_t count = std::size_t(rows_held_) * std::size_t(width);
  std::vector<std::unique_ptr<comm::PendingOp>> sums;
  for (int j = 0; j < tp_size_; ++j) {
    ops::Act* block = row(partial, j * rows_held_, width);
    produce(j * rows_held_, rows_held_, block);
    sums.push_back(tp_->reduce_beside(block, held, count, dtype_, j));
  }
  for (auto& sum : sums) sum->wait_in_queue();
}

const ops::Act* TensorParallelRegions::row(const ops::Act* a, int index, int width) const {
  return ops::advance(a, std::size_t(index) * std::size_t(width), dtype_);
}

ops::Act* TensorParallelRegions::row(ops::Act* a, int index, int width) const {
  return ops::advance(a, std::size_t(index) * std::size_t(width), dtype_);
}

void TensorParallelRegions::all_gather_in_place(ops::Act* data, std::size_t count) const {
  if (tp_size_ == 1) return;
  const ops::Act* mine = ops::advance(data, std::size_t(tp_->rank()) * count, dtype_);
  tp_->all_gather(mine, data, count, dtype_);
}

void TensorParallelRegions::reduce_stats(float* data, std::size_t n, comm::ReduceOp op) const {
  if (tp_size_ > 1) tp_->all_reduce(data, n, op);
}

}  // namespace pptrain
