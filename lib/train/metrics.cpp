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

void TraceRecorder::add(const std::string& name, int64_t step, Clock::time_point begin,
                        Clock::time_point end) {
  using us = std::chrono::duration<double, std::micro>;
  events_.push_back({{"name", name},
                     {"ph", "X"},
                     {"pid", 0},
                     {"tid", rank_},
                     {"ts", us(begin - origin_).count()},
                     {"dur", us(end - begin).count()},
                     {"args", {{"step", step}}}});
}

void TraceRecorder::write() const {
  if (path_.empty()) return;
  make_parent_dirs(path_, "logging.trace");
  nlohmann::json events = events_;
  events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", rank_},
                    {"args", {{"name", "rank " + std::to_string(rank_)}}}});
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
