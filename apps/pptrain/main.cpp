// pptrain: command-line entry point. Parses arguments (CLI11), loads the config, starts
// the ranks the layout needs (through mpirun when no launcher started us) and runs the
// chosen command. Exit codes: 0 success, 1 failure during the run, 2 bad input
// (arguments, config, data file or checkpoint), 3 a communication timeout, 4 stopped by
// SIGTERM/SIGUSR1 after saving a checkpoint, or before the first step with nothing to save
// (preemption: resume with checkpoint.resume: auto).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/export_hf.hpp"
#include "comm/launcher.hpp"
#include "config/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/stop_signal.hpp"
#include "ops/cpu/blas_kernels.hpp"
#include "plan/auto_layout.hpp"
#include "plan/calibrate.hpp"
#include "plan/memory_fixes.hpp"
#include "plan/planner.hpp"
#include "plan/time_model.hpp"
#include "topology/rank_grid.hpp"
#include "train/memory_check.hpp"
#include "train/session.hpp"
#include "train/trainer.hpp"

namespace {

struct Options {
  std::string config_path;
  std::vector<std::string> overrides;
};

// The options every command takes, bound to the same storage.
void add_config_options(CLI::App& app, Options& opts) {
  app.add_option("-c,--config", opts.config_path, "YAML run configuration");
  app.add_option("-s,--set", opts.overrides,
                 "Override a config key, KEY=VALUE with VALUE read as YAML "
                 "(e.g. train.steps=50, logging.trace_steps=[3,4]); repeatable")
      ->allow_extra_args(false);
}

pptrain::Config load(const Options& opts) {
  if (opts.config_path.empty()) throw pptrain::InputError("--config is required");
  return pptrain::load_config(opts.config_path, opts.overrides);
}

// Ranks other than 0 log warnings and errors only.
void setup_rank_logging(const pptrain::Config& config, const pptrain::comm::LaunchInfo& launch) {
  pptrain::setup_logging(launch.rank == 0 ? std::string(pptrain::name_of(config.logging.level)) : "warn");
}

using pptrain::world_size;

// A stop requested before any rank started: nothing was done, so nothing is lost, and
// the requeued job starts exactly as this one would have.
int stopped_before_start() {
  spdlog::warn("stop signal received before the ranks started: nothing to save");
  return pptrain::kExitPreempted;
}

// `pptrain export`: exit 0, 2 for bad input (checkpoint, --out), 1 for a write failure.
int export_checkpoint_to_hf(const std::string& checkpoint, const std::string& out) {
  try {
    const pptrain::ExportSummary s = pptrain::export_hf(checkpoint, out);
    spdlog::info("exported {} (step {}): {} tensors, {:.1f} MiB, to {}", s.step_dir, s.step,
                 s.tensors, double(s.bytes) / (1024.0 * 1024.0), out);
    return pptrain::kExitOk;
  } catch (const pptrain::InputError& e) {
    std::fprintf(stderr, "pptrain: error: %s\n", e.what());
    return pptrain::kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pptrain: error: %s\n", e.what());
    return pptrain::kExitFailure;
  }
}

// `pptrain plan --calibrate --out FILE`: two local ranks (started through mpirun when
// nobody launched them) measure this machine; rank 0 writes the cluster file.
int calibrate_cluster(const std::string& out, const pptrain::comm::LaunchInfo& launch, int argc,
                      char** argv) {
  if (out.empty()) throw pptrain::InputError("plan --calibrate: --out FILE is required");
  if (!launch.under_launcher) return pptrain::comm::relaunch_under_mpirun(2, argc, argv, nullptr);
  pptrain::comm::Comms comms = pptrain::comm::make_mpi_comms(pptrain::RankGrid(1, 2, 1), 60);
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const pptrain::Cluster c = pptrain::calibrate_cpu(*comms.world, cores);
  if (comms.world->rank() != 0) return pptrain::kExitOk;
  std::ofstream file(out);
  file << pptrain::cluster_yaml(c, "pptrain plan --calibrate: this machine, one node of " +
                                       std::to_string(cores) + " CPU ranks");
  if (!file.flush()) throw std::runtime_error(out + ": cannot write the cluster file");
  spdlog::info("calibrated: GEMM {:.1f} GFLOP/s (half rate at dimension {:.0f}), {:.1f} GB/s "
               "elementwise, {:.2f} us an op; MPI {:.1f} us, {:.2f} GB/s; written to {}",
               c.device.peak_tflops * 1e3, c.device.gemm_half_dim, c.device.hbm_gbps,
               c.device.launch_us, c.intra_node.latency_us, c.intra_node.gbps, out);
  return pptrain::kExitOk;
}

// `signals` was installed first thing, so that a stop requested during start-up is
// honoured rather than killing the process.
int run(int argc, char** argv, std::optional<pptrain::StopSignals>& signals) {
  CLI::App app{"pptrain: trains GPT-2 and Llama transformers with tensor, pipeline and data "
               "parallelism.\nWithout a command, trains: pptrain --config configs/tiny.yaml"};
  app.require_subcommand(0, 1);
  Options opts;
  add_config_options(app, opts);
  CLI::App* train_cmd = app.add_subcommand("train", "Train per the config (the default command)");
  CLI::App* check_cmd = app.add_subcommand(
      "check-config", "Validate the config and print the run plan: sizes, FLOPs, memory");
  CLI::App* eval_cmd = app.add_subcommand(
      "eval", "Mean validation loss of the checkpoint named by checkpoint.resume");
  CLI::App* topo_cmd = app.add_subcommand(
      "topology", "Print the rank grid: rank -> (tp, dp, pp) and every communication group");
  for (CLI::App* cmd : {train_cmd, check_cmd, eval_cmd, topo_cmd}) add_config_options(*cmd, opts);
  CLI::App* export_cmd = app.add_subcommand(
      "export", "Write a Hugging Face GPT-2 or Llama directory (model.safetensors, config.json) from a "
                "checkpoint of any layout; one process, no MPI");
  std::string export_checkpoint, export_out;
  export_cmd->add_option("--checkpoint", export_checkpoint,
                         "A step dir, or a checkpoint dir whose latest is exported")
      ->required();
  export_cmd->add_option("--out", export_out, "The directory to create (absent or empty)")
      ->required();
  bool plan_json = false;
  check_cmd->add_flag("--json", plan_json, "Print the plan as one JSON object");
  CLI::App* plan_cmd = app.add_subcommand(
      "plan", "Rank the layouts of the config's model and global batch that fit a cluster, "
              "by predicted tokens/s");
  add_config_options(*plan_cmd, opts);
  std::string cluster_path;
  int plan_top = 10;
  pptrain::PlanOptions plan_options;
  plan_cmd->add_option("--cluster", cluster_path, "Cluster file (nodes, gpus_per_node, device)");
  bool calibrate = false;
  std::string calibrate_out;
  plan_cmd->add_flag("--calibrate", calibrate,
                     "Measure this machine's CPU rates and MPI between two local ranks; write "
                     "them as a cluster file (--out)");
  plan_cmd->add_option("--out", calibrate_out, "Where --calibrate writes the cluster file");
  plan_cmd->add_flag("--json", plan_json, "Print the rows as a JSON list");
  plan_cmd->add_option("--top", plan_top, "Rows to print (0: all; default 10)");
  plan_cmd->add_flag("--this", plan_options.this_layout, "Predict only the config's own layout");
  plan_cmd->add_flag("--all", plan_options.all,
                     "Also list layouts that do not fit, and dropped ones with the reason");
  plan_cmd->add_flag("--tp-across-nodes", plan_options.tp_across_nodes,
                     "Let tensor-parallel groups span nodes");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? pptrain::kExitOk : pptrain::kExitBadInput;
  }

