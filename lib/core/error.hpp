// Error types shared by every layer. InputError is bad user input (config, data
// file, checkpoint): the CLI prints its one-line message and exits with code 2.
// DataChanged is a data file that changed under a running job: the job ends with
// kExitRunFailure. Anything else thrown is an internal or runtime failure and exits
// with code 1.
#pragma once
#include <stdexcept>
#include <string>
#include <string_view>

namespace pptrain {

class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class DataChanged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `text` when it is at most `max` bytes, else its first `max` bytes followed by
// "...(N bytes)": for quoting user input in an error message without repeating all of it.
std::string abbreviated(std::string_view text, std::size_t max = 64);

// Exit codes of the pptrain binary.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;
// A job that failed part way through, through no fault of its own: a lost peer, a
// communication timeout, a data file changed under it. The last checkpoint stands.
inline constexpr int kExitRunFailure = 3;
// Stopped by SIGTERM/SIGUSR1 after checkpointing: rerun with checkpoint.resume: auto.
inline constexpr int kExitPreempted = 4;

// Throws std::logic_error naming the failed condition and its location. For
// internal invariants only: user input is validated by code that throws InputError.
[[noreturn]] void fail_check(const char* condition, const char* file, int line,
                             const std::string& message);

}  // namespace pptrain

#define PPTRAIN_CHECK(cond, msg)                                     \
  do {                                                               \
    if (!(cond)) ::pptrain::fail_check(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)
