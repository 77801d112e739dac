// Vocab-parallel token + position embedding: forward lookup, and a deterministic
// backward. dwte: first a bit per (vocabulary row, tile of kCudaEmbeddingTile positions)
// where the tile holds the row's token (atomicOr: the same bits in any order); then each
// block owns a shard of vocabulary rows and a slice of columns, keeps those rows in shared
// memory, and adds the matching dout rows in position order, reading only the tiles its
// rows' bits name (so repeated tokens always sum in the same order, as on the CPU). dwpe:
// each element sums over the batch in order.
#include <algorithm>

#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/kernels.hpp"

namespace pptrain::ops::cuda {

namespace {

constexpr int kMaxThreads = 256;
constexpr int kShardFloats = 8192;  // shared-memory rows of a dwte block: 32 KiB
constexpr int kMaxShardRows = 64;

// out[bt, c..c+W) = wte row (or 0) + wpe[t] row: x over column packs, y over positions.
template <typename T, int W>
__global__ void embedding_forward_kernel(T* __restrict__ out, const int32_t* __restrict__ tokens,
                                         const T* __restrict__ wte, int vocab_begin, int vocab_rows,
                                         const T* __restrict__ wpe, int BT, int T_, int C) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * W;
  if (c >= C) return;
  for (int bt = blockIdx.y; bt < BT; bt += gridDim.y) {
    const int row = tokens[bt] - vocab_begin;
    Pack<T, W> r;
    if (row >= 0 && row < vocab_rows) {
      r = load_pack<W>(wte + static_cast<std::size_t>(row) * C + c);
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) r.v[k] = from_f32<T>(0.0f);
    }
    if (wpe != nullptr) {
      const Pack<T, W> p = load_pack<W>(wpe + static_cast<std::size_t>(bt % T_) * C + c);
#pragma unroll
      for (int k = 0; k < W; ++k) r.v[k] = from_f32<T>(to_f32(r.v[k]) + to_f32(p.v[k]));
    }
    store_pack<W>(out + static_cast<std::size_t>(bt) * C + c, r);
  }
}

// dwpe[i] += sum_b dout[b * TC + i] over i < TC = T*C, b in order.
template <typename T, int W>
__global__ void embedding_wpe_backward_kernel(float* __restrict__ dwpe, const T* __restrict__ dout,
                                              int B, std::size_t TC) {
  for_each_pack<W>(TC, [=](std::size_t i, auto w) {
    constexpr int M = decltype(w)::value;
    Pack<float, M> acc = load_pack<M>(dwpe + i);
    for (int b = 0; b < B; ++b) {
      const Pack<T, M> d = load_pack<M>(dout + b * TC + i);
#pragma unroll
      for (int k = 0; k < M; ++k) acc.v[k] += to_f32(d.v[k]);
    }
    store_pack<M>(dwpe + i, acc);
  });
}

constexpr int kTile = kCudaEmbeddingTile;

// tile_bits[row * words + tile / 32] gets bit tile % 32 where position tile * kTile + j
// holds vocabulary row `row`'s token.
__global__ void embedding_mark_tiles_kernel(unsigned* tile_bits, const int32_t* __restrict__ tokens,
                                            int vocab_begin, int vocab_rows, int BT, int words) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < BT; i += gridDim.x * blockDim.x) {
    const int row = tokens[i] - vocab_begin;
    if (row < 0 || row >= vocab_rows) continue;
    const int tile = i / kTile;
    atomicOr(tile_bits + static_cast<std::size_t>(row) * words + tile / 32, 1u << (tile % 32));
  }
}