  // Only training turns a signal into a checkpoint and a stop: other commands keep the
  // default action (also for a signal that came while the arguments were parsed).
  if (check_cmd->parsed() || eval_cmd->parsed() || topo_cmd->parsed() || export_cmd->parsed() ||
      plan_cmd->parsed()) {
    const int sig = signals->signal_number();
    signals.reset();
    if (sig != 0) std::raise(sig);
  }
  pptrain::setup_logging("info");
  if (export_cmd->parsed()) return export_checkpoint_to_hf(export_checkpoint, export_out);
  pptrain::comm::LaunchInfo launch;
  pptrain::Config config;
  try {
    launch = pptrain::comm::detect_launcher();
    pptrain::comm::exit_with_launcher(launch);
    if (plan_cmd->parsed() && calibrate) return calibrate_cluster(calibrate_out, launch, argc, argv);
    if (plan_cmd->parsed() && cluster_path.empty())
      throw pptrain::InputError("plan: --cluster is required (or --calibrate --out FILE)");
    config = load(opts);
    setup_rank_logging(config, launch);
    // What is resolved at start is logged once, by rank 0 of the job (not by the process
    // that starts its ranks); check-config prints it in its plan.
    auto log_choice = [&] {
      return launch.rank == 0 && !check_cmd->parsed() &&
             (launch.under_launcher || world_size(config) == 1 || topo_cmd->parsed());
    };
    std::vector<std::string> auto_sets;
    if (config.parallel.layout == pptrain::LayoutChoice::Auto && !plan_cmd->parsed()) {
      if (launch.under_launcher && launch.world_size == 0)
        throw pptrain::InputError(config.source_path + ": parallel.layout: auto needs the number of ranks, and " +
                                  launch.launcher + " does not say it");
      const pptrain::Cluster machine = pptrain::local_machine(
          config, launch.under_launcher ? launch.world_size : 0, launch.local_size);
      const pptrain::AutoLayout chosen = pptrain::choose_layout(config, machine);
      config = chosen.config;
      auto_sets = chosen.sets;
      std::string sets;
      for (const std::string& s : auto_sets) sets += " --set " + s;
      if (log_choice())
        spdlog::info("parallel.layout: auto on {}:{} ({:.1f} GiB a rank, {:.0f} tokens/s predicted)",
                     machine.source, sets, chosen.row.peak_memory_mib / 1024, chosen.row.tokens_per_s);
    }
    if (config.parallel.layers_per_stage.automatic) {
      pptrain::resolve_layer_split(config);
      std::string split;
      for (int n : config.parallel.layers_per_stage) split += (split.empty() ? "" : ",") + std::to_string(n);
      if (log_choice()) spdlog::info("parallel.layers_per_stage: auto -> [{}]", split);
    }
    if (check_cmd->parsed()) {
      if (plan_json) {
        std::fputs(pptrain::describe_plan_json(config, auto_sets).c_str(), stdout);
        return pptrain::kExitOk;
      }
      std::fputs(pptrain::describe_plan(config, auto_sets).c_str(), stdout);
      std::puts("config OK");
      return pptrain::kExitOk;
    }
    if (plan_cmd->parsed()) {
      const pptrain::Cluster cluster = pptrain::load_cluster(cluster_path);
      plan_options.top = plan_top;
      const auto rows = pptrain::plan_layouts(config, cluster, plan_options);
      std::fputs((plan_json ? pptrain::format_plan_json(rows, plan_top)
                            : pptrain::format_plan(rows, plan_top)).c_str(), stdout);
      return pptrain::kExitOk;
    }
    if (topo_cmd->parsed()) {
      std::fputs(pptrain::make_grid(config).describe().c_str(), stdout);
      return pptrain::kExitOk;
    }
    pptrain::check_schedule(config);
    if (launch.under_launcher && launch.world_size > 0 && launch.world_size != world_size(config))
      throw pptrain::InputError(config.source_path + ": parallel: the layout tp*cp*pp*dp = " +
                                std::to_string(world_size(config)) + " needs that many ranks, but " +
                                launch.launcher + " started " + std::to_string(launch.world_size));
    // A multi-rank layout started by hand: start its ranks through mpirun.
    if (world_size(config) > 1 && !launch.under_launcher) {
      if (signals && signals->requested()) return stopped_before_start();
      spdlog::info("starting {} ranks with mpirun", world_size(config));
      return pptrain::comm::relaunch_under_mpirun(world_size(config), argc, argv,
                                                  signals ? &*signals : nullptr);
    }
    if (eval_cmd->parsed()) {
      const double loss = pptrain::evaluate_checkpoint(config);
      if (launch.rank == 0) std::printf("val_loss %.9f\n", loss);
    } else {
      const pptrain::TrainResult r = pptrain::train(config, *signals);
      spdlog::info("{}: {} steps, loss {:.4f}{}", r.stopped_by_signal ? "stopped" : "done",
                   r.steps_done, r.last_loss,
                   r.last_val_loss ? fmt::format(", val loss {:.4f}", *r.last_val_loss) : "");
      if (r.stopped_by_signal) return pptrain::kExitPreempted;
    }
    return pptrain::kExitOk;
  } catch (const pptrain::MemoryDoesNotFit& e) {
    // Every rank got the same verdict; rank 0 says it, with what would fit.
    if (launch.rank == 0) {
      const auto fixes = pptrain::memory_fixes(config, pptrain::runs_on_cuda(config), e.available);
      std::fprintf(stderr, "pptrain: error: %s%s; or --set train.memory_check=warn\n", e.what(),
                   pptrain::describe_fixes(fixes).c_str());
    }
    return pptrain::kExitBadInput;
  } catch (const pptrain::InputError& e) {
    std::fprintf(stderr, "pptrain: error: %s\n", e.what());
    return pptrain::kExitBadInput;
  } catch (const pptrain::ops::OutOfMemory& e) {
    std::fprintf(stderr, "pptrain: rank %d failed: %s%s\n", launch.rank, e.what(),
                 pptrain::predicted_peak_note(config).c_str());
    return pptrain::kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pptrain: rank %d failed: %s\n", launch.rank, e.what());
    return pptrain::kExitFailure;
  }
}

}  // namespace

// Stop handlers before the libraries' initialisers run (see StopSignals).
__attribute__((section(".preinit_array"), used)) static void (*const install_stop_handlers)() =
    &pptrain::StopSignals::install_at_startup;

int main(int argc, char** argv) {
  // Before anything else: OpenBLAS may have loaded with kernels older than this CPU's.
  if (pptrain::ops::request_better_blas_kernels()) pptrain::StopSignals::exec_again(argv);
  std::optional<pptrain::StopSignals> signals(std::in_place);
  const int code = run(argc, argv, signals);
  // exit() rather than return: `signals` stays installed while the libraries shut down,
  // so a stop request that comes after the run has ended cannot turn its exit code into
  // death by signal.
  std::exit(code);
}
