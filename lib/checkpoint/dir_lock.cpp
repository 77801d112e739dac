#include "checkpoint/dir_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.hpp"

namespace pptrain {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const std::string& dir, const std::string& why) {
  throw InputError("checkpoint.dir: " + dir + ": " + why);
}

// "host H, pid P" from a held lock file, or a placeholder while the holder writes it.
std::string holder_of(int fd) {
  char buf[256] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string text(buf, n > 0 ? std::size_t(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  const auto space = text.find(' ');
  if (space == std::string::npos) return "holder unknown";
  return "host " + text.substr(0, space) + ", pid " + text.substr(space + 1);
}

}  // namespace

CheckpointDirLock::CheckpointDirLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(dir, "cannot create: " + ec.message());
  if (!fs::is_directory(dir, ec)) fail(dir, "not a directory");
  const std::string path = (fs::path(dir) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd_ < 0) fail(dir, "cannot open its lock file .lock: " + std::string(std::strerror(errno)));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = err == EWOULDBLOCK ? holder_of(fd_) : "";
    ::close(fd_);
    if (err != EWOULDBLOCK) fail(dir, "cannot lock .lock: " + std::string(std::strerror(err)));
    fail(dir, "in use by another run (" + holder +
                  "); wait for it to end or choose another checkpoint.dir");
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = std::string(host) + " " + std::to_string(::getpid()) + "\n";
  // Without the note the lock still holds; only a second run's message is poorer.
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, me.data(), me.size(), 0);
  const fs::path latest = fs::path(dir) / "latest";
  const auto status = fs::status(latest, ec);
  if (!ec && fs::exists(status) && !fs::is_regular_file(status)) {
    ::close(fd_);
    fail(dir, std::string("latest is ") +
                  (fs::is_directory(status) ? "a directory" : "not a regular file") +
                  ", not the file naming the newest step dir; remove it");
  }
}

CheckpointDirLock::~CheckpointDirLock() { ::close(fd_); }

}  // namespace pptrain
