// The emulated runtime's stream capture and graphs (emulator_host_api.hpp), as CUDA
// documents them for one stream: between cudaStreamBeginCapture and cudaStreamEndCapture
// what is queued on the stream is recorded, not run (its kernels' arguments, products and
// copies as they were called); a graph launch queues all of it again, in order, on the
// launch stream, as often as it is launched. Capture ends invalidated, and the call fails,
// on what a capture does not allow: a synchronisation of the stream or device, the legacy
// stream or cudaFree beside it, a copy from pageable memory (its bytes are taken at the
// call). Work of other streams joining the capture through events is not modelled: such a
// wait fails (cudaErrorStreamCaptureIsolation, cudaErrorStreamCaptureUnsupported).
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cuda_emulator.hpp"
#include "emulator_schedule.hpp"

namespace pptrain_emu {

struct Graph {
  std::vector<std::pair<std::string, Work>> items;
};
struct GraphExec {
  int device = 0;
  std::vector<std::pair<std::string, Work>> items;
};

namespace {
// The live handles (under the scheduler's lock).
std::set<const Graph*>& graphs() {
  static std::set<const Graph*> g;
  return g;
}
std::set<const GraphExec*>& execs() {
  static std::set<const GraphExec*> e;
  return e;
}
}  // namespace

cudaError_t stream_begin_capture(Stream* s, cudaStreamCaptureMode mode) {
  if (mode < cudaStreamCaptureModeGlobal || mode > cudaStreamCaptureModeRelaxed)
    return cudaErrorInvalidValue;
  auto held = sched::lock();
  if (s == nullptr) return cudaErrorStreamCaptureUnsupported;  // the legacy stream
  const auto q = sched::queue_of(s);
  if (!q) return cudaErrorInvalidResourceHandle;
  if (q->capture) return cudaErrorInvalidValue;  // already capturing
  q->capture = std::make_shared<sched::Capture>();
  return cudaSuccess;
}

cudaError_t stream_end_capture(Stream* s, Graph** graph) {
  if (graph == nullptr) return cudaErrorInvalidValue;
  *graph = nullptr;
  auto held = sched::lock();
  const auto q = s ? sched::queue_of(s) : nullptr;
  if (!q) return cudaErrorInvalidResourceHandle;
  if (!q->capture) return cudaErrorInvalidValue;  // not capturing
  const std::shared_ptr<sched::Capture> capture = std::move(q->capture);
  q->capture = nullptr;
  if (!capture->invalidated.empty()) return cudaErrorStreamCaptureInvalidated;
  *graph = new Graph{std::move(capture->items)};
  graphs().insert(*graph);
  return cudaSuccess;
}

cudaError_t stream_is_capturing(Stream* s, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return cudaErrorInvalidValue;
  auto held = sched::lock();
  const auto q = sched::queue_of(s);
  if (!q) return cudaErrorInvalidResourceHandle;
  *status = !q->capture                       ? cudaStreamCaptureStatusNone
            : q->capture->invalidated.empty() ? cudaStreamCaptureStatusActive
                                              : cudaStreamCaptureStatusInvalidated;
  return cudaSuccess;
}

cudaError_t graph_instantiate(GraphExec** exec, Graph* graph) {
  if (exec == nullptr) return cudaErrorInvalidValue;
  auto held = sched::lock();
  if (graphs().count(graph) == 0) return cudaErrorInvalidValue;
  *exec = new GraphExec{current_device(), graph->items};
  execs().insert(*exec);
  return cudaSuccess;
}

cudaError_t graph_launch(GraphExec* exec, Stream* s) {
  auto held = sched::lock();
  if (execs().count(exec) == 0) return cudaErrorInvalidValue;
  const auto q = sched::queue_of(s);
  if (!q || q->device != exec->device) return cudaErrorInvalidResourceHandle;
  if (q->capture) {  // a graph inside a capture (a child graph) is not modelled
    sched::invalidate(*q, "cudaGraphLaunch");
    return cudaErrorStreamCaptureUnsupported;
  }
  for (const auto& [what, work] : exec->items) sched::submit(held, q, "graph: " + what, work);
  return cudaSuccess;
}

cudaError_t graph_destroy(Graph* graph) {
  auto held = sched::lock();
  if (graphs().erase(graph) == 0) return cudaErrorInvalidValue;
  delete graph;
  return cudaSuccess;
}

cudaError_t graph_exec_destroy(GraphExec* exec) {
  auto held = sched::lock();
  if (execs().erase(exec) == 0) return cudaErrorInvalidValue;
  delete exec;  // launched work holds its own copies
  return cudaSuccess;
}

cudaError_t refuse_while_capturing(int device, const char* what, cudaError_t code) {
  auto held = sched::lock();
  if (!sched::capturing_on(device)) return cudaSuccess;
  sched::invalidate_captures(device, what);
  return code;
}

}  // namespace pptrain_emu
