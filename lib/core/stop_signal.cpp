#include "core/stop_signal.hpp"

#include <unistd.h>

#include <cstdlib>

namespace pptrain {

namespace {
// Written by the handler, and cleared by a StopSignals that installs the handler itself.
volatile std::sig_atomic_t g_stop_signal = 0;
bool g_installed_at_startup = false;  // and the flag not yet handed to a StopSignals
void on_stop_signal(int sig) { g_stop_signal = sig; }

void install(struct sigaction* old_term, struct sigaction* old_usr1) {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, old_term);
  sigaction(SIGUSR1, &sa, old_usr1);
}

sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  return set;
}
}  // namespace

void StopSignals::install_at_startup() {
  install(nullptr, nullptr);
  g_installed_at_startup = true;
  const sigset_t set = stop_signal_set();
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
}

void StopSignals::exec_again(char** argv) {
  const sigset_t set = stop_signal_set();
  sigprocmask(SIG_BLOCK, &set, nullptr);
  if (g_stop_signal != 0) raise(g_stop_signal);  // pending now, delivered after the exec
  execv("/proc/self/exe", argv);
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
}

StopSignals::StopSignals() {
  if (!g_installed_at_startup) g_stop_signal = 0;  // else keep what start-up received
  install(&old_term_, &old_usr1_);
  // Restoring the start-up handlers would keep signals caught: restore the defaults.
  if (g_installed_at_startup) {
    old_term_ = {};
    old_term_.sa_handler = SIG_DFL;
    old_usr1_ = old_term_;
    g_installed_at_startup = false;
  }
  if (const char* file = std::getenv(kStopFileVariable)) stop_file_ = file;
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGUSR1, &old_usr1_, nullptr);
}

bool StopSignals::requested() const {
  return g_stop_signal != 0 || (!stop_file_.empty() && ::access(stop_file_.c_str(), F_OK) == 0);
}

int StopSignals::signal_number() const { return g_stop_signal; }

}  // namespace pptrain
