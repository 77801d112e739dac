#include "train/stop_signal.hpp"

namespace pptrain {

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;  // written only by the handler
void on_stop_signal(int sig) { g_stop_signal = sig; }
}  // namespace

StopSignals::StopSignals() {
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &old_term_);
  sigaction(SIGUSR1, &sa, &old_usr1_);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGUSR1, &old_usr1_, nullptr);
}

bool StopSignals::requested() const { return g_stop_signal != 0; }
int StopSignals::signal_number() const { return g_stop_signal; }

}  // namespace pptrain
