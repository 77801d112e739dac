// Shared by the fuzz targets: the one rule every target checks (bad input may only
// throw InputError; anything else, or a broken invariant, aborts so that libFuzzer
// and the replay test report it) and a scratch file for parsers that read paths.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <typeinfo>

#include "core/error.hpp"

namespace pptrain::fuzz {

// Prints `what` and aborts: a finding.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Fails with `what` unless `cond` holds.
inline void expect(bool cond, const std::string& what) {
  if (!cond) finding(what);
}

// Runs `body`; an InputError is the expected answer to bad input, any other
// exception is a finding.
template <typename Body>
void only_input_errors(Body&& body) {
  try {
    body();
  } catch (const InputError&) {
  } catch (const std::exception& e) {
    finding(std::string("unexpected exception ") + typeid(e).name() + ": " + e.what());
  } catch (...) {
    finding("unexpected exception of a non-std type");
  }
}

// A file in the temp directory, private to this process, rewritten per input and
// removed when the process exits normally.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& stem)
      : path_((std::filesystem::temp_directory_path() /
               ("pptrain-fuzz-" + stem + "-" + std::to_string(::getpid())))
                  .string()) {}
  ~ScratchFile() { std::remove(path_.c_str()); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  // Replaces the file's contents with `n` bytes at `data`; returns its path.
  const std::string& write(const uint8_t* data, std::size_t n) const {
    std::FILE* f = std::fopen(path_.c_str(), "wb");
    if (!f) finding("cannot create scratch file " + path_);
    bool ok = n == 0 || std::fwrite(data, 1, n, f) == n;
    ok = std::fclose(f) == 0 && ok;
    if (!ok) finding("cannot write scratch file " + path_);
    return path_;
  }

 private:
  std::string path_;
};

}  // namespace pptrain::fuzz