// Block (x = shard, y = column slice) owns dwte rows [shard_begin, shard_begin + rows)
// and the columns [slice * cols, slice * cols + cols), cols = blockDim.x * W. It loads
// the rows whose bits show a token into shared memory, adds dout rows in position order
// (through the tiles any of its rows' bits name, positions compacted per blockDim.x of a
// tile, order kept), and stores them back.
template <typename T, int W>
__global__ void embedding_wte_backward_kernel(float* __restrict__ dwte, const T* __restrict__ dout,
                                              const int32_t* __restrict__ tokens,
                                              const unsigned* __restrict__ tile_bits,
                                              int vocab_begin, int vocab_rows, int shard_rows,
                                              int BT, int words, int C) {
  extern __shared__ float acc[];  // [shard_rows][cols]
  __shared__ int touched[kMaxShardRows];
  __shared__ unsigned tiles[1];  // the current word's tiles holding one of the rows' tokens
  __shared__ int list_row[kMaxThreads];
  __shared__ int list_pos[kMaxThreads];
  __shared__ int warp_count[kMaxThreads / 32];
  const int tx = threadIdx.x, lane = tx % 32, warp = tx / 32, warps = blockDim.x / 32;
  const int cols = blockDim.x * W;
  const int shard_begin = blockIdx.x * shard_rows;
  const int rows = min(shard_rows, vocab_rows - shard_begin);
  const int c = blockIdx.y * cols + tx * W;  // this thread's columns [c, c+W) when c < C
  const unsigned* bits = tile_bits + static_cast<std::size_t>(shard_begin) * words;

  // 1. The shard rows that occur: those with a bit.
  for (int r = tx; r < rows; r += blockDim.x) {
    unsigned any = 0;
    for (int w = 0; w < words; ++w) any |= bits[r * words + w];
    touched[r] = any != 0;
  }
  __syncthreads();
  int any = 0;
  for (int r = 0; r < rows; ++r) any |= touched[r];
  if (!any) return;  // uniform: every thread read the same flags

  // 2. Load the touched rows.
  for (int r = 0; r < rows; ++r)
    if (touched[r] && c < C)
      store_pack<W>(acc + r * cols + tx * W,
                    load_pack<W>(dwte + static_cast<std::size_t>(shard_begin + r) * C + c));

  // 3. The named tiles in order, each in parts of blockDim.x positions: compact the
  // matches in order, then add them.
  for (int w = 0; w < words; ++w) {
    __syncthreads();  // the previous word's tiles are read by every thread
    if (warp == 0) {
      unsigned m = 0;
      for (int r = lane; r < rows; r += 32) m |= bits[r * words + w];
      for (int o = 16; o > 0; o /= 2) m |= __shfl_xor_sync(0xffffffffu, m, o);
      if (lane == 0) tiles[0] = m;
    }
    __syncthreads();
    for (unsigned m = tiles[0]; m != 0; m &= m - 1) {
      const int tile = w * 32 + __ffs(static_cast<int>(m)) - 1;
      const int end = min(BT, (tile + 1) * kTile);
      for (int base = tile * kTile; base < end; base += blockDim.x) {
        const int i = base + tx;
        int r = i < end ? tokens[i] - vocab_begin - shard_begin : -1;
        if (r >= rows) r = -1;
        const unsigned mask = __ballot_sync(0xffffffffu, r >= 0);
        if (lane == 0) warp_count[warp] = __popc(mask);
        __syncthreads();  // also orders step 2 and the previous part's adds before this one
        int offset = 0, total = 0;
        for (int k = 0; k < warps; ++k) {
          offset += k < warp ? warp_count[k] : 0;
          total += warp_count[k];
        }
        if (r >= 0) {
          const int slot = offset + __popc(mask & ((1u << lane) - 1u));
          list_row[slot] = r;
          list_pos[slot] = i;
        }
        __syncthreads();
        if (c < C) {
          for (int j = 0; j < total; ++j) {
            float* a = acc + list_row[j] * cols + tx * W;
            Pack<float, W> s = load_pack<W>(a);
            const Pack<T, W> d =
                load_pack<W>(dout + static_cast<std::size_t>(list_pos[j]) * C + c);
#pragma unroll
            for (int k = 0; k < W; ++k) s.v[k] += to_f32(d.v[k]);
            store_pack<W>(a, s);
          }
        }
        __syncthreads();  // the list is rewritten by the next part
      }
    }
  }

  // 4. Store the touched rows back (each thread stores only what it wrote itself).
  for (int r = 0; r < rows; ++r)
    if (touched[r] && c < C)
      store_pack<W>(dwte + static_cast<std::size_t>(shard_begin + r) * C + c,
                    load_pack<W>(acc + r * cols + tx * W));
}

// Threads for `packs` column packs: a multiple of 32, at most kMaxThreads.
int threads_for(int packs) { return packs >= kMaxThreads ? kMaxThreads : (packs + 31) / 32 * 32; }

void check_sizes(const char* op, int vocab_begin, int vocab_rows, int B, int T_, int C) {
  PPTRAIN_CHECK(vocab_begin >= 0 && vocab_rows >= 0 && B >= 0 && T_ >= 0 && C >= 0,
                std::string(op) + ": negative size");
  PPTRAIN_CHECK(static_cast<long long>(B) * T_ < (1LL << 30), std::string(op) + ": B*T too large");
}

