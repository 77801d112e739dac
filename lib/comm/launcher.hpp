// Which launcher started this process (mpirun, srun, PMIx), and starting our own ranks
// under mpirun when a run needs several and nobody launched them.
#pragma once
#include <string>

#include "core/stop_signal.hpp"

namespace pptrain::comm {

struct LaunchInfo {
  bool under_launcher = false;
  int rank = 0, world_size = 1, local_rank = 0;  // world_size 0: unknown until MPI starts
  int local_size = 1;  // ranks on this host (0: the launcher does not say)
  std::string launcher;     // "openmpi", "slurm", "pmix" or "" (none)
  bool relaunched = false;  // PPTRAIN_LAUNCHED=1: started by relaunch_under_mpirun
  int relaunching_parent = 0;  // the pptrain that ran mpirun for us (PPTRAIN_PARENT_PID)
};

// Reads the environment: OpenMPI (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE), then
// a Slurm step started by srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS or SLURM_NTASKS,
// SLURM_LOCALID, this node's entry of SLURM_STEP_TASKS_PER_NODE such as "4(x2),3";
// SLURM_STEP_ID must be set, so a bare batch script is not a launch),
// then PMIx alone (PMIX_RANK; the size is then unknown). Throws InputError naming the
// variable when a value is not a non-negative integer or the rank is out of range.
LaunchInfo detect_launcher();

// Re-runs this executable with the same arguments under `mpirun -np world_size
// --oversubscribe --bind-to none` (plus --allow-run-as-root when running as root),
// with PPTRAIN_LAUNCHED=1 exported so the children never relaunch, PPTRAIN_PARENT_PID
// (this process) and PPTRAIN_STOP_FILE, a file in a private temporary directory that
// this process creates once `stop` (when given) is requested: the ranks then checkpoint
// and stop.
// Uses $PPTRAIN_MPIRUN (a path, or a name looked up on PATH) or else mpirun from PATH.
// Waits and returns mpirun's exit status (128 + signal if it was killed). Throws
// std::runtime_error if mpirun cannot be found or started.
int relaunch_under_mpirun(int world_size, int argc, char** argv, const StopSignals* stop);

// For a process started by a launcher: a background thread that ends this process
// (exit code 1, one line on stderr) within a fraction of a second once its launcher is
// gone, that is when its parent process changes (mpirun or srun's step daemon died) or,
// for a relaunched rank, when the relaunching pptrain exits. So no rank outlives the
// job that started it.
void exit_with_launcher(const LaunchInfo& launch);

}  // namespace pptrain::comm
