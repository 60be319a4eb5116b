// `offsim calibrate` (see commands.h): this machine's GPUs measured into a calibration profile.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "calibrate/calibrate.h"
#include "calibrate/host_calibration.h"
#include "scenarios/cli/commands.h"
#include "scenarios/cli/common.h"
#include "scenarios/output_paths.h"
#include "sim/platform/host.h"
#include "sim/platform/profile.h"

namespace offsim::cli {
namespace {

// The host stage (calibrate/host_calibration.h): cores, DRAM bandwidth per NUMA node and the
// CPU Adam rate of this machine.
sim::Result<calibrate::HostCalibration> measure_this_host(bool quick, std::int64_t array_mib) {
  calibrate::HostCalibrationOptions ho;
  if (quick) {
    ho.array_bytes = std::int64_t{64} << 20;
    ho.samples = 5;
    ho.adam_params = std::int64_t{4} << 20;
    ho.adam_samples = 3;
  }
  if (array_mib > 0) ho.array_bytes = array_mib << 20;
  OFFSIM_ASSIGN_OR_RETURN(calibrate::HostCalibration host, calibrate::measure_host(ho));
  fmt::print("{}", calibrate::host_calibration_to_text(host));
  return host;
}

// The host stage written into `profile`'s host keys.
sim::Status calibrate_host(bool quick, std::int64_t array_mib,
                           sim::platform::CalibrationProfile& profile) {
  OFFSIM_ASSIGN_OR_RETURN(calibrate::HostCalibration host, measure_this_host(quick, array_mib));
  calibrate::apply_host_calibration(host, profile);
  return sim::ok();
}

// --host-out: a host file (sim/platform/host.h) over the catalogue host --host-base, holding the
// measured figures; named after the file ("lab-node.json" -> "lab-node").
std::string host_file_text(const calibrate::HostCalibration& measured,
                           const sim::platform::Host& base, const std::string& path) {
  sim::platform::Host host = base;
  host.name = std::filesystem::path(path).stem().string();
  host.description = fmt::format("{} with figures measured by offsim calibrate --host on {}",
                                 base.name, measured.date);
  calibrate::apply_host_calibration(measured, host);
  return sim::platform::host_to_json(host, &base).dump(2) + "\n";
}

// Checks the --host options; the catalogue host of --host-base.
sim::Result<sim::platform::Host> host_out_base(const CalibrateArgs& a) {
  if (a.base.empty() && a.host_out.empty()) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "calibrate --host: --base (the GPU kind, e.g. h200, or the profile JSON whose "
                     "host keys the measurement replaces) or --host-out (a host file for "
                     "hardware.host) is required");
  }
  if (a.host_out.empty()) return sim::platform::Host{};
  std::vector<std::string> names;
  for (const auto& h : sim::platform::list_hosts()) names.push_back(h.name);
  if (a.host_base.empty()) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "calibrate --host-out: --host-base is required: the catalogue host whose "
                     "unmeasured figures (vector width, channels, PCIe, root complex) the file "
                     "keeps (expected one of: {})",
                     fmt::join(names, ", "));
  }
  auto base = sim::platform::find_host(a.host_base);
  if (!base)
    return sim::fail(sim::ErrorCode::kInvalidInput, "--host-base: {}", base.error().message);
  return base;
}

// `calibrate --host [--base KIND|profile.json] [--host-out FILE --host-base HOST]`: the host
// stage alone, into the host keys of a base profile and/or a host file.
int cmd_calibrate_host(const CalibrateArgs& a) {
  auto host_base = host_out_base(a);
  if (!host_base) return usage_error(host_base.error().message);
  const bool profile_out = !a.base.empty();
  const std::string path = !profile_out ? "" : a.out.empty() ? "calibration-profile.json" : a.out;
  const bool file = a.base.ends_with(".json");
  scenarios::OutputFiles outputs(file ? std::vector<std::string>{a.base}
                                      : std::vector<std::string>{});
  if (auto st = outputs.reserve("--out", path, {".json"}); !st) return report(st.error());
  if (auto st = outputs.reserve("--host-out", a.host_out, {".json"}); !st) {
    return report(st.error());
  }
  sim::Result<sim::platform::CalibrationProfile> profile = sim::platform::CalibrationProfile{};
  if (profile_out) {
    profile =
        file ? sim::platform::read_profile_file(a.base) : sim::platform::default_profile(a.base);
  }
  if (!profile) return report(profile.error());
  auto measured = measure_this_host(a.quick, a.host_array_mib);
  if (!measured) return report(measured.error());
  sim::Status st = sim::ok();
  if (profile_out) {
    calibrate::apply_host_calibration(*measured, *profile);
    profile->provenance.command_line = a.command_line;
    st = outputs.write(path, sim::platform::profile_to_json(*profile).dump(2) + "\n");
  }
  if (st && !a.host_out.empty()) {
    st = outputs.write(a.host_out, host_file_text(*measured, *host_base, a.host_out));
  }
  if (st) st = outputs.commit();
  if (!st) return report(st.error());
  if (profile_out) {
    fmt::print("wrote the calibration profile with measured host figures to {}\n", path);
  }
  if (!a.host_out.empty()) {
    fmt::print(
        "wrote the host file (base {}, measured figures) to {}; use it with "
        "hardware.host: {}\n",
        host_base->name, a.host_out, a.host_out);
  }
  return 0;
}

}  // namespace

CLI::App* add_calibrate_command(CLI::App& app, CalibrateArgs& calibrate) {
  auto* cmd =
      app.add_subcommand("calibrate",
                         "Measure this machine's GPUs into a calibration profile.\n\nExamples:\n"
                         "  offsim calibrate --quick --out h200.json\n"
                         "  offsim calibrate --host --base h200 --out h200-host.json\n"
                         "  offsim calibrate --host --host-out lab.json --host-base xeon-8480c\n"
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
  cmd->add_option("--host-out", calibrate.host_out,
                  "with --host: also write a host file for hardware.host (measured figures over "
                  "--host-base)");
  cmd->add_option("--host-base", calibrate.host_base,
                  "with --host-out: the catalogue host (offsim list hosts) whose other figures "
                  "the host file keeps");
  return cmd;
}

int cmd_calibrate(const CalibrateArgs& a) {
  if (a.host) return cmd_calibrate_host(a);
  if (!a.host_out.empty() || !a.host_base.empty()) {
    return usage_error("calibrate: --host-out and --host-base need --host");
  }
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
