// Stable timing of one microbenchmark: warm-up, repeated samples, median, and a stopping rule
// in the manner of nvbench (stop once the samples' relative noise is small enough, or at a
// sample or time budget). CPU-only: the sample function times one run (CUDA events on a GPU).
//
//   calibrate::StopRule rule{.min_samples = 5, .max_samples = 50, .max_noise = 0.01};
//   calibrate::StableTiming t = calibrate::measure_stable(
//       [&] { return time_one_copy_with_events(); }, rule);
//   if (!t.stable) { ... t.noise ... }   // still usable: the median of what was taken
#pragma once

#include <functional>

namespace offsim::calibrate {

struct StopRule {
  int warmup = 2;  // runs thrown away first (module load, handle creation, caches)
  int min_samples = 5;
  int max_samples = 100;
  double max_noise = 0.005;  // relative: (p75 - p25) / median of the samples so far
  double max_total_s = 2.0;  // budget of summed sample times for this benchmark
};

struct StableTiming {
  double median_s = 0.0;
  double min_s = 0.0;
  double noise = 0.0;  // (p75 - p25) / median
  int samples = 0;
  bool stable = false;  // the noise criterion was met (not a budget stop)
};

// `sample` returns the seconds of one run (> 0). Samples that are not positive and finite are
// dropped; when none is left the result has samples == 0.
StableTiming measure_stable(const std::function<double()>& sample, const StopRule& rule);

}  // namespace offsim::calibrate
