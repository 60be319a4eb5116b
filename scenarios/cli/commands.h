// The offsim command's subcommands, one source each (scenarios/cli/cmd_<name>.cc; `import` in
// import_command.h): add_<name>_command declares the subcommand and its options on the CLI11 app,
// bound to an <Name>Args; cmd_<name> runs it once parsed and returns the exit status (0 ok, 2 input
// errors, 1 other failures).
//
//   cli::RunArgs run;
//   CLI::App* run_cmd = cli::add_run_command(app, run);
//   app.parse(argc, argv);
//   if (run_cmd->parsed()) return cli::cmd_run(run);
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "scenarios/resource_limits.h"

namespace offsim::cli {

// run (cmd_run.cc): one step of each scenario, reports side by side.
struct RunArgs {
  std::vector<std::string> scenarios;
  std::vector<std::string> sets;
  std::string format = "table";
  std::string trace;
  std::string plan_out;
  std::string timeline_out;
  bool print_effective = false;
  std::string jax_memory;  // JAX memory_analysis() JSON shown beside the forecast
  bool break_even = false;
  scenarios::ResourceLimits limits;
};
CLI::App* add_run_command(CLI::App& app, RunArgs& args);
int cmd_run(const RunArgs& args);

// sweep (cmd_sweep.cc): every point of a sweep block, rows written durably.
struct SweepArgs {
  std::string scenario;
  std::vector<std::string> sets;
  int jobs = 0;
  std::string out;
  bool resume = false;
  bool overwrite = false;
  std::string shard;
  bool mpi = false;
  bool quiet = false;
  std::int64_t max_points = 1'000'000;
  scenarios::ResourceLimits limits;
};
CLI::App* add_sweep_command(CLI::App& app, SweepArgs& args);
int cmd_sweep(const SweepArgs& args);

// plan (cmd_plan.cc): the offload-policy search.
struct PlanArgs {
  std::string scenario;
  std::vector<std::string> sets;
  std::string objective = "step_time";
  int top = 5;
  std::string search = "pruned";
  std::vector<std::string> joint;
  std::vector<std::string> classes;
  std::vector<double> fractions;
  std::vector<int> prefetch;
  std::vector<std::int64_t> micro_batches;
  int jobs = 0;
  std::string format = "table";
  scenarios::ResourceLimits limits;
};
CLI::App* add_plan_command(CLI::App& app, PlanArgs& args);
int cmd_plan(const PlanArgs& args);

// validate (cmd_validate.cc): a scenario and its sweep points checked without simulating.
struct ValidateArgs {
  std::string scenario;
  std::vector<std::string> sets;
  scenarios::ResourceLimits limits;
  std::int64_t max_points = 1'000'000;
};
CLI::App* add_validate_command(CLI::App& app, ValidateArgs& args);
int cmd_validate(const ValidateArgs& args);

// list (cmd_list.cc): the catalogues.
struct ListArgs {
  std::string what;
  std::vector<std::string> files;  // list hosts --file: host files to read and list
};
CLI::App* add_list_command(CLI::App& app, ListArgs& args);
int cmd_list(const ListArgs& args);

// replay (cmd_replay.cc): the Plan executed on a device and compared with the forecast.
struct ReplayArgs {
  std::string scenario;
  std::vector<std::string> sets;
  std::string profile;
  std::int64_t layers = 0;
  int steps = 3;
  int warmup = 1;
  std::string device = "auto";
  std::string out;
  std::string predicted_out;
  std::string trace;
  bool all_ranks = false;
  bool mpi = false;  // one rank per MPI process (cmd_replay_mpi)
  scenarios::ResourceLimits limits;
};
CLI::App* add_replay_command(CLI::App& app, ReplayArgs& args);
int cmd_replay(const ReplayArgs& args);

// compare (cmd_compare.cc): a predicted and a measured Timeline JSON.
struct CompareArgs {
  std::string predicted;
  std::string measured;
  std::string format = "text";
};
CLI::App* add_compare_command(CLI::App& app, CompareArgs& args);
int cmd_compare(const CompareArgs& args);

// calibrate (cmd_calibrate.cc): this machine's GPUs measured into a profile.
struct CalibrateArgs {
  bool quick = false;
  int gpus = 0;
  std::string out;
  std::string command_line;  // recorded in the profile; main() sets it from argv
  bool host = false;         // --host: only the host stage, over --base
  std::string base;          // GPU kind or profile JSON whose host keys are replaced
  std::int64_t host_array_mib = 0;
  std::string host_out;   // --host-out: a host file for hardware.host
  std::string host_base;  // --host-base: the catalogue host it is based on
};
CLI::App* add_calibrate_command(CLI::App& app, CalibrateArgs& args);
int cmd_calibrate(const CalibrateArgs& args);

}  // namespace offsim::cli
