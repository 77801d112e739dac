// Durable POSIX file writes, read-only mappings and the file checksum.
#include "checkpoint/file_io.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "core/error.hpp"
#include "core/input_file.hpp"
#include "core/random.hpp"

namespace pptrain::ckpt {

namespace {
uint64_t load_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string errno_text() { return std::strerror(errno); }
}  // namespace

void Checksum::block(const unsigned char* p) {
  for (int l = 0; l < 4; ++l) lane_[l] = mix64(lane_[l] ^ load_le64(p + 8 * l));
}

void Checksum::update(const void* data, std::size_t n) {
  if (n == 0) return;  // data may be null
  auto p = static_cast<const unsigned char*>(data);
  total_ += n;
  if (npending_ > 0) {
    std::size_t take = std::min(n, sizeof(pending_) - npending_);
    std::memcpy(pending_ + npending_, p, take);
    npending_ += take;
    p += take;
    n -= take;
    if (npending_ < sizeof(pending_)) return;
    block(pending_);
    npending_ = 0;
  }
  for (; n >= 32; p += 32, n -= 32) block(p);
  std::memcpy(pending_, p, n);
  npending_ = n;
}

uint64_t Checksum::value() const {
  Checksum tail = *this;
  if (tail.npending_ > 0) {
    std::memset(tail.pending_ + tail.npending_, 0, sizeof(pending_) - tail.npending_);
    tail.block(tail.pending_);
  }
  uint64_t h = mix64(total_);
  for (uint64_t lane : tail.lane_) h = mix64(h ^ lane);
  return h;
}

std::string to_hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

DurableWriter::DurableWriter(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error("cannot create " + path_ + ": " + errno_text());
}

DurableWriter::~DurableWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void DurableWriter::write(const void* data, std::size_t n) {
  PPTRAIN_CHECK(fd_ >= 0, "write after finish");
  sum_.update(data, n);
  bytes_ += n;
  auto p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw std::runtime_error("cannot write " + path_ + ": " + errno_text());
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void DurableWriter::finish() {
  PPTRAIN_CHECK(fd_ >= 0, "finish twice");
  if (::fsync(fd_) != 0) throw std::runtime_error("cannot fsync " + path_ + ": " + errno_text());
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw std::runtime_error("cannot close " + path_ + ": " + errno_text());
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open directory " + dir + ": " + errno_text());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0)
    throw std::runtime_error("cannot fsync directory " + dir + ": " + std::strerror(err));
}

void write_file_atomic(const std::string& path, std::string_view text) {
  const std::string tmp = path + ".tmp";
  try {
    DurableWriter w(tmp);
    w.write(text.data(), text.size());
    w.finish();
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " + why);
  }
  std::string parent = path.substr(0, path.find_last_of('/') + 1);
  fsync_dir(parent.empty() ? "." : parent);
}

std::string meta_seal(std::string_view meta_text) {
  Checksum sum;
  sum.update(meta_text.data(), meta_text.size());
  return std::string(kChecksumName) + " " + to_hex(sum.value()) + " " +
         std::to_string(meta_text.size()) + "\n";
}

MappedFile::MappedFile(const std::string& path) {
  const InputFile file(path);
  size_ = file.size();
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, file.fd(), 0);
    if (p == MAP_FAILED) throw InputError(path + ": cannot map (" + errno_text() + ")");
    data_ = static_cast<const char*>(p);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<char*>(data_), size_);
}

}  // namespace pptrain::ckpt
