// The PTX instructions that lib/ops/cuda/warp_mma.cuh wraps, for the CUDA emulator,
// written from the PTX ISA's descriptions (fragment layouts and semantics):
//
// - mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: a warp collective. With
//   g = lane / 4 and t = lane % 4, a lane holds A (16x16, row) as four registers of two
//   bf16 each, {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)}, the lower
//   column in the lower half; B (16x8, col) as two, {(2t..2t+1, g), (2t+8..2t+9, g)};
//   C and D (16x8, f32) as {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}. Products are
//   exact in fp32 and summed onto C in k order.
// - ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16: a warp collective. Lanes
//   8i..8i+7 give the addresses of matrix i's eight 16-byte rows (16-byte aligned, in
//   shared memory); register i of lane l gets row l/4, columns 2(l%4) and 2(l%4)+1 of
//   matrix i, or with .trans rows 2(l%4) and 2(l%4)+1 of column l/4.
// - cp.async.cg.shared.global (16 bytes, a source size of 16 or 0: zeros),
//   cp.async.commit_group and cp.async.wait_group N: per thread. The source is read at
//   the copy; the destination holds poison until a wait_group that covers the copy's
//   group lands it (copies not yet committed are covered by no wait), so a read that
//   lacks its wait sees NaN. Both addresses must be 16-byte aligned, the destination in
//   the block's shared memory.
//
// Every call counts as its instruction in the emulator's counters (counters()).
#pragma once
#include <cstdint>
#include <source_location>

namespace pptrain_emu::ptx {

void mma_bf16_m16n8k16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                       const float (&c)[4],
                       std::source_location w = std::source_location::current());
// `count` matrices (1, 2 or 4) into r[0..count); `row` is this lane's row address.
void ldmatrix(std::uint32_t* r, int count, bool trans, const void* row,
              std::source_location w = std::source_location::current());
void cp_async_16(void* shared_dst, const void* global_src, bool fill);
void cp_async_commit();
void cp_async_wait(int newest_pending);

// Instructions executed by every kernel of this process so far (warp instructions count
// once per warp).
struct Counters {
  unsigned long long mma = 0, ldmatrix = 0, cp_async = 0;
};
Counters counters();

}  // namespace pptrain_emu::ptx
