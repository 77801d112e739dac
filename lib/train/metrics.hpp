// Run outputs besides the console: a JSON Lines metrics file (one object per logged
// step) and a Chrome-trace/Perfetto timeline of the traced steps.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace pptrain {

class MetricsWriter {
 public:
  // Opens `path` for appending (creating parent dirs); an empty path disables writing.
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  // One line, flushed. A failed write (a full disk) does not stop the run: the first
  // one logs an error naming the file and the reason, and lost() counts them.
  void write(const nlohmann::json& record);
  int64_t lost() const { return lost_; }
  int64_t written() const { return written_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  int64_t written_ = 0, lost_ = 0;
};

// Collects one slice per action (forward, backward-input, backward-weight, messages,
// optimizer) and writes them as Chrome trace events ("X" phase, microseconds) with one
// track per rank ("rank r", thread id r), and the communication beside compute on
// tracks of their own ("rank r: <track>", thread ids from 10000, their slices'
// args naming the track), sorted right below their rank's. Rank r writes
// `path.rank<r>`; merge_traces joins them into `path`.
class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  TraceRecorder(std::string path, std::vector<int> steps, int rank = 0);
  bool enabled_for(int64_t step) const;  // traced step?
  void add(const std::string& name, int64_t step, Clock::time_point begin, Clock::time_point end);
  // A slice on this rank's track `track` (communication).
  void add_on(const std::string& track, const std::string& name, int64_t step,
              Clock::time_point begin, Clock::time_point end);
  // This rank's part; no-op when disabled. A failed write logs an error: the trace is
  // lost, the run goes on.
  void write() const;

 private:
  std::string path_;
  std::vector<int> steps_;
  int rank_;
  Clock::time_point origin_ = Clock::now();
  nlohmann::json events_ = nlohmann::json::array();
  std::vector<std::string> tracks_;  // add_on's, in first use
  nlohmann::json slice(const std::string& name, int tid, int64_t step, Clock::time_point begin,
                       Clock::time_point end) const;
};

// Joins the parts written by ranks 0..world-1 into one trace file at `path` and
// removes the parts. Logs an error (the trace is lost, the run goes on) when a part is
// missing or the file cannot be written.
void merge_traces(const std::string& path, int world);

}  // namespace pptrain
