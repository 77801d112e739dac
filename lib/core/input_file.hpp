// Opening input files (config, token files, checkpoint files) without the ways a path
// can hang or exhaust memory: the file is opened non-blocking, so a FIFO fails instead
// of waiting for a writer, and anything but a regular file (FIFO, device, socket,
// directory) is refused.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace pptrain {

// A read-only regular file. Every error is an InputError "PATH: reason".
class InputFile {
 public:
  // `noun` names the file's role in the open error ("cannot open config file: ...").
  explicit InputFile(const std::string& path, std::string_view noun = "");
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  std::size_t size() const { return size_; }

  // Reads exactly `n` bytes at byte `offset` into `dst`.
  void read_at(void* dst, std::size_t n, std::size_t offset) const;
  // The whole file; an InputError naming the limit when it holds more than `max_bytes`.
  std::string read_all(std::size_t max_bytes) const;

 private:
  [[noreturn]] void fail(const std::string& reason) const;
  std::string path_;
  int fd_ = -1;
  std::size_t size_ = 0;
};

}  // namespace pptrain
