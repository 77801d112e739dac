#include "train/metrics.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <spdlog/spdlog.h>

#include "core/error.hpp"

namespace pptrain {

namespace {
// An output path that cannot be created is bad input (the config names it).
void make_parent_dirs(const std::string& path, const char* key) {
  auto parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) throw InputError(std::string(key) + ": " + path + ": cannot create " + parent.string() +
                           ": " + ec.message());
}
// Writes `text` to `path`; on failure logs an error naming the file and the reason.
void write_text(const std::string& path, const std::string& text) {
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "w");
  bool ok = f && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f) ok = std::fclose(f) == 0 && ok;
  if (!ok)
    spdlog::error("logging.trace: {}: cannot write ({}); the trace is lost", path,
                  errno ? std::strerror(errno) : "write error");
}
}  // namespace

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  if (path.empty()) return;
  make_parent_dirs(path, "logging.metrics");
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) throw InputError("logging.metrics: " + path + ": cannot open: " + std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!file_) return;
  const std::string line = record.dump() + "\n";
  errno = 0;
  const bool ok = std::fwrite(line.data(), 1, line.size(), file_) == line.size() &&
                  std::fflush(file_) == 0;
  if (ok) {
    ++written_;
    return;
  }
  if (lost_++ == 0)
    spdlog::error("logging.metrics: {}: cannot write ({}); metrics are being lost, training "
                  "goes on",
                  path_, errno ? std::strerror(errno) : "write error");
  std::clearerr(file_);
}

TraceRecorder::TraceRecorder(std::string path, std::vector<int> steps, int rank)
    : path_(std::move(path)), steps_(std::move(steps)), rank_(rank) {
  if (!path_.empty()) make_parent_dirs(path_, "logging.trace");  // fail before training
}

bool TraceRecorder::enabled_for(int64_t step) const {
  return !path_.empty() && std::find(steps_.begin(), steps_.end(), step) != steps_.end();
}

namespace {
// Thread ids and sort order: rank r's compute track is thread r, sorted at r * kTracks;
// its k-th communication track (from 1) thread kFirstTrackTid + r * kTracks + k, sorted
// right after it.
constexpr int kTracks = 64, kFirstTrackTid = 10000;
}  // namespace

nlohmann::json TraceRecorder::slice(const std::string& name, int tid, int64_t step,
                                    Clock::time_point begin, Clock::time_point end) const {
  using us = std::chrono::duration<double, std::micro>;
  return {{"name", name},
          {"ph", "X"},
          {"pid", 0},
          {"tid", tid},
          {"ts", us(begin - origin_).count()},
          {"dur", us(end - begin).count()},
          {"args", {{"step", step}}}};
}

void TraceRecorder::add(const std::string& name, int64_t step, Clock::time_point begin,
                        Clock::time_point end) {
  events_.push_back(slice(name, rank_, step, begin, end));
}

void TraceRecorder::add_on(const std::string& track, const std::string& name, int64_t step,
                           Clock::time_point begin, Clock::time_point end) {
  auto it = std::find(tracks_.begin(), tracks_.end(), track);
  if (it == tracks_.end()) {
    if (tracks_.size() + 1 >= std::size_t(kTracks)) return;  // more tracks than a rank has
    it = tracks_.insert(tracks_.end(), track);
  }
  const int k = int(it - tracks_.begin()) + 1;
  nlohmann::json e = slice(name, kFirstTrackTid + rank_ * kTracks + k, step, begin, end);
  e["args"]["track"] = track;
  events_.push_back(std::move(e));
}

void TraceRecorder::write() const {
  if (path_.empty()) return;
  make_parent_dirs(path_, "logging.trace");
  nlohmann::json events = events_;
  auto name_track = [&](int tid, const std::string& name, int sort) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", tid},
                      {"args", {{"name", name}}}});
    events.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", 0}, {"tid", tid},
                      {"args", {{"sort_index", sort}}}});
  };
  const std::string rank = "rank " + std::to_string(rank_);
  name_track(rank_, rank, rank_ * kTracks);
  for (std::size_t i = 0; i < tracks_.size(); ++i) {
    const int k = int(i) + 1;
    name_track(kFirstTrackTid + rank_ * kTracks + k, rank + ": " + tracks_[i], rank_ * kTracks + k);
  }
  write_text(path_ + ".rank" + std::to_string(rank_), events.dump() + "\n");
}

void merge_traces(const std::string& path, int world) {
  nlohmann::json events = nlohmann::json::array();
  for (int r = 0; r < world; ++r) {
    const std::string part = path + ".rank" + std::to_string(r);
    std::ifstream in(part);
    if (!in) {
      spdlog::error("logging.trace: {}: part missing; no trace written", part);
      return;
    }
    try {
      for (auto& e : nlohmann::json::parse(in)) events.push_back(std::move(e));
    } catch (const nlohmann::json::exception&) {
      spdlog::error("logging.trace: {}: part unreadable; no trace written", part);
      return;
    }
    in.close();
    std::filesystem::remove(part);
  }
  nlohmann::json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  write_text(path, doc.dump() + "\n");
}

}  // namespace pptrain
