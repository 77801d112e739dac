// One run per checkpoint directory. Two runs writing the same directory race on its
// temporary step dirs and on `latest`, and one of them fails mid-save; so a run holds
// an exclusive lock on its directory for as long as it lives.
#pragma once
#include <string>

namespace pptrain {

// Creates `dir` if needed and takes an exclusive flock on `dir`/.lock, which the kernel
// releases when the process ends, however it ends; the file records the holder's host
// and pid for the message a second run gets. Also refuses a `latest` that is not a
// regular file (every save would fail to replace it). InputError naming the directory
// (and the holder) when the lock is taken, the directory unusable or `latest` odd.
class CheckpointDirLock {
 public:
  explicit CheckpointDirLock(const std::string& dir);
  ~CheckpointDirLock();  // releases the lock
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace pptrain
