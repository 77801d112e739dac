#include "train/metrics.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

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
}  // namespace

MetricsWriter::MetricsWriter(const std::string& path) {
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
  std::string line = record.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
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
  const std::string part = path_ + ".rank" + std::to_string(rank_);
  std::ofstream out(part);
  out << events.dump() << "\n";
  if (!out) throw std::runtime_error(part + ": cannot write trace file");
}

void merge_traces(const std::string& path, int world) {
  nlohmann::json events = nlohmann::json::array();
  for (int r = 0; r < world; ++r) {
    const std::string part = path + ".rank" + std::to_string(r);
    std::ifstream in(part);
    if (!in) throw std::runtime_error(part + ": trace part missing");
    for (auto& e : nlohmann::json::parse(in)) events.push_back(std::move(e));
    in.close();
    std::filesystem::remove(part);
  }
  nlohmann::json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  std::ofstream out(path);
  out << doc.dump() << "\n";
  if (!out) throw std::runtime_error(path + ": cannot write trace file");
}

}  // namespace pptrain
