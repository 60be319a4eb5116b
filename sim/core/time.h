// Simulated time: integer nanoseconds on a std::chrono clock of its own.
//
// Every time the engine computes is exact and repeatable: no floating-point seconds are ever
// accumulated. Conversions to and from seconds exist only at the edges (cost model, reports).
//
//   sim::TimePoint t = sim::kTimeZero + sim::Duration{1500};   // 1.5 µs
//   sim::Duration d = sim::duration_from_seconds(2.5e-3);       // 2,500,000 ns
//   double s = sim::to_seconds(t - sim::kTimeZero);             // 1.5e-6
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>

namespace offsim::sim {

// The simulated clock. It never reads a real clock; it only gives time points a distinct type.
struct SimClock {
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::duration<rep, period>;
  using time_point = std::chrono::time_point<SimClock>;
  static constexpr bool is_steady = true;
};

using Duration = SimClock::duration;
using TimePoint = SimClock::time_point;

inline constexpr TimePoint kTimeZero{};
inline constexpr TimePoint kTimeNever{Duration{std::numeric_limits<std::int64_t>::max()}};

constexpr double to_seconds(Duration d) { return static_cast<double>(d.count()) * 1e-9; }
constexpr double to_seconds(TimePoint t) { return to_seconds(t.time_since_epoch()); }
constexpr double to_micros(Duration d) { return static_cast<double>(d.count()) * 1e-3; }

// Rounds up to the next whole nanosecond so that an operation never finishes before its work is
// done. Negative and NaN inputs give zero; huge inputs saturate at the largest duration.
inline Duration duration_from_seconds(double seconds) {
  if (!(seconds > 0.0)) return Duration{0};
  const double ns = std::ceil(seconds * 1e9);
  if (ns >= 9.0e18) return Duration{std::numeric_limits<std::int64_t>::max() / 2};
  return Duration{static_cast<std::int64_t>(ns)};
}

}  // namespace offsim::sim
