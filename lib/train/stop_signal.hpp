// Preemption: SIGTERM and SIGUSR1 (what Slurm sends before it stops or requeues a job)
// become a request to stop after the current step, checkpoint and exit. The flag is
// process-wide because signal handlers are; the trainer turns it into a decision all
// ranks share.
#pragma once
#include <csignal>

namespace pptrain {

class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  bool requested() const;
  int signal_number() const;  // the last signal received (0: none)

 private:
  struct sigaction old_term_ {}, old_usr1_ {};
};

}  // namespace pptrain