template <typename T, int W>
void launch_wte_backward(float* dwte, const T* dout, const int32_t* tokens, unsigned* tile_bits,
                         int vocab_begin, int vocab_rows, int BT, int C, cudaStream_t s) {
  const int words = static_cast<int>(cuda_embedding_tile_words(BT));
  PPTRAIN_CUDA_CHECK(
      cudaMemsetAsync(tile_bits, 0, cuda_embedding_scratch_bytes(vocab_rows, BT), s));
  embedding_mark_tiles_kernel<<<grid_for(BT, kMaxThreads), kMaxThreads, 0, s>>>(
      tile_bits, tokens, vocab_begin, vocab_rows, BT, words);
  PPTRAIN_CUDA_CHECK_LAUNCH();
  const int threads = threads_for((C + W - 1) / W);
  const int cols = threads * W;
  const int slices = (C + cols - 1) / cols;
  const int shard_rows = std::max(1, std::min(kMaxShardRows, kShardFloats / cols));
  const int shards = (vocab_rows + shard_rows - 1) / shard_rows;
  PPTRAIN_CHECK(slices <= 65535, "embedding_backward: C too large");
  const std::size_t smem = static_cast<std::size_t>(shard_rows) * cols * sizeof(float);
  embedding_wte_backward_kernel<T, W><<<dim3(shards, slices), threads, smem, s>>>(
      dwte, dout, tokens, tile_bits, vocab_begin, vocab_rows, shard_rows, BT, words, C);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int vocab_begin, int vocab_rows,
                       const T* wpe, int B, int T_, int C, cudaStream_t s) {
  check_sizes("embedding_forward", vocab_begin, vocab_rows, B, T_, C);
  const int BT = B * T_;
  if (BT == 0 || C == 0) return;
  PPTRAIN_CHECK(out && tokens && (wte || vocab_rows == 0), "embedding_forward: null pointer");
  constexpr int V = kVec<T>;
  const bool wide = C % V == 0 && aligned16({out, wte, wpe});
  const int packs = wide ? C / V : C;
  const int threads = threads_for(packs);
  const dim3 grid((packs + threads - 1) / threads, BT < 8192 ? BT : 8192);
  if (wide)
    embedding_forward_kernel<T, V>
        <<<grid, threads, 0, s>>>(out, tokens, wte, vocab_begin, vocab_rows, wpe, BT, T_, C);
  else
    embedding_forward_kernel<T, 1>
        <<<grid, threads, 0, s>>>(out, tokens, wte, vocab_begin, vocab_rows, wpe, BT, T_, C);
  PPTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void embedding_backward(float* dwte, float* dwpe, const T* dout, const int32_t* tokens,
                        int vocab_begin, int vocab_rows, int B, int T_, int C, void* scratch,
                        cudaStream_t s) {
  check_sizes("embedding_backward", vocab_begin, vocab_rows, B, T_, C);
  const int BT = B * T_;
  if (BT == 0 || C == 0) return;
  PPTRAIN_CHECK(dout && tokens && (vocab_rows == 0 || (dwte && scratch)),
                "embedding_backward: null pointer");
  if (vocab_rows > 0) {
    auto* bits = static_cast<unsigned*>(scratch);
    if (C % 4 == 0 && aligned16({dwte, dout}))
      launch_wte_backward<T, 4>(dwte, dout, tokens, bits, vocab_begin, vocab_rows, BT, C, s);
    else
      launch_wte_backward<T, 1>(dwte, dout, tokens, bits, vocab_begin, vocab_rows, BT, C, s);
  }
  if (dwpe != nullptr) {
    const std::size_t TC = static_cast<std::size_t>(T_) * C;
    if (TC % 4 == 0 && aligned16({dwpe, dout}))
      embedding_wpe_backward_kernel<T, 4>
          <<<grid_for(TC / 4, kMaxThreads), kMaxThreads, 0, s>>>(dwpe, dout, B, TC);
    else
      embedding_wpe_backward_kernel<T, 1>
          <<<grid_for(TC, kMaxThreads), kMaxThreads, 0, s>>>(dwpe, dout, B, TC);
    PPTRAIN_CUDA_CHECK_LAUNCH();
  }
}

#define PPTRAIN_INSTANTIATE(T)                                                                   \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int, int, const T*, int, int, \
                                     int, cudaStream_t);                                         \
  template void embedding_backward<T>(float*, float*, const T*, const int32_t*, int, int, int,   \
                                      int, int, void*, cudaStream_t);
PPTRAIN_INSTANTIATE(float)
PPTRAIN_INSTANTIATE(bf16)
#undef PPTRAIN_INSTANTIATE

}  // namespace pptrain::ops::cuda
