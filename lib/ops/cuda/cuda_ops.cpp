// CUDA backend: construction, identity, memory (tracked for peak_memory_bytes),
// precision conversion, AdamW and squared norms; plus the factory entry points.
#include "ops/cuda/cuda_ops.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "core/error.hpp"
#include "ops/cuda/cuda_check.hpp"

namespace pptrain::ops {

namespace {

int select_device(int device) {
  PPTRAIN_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  PPTRAIN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

int max_smem_optin(int device) {
  int bytes = 0;
  PPTRAIN_CUDA_CHECK(
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes;
}

}  // namespace

CudaOps::CudaOps(int device, DType compute, bool fuse_epilogues, bool flash_attention)
    : device_(select_device(device)),
      dtype_(compute),
      fuse_epilogues_(fuse_epilogues),
      flash_attention_(flash_attention),
      max_smem_optin_(max_smem_optin(device)),
      device_model_(device_name(device)) {
  update_peak();
}

CudaOps::~CudaOps() {
  // Let queued work finish before its memory and handles go, and free what the caller
  // did not give back; nothing to report from a destructor.
  (void)cudaStreamSynchronize(stream_.get());
  for (const auto& [p, bytes] : memory_.live()) (void)cudaFree(p);
}

// The CUDA emulator counts what kernels do (tests/ops/emulation); a GPU's runtime does not.
std::optional<Ops::KernelCounters> CudaOps::kernel_counters() const {
#ifdef PPTRAIN_CUDA_EMULATOR
  const pptrain_emu::counters::Counts c = pptrain_emu::counters::totals();
  return KernelCounters{c.launches, c.global_read + c.global_written,
                        c.shared_read + c.shared_written, c.mma};
#else
  return std::nullopt;
#endif
}

std::string CudaOps::name() const {
  return "cuda:" + std::to_string(device_) + " " + device_model_ + " (" + dtype_name(dtype_) +
         (flash_active() ? ", fused attention" : "") + ")";
}

// ---- Memory ----

std::size_t CudaOps::device_memory_free() const {
  PPTRAIN_CUDA_CHECK(cudaSetDevice(device_));
  std::size_t free = 0, total = 0;
  PPTRAIN_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

void CudaOps::update_peak() {
  memory_.note(workspace_.bytes() + gemm_.workspace_bytes());
}

void* CudaOps::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  if (const cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) {
    (void)cudaGetLastError();
    if (e == cudaErrorMemoryAllocation) throw OutOfMemory(bytes, memory_.held(), name());
    throw std::runtime_error("CUDA allocation of " + std::to_string(bytes) + " bytes failed on " +
                             name() + " with " + std::to_string(memory_.held()) +
                             " bytes held: " + cudaGetErrorString(e));
  }
  memory_.added(p, bytes, workspace_.bytes() + gemm_.workspace_bytes());
  return p;
}

void CudaOps::deallocate(void* p) noexcept {
  if (p == nullptr) return;
  graph_ = {};  // it may read p
  memory_.removed(p);
  waits_.add();
  (void)cudaFree(p);  // synchronises the device first: queued work may still use p
}

void* CudaOps::workspace(std::size_t bytes) {
  if (workspace_.bytes() < bytes) {
    retired_.push_back(std::move(workspace_));  // queued work may still read the old block
    graph_ = {};                                // and a graph would read it again
    workspace_ = cuda::DeviceMemory(bytes);
    update_peak();
  }
  return workspace_.get();
}

void CudaOps::upload(void* dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  // From pageable memory (what callers hold) cudaMemcpyAsync returns once it has
  // staged the source, so the host buffer is free to reuse on return.
  PPTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream()));
}

void CudaOps::download(void* host_dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  PPTRAIN_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
  waits_.add();
  PPTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void* CudaOps::allocate_host(std::size_t bytes) {
  void* p = nullptr;
  PPTRAIN_CUDA_CHECK(cudaMallocHost(&p, bytes));
  return p;
}

void CudaOps::free_host(void* p) noexcept { (void)cudaFreeHost(p); }

void CudaOps::download_async(void* host_dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  // Into pinned memory (allocate_host) the copy is queued and the host goes on.
  PPTRAIN_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
}

void CudaOps::begin_capture() {
  PPTRAIN_CHECK(!capturing_, "begin_capture: a capture is open");
  PPTRAIN_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeGlobal));
  capturing_ = true;
}

