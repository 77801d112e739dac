// The emulator's counters (emulator_counters.hpp).
#include "emulator_counters.hpp"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include <sys/file.h>

namespace pptrain_emu::counters {

void Counts::add(const Counts& o) {
  launches += o.launches, global_read += o.global_read, global_written += o.global_written;
  shared_read += o.shared_read, shared_written += o.shared_written, mma += o.mma;
}

namespace {

struct Running {
  std::string site;
  Counts counts;
  Range shared[2];
};
thread_local Running* running = nullptr;

struct Sites {
  std::mutex mutex;
  std::map<std::string, Counts> by_site;
  Counts total;
  void add(const std::string& site, const Counts& c) {
    std::lock_guard<std::mutex> lock(mutex);
    by_site[site].add(c);
    total.add(c);
  }
  // PPTRAIN_EMULATED_KERNEL_TABLE=FILE: the table by launch site, at exit; the ranks of
  // one job append theirs in turn (the file is locked while one writes).
  ~Sites() {
    const char* path = std::getenv("PPTRAIN_EMULATED_KERNEL_TABLE");
    std::FILE* f = path ? std::fopen(path, "a") : nullptr;
    if (f == nullptr) return;
    ::flock(::fileno(f), LOCK_EX);
    std::fprintf(f, "| launch site | launches | global read | global written | shared read | "
                    "shared written | mma |\n|---|---:|---:|---:|---:|---:|---:|\n");
    for (const auto& [site, c] : by_site)
      std::fprintf(f, "| %s | %llu | %llu | %llu | %llu | %llu | %llu |\n", site.c_str(), c.launches,
                   c.global_read, c.global_written, c.shared_read, c.shared_written, c.mma);
    std::fflush(f);
    ::flock(::fileno(f), LOCK_UN);
    std::fclose(f);
  }
};
Sites& sites() {
  static Sites s;
  return s;
}

}  // namespace

Counts totals() {
  Sites& s = sites();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.total;
}

void begin_kernel(const std::string& site, Range dynamic_shared, Range static_shared) {
  delete running;  // a kernel that threw and was not ended
  const std::size_t slash = site.rfind('/');  // file:line without the directories
  running = new Running{slash == std::string::npos ? site : site.substr(slash + 1), {},
                        {dynamic_shared, static_shared}};
  running->counts.launches = 1;
}

void end_kernel() {
  if (running == nullptr) return;
  sites().add(running->site, running->counts);
  delete running;
  running = nullptr;
}

void global_access(std::size_t bytes, bool write) {
  if (running) (write ? running->counts.global_written : running->counts.global_read) += bytes;
}

bool shared_access(std::uintptr_t address, std::size_t bytes, bool write) {
  if (running == nullptr) return false;
  const Range* r = running->shared;
  if (!(address >= r[0].lo && address < r[0].hi) && !(address >= r[1].lo && address < r[1].hi))
    return false;
  shared_moved(bytes, write);
  return true;
}

void shared_moved(std::size_t bytes, bool write) {
  if (running) (write ? running->counts.shared_written : running->counts.shared_read) += bytes;
}

void mma(unsigned long long instructions) {
  if (running) running->counts.mma += instructions;
}

void product(const std::string& site, unsigned long long bytes_read,
             unsigned long long bytes_written, unsigned long long mma_instructions) {
  Counts c;
  c.launches = 1, c.global_read = bytes_read, c.global_written = bytes_written;
  c.mma = mma_instructions;
  sites().add(site, c);
}

}  // namespace pptrain_emu::counters
