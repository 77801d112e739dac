// Preemption: SIGTERM and SIGUSR1 (what Slurm sends before it stops or requeues a job)
// become a request to stop after the current step, checkpoint and exit. A rank started
// by pptrain's own mpirun relaunch is asked through a stop file instead (the parent
// creates it on a signal), so no signal can reach a rank before its handlers exist.
// The flag is process-wide because signal handlers are; the trainer turns it into a
// decision all ranks share.
#pragma once
#include <csignal>
#include <string>

namespace pptrain {

// The environment variable naming the stop file of a relaunched rank.
inline constexpr const char* kStopFileVariable = "PPTRAIN_STOP_FILE";

class StopSignals {
 public:
  // Installs the handlers before anything else of the process runs: called from the
  // executable's .preinit_array, ahead of the shared libraries' initialisers (tens of
  // milliseconds), so a stop requested meanwhile is kept for the first StopSignals.
  // Also unblocks the two signals, which exec_again hands over blocked and pending.
  static void install_at_startup();

  // Executes this program again with argv (the environment as it now is), keeping any
  // stop request: the signals are blocked, one already received is raised again, and
  // pending signals and the mask survive the exec, so the new image's start-up handlers
  // receive them. Returns only when the exec fails, with the signals unblocked again.
  static void exec_again(char** argv);

  StopSignals();   // installs the handlers; reads $PPTRAIN_STOP_FILE
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // A signal arrived, or the stop file exists.
  bool requested() const;
  int signal_number() const;  // the last signal received (0: none)

 private:
  struct sigaction old_term_ {}, old_usr1_ {};
  std::string stop_file_;
};

}  // namespace pptrain