void CudaOps::end_capture() {
  PPTRAIN_CHECK(capturing_, "end_capture: no capture is open");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  PPTRAIN_CUDA_CHECK(cudaStreamEndCapture(stream(), &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  PPTRAIN_CUDA_CHECK(made);
  graph_ = cuda::GraphExec(exec);
}

void CudaOps::replay() {
  PPTRAIN_CHECK(replayable() && !capturing_, "replay: no graph to replay");
  PPTRAIN_CUDA_CHECK(cudaGraphLaunch(graph_.get(), stream()));
}

std::size_t CudaOps::mark() {
  if (capturing_) return marks_.size();  // a graph's work is not timed
  if (free_marks_.empty()) free_marks_.emplace_back(true);
  marks_.push_back(std::move(free_marks_.back()));
  free_marks_.pop_back();
  PPTRAIN_CUDA_CHECK(cudaEventRecord(marks_.back().get(), stream()));
  return marks_.size() - 1;
}

void CudaOps::wait_queue(const std::function<void()>& poll) {
  constexpr auto kMaxSleep = std::chrono::microseconds(100);
  PPTRAIN_CUDA_CHECK(cudaEventRecord(queue_end_.get(), stream()));
  waits_.add();
  auto sleep = std::chrono::microseconds(1);
  for (;;) {
    const cudaError_t state = cudaEventQuery(queue_end_.get());
    if (state == cudaSuccess) break;
    if (state != cudaErrorNotReady) PPTRAIN_CUDA_CHECK(state);
    if (poll) poll();
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kMaxSleep);
  }
  retired_.clear();  // nothing queued can use them now
}

std::vector<double> CudaOps::take_marks() {
  std::vector<double> s;
  for (const cuda::Event& e : marks_) {
    if (cudaEventQuery(e.get()) != cudaSuccess) {  // not after wait_queue: wait for it
      waits_.add();
      PPTRAIN_CUDA_CHECK(cudaEventSynchronize(e.get()));
    }
    float ms = 0;
    PPTRAIN_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_.front().get(), e.get()));
    s.push_back(double(ms) * 1e-3);
  }
  for (cuda::Event& e : marks_) free_marks_.push_back(std::move(e));
  marks_.clear();
  return s;
}

void CudaOps::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  PPTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}

void CudaOps::fill_zero(void* dst, std::size_t bytes) {
  if (bytes == 0) return;
  PPTRAIN_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream()));
}

void CudaOps::synchronize() {
  waits_.add();
  PPTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

// ---- Precision and optimizer ----

void CudaOps::to_compute(Act* dst, const float* src, std::size_t n) {
  launch_typed([](auto... args) { cuda::to_compute(args...); }, dst, src, n);
}

void CudaOps::to_float(float* dst, const Act* src, std::size_t n) {
  launch_typed([](auto... args) { cuda::to_float(args...); }, dst, src, n);
}

void CudaOps::sum_squares_to(double* out, const std::vector<Span>& spans) {
  std::vector<cuda::SquaredArray> arrays;
  for (const Span& x : spans) arrays.push_back({x.data, x.n});
  auto* partials =
      static_cast<double*>(workspace(cuda::sum_squares_partials(spans.size()) * sizeof(double)));
  cuda::sum_squares(out, arrays, partials, stream());
}

void CudaOps::add_mean(double* total, const float* x, std::size_t n) {
  cuda::add_mean(total, x, n, stream());
}

void CudaOps::update_control(float* control, const double* stats, double grad_clip) {
  cuda::update_control(control, stats, grad_clip, stream());
}

double CudaOps::sum_squares(const std::vector<Span>& spans) {
  if (spans.empty()) return 0.0;
  sum_squares_to(static_cast<double*>(sum_out_.get()), spans);
  double total = 0.0;
  download(&total, sum_out_.get(), sizeof total);
  return total;
}

void CudaOps::adamw_segments(float* params, Act* weights, const float* grads, float* m,
                             float* v, const std::vector<AdamWSegment>& segments,
                             const AdamWStep& h) {
  std::vector<cuda::AdamWTensor> tensors;
  for (const AdamWSegment& s : segments)
    tensors.push_back({s.arena, s.param, s.state, s.n, s.weight_decay});
  launch_typed([](auto... args) { cuda::adamw(args...); }, params, weights, grads, m, v, tensors,
               h.lr, h.beta1, h.beta2, h.one_minus_beta1, h.one_minus_beta2, h.eps,
               h.inv_bias_correction1, h.inv_bias_correction2, h.grad_scale, h.control,
               h.schedule);
}

// ---- Entry points ----

bool cuda_backend_built() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // leave no error behind for the next call
    return 0;
  }
  return n;
}

CudaDeviceInfo cuda_device_info(int device) {
  cudaDeviceProp prop{};
  PPTRAIN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return {prop.name, prop.totalGlobalMem};
}

std::unique_ptr<Ops> make_cuda_ops(int device, DType compute, bool flash_attention) {
  const int count = cuda_device_count();
  if (device < 0 || device >= count)
    throw std::runtime_error("CUDA device " + std::to_string(device) + " does not exist (" +
                             std::to_string(count) + " visible)");
  return std::make_unique<CudaOps>(device, compute, /*fuse_epilogues=*/true, flash_attention);
}

}  // namespace pptrain::ops
