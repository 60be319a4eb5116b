// `offsim calibrate` (see commands.h): this machine's GPUs measured into a calibration profile.

#include <string>

#include <fmt/format.h>

#include "calibrate/calibrate.h"
#include "scenarios/cli/commands.h"
#include "scenarios/cli/common.h"
#include "scenarios/output_paths.h"
#include "sim/platform/profile.h"

namespace offsim::cli {

CLI::App* add_calibrate_command(CLI::App& app, CalibrateArgs& calibrate) {
  auto* cmd =
      app.add_subcommand("calibrate",
                         "Measure this machine's GPUs into a calibration profile.\n\nExamples:\n"
                         "  offsim calibrate --quick --out h200.json\n"
                         "  offsim run ex.yaml --set hardware.profile=h200.json");
  cmd->add_flag("--quick", calibrate.quick, "fewer sizes; under 3 minutes on one GPU");
  cmd->add_option("--gpus", calibrate.gpus, "GPUs to use (default: all visible)")
      ->check(in_range(0, 1024, true, ""));
  cmd->add_option("--out", calibrate.out, "profile file (default calibration-profile.json)");
  return cmd;
}

int cmd_calibrate(const CalibrateArgs& a) {
  // The profile's path is checked and reserved before measuring (minutes of GPU time).
  const std::string path = a.out.empty() ? "calibration-profile.json" : a.out;
  scenarios::OutputFiles outputs({});
  if (auto st = outputs.reserve("--out", path, {".json"}); !st) return report(st.error());
  calibrate::CalibrateOptions o;
  o.quick = a.quick;
  o.gpus = a.gpus;
  o.command_line = a.command_line;
  auto run = calibrate::run_calibration(o);
  if (!run) return report(run.error());
  auto st = outputs.write(path, sim::platform::profile_to_json(run->profile).dump(2) + "\n");
  if (st) st = outputs.commit();
  if (!st) return report(st.error());
  fmt::print("wrote the calibration profile to {}\n", path);
  return 0;
}

}  // namespace offsim::cli
