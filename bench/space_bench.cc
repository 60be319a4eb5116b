// offsim-bench: configurations per CPU-second over the cluster-scale spaces (spaces.h).
//
//   offsim-bench space-a                 # all 747 points, one thread
//   offsim-bench space-b --stride 10     # every 10th point of the 918
//   offsim-bench space-a --check         # also the full simulation of every point: exact?
//   offsim-bench space-b --full-path     # the baseline: no early answers, no steady state
//
// Time is the calling thread's CPU time (clock_gettime CLOCK_THREAD_CPUTIME_ID) around
// models::evaluate() of each point, with the options a sweep uses; minor page faults come from
// getrusage(RUSAGE_THREAD). Each point is counted under the path it took: early (an exact early
// answer, no plan built), steady (the steady-state fast path) or full (the whole step simulated).
// For space B it also times the reference step (megatron_1t_reference(), best of 3).
// --check evaluates every point a second time on the full path (no shortcut) and compares every
// field the shortcut can know; any difference is printed and the exit code is 1.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench/check.h"
#include "bench/spaces.h"
#include "models/evaluate.h"

namespace offsim::bench {
namespace {

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

struct Args {
  Space space = Space::kA;
  int stride = 1;
  bool check = false;
  bool full_path = false;
};

int usage(const std::string& why) {
  fmt::print(stderr,
             "offsim-bench: {}\nusage: offsim-bench space-a|space-b [--stride N] [--check] "
             "[--full-path]\n",
             why);
  return 2;
}

struct PathStats {
  int points = 0;
  double cpu_s = 0.0;
};

int run(const Args& a) {
  const SpaceDef def = space_definition(a.space);
  const std::vector<SpacePoint> points = space_points(def);
  models::EvalOptions options = sweep_eval_options(a.full_path);
  std::map<std::string, PathStats> paths;
  int fits = 0;
  int evaluated = 0;
  int errors = 0;
  int mismatches = 0;
  double cpu_total = 0.0;
  double cpu_max = 0.0;
  std::string slowest;
  const long faults0 = minor_faults();
  for (std::size_t i = 0; i < points.size(); i += static_cast<std::size_t>(a.stride)) {
    const SpacePoint& p = points[i];
    const double t0 = thread_cpu_s();
    sim::Result<models::Evaluation> e = models::evaluate(p.scenario, options);
    const double dt = thread_cpu_s() - t0;
    ++evaluated;
    cpu_total += dt;
    if (dt > cpu_max) {
      cpu_max = dt;
      slowest = p.label;
    }
    if (!e) {
      ++errors;
      fmt::print(stderr, "{}: error: {}\n", p.label, e.error().message);
      continue;
    }
    PathStats& ps = paths[path_of(*e)];
    ++ps.points;
    ps.cpu_s += dt;
    if (e->report.fits) ++fits;
    if (a.check) {
      const std::string diff = compare_with_full_path(p.scenario, *e);
      if (!diff.empty()) {
        ++mismatches;
        fmt::print(stderr, "{}: MISMATCH {}\n", p.label, diff);
      }
    }
  }
  const long faults = minor_faults() - faults0;
  fmt::print("{}: {} of {} points (stride {}), {} fit, {} errors\n", def.name, evaluated,
             points.size(), a.stride, fits, errors);
  fmt::print(
      "cpu {:.3f} s, {:.1f} configs per CPU-second, {:.2f} ms per point (max {:.1f} ms: "
      "{}), {:.0f} minor page faults per point\n",
      cpu_total, cpu_total > 0 ? evaluated / cpu_total : 0.0,
      evaluated > 0 ? 1e3 * cpu_total / evaluated : 0.0, 1e3 * cpu_max, slowest,
      evaluated > 0 ? static_cast<double>(faults) / evaluated : 0.0);
  for (const auto& [name, ps] : paths) {
    fmt::print("path {:7} {:5} points, cpu {:8.3f} s, {:8.2f} ms per point\n", name, ps.points,
               ps.cpu_s, ps.points > 0 ? 1e3 * ps.cpu_s / ps.points : 0.0);
  }
  if (a.space == Space::kB) {
    const SpacePoint ref = megatron_1t_reference();
    double best = 1e300;
    std::string path;
    double step_s = 0.0;
    for (int k = 0; k < 3; ++k) {
      const double t0 = thread_cpu_s();
      sim::Result<models::Evaluation> e = models::evaluate(ref.scenario, options);
      best = std::min(best, thread_cpu_s() - t0);
      if (!e) return usage("reference step: " + e.error().message);
      path = path_of(*e);
      step_s = e->report.step_time_s;
    }
    fmt::print(
        "reference Megatron-1T on 1024 GPUs ({}): {:.2f} ms CPU to simulate ({} path), "
        "step {:.3f} s\n",
        ref.label, 1e3 * best, path, step_s);
  }
  if (a.check)
    fmt::print("check: {} of {} points differ from the full path\n", mismatches,
               evaluated - errors);
  return (errors > 0 || mismatches > 0) ? 1 : 0;
}

}  // namespace
}  // namespace offsim::bench

int main(int argc, char** argv) {
  using namespace offsim::bench;
  Args a;
  bool have_space = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--check") {
      a.check = true;
    } else if (arg == "--full-path") {
      a.full_path = true;
    } else if (arg == "--stride") {
      if (i + 1 >= argc) return usage("--stride: expected a number >= 1");
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 1 || v > 1000000) {
        return usage(fmt::format("--stride: expected a number >= 1, got '{}'", argv[i]));
      }
      a.stride = static_cast<int>(v);
    } else if (auto s = space_from_name(arg); s && !have_space) {
      a.space = *s;
      have_space = true;
    } else {
      return usage(fmt::format("unexpected argument '{}'", arg));
    }
  }
  if (!have_space) return usage("expected space-a or space-b");
  return run(a);
}
