// detect_launcher against environments set in-process, and the errors of
// relaunch_under_mpirun that need no mpirun (the relaunch itself is a ctest entry).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <csignal>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "comm/launcher.hpp"
#include "core/error.hpp"

namespace pptrain::comm {
namespace {

// Clears every variable detect_launcher reads, sets the given ones, and restores the
// original environment on destruction.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> set) {
    for (const char* name : kNames) save(name);
    for (const auto& [k, v] : set) {
      save(k);
      ::setenv(k, v, 1);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v) ::setenv(k.c_str(), v->c_str(), 1);
      else ::unsetenv(k.c_str());
    }
  }

 private:
  void save(const std::string& name) {
    if (saved_.count(name)) return;
    const char* v = std::getenv(name.c_str());
    saved_[name] = v ? std::optional<std::string>(v) : std::nullopt;
    ::unsetenv(name.c_str());
  }
  static constexpr const char* kNames[] = {
      "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
      "SLURM_PROCID",         "SLURM_NTASKS",         "SLURM_STEP_NUM_TASKS",
      "SLURM_LOCALID",        "SLURM_STEP_ID",        "PMIX_RANK",
      "PPTRAIN_LAUNCHED",     "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_STEP_TASKS_PER_NODE",
      "SLURM_NODEID",         "PMIX_LOCAL_SIZE"};
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST(DetectLauncher, NoneWhenNothingIsSet) {
  ScopedEnv env({});
  LaunchInfo info = detect_launcher();
  EXPECT_FALSE(info.under_launcher);
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.launcher, "");
  EXPECT_FALSE(info.relaunched);
}

TEST(DetectLauncher, OpenMpi) {
  ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                 {"PMIX_RANK", "5"}, {"PPTRAIN_LAUNCHED", "1"}});
  LaunchInfo info = detect_launcher();
  EXPECT_TRUE(info.under_launcher);
  EXPECT_EQ(info.launcher, "openmpi");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_size, 4);
  EXPECT_TRUE(info.relaunched);
}

TEST(DetectLauncher, SlurmStepPrefersStepTaskCount) {
  ScopedEnv env({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "16"}, {"SLURM_STEP_NUM_TASKS", "4"},
                 {"SLURM_LOCALID", "3"}, {"SLURM_STEP_ID", "0"}});
  LaunchInfo info = detect_launcher();
  EXPECT_TRUE(info.under_launcher);
  EXPECT_EQ(info.launcher, "slurm");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 3);
  EXPECT_FALSE(info.relaunched);
}

// The tasks on this node come from SLURM_STEP_TASKS_PER_NODE's entry for SLURM_NODEID.
TEST(DetectLauncher, SlurmTasksOnThisNode) {
  const std::pair<const char*, int> cases[] = {{"0", 4}, {"1", 4}, {"2", 3}, {"3", 0}};
  for (const auto& [node, tasks] : cases) {
    ScopedEnv env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "11"}, {"SLURM_STEP_ID", "0"},
                   {"SLURM_STEP_TASKS_PER_NODE", "4(x2),3"}, {"SLURM_NODEID", node}});
    EXPECT_EQ(detect_launcher().local_size, tasks) << node;
  }
  ScopedEnv odd({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"},
                 {"SLURM_STEP_TASKS_PER_NODE", "2(x"}});
  EXPECT_EQ(detect_launcher().local_size, 0);  // unreadable: unknown
}

TEST(DetectLauncher, SlurmWithoutStepTaskCountUsesNtasks) {
  ScopedEnv env({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}, {"SLURM_STEP_ID", "1"}});
  LaunchInfo info = detect_launcher();
  EXPECT_EQ(info.launcher, "slurm");
  EXPECT_EQ(info.world_size, 3);
  EXPECT_EQ(info.local_rank, 0);
}

TEST(DetectLauncher, BatchScriptWithoutStepIsNoLaunch) {
  ScopedEnv env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}});
  EXPECT_FALSE(detect_launcher().under_launcher);
}

TEST(DetectLauncher, PmixAloneLeavesTheSizeUnknown) {
  ScopedEnv env({{"PMIX_RANK", "7"}});
  LaunchInfo info = detect_launcher();
  EXPECT_TRUE(info.under_launcher);
  EXPECT_EQ(info.launcher, "pmix");
  EXPECT_EQ(info.rank, 7);
  EXPECT_EQ(info.world_size, 0);
}

TEST(DetectLauncher, BadValuesNameTheVariable) {
  for (const char* bad : {"abc", "", "-1", "3x", "99999999999"}) {
    ScopedEnv env({{"OMPI_COMM_WORLD_RANK", bad}, {"OMPI_COMM_WORLD_SIZE", "4"}});
    try {
      detect_launcher();
      ADD_FAILURE() << "no error for '" << bad << "'";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("OMPI_COMM_WORLD_RANK"), std::string::npos);
    }
  }
  ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_THROW(detect_launcher(), InputError);
}

TEST(Relaunch, MissingMpirunThrows) {
  char arg0[] = "pptrain";
  char* argv[] = {arg0, nullptr};
  const StopSignals stop;
  {
    ScopedEnv env({{"PPTRAIN_MPIRUN", "/nonexistent/dir/mpirun"}});
    EXPECT_THROW(relaunch_under_mpirun(2, 1, argv, &stop), std::runtime_error);
  }
  {
    ScopedEnv env({{"PPTRAIN_MPIRUN", "no-such-mpirun-program"}});
    try {
      relaunch_under_mpirun(2, 1, argv, &stop);
      ADD_FAILURE() << "no error";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("no-such-mpirun-program"), std::string::npos);
    }
  }
}

// A relaunched rank is asked to stop through its stop file, not a signal.
TEST(StopSignalsTest, TheStopFileRequestsAStop) {
  const std::string file = ::testing::TempDir() + "pptrain_stop_file_test";
  std::remove(file.c_str());
  ScopedEnv env({{kStopFileVariable, file.c_str()}});
  const StopSignals stop;
  EXPECT_FALSE(stop.requested());
  std::fclose(std::fopen(file.c_str(), "w"));
  EXPECT_TRUE(stop.requested());
  EXPECT_EQ(stop.signal_number(), 0);
  std::remove(file.c_str());
}

TEST(StopSignalsTest, ASignalRequestsAStop) {
  const StopSignals stop;
  EXPECT_FALSE(stop.requested());
  std::raise(SIGUSR1);  // caught: the process goes on
  EXPECT_TRUE(stop.requested());
  EXPECT_EQ(stop.signal_number(), SIGUSR1);
}

}  // namespace
}  // namespace pptrain::comm
