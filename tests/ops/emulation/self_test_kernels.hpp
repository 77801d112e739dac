// Launchers of the CUDA emulator's own test kernels (self_test_kernels.cu): each runs a
// small kernel, some of them with a planted bug the emulator must catch, and (but for the
// stream tests' launchers) synchronises the device before it returns.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace emulator_selftest {

// out[b * n + t] = value thread (t + offset) mod n of block b wrote to shared memory;
// with_barrier puts a __syncthreads between the writes and the reads.
void neighbour_read(float* out, int blocks, int n, int offset, bool with_barrier);
// Per lane: writes its value to shared memory, then reads lane ^ 1's (32 threads);
// with_syncwarp puts a __syncwarp in between.
void warp_exchange(float* out, bool with_syncwarp);
// 64 threads read element 63 - t of a shared array, then overwrite element t, then add
// the new element 63 - t to what they read; with_barrier puts a __syncthreads between the
// read and the overwrite (without it, a thread that runs ahead overwrites what another
// has yet to read).
void reuse_shared(float* out, bool with_barrier);
// One warp stores a 16x16 fragment of value 2 to shared memory with wmma, then lane l
// reads element l of it into out[l]; with_syncwarp puts a __syncwarp in between.
void wmma_store_then_read(float* out, bool with_syncwarp);
// A (16, 4) block; per thread, out[7 * linear + k] for k = 0..6: xor 1, down 3, up 2,
// index 7 shuffles of the lane id, the ballot of lane % 3 == 0, any(lane == 5),
// all(lane < 32).
void shuffles(unsigned* out);
// out[b] = blockIdx.x + 10 blockIdx.y + 100 gridDim.x + 1000 gridDim.y for a (2, 3) grid.
void grid_indices(int* out);
// Planted faults, each must throw: __syncthreads in both branches of a divergent if; a
// shuffle over a warp whose upper half has exited; a deadlock (half a warp at
// __syncthreads, the other half at __syncwarp); a write one past the dynamic shared
// memory; more than 48 KiB of static shared memory.
void divergent_barrier();
void shuffle_with_exited_lanes();
void deadlock();
void dynamic_shared_overflow();
void static_shared_too_big();
// out[0]: block 0 reads a static shared element no thread wrote; out[1]: block 1 reads
// the element block 0 wrote (each block's shared memory starts poisoned).
void shared_memory_poisoned(float* out);
// The launch status (cudaGetLastError after the launch) for a block of `threads`
// threads, a grid of `grid_y` rows, and `smem` bytes of dynamic shared memory, after
// raising the kernel's limit to `allow` bytes when allow > 0.
cudaError_t launch_status(int threads, int grid_y, int smem, int allow);
// d[16][16] = a[16][16] @ b[16][16] + c with wmma on one warp; a row-major (stride 24),
// b column-major (stride 16), c and d row-major (stride 20). `shift` moves a by that many
// elements (a misaligned pointer when odd).
void wmma_product(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c,
                  int shift);

// For the stream tests (streams_self_test.cpp): each queues one kernel on stream s and
// returns. x[i] = value; x[i] = a x[i] + b; *out = the sum of x[0..n) (one thread, in
// order); dst[i] = src[i].
void fill(float* x, int n, float value, cudaStream_t s);
void scale_add(float* x, int n, float a, float b, cudaStream_t s);
void sum(float* out, const float* x, int n, cudaStream_t s);
void copy(float* dst, const float* src, int n, cudaStream_t s);

}  // namespace emulator_selftest
