// The CUDA emulator's own interface (cuda_emulator.hpp has the model and the CUDA names
// built on it): the runtime's types, a host bf16, the calls kernels make into the
// scheduler (emulator.cpp), the launch operator the rewritten sources use, and the data
// the warp collectives exchange.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <source_location>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>

namespace pptrain_emu {

// ---- vector and runtime types ----
struct Dim3 {
  unsigned x, y, z;
  constexpr Dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct UInt3 {
  unsigned x = 0, y = 0, z = 0;
};
struct alignas(8) Float2 {
  float x, y;
};
struct alignas(16) Float4 {
  float x, y, z, w;
};
struct alignas(16) UInt4 {
  unsigned x, y, z, w;
};
struct alignas(16) Int4 {
  int x, y, z, w;
};
struct Stream;  // a queue of work (emulator_schedule.hpp)

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureMerge = 902,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

// ---- bf16, rounding to nearest even as __float2bfloat16_rn does ----
inline std::uint16_t bf16_bits_rn(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
struct alignas(2) BFloat16 {
  std::uint16_t bits;
  BFloat16() = default;
  BFloat16(float f) : bits(bf16_bits_rn(f)) {}  // NOLINT: implicit, as the toolkit's
  operator float() const {
    const std::uint32_t u = std::uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
struct alignas(4) BFloat162 {
  BFloat16 x, y;
};

// ---- execution (emulator.cpp) ----
// The order of a block's threads (cuda_emulator.hpp): ascending thread index in even
// blocks and descending in odd ones (Alternate, the default), or one of them throughout.
enum class ScheduleOrder { Alternate, Ascending, Descending };
void set_schedule_order(ScheduleOrder order);  // for the calling thread's launches
ScheduleOrder schedule_order();
// Kernel launches accepted so far, by every thread of the process (also appended to the
// file PPTRAIN_EMULATED_LAUNCH_COUNT names, if set, at exit).
unsigned long long launch_count();

// The calling fiber waits at the block barrier.
void sync_block(std::source_location where);
// The calling lane joins warp collective `what` over `mask`: the first lane to join calls
// first(data) (unless null: a collective that reads memory reads it then, before lanes that
// lack a __syncwarp have written it); once every lane in mask has joined,
// complete(lane_data, mask) runs once (lane_data[l] is lane l's `data`; null for
// __syncwarp), then all go on.
using Complete = void (*)(void* const* lane_data, unsigned mask);
using Arrive = void (*)(void* data);
void sync_warp(const char* what, unsigned mask, void* data, Complete complete, Arrive first,
               std::source_location where);
int lane_id();
// Defers a write until the calling lane's warp next synchronises (one of its lanes
// reaching a warp collective or __syncthreads, or exiting) or the block ends: a store
// whose split over the lanes is opaque (wmma) is then unseen by lanes that read it
// without a __syncwarp. apply(payload) performs it; payload is copied.
using Apply = void (*)(const void* payload);
void defer_to_warp_sync(Apply apply, const void* payload, std::size_t bytes);
// Storage of the current block's shared memory (poisoned before each block).
void* static_shared(const std::type_info& key, std::size_t bytes, std::size_t align);
void* dynamic_shared_base(std::size_t align);
// Throws a kernel failure naming the block and thread.
[[noreturn]] void fail(const char* what);
// A vector access of `bytes` (a power of two) at p: it faults unless p is aligned to
// them, as on a GPU (kernel_util.cuh's packs call it).
void check_vector_access(const void* p, std::size_t bytes);

// A static __shared__ declaration (rewritten by emulate_cu.cmake): array type A, at least
// Align-byte aligned; Key (a lambda's type) tells declarations apart.
template <typename A, std::size_t Align, typename Key>
A& shared_array(Key) {
  constexpr std::size_t align = Align > alignof(A) ? Align : alignof(A);
  return *static_cast<A*>(static_shared(typeid(Key), sizeof(A), align));
}
template <typename T>
T* dynamic_shared() {
  return static_cast<T*>(dynamic_shared_base(alignof(T)));
}

// The per-thread body of a launch, type-erased; the context (the kernel and its
// arguments, copied at the launch) lives until the queued launch has run.
struct KernelBody {
  std::shared_ptr<void> context;
  void (*call)(void* context);
};
struct LaunchConfig;
// Checks the launch (cudaGetLastError reports a bad one at once) and queues it on its
// stream; the blocks run when the stream's work is due (emulator_streams.hpp).
void run(const LaunchConfig& config, std::uintptr_t kernel, KernelBody body);
void set_max_dynamic_shared(std::uintptr_t kernel, int bytes);
cudaError_t take_last_error();
cudaError_t peek_last_error();

// `kernel<<<grid, block, smem, stream>>>(args)` becomes
// `kernel * LaunchConfig(grid, block, smem, stream)(args)`.
template <typename... A>
struct LaunchArgs;
struct LaunchConfig {
  Dim3 grid, block;
  std::size_t smem;
  Stream* stream;  // null: the legacy default stream
  std::source_location where;
  LaunchConfig(Dim3 g, Dim3 b, std::size_t bytes = 0, Stream* s = nullptr,
               std::source_location w = std::source_location::current())
      : grid(g), block(b), smem(bytes), stream(s), where(w) {}
  template <typename... A>
  LaunchArgs<std::decay_t<A>...> operator()(A&&... args) const {
    return {*this, {std::forward<A>(args)...}};
  }
};
template <typename... A>
struct LaunchArgs {
  LaunchConfig config;
  std::tuple<A...> args;
};
template <typename... P, typename... A>
void operator*(void (*kernel)(P...), LaunchArgs<A...>&& launch) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong argument count");
  struct Context {
    void (*kernel)(P...);
    std::tuple<P...> params;  // converted once, as the launch converts them
  };
  auto context = std::make_shared<Context>(Context{
      kernel, std::apply([](auto&... a) { return std::tuple<P...>(a...); }, launch.args)});
  auto call = [](void* c) {
    auto* ctx = static_cast<Context*>(c);
    std::apply(ctx->kernel, ctx->params);  // each thread gets its own copies
  };
  run(launch.config, reinterpret_cast<std::uintptr_t>(kernel), {std::move(context), call});
}

// ---- warp collectives ----
template <typename T>
struct ShuffleData {
  T value;
  int source;  // this lane's source lane; -1 keeps the own value
  T result;
};
template <typename T>
void complete_shuffle(void* const* lanes, unsigned mask) {
  for (int l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    auto* me = static_cast<ShuffleData<T>*>(lanes[l]);
    const int s = me->source < 0 ? l : me->source;
    if (!(mask >> s & 1u)) fail("shuffle from a lane outside the mask");
    me->result = static_cast<ShuffleData<T>*>(lanes[s])->value;
  }
}
template <typename T>
T shuffle(const char* what, unsigned mask, T value, int source, std::source_location where) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 16, "unsupported shuffle type");
  ShuffleData<T> d{value, source, value};
  sync_warp(what, mask, &d, &complete_shuffle<T>, nullptr, where);
  return d.result;
}
// The source lane within a segment of `width` lanes, or -1 (own value) when outside it.
inline int segment_lane(int lane, int target, int width) {
  const int base = lane / width * width;
  return target >= base && target < base + width ? target : -1;
}
struct VoteData {
  bool predicate;
  unsigned result;
};
void complete_ballot(void* const* lanes, unsigned mask);

}  // namespace pptrain_emu
