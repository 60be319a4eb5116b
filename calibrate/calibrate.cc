#include "calibrate/calibrate.h"

#include <chrono>
#include <ctime>

#include <fmt/format.h>

#include "backends/gpu_plugin.h"
#include "calibrate/microbench.h"

namespace offsim::calibrate {
namespace {

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

bool calibration_available() { return backends::gpu_plugin_built(); }

sim::Result<CalibrationRun> run_calibration(const CalibrateOptions& options) {
  if (!backends::gpu_plugin_built()) {
    return sim::fail(sim::ErrorCode::kUnsupported,
                     "calibrate: offsim was built without CUDA, so it cannot measure a GPU "
                     "(rebuild with nvcc available and OFFSIM_WITH_CUDA=AUTO or ON); the built-in "
                     "profiles from published figures are used instead");
  }
  CalibrationRun run;
  OFFSIM_ASSIGN_OR_RETURN(run.samples, measure_machine(options));
  std::string kind = options.gpu_kind;
  if (kind.empty()) {
    OFFSIM_ASSIGN_OR_RETURN(kind, gpu_kind_from_name(run.samples.machine.gpu_name));
  }
  OFFSIM_ASSIGN_OR_RETURN(sim::platform::CalibrationProfile base,
                          sim::platform::builtin_profile(kind));
  OFFSIM_ASSIGN_OR_RETURN(run.profile,
                          fit_profile(run.samples, base, options.command_line,
                                      options.date.empty() ? utc_now() : options.date));
  return run;
}

}  // namespace offsim::calibrate
