// Work queued on the emulated runtime's streams (emulator_streams.cpp). Kernels, copies,
// memsets, cuBLASLt products, event records and waits, and the emulated NCCL's
// operations are all work items: nothing runs when it is queued, only when a host call
// makes it due (a synchronisation, an event query or wait, a blocking copy, a free).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "emulator_runtime.hpp"

namespace pptrain_emu {

// One item of a stream. run() is called once the item is at the head of its stream and
// may be called again: it returns true once the work is done, false while it waits for
// something outside this process (the emulated NCCL's peers), to be tried again later.
// It runs on whichever host thread's call made it due, with no lock held, and must not
// call a synchronising runtime function (that throws std::logic_error).
using Work = std::function<bool()>;

// Queues `work` on stream s (null: the legacy default stream). `what` names the item in
// error messages ("kernel gelu_forward", "ncclAllReduce on comm 2", ...).
void enqueue(Stream* s, std::string what, Work work);

// One item on each of `streams` (distinct), as NCCL queues a group on several streams:
// each starts once every one of the streams has reached it (its work from work_of(k)),
// and the work after it on any of them comes after all of them.
void enqueue_together(const std::vector<Stream*>& streams, const std::string& what,
                      const std::function<Work(std::size_t)>& work_of);

// The work of a captured item for one launch of its graph (`launch` numbers the
// launches): captured NCCL operations make their exchanges anew at each launch.
using WorkRecipe = std::function<Work(std::uint64_t launch)>;

// As enqueue_together, on streams that all capture into one graph: one node on each,
// its work made at each launch by recipe_of(k). False (nothing recorded) when the
// streams do not all capture into the same graph.
bool capture_together(const std::vector<Stream*>& streams, const std::string& what,
                      const std::function<WorkRecipe(std::size_t)>& recipe_of);

// The device (cudaSetDevice's ordinal) of the allocation that holds all of
// [p, p + bytes), or -1 when the range is not inside one live device allocation.
int device_of(const void* p, std::size_t bytes);

// The interleaving of the streams, set from PPTRAIN_EMULATED_STREAM_SEED when the runtime
// first uses its streams: a number (default 0) seeds the choice among the streams that can
// progress, so one seed gives one order; "sync" runs every item when it is queued (the
// order of the calls, for debugging). set_stream_schedule takes the same text (throws
// std::invalid_argument on anything else) and restarts the seeded sequence.
void set_stream_schedule(const std::string& setting);
std::string stream_schedule();

}  // namespace pptrain_emu
