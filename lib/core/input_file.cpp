#include "core/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.hpp"

namespace pptrain {

namespace {
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}
}  // namespace

InputFile::InputFile(const std::string& path, std::string_view noun) : path_(path) {
  // O_NONBLOCK: opening a FIFO returns at once; reads of a regular file ignore it.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd_ < 0) {
    const int err = errno;
    std::string reason = "cannot open";
    if (!noun.empty()) reason.append(" ").append(noun);
    fail(reason.append(": ").append(std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    fail(std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    fail(std::string("not a regular file (") + kind_of(st.st_mode) + ")");
  }
  size_ = std::size_t(st.st_size);
}

InputFile::~InputFile() { ::close(fd_); }

void InputFile::fail(const std::string& reason) const { throw InputError(path_ + ": " + reason); }

void InputFile::read_at(void* dst, std::size_t n, std::size_t offset) const {
  auto* p = static_cast<unsigned char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd_, p, n, off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(std::string("read failed: ") + std::strerror(errno));
    if (got == 0) fail("file shrank while being read");
    p += got;
    n -= std::size_t(got);
    offset += std::size_t(got);
  }
}

std::string InputFile::read_all(std::size_t max_bytes) const {
  if (size_ > max_bytes)
    fail("is " + std::to_string(size_) + " bytes, more than the " + std::to_string(max_bytes) +
         " allowed");
  std::string text(size_, '\0');
  read_at(text.data(), text.size(), 0);
  return text;
}

}  // namespace pptrain
