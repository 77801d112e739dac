// Launcher detection from environment variables, and the self-relaunch under mpirun
// that lets `pptrain --config x.yaml` start its own ranks on one machine.
#include "comm/launcher.hpp"

#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <vector>

#include "core/error.hpp"

extern char** environ;

namespace pptrain::comm {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

// The variable's value as a non-negative int, or nullopt when unset.
std::optional<int> env_int(const char* name) {
  const auto text = env(name);
  if (!text) return std::nullopt;
  int value = -1;
  const char* end = text->data() + text->size();
  auto [ptr, ec] = std::from_chars(text->data(), end, value);
  if (text->empty() || ec != std::errc() || ptr != end || value < 0)
    throw InputError("environment variable " + std::string(name) + "='" + *text +
                     "' is not a non-negative integer");
  return value;
}

LaunchInfo make_info(const char* launcher, const char* rank_var, int rank,
                     std::optional<int> size, std::optional<int> local_rank) {
  LaunchInfo info;
  info.under_launcher = true;
  info.launcher = launcher;
  info.rank = rank;
  info.world_size = size.value_or(0);
  info.local_rank = local_rank.value_or(0);
  if (size && rank >= *size)
    throw InputError("environment variable " + std::string(rank_var) + "=" +
                     std::to_string(rank) + " is not below the job size " +
                     std::to_string(*size));
  return info;
}

bool is_executable(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}

// A name containing '/' is taken as a path; otherwise it is looked up on PATH.
std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return is_executable(name) ? name : "";
  const std::string path = env("PATH").value_or("");
  std::size_t begin = 0;
  while (begin <= path.size()) {
    std::size_t end = path.find(':', begin);
    if (end == std::string::npos) end = path.size();
    const std::string dir = end > begin ? path.substr(begin, end - begin) : ".";
    const std::string candidate = dir + "/" + name;
    if (is_executable(candidate)) return candidate;
    begin = end + 1;
  }
  return "";
}

std::string self_executable(const char* argv0) {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(argv0) : exe.string();
}

}  // namespace

LaunchInfo detect_launcher() {
  LaunchInfo info;
  if (auto rank = env_int("OMPI_COMM_WORLD_RANK"); rank && env("OMPI_COMM_WORLD_SIZE"))
    info = make_info("openmpi", "OMPI_COMM_WORLD_RANK", *rank, env_int("OMPI_COMM_WORLD_SIZE"),
                     env_int("OMPI_COMM_WORLD_LOCAL_RANK"));
  else if (auto procid = env_int("SLURM_PROCID"); procid && env("SLURM_STEP_ID")) {
    auto size = env_int("SLURM_STEP_NUM_TASKS");
    if (!size) size = env_int("SLURM_NTASKS");
    info = make_info("slurm", "SLURM_PROCID", *procid, size, env_int("SLURM_LOCALID"));
  } else if (auto pmix = env_int("PMIX_RANK"))
    info = make_info("pmix", "PMIX_RANK", *pmix, std::nullopt, std::nullopt);
  info.relaunched = env("PPTRAIN_LAUNCHED").value_or("") == "1";
  return info;
}

namespace {
volatile std::sig_atomic_t g_forward_signal = 0;  // set by the relaunching parent's handler
}  // namespace

int relaunch_under_mpirun(int world_size, int argc, char** argv) {
  PPTRAIN_CHECK(world_size >= 1 && argc >= 1, "relaunch_under_mpirun: bad arguments");
  const std::string wanted = env("PPTRAIN_MPIRUN").value_or("mpirun");
  const std::string mpirun = find_program(wanted);
  if (mpirun.empty())
    throw std::runtime_error("cannot start " + std::to_string(world_size) +
                             " ranks: '" + wanted + "' is not an executable" +
                             (wanted.find('/') == std::string::npos ? " on PATH" : "") +
                             " (set PPTRAIN_MPIRUN, or launch with mpirun/srun yourself)");

  std::vector<std::string> args = {mpirun, "-np", std::to_string(world_size),
                                   "--oversubscribe", "--bind-to", "none"};
  if (::geteuid() == 0) args.push_back("--allow-run-as-root");
  args.insert(args.end(), {"-x", "PPTRAIN_LAUNCHED", self_executable(argv[0])});
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);

  // The children inherit our environment plus PPTRAIN_LAUNCHED=1.
  std::string marker = "PPTRAIN_LAUNCHED=1";
  std::vector<char*> cenv;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "PPTRAIN_LAUNCHED=", 17) != 0) cenv.push_back(*e);
  cenv.push_back(marker.data());
  cenv.push_back(nullptr);

  pid_t pid = 0;
  if (int err = ::posix_spawn(&pid, mpirun.c_str(), nullptr, nullptr, cargs.data(), cenv.data()))
    throw std::runtime_error("cannot start " + mpirun + ": " + std::strerror(err));
  // A stop request (SIGTERM/SIGUSR1) to this parent reaches the ranks as SIGUSR1, which
  // mpirun forwards to every rank: they checkpoint and stop. (mpirun answers SIGTERM
  // itself by killing the ranks, which would lose the step.)
  struct sigaction forward {}, old_term {}, old_usr1 {};
  forward.sa_handler = [](int sig) { g_forward_signal = sig; };
  sigemptyset(&forward.sa_mask);  // no SA_RESTART: waitpid returns EINTR
  ::sigaction(SIGTERM, &forward, &old_term);
  ::sigaction(SIGUSR1, &forward, &old_usr1);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      ::sigaction(SIGTERM, &old_term, nullptr);
      ::sigaction(SIGUSR1, &old_usr1, nullptr);
      throw std::runtime_error("waiting for " + mpirun + " failed: " + std::strerror(errno));
    }
    if (g_forward_signal != 0) {
      g_forward_signal = 0;
      ::kill(pid, SIGUSR1);
    }
  }
  ::sigaction(SIGTERM, &old_term, nullptr);
  ::sigaction(SIGUSR1, &old_usr1, nullptr);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace pptrain::comm
