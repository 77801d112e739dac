// The emulated runtime's stream capture and graphs (emulator_host_api.hpp), as CUDA
// documents them: between cudaStreamBeginCapture and cudaStreamEndCapture what is queued
// on the stream is recorded, not run (its kernels' arguments, products and copies as they
// were called). Another stream joins the capture by waiting for an event recorded in it,
// and must be joined back (the origin stream waits for an event recorded after its work)
// before the capture ends. Each recorded item is a node that depends on what its stream
// had reached; a graph launch queues every node again, on the launch stream and on one
// stream of the graph's own for each joined stream, each after the nodes it depends on,
// and the launch stream's later work after all of them. Captured NCCL operations are
// made anew at each launch (their exchanges with peers repeat). Capture ends invalidated,
// and the call fails, on what a capture does not allow: a synchronisation of a stream or
// the device, the legacy stream or cudaFree beside it, a copy from pageable memory (its
// bytes are taken at the call), a wait for work outside the capture.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cuda_emulator.hpp"
#include "emulator_schedule.hpp"

namespace pptrain_emu {

struct Graph {
  std::vector<sched::Node> nodes;
  std::size_t lanes = 1;
};
struct GraphExec {
  int device = 0;
  std::vector<sched::Node> nodes;
  std::vector<std::shared_ptr<sched::Queue>> lanes;  // lanes 1.. (lane 0: the launch stream)
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
  q->capture_lane = 0;
  q->capture_tail.clear();
  return cudaSuccess;
}

namespace {
// Whether every node is the origin's tail or something it depends on: no joined stream's
// work is left unjoined.
bool all_joined(const sched::Capture& c, const std::vector<std::size_t>& origin_tail) {
  std::vector<bool> reached(c.nodes.size(), false);
  std::vector<std::size_t> to_visit(origin_tail);
  while (!to_visit.empty()) {
    const std::size_t n = to_visit.back();
    to_visit.pop_back();
    if (reached[n]) continue;
    reached[n] = true;
    to_visit.insert(to_visit.end(), c.nodes[n].deps.begin(), c.nodes[n].deps.end());
  }
  return std::find(reached.begin(), reached.end(), false) == reached.end();
}
}  // namespace

cudaError_t stream_end_capture(Stream* s, Graph** graph) {
  if (graph == nullptr) return cudaErrorInvalidValue;
  *graph = nullptr;
  auto held = sched::lock();
  const auto q = s ? sched::queue_of(s) : nullptr;
  if (!q) return cudaErrorInvalidResourceHandle;
  if (!q->capture) return cudaErrorInvalidValue;  // not capturing
  if (q->capture_lane != 0) {  // a joined stream
    sched::invalidate(*q, "cudaStreamEndCapture on a stream that joined the capture");
    return cudaErrorStreamCaptureUnmatched;
  }
  const std::shared_ptr<sched::Capture> capture = q->capture;
  const std::vector<std::size_t> origin_tail = q->capture_tail;
  sched::end_capture(*capture);  // every stream of it leaves
  if (!capture->invalidated.empty()) return cudaErrorStreamCaptureInvalidated;
  if (!all_joined(*capture, origin_tail)) return cudaErrorStreamCaptureUnjoined;
  *graph = new Graph{std::move(capture->nodes), capture->lanes};
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
  const int device = current_device();
  *exec = new GraphExec{device, graph->nodes, {}};
  for (std::size_t lane = 1; lane < graph->lanes; ++lane)
    (*exec)->lanes.push_back(sched::new_queue(device, false));
  execs().insert(*exec);
  return cudaSuccess;
}

cudaError_t graph_launch(GraphExec* exec, Stream* s) {
  std::vector<sched::Node> nodes;
  std::uint64_t launch = 0;
  {
    auto held = sched::lock();
    if (execs().count(exec) == 0) return cudaErrorInvalidValue;
    const auto q = sched::queue_of(s);
    if (!q || q->device != exec->device) return cudaErrorInvalidResourceHandle;
    if (q->capture) {  // a graph inside a capture (a child graph) is not modelled
      sched::invalidate(*q, "cudaGraphLaunch");
      return cudaErrorStreamCaptureUnsupported;
    }
    static std::uint64_t launches = 0;
    launch = ++launches;
    nodes = exec->nodes;
  }
  // Each node's work for this launch, in capture order, outside the lock (a captured
  // NCCL operation is made here, and asks the runtime for its schedule).
  std::vector<Work> works;
  for (const sched::Node& n : nodes) works.push_back(n.work_for(launch));
  auto held = sched::lock();
  if (execs().count(exec) == 0) return cudaErrorInvalidValue;
  const auto q = sched::queue_of(s);
  if (!q) return cudaErrorInvalidResourceHandle;
  std::vector<std::shared_ptr<sched::Queue>> lanes{q};
  lanes.insert(lanes.end(), exec->lanes.begin(), exec->lanes.end());
  const sched::Mark start = sched::end_of(q);  // what the launch stream had reached
  std::vector<sched::Mark> marks;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    std::vector<sched::Mark> after;
    for (std::size_t d : nodes[i].deps) after.push_back(marks[d]);
    if (nodes[i].deps.empty() && nodes[i].lane != 0) after.push_back(start);
    marks.push_back(sched::submit(held, lanes[nodes[i].lane], "graph: " + nodes[i].what,
                                  std::move(works[i]), std::move(after)));
  }
  std::vector<sched::Mark> ends;
  for (std::size_t lane = 1; lane < lanes.size(); ++lane) ends.push_back(sched::end_of(lanes[lane]));
  if (!ends.empty())
    sched::submit(held, q, "graph: the end of its streams", [] { return true; }, std::move(ends));
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
  for (const auto& lane : exec->lanes) sched::retire(lane);  // its queued work still runs
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
