#include "scenarios/progress.h"

#include <unistd.h>

#include <cstdio>
#include <string>

#include <fmt/format.h>

namespace offsim::scenarios {

Progress::Progress(std::int64_t total, bool enabled, double interval_s)
    : total_(total),
      enabled_(enabled),
      tty_(::isatty(STDERR_FILENO) == 1),
      interval_s_(tty_ ? 0.1 : interval_s),
      start_(std::chrono::steady_clock::now()),
      last_(start_) {}

void Progress::update(std::int64_t done) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (std::chrono::duration<double>(now - last_).count() < interval_s_) return;
  last_ = now;
  print(done, false);
}

void Progress::finish(std::int64_t done) {
  if (!enabled_) return;
  print(done, true);
}

void Progress::print(std::int64_t done, bool final) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0.0;
  const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : 0.0;
  const double frac = total_ > 0 ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
  std::string line;
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    line = fmt::format("\r[{}{}] {}/{} {:.1f} points/s ETA {:.0f} s ", std::string(filled, '#'),
                       std::string(kWidth - filled, '.'), done, total_, rate, eta);
    if (final) line += "\n";
  } else {
    line = fmt::format(
        "sweep: {}/{} points ({:.0f}%), {:.1f} points/s, {}\n", done, total_, 100.0 * frac, rate,
        final ? fmt::format("done in {:.1f} s", elapsed) : fmt::format("ETA {:.0f} s", eta));
  }
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace offsim::scenarios
