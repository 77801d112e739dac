// Tests relaunch_under_mpirun. Started plainly, it makes a temp dir, relaunches itself
// with 2 ranks and checks the result; each relaunched child writes
// "<rank> <size> <launcher> <relaunched> <parent pid> <stop file set> <args>" to <dir>/rank<R> (the dir reaches the
// children through PPTRAIN_TEST_RELAUNCH_DIR). Usage: relaunch_probe CHILD_EXIT [ARGS...];
// with CHILD_EXIT != 0 rank 1 exits with it and the relaunch must report a failure.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "comm/launcher.hpp"

namespace fs = std::filesystem;
using namespace pptrain::comm;

namespace {

constexpr const char* kDirVar = "PPTRAIN_TEST_RELAUNCH_DIR";

std::string args_text(int argc, char** argv) {
  std::string s;
  for (int i = 2; i < argc; ++i) s += std::string(" [") + argv[i] + "]";
  return s;
}

int child(int exit_code, int argc, char** argv) {
  const char* dir = std::getenv(kDirVar);
  if (!dir) return 10;
  const LaunchInfo info = detect_launcher();
  std::ofstream(fs::path(dir) / ("rank" + std::to_string(info.rank)))
      << info.rank << " " << info.world_size << " " << info.launcher << " "
      << info.relaunched << " " << info.relaunching_parent << " "
      << (std::getenv(pptrain::kStopFileVariable) != nullptr) << args_text(argc, argv) << "\n";
  return info.rank == 1 ? exit_code : 0;
}

int fail(const std::string& why) {
  std::fprintf(stderr, "relaunch_probe: %s\n", why.c_str());
  return 1;
}

int check(int argc, char** argv, int status, int child_exit, const fs::path& dir) {
  if (child_exit != 0) {
    if (status == 0) return fail("a child exited " + std::to_string(child_exit) +
                                 " but the relaunch returned 0");
    std::printf("ok: the relaunch returned %d\n", status);
    return 0;
  }
  if (status != 0) return fail("the relaunch returned " + std::to_string(status));
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(dir / ("rank" + std::to_string(r)));
    std::stringstream got;
    got << in.rdbuf();
    const std::string want = std::to_string(r) + " 2 openmpi 1 " + std::to_string(::getpid()) +
                             " 1" + args_text(argc, argv) + "\n";
    if (got.str() != want)
      return fail("rank " + std::to_string(r) + " wrote '" + got.str() + "', expected '" +
                  want + "'");
  }
  std::printf("ok: both ranks ran with the same arguments\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return fail("usage: relaunch_probe CHILD_EXIT [ARGS...]");
  const int child_exit = std::atoi(argv[1]);
  if (detect_launcher().relaunched) return child(child_exit, argc, argv);

  const fs::path dir =
      fs::temp_directory_path() / ("pptrain-relaunch-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  ::setenv(kDirVar, dir.c_str(), 1);
  const pptrain::StopSignals stop;
  const int status = relaunch_under_mpirun(2, argc, argv, &stop);
  const int rc = check(argc, argv, status, child_exit, dir);
  fs::remove_all(dir);
  return rc;
}
