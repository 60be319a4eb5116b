#include "calibrate/timing.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace offsim::calibrate {
namespace {

// Linear-interpolated quantile of sorted values.
double quantile(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

}  // namespace

StableTiming measure_stable(const std::function<double()>& sample, const StopRule& rule) {
  for (int i = 0; i < rule.warmup; ++i) sample();
  std::vector<double> v;
  double total = 0.0;
  StableTiming out;
  const int max_samples = std::max(rule.max_samples, 1);
  for (int attempts = 0; attempts < 2 * max_samples && static_cast<int>(v.size()) < max_samples;
       ++attempts) {
    const double s = sample();
    if (!(std::isfinite(s) && s > 0.0)) continue;
    v.push_back(s);
    total += s;
    if (static_cast<int>(v.size()) < std::max(rule.min_samples, 1)) continue;
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    const double med = quantile(sorted, 0.5);
    const double noise = (quantile(sorted, 0.75) - quantile(sorted, 0.25)) / med;
    if (noise <= rule.max_noise) {
      out.stable = true;
      break;
    }
    if (total >= rule.max_total_s) break;
  }
  if (v.empty()) return out;
  std::sort(v.begin(), v.end());
  out.samples = static_cast<int>(v.size());
  out.median_s = quantile(v, 0.5);
  out.min_s = v.front();
  out.noise = (quantile(v, 0.75) - quantile(v, 0.25)) / out.median_s;
  return out;
}

}  // namespace offsim::calibrate
