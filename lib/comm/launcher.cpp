// Launcher detection from environment variables, and the self-relaunch under mpirun
// that lets `pptrain --config x.yaml` start its own ranks on one machine.
#include "comm/launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>
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
    throw InputError("environment variable " + std::string(name) + "='" + abbreviated(*text) +
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

// Slurm's tasks per node, "4(x2),3" (nodes 0 and 1 run 4, node 2 runs 3): node `node`'s
// count, or 0 when the text does not say.
int slurm_tasks_on_node(const std::string& text, int node) {
  std::size_t at = 0;
  while (at < text.size()) {
    int tasks = 0, repeat = 1;
    auto [p, ec] = std::from_chars(text.data() + at, text.data() + text.size(), tasks);
    if (ec != std::errc()) return 0;
    at = std::size_t(p - text.data());
    if (text.compare(at, 2, "(x") == 0) {
      auto [q, ec2] = std::from_chars(text.data() + at + 2, text.data() + text.size(), repeat);
      if (ec2 != std::errc() || q == text.data() + text.size() || *q != ')') return 0;
      at = std::size_t(q - text.data()) + 1;
    }
    if (node < repeat) return tasks;
    node -= repeat;
    if (at < text.size() && text[at] != ',') return 0;
    ++at;
  }
  return 0;
}

}  // namespace

LaunchInfo detect_launcher() {
  LaunchInfo info;
  if (auto rank = env_int("OMPI_COMM_WORLD_RANK"); rank && env("OMPI_COMM_WORLD_SIZE"))
  {
    info = make_info("openmpi", "OMPI_COMM_WORLD_RANK", *rank, env_int("OMPI_COMM_WORLD_SIZE"),
                     env_int("OMPI_COMM_WORLD_LOCAL_RANK"));
    info.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE").value_or(0);
  } else if (auto procid = env_int("SLURM_PROCID"); procid && env("SLURM_STEP_ID")) {
    auto size = env_int("SLURM_STEP_NUM_TASKS");
    if (!size) size = env_int("SLURM_NTASKS");
    info = make_info("slurm", "SLURM_PROCID", *procid, size, env_int("SLURM_LOCALID"));
    info.local_size = slurm_tasks_on_node(env("SLURM_STEP_TASKS_PER_NODE").value_or(""),
                                          env_int("SLURM_NODEID").value_or(0));
  } else if (auto pmix = env_int("PMIX_RANK")) {
    info = make_info("pmix", "PMIX_RANK", *pmix, std::nullopt, std::nullopt);
    info.local_size = env_int("PMIX_LOCAL_SIZE").value_or(0);
  }
  info.relaunched = env("PPTRAIN_LAUNCHED").value_or("") == "1";
  if (info.relaunched) info.relaunching_parent = env_int("PPTRAIN_PARENT_PID").value_or(0);
  return info;
}

namespace {

// A descriptor that becomes readable when process `pid` exits (-1: no such process or
// no pidfd support, see errno).
int open_pidfd(int pid) { return int(::syscall(SYS_pidfd_open, pid, 0)); }

constexpr const char* kRelauncher = "the pptrain that started the ranks";

[[noreturn]] void launcher_gone(const char* what, int pid) {
  char line[160];
  const int n = std::snprintf(line, sizeof line,
                              "pptrain: error: %s (pid %d) is gone; this rank stops\n", what, pid);
  if (n > 0) (void)!::write(STDERR_FILENO, line, std::size_t(n));
  ::_exit(kExitFailure);
}

}  // namespace

void exit_with_launcher(const LaunchInfo& launch) {
  if (!launch.under_launcher) return;
  const pid_t parent = ::getppid();
  const int relauncher = launch.relaunching_parent;
  int pidfd = -1;
  if (relauncher > 0) {
    pidfd = open_pidfd(relauncher);
    if (pidfd < 0 && errno == ESRCH) launcher_gone(kRelauncher, relauncher);
  }
  std::thread([parent, relauncher, pidfd] {
    for (;;) {
      if (pidfd >= 0) {
        pollfd p{pidfd, POLLIN, 0};
        if (::poll(&p, 1, 200) > 0) launcher_gone(kRelauncher, relauncher);
      } else {
        ::usleep(200 * 1000);
        if (relauncher > 0 && ::kill(relauncher, 0) != 0 && errno == ESRCH)
          launcher_gone(kRelauncher, relauncher);
      }
      if (::getppid() != parent) launcher_gone("the launcher that started this rank", parent);
    }
  }).detach();
}

namespace {

// A private temporary directory, removed with what is in it.
class TempDir {
 public:
  TempDir() {
    const std::string base = env("TMPDIR").value_or("/tmp");
    std::string pattern = base + "/pptrain-XXXXXX";
    if (!::mkdtemp(pattern.data()))
      throw std::runtime_error("cannot create a temporary directory in " + base + ": " +
                               std::strerror(errno));
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void create_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
}

}  // namespace

int relaunch_under_mpirun(int world_size, int argc, char** argv, const StopSignals* stop) {
  PPTRAIN_CHECK(world_size >= 1 && argc >= 1, "relaunch_under_mpirun: bad arguments");
  const std::string wanted = env("PPTRAIN_MPIRUN").value_or("mpirun");
  const std::string mpirun = find_program(wanted);
  if (mpirun.empty())
    throw std::runtime_error("cannot start " + std::to_string(world_size) +
                             " ranks: '" + wanted + "' is not an executable" +
                             (wanted.find('/') == std::string::npos ? " on PATH" : "") +
                             " (set PPTRAIN_MPIRUN, or launch with mpirun/srun yourself)");
  const TempDir dir;
  const std::string stop_file = dir.path() + "/stop";

  // The children inherit our environment plus these variables, which mpirun exports.
  std::vector<std::string> exported = {  // mutable: execve takes char*
      "PPTRAIN_LAUNCHED=1", "PPTRAIN_PARENT_PID=" + std::to_string(::getpid()),
      std::string(kStopFileVariable) + "=" + stop_file};
  std::vector<std::string> args = {mpirun, "-np", std::to_string(world_size),
                                   "--oversubscribe", "--bind-to", "none"};
  if (::geteuid() == 0) args.push_back("--allow-run-as-root");
  for (const std::string& e : exported) args.insert(args.end(), {"-x", e.substr(0, e.find('='))});
  args.push_back(self_executable(argv[0]));
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);

  std::vector<char*> cenv;
  auto replaced = [&](const char* entry) {
    return std::any_of(exported.begin(), exported.end(), [&](const std::string& e) {
      return std::strncmp(entry, e.c_str(), e.find('=') + 1) == 0;
    });
  };
  for (char** e = environ; *e; ++e)
    if (!replaced(*e)) cenv.push_back(*e);
  for (auto& e : exported) cenv.push_back(e.data());
  cenv.push_back(nullptr);

  pid_t pid = 0;
  if (int err = ::posix_spawn(&pid, mpirun.c_str(), nullptr, nullptr, cargs.data(), cenv.data()))
    throw std::runtime_error("cannot start " + mpirun + ": " + std::strerror(err));
  // A stop request (SIGTERM/SIGUSR1 to this process, caught by `stop`) becomes the stop
  // file, which the ranks check before the first step and after every step. (mpirun
  // answers SIGTERM itself by killing the ranks, which would lose the step.)
  int status = 0;
  bool stop_sent = false;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR)
      throw std::runtime_error("waiting for " + mpirun + " failed: " + std::strerror(errno));
    if (!stop_sent && stop && stop->requested()) {
      create_file(stop_file);
      stop_sent = true;
    }
    ::usleep(50 * 1000);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace pptrain::comm
