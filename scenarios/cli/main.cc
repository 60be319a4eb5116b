// offsim: the command-line tool. Subcommands run, sweep, plan, validate, list, replay, compare,
// calibrate and import, one source each (commands.h); see `offsim --help` and
// `offsim <command> --help`.
//
// Exit status: 0 ok, 2 input errors (bad scenario, bad option, missing file), 1 other failures.
// Errors go to stderr, one clear line first.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "models/evaluate.h"
#include "scenarios/cli/commands.h"
#include "scenarios/cli/import_command.h"

namespace offsim::cli {

int main(int argc, char** argv) {
  CLI::App app{
      "offsim: forecast the step time and memory of LLM training with host-offload policies.\n"
      "\nExamples:\n"
      "  offsim run scenarios/examples/llama70b-8xh100-offload.yaml\n"
      "  offsim run scenarios/examples/llama70b-8xh100-no-offload.yaml "
      "scenarios/examples/llama70b-8xh100-offload.yaml\n"
      "  offsim sweep scenarios/examples/2b-1xa100-sweep.yaml --out sweep.csv\n"
      "  offsim plan scenarios/examples/llama70b-8xh100-offload.yaml --top 3\n"
      "  offsim list models\n",
      "offsim"};
  app.set_version_flag("--version", std::string("offsim ") + OFFSIM_VERSION);
  app.require_subcommand(1);
  app.footer(
      "Exit status: 0 ok, 2 input error, 1 other failure. `offsim COMMAND --help` for more.");

  RunArgs run;
  CLI::App* run_cmd = add_run_command(app, run);
  SweepArgs sweep;
  CLI::App* sweep_cmd = add_sweep_command(app, sweep);
  PlanArgs plan;
  CLI::App* plan_cmd = add_plan_command(app, plan);
  ValidateArgs validate;
  CLI::App* validate_cmd = add_validate_command(app, validate);
  ListArgs list;
  CLI::App* list_cmd = add_list_command(app, list);
  ReplayArgs replay;
  CLI::App* replay_cmd = add_replay_command(app, replay);
  CompareArgs compare;
  CLI::App* compare_cmd = add_compare_command(app, compare);
  CalibrateArgs calibrate;
  CLI::App* calibrate_cmd = add_calibrate_command(app, calibrate);
  ImportArgs import_args;
  CLI::App* import_cmd = add_import_command(app, import_args);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One clear line first, then the usage hint.
    fmt::print(stderr, "offsim: error: {}\n", e.what());
    fmt::print(stderr, "run `offsim --help` or `offsim COMMAND --help` for usage\n");
    return 2;
  }

  if (run_cmd->parsed()) return cmd_run(run);
  // Sweeps and searches evaluate many steps: each reuses the memory the last one freed.
  if (sweep_cmd->parsed() || plan_cmd->parsed()) models::retain_freed_memory();
  if (sweep_cmd->parsed()) return cmd_sweep(sweep);
  if (plan_cmd->parsed()) return cmd_plan(plan);
  if (validate_cmd->parsed()) return cmd_validate(validate);
  if (list_cmd->parsed()) return cmd_list(list);
  if (replay_cmd->parsed()) return cmd_replay(replay);
  if (compare_cmd->parsed()) return cmd_compare(compare);
  if (import_cmd->parsed()) return cmd_import(import_args);
  if (calibrate_cmd->parsed()) {
    for (int i = 0; i < argc; ++i) {
      calibrate.command_line += (i ? " " : "") + std::string(argv[i]);
    }
    return cmd_calibrate(calibrate);
  }
  return 2;
}

}  // namespace offsim::cli

int main(int argc, char** argv) { return offsim::cli::main(argc, argv); }
