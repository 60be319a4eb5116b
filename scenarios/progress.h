// Progress: a sweep's progress on stderr — a bar with rate and ETA on a terminal, a plain line
// every few seconds otherwise (logs, CI), nothing when disabled.
//
//   Progress progress(total_points, /*enabled=*/true, /*interval_s=*/5.0);
//   progress.update(done);   // cheap; prints only when due
//   progress.finish(done);   // final line
#pragma once

#include <chrono>
#include <cstdint>

namespace offsim::scenarios {

class Progress {
 public:
  Progress(std::int64_t total, bool enabled, double interval_s);
  void update(std::int64_t done);
  void finish(std::int64_t done);

 private:
  void print(std::int64_t done, bool final);

  std::int64_t total_;
  bool enabled_;
  bool tty_;
  double interval_s_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace offsim::scenarios
