// `offsim calibrate` (see commands.h): this machine's GPUs measured into a calibration profile.

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "calibrate/calibrate.h"
#include "calibrate/host_calibration.h"
#include "scenarios/cli/commands.h"
#include "scenarios/cli/common.h"
#include "scenarios/output_paths.h"
#include "sim/platform/profile.h"

namespace offsim::cli {
namespace {

// The host stage (calibrate/host_calibration.h): cores, DRAM bandwidth per NUMA node and the
// CPU Adam rate, written into `profile`'s host keys.
sim::Status calibrate_host(bool quick, std::int64_t array_mib,
                           sim::platform::CalibrationProfile& profile) {
  calibrate::HostCalibrationOptions ho;
  if (quick) {
    ho.array_bytes = std::int64_t{64} << 20;
    ho.samples = 5;
    ho.adam_params = std::int64_t{4} << 20;
    ho.adam_samples = 3;
  }
  if (array_mib > 0) ho.array_bytes = array_mib << 20;
  OFFSIM_ASSIGN_OR_RETURN(calibrate::HostCalibration host, calibrate::measure_host(ho));
  calibrate::apply_host_calibration(host, profile);
  fmt::print("{}", calibrate::host_calibration_to_text(host));
  return sim::ok();
}

// `calibrate --host --base KIND|profile.json`: the host stage alone over a base profile.
int cmd_calibrate_host(const CalibrateArgs& a) {
  if (a.base.empty()) {
    return usage_error(
        "calibrate --host: --base is required: the GPU kind (e.g. h200) or the profile JSON "
        "whose host keys the measurement replaces");
  }
  const std::string path = a.out.empty() ? "calibration-profile.json" : a.out;
  const bool file = a.base.ends_with(".json");
  scenarios::OutputFiles outputs(file ? std::vector<std::string>{a.base}
                                      : std::vector<std::string>{});
  if (auto st = outputs.reserve("--out", path, {".json"}); !st) return report(st.error());
  auto profile =
      file ? sim::platform::read_profile_file(a.base) : sim::platform::default_profile(a.base);
  if (!profile) return report(profile.error());
  if (auto st = calibrate_host(a.quick, a.host_array_mib, *profile); !st) {
    return report(st.error());
  }
  profile->provenance.command_line = a.command_line;
  auto st = outputs.write(path, sim::platform::profile_to_json(*profile).dump(2) + "\n");
  if (st) st = outputs.commit();
  if (!st) return report(st.error());
  fmt::print("wrote the calibration profile with measured host figures to {}\n", path);
  return 0;
}

}  // namespace

CLI::App* add_calibrate_command(CLI::App& app, CalibrateArgs& calibrate) {
  auto* cmd =
      app.add_subcommand("calibrate",
                         "Measure this machine's GPUs into a calibration profile.\n\nExamples:\n"
                         "  offsim calibrate --quick --out h200.json\n"
                         "  offsim calibrate --host --base h200 --out h200-host.json\n"
                         "  offsim run ex.yaml --set hardware.profile=h200.json");
  cmd->add_flag("--quick", calibrate.quick, "fewer sizes; under 3 minutes on one GPU");
  cmd->add_option("--gpus", calibrate.gpus, "GPUs to use (default: all visible)")
      ->check(in_range(0, 1024, true, ""));
  cmd->add_option("--out", calibrate.out, "profile file (default calibration-profile.json)");
  cmd->add_flag("--host", calibrate.host,
                "measure only the host (cores, DRAM bandwidth per NUMA node, CPU Adam per core) "
                "into the host keys of --base");
  cmd->add_option("--base", calibrate.base,
                  "with --host: GPU kind (h200, ...) or profile JSON to start from");
  cmd->add_option("--host-array-mib", calibrate.host_array_mib,
                  "host DRAM test: MiB per array and NUMA node (default 256, 64 quick)")
      ->check(in_range(1, 65536, true, ""));
  return cmd;
}

int cmd_calibrate(const CalibrateArgs& a) {
  if (a.host) return cmd_calibrate_host(a);
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
  if (auto st = calibrate_host(a.quick, 0, run->profile); !st) return report(st.error());
  auto st = outputs.write(path, sim::platform::profile_to_json(run->profile).dump(2) + "\n");
  if (st) st = outputs.commit();
  if (!st) return report(st.error());
  fmt::print("wrote the calibration profile to {}\n", path);
  return 0;
}

}  // namespace offsim::cli
