// run_calibration(): measures this machine's GPUs into a CalibrationProfile.
//
// Runs the microbenchmarks (calibrate/microbench.h: GEMMs, attention and memory-bound
// kernels, copies over sizes and directions, interference, NCCL collectives, launch overheads)
// with CUDA-event timing and the stopping rule of timing.h, then fits them (fit.h) over the
// built-in profile of the GPU kind. Without CUDA in the build it returns kUnsupported; without a
// GPU or driver, kNoDevice ("no GPU: ...").
//
//   calibrate::CalibrateOptions o;
//   o.quick = true;                                    // < 3 minutes on one GPU
//   auto r = calibrate::run_calibration(o);
//   if (!r) { fmt::print(stderr, "{}\n", r.error().message); return 2; }
//   sim::platform::write_profile_file("h200.json", r->profile);
#pragma once

#include <string>

#include "calibrate/fit.h"
#include "sim/core/result.h"
#include "sim/platform/profile.h"

namespace offsim::calibrate {

struct CalibrateOptions {
  bool quick = false;  // fewer sizes and shapes, tighter time budgets
  int gpus = 0;        // GPUs to use (0: all visible); collectives need 2 or more
  int first_gpu = 0;
  std::string gpu_kind;      // base profile ("h200"); empty: from the GPU's name
  std::string command_line;  // recorded in the provenance
  std::string date;          // ISO 8601, recorded in the provenance; empty: now (UTC)
};

struct CalibrationRun {
  sim::platform::CalibrationProfile profile;
  Samples samples;
};

sim::Result<CalibrationRun> run_calibration(const CalibrateOptions& options);

// True when this build has the CUDA microbenchmarks.
bool calibration_available();

}  // namespace offsim::calibrate
