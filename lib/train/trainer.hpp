// The training loop one rank runs (in any layout) and the commands built on it: train,
// eval, and the run plan printed by check-config.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "config/config.hpp"
#include "core/stop_signal.hpp"

namespace pptrain {

struct TrainResult {
  int64_t steps_done = 0;               // optimizer steps completed in total
  double last_loss = 0;                 // training loss of the last step run (0 if none)
  std::optional<double> last_val_loss;  // last validation loss, if evaluated
  std::string last_checkpoint;          // newest checkpoint written ("" if none)
  bool stopped_by_signal = false;       // SIGTERM/SIGUSR1: stopped early after a checkpoint
};

// Trains per `config`: resumes if checkpoint.resume says so, logs, evaluates and
// checkpoints. Throws InputError for bad input, other exceptions for failures. A stop
// that `signals` reports ends the run after the step in progress, with a checkpoint,
// or before the first step (nothing to save) if it came during start-up.
TrainResult train(const Config& config, const StopSignals& signals);
// The same with signal handlers installed for the run.
TrainResult train(const Config& config);

// Loads the checkpoint checkpoint.resume names and returns the mean loss over the
// whole validation set (windows of seq_len+1 tokens, in order).
double evaluate_checkpoint(const Config& config);  // checkpoint.resume, else init_from

// Human-readable summary of the run: sizes, FLOPs and a memory estimate. Opens the
// data files so that their errors surface here. `auto_sets`: the --set lines of the
// layout parallel.layout: auto chose (none: the config's own).
std::string describe_plan(const Config& config, const std::vector<std::string>& auto_sets = {});
// The same plan as one JSON object (check-config --json), with the predicted peak
// memory of the heaviest rank (predicted_peak_memory_mib) and its parts, and
// "layout_auto": the auto_sets.
std::string describe_plan_json(const Config& config,
                               const std::vector<std::string>& auto_sets = {});

}  // namespace pptrain
