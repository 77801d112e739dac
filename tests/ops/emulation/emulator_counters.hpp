// What the emulated kernels do, counted (there is no GPU to time them): per launch site
// and for the whole process, launches, bytes of device (global) memory read and written,
// bytes of shared memory read and written, and tensor-core instructions (mma.sync
// m16n8k16; a cuBLASLt product counts the m*n*k/2048 of them its math needs, and its
// operands' bytes once each, the least it can move).
//
// Kernel loads and stores are seen through the race detector's instrumentation
// (emulator_races.hpp: GCC only): device memory is marked in its shadow, and so is each
// running block's shared memory; the PTX emulation (emulator_ptx.cpp) adds what ldmatrix
// and cp.async move. With PPTRAIN_EMULATED_KERNEL_TABLE=FILE a process appends a
// markdown table of its launch sites to FILE as it exits.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace pptrain_emu::counters {

struct Counts {
  unsigned long long launches = 0, global_read = 0, global_written = 0, shared_read = 0,
                     shared_written = 0, mma = 0;
  void add(const Counts& o);
};

// The whole process's counts so far.
Counts totals();

// The runtime's calls: a launch from `site` ("file:line launcher": the function around
// the launch) runs its blocks between begin and end, on this thread, with its shared
// memory in the two ranges [lo, hi) given (dynamic and static).
struct Range {
  std::uintptr_t lo = 0, hi = 0;
};
void begin_kernel(const std::string& site, Range dynamic_shared, Range static_shared);
void end_kernel();
// Accesses by the running kernel (none: ignored). shared_access counts an access to the
// running block's shared memory and returns true, or returns false for other addresses.
void global_access(std::size_t bytes, bool write);
bool shared_access(std::uintptr_t address, std::size_t bytes, bool write);
void shared_moved(std::size_t bytes, bool write);  // ldmatrix, cp.async
void mma(unsigned long long instructions);
// A cuBLASLt product, counted as one launch of its own.
void product(const std::string& site, unsigned long long bytes_read,
             unsigned long long bytes_written, unsigned long long mma_instructions);

}  // namespace pptrain_emu::counters
