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
// --phases splits each full-path point into lowering, simulation and freeing.
// --reasons prints each point's path, each full-path point's Evaluation::full_path_reason, and
// groups the reasons (numbers dropped). --only LABEL evaluates just the point of that label
// (e.g. tp8.pp8.dp1.mb1.none.none).
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
#include "models/step_builder.h"
#include "sim/engine/simulator.h"

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
  bool phases = false;
  bool reasons = false;
  std::string only;  // --only LABEL: just that point
};

int usage(const std::string& why) {
  fmt::print(stderr,
             "offsim-bench: {}\nusage: offsim-bench space-a|space-b [--stride N] [--check] "
             "[--full-path] [--phases] [--reasons] [--only LABEL]\n",
             why);
  return 2;
}

// Where a full-path point's time goes: lowering (build_step), simulation, freeing plan and
// timeline (--phases: each full-path point is evaluated a second time, phase by phase).
struct Phases {
  double build_s = 0.0;
  double simulate_s = 0.0;
  double free_s = 0.0;
  double ops = 0.0;
  int points = 0;
};

void time_phases(const models::Scenario& s, Phases& p) {
  double t0 = thread_cpu_s();
  auto* step = new sim::Result<models::BuiltStep>(models::build_step(s));
  double t1 = thread_cpu_s();
  if (!*step) {
    delete step;
    return;
  }
  sim::SimOptions o;
  o.validate_plan = false;
  o.record_memory = false;
  o.run_past_capacity = true;
  o.record_op_infos = false;
  auto* result = new sim::Result<sim::SimResult>(sim::simulate((*step)->plan, o));
  double t2 = thread_cpu_s();
  p.ops += static_cast<double>((*step)->plan.ops.size());
  delete result;
  delete step;
  double t3 = thread_cpu_s();
  p.build_s += t1 - t0;
  p.simulate_s += t2 - t1;
  p.free_s += t3 - t2;
  ++p.points;
}

struct PathStats {
  int points = 0;
  double cpu_s = 0.0;
};

// A full-path reason without its numbers, so points that fell back for the same cause group.
std::string reason_class(const std::string& why) {
  std::string out;
  for (char c : why) {
    if (c >= '0' && c <= '9') {
      if (out.empty() || out.back() != '#') out += '#';
    } else if (c != '.' || out.empty() || out.back() != '#') {
      out += c;
    }
  }
  return out;
}

// The Megatron-1T reference step on 1,024 GPUs: best CPU time of three evaluations.
int time_reference_step(const models::EvalOptions& options) {
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
  return 0;
}

int run(const Args& a) {
  const SpaceDef def = space_definition(a.space);
  const std::vector<SpacePoint> points = space_points(def);
  models::EvalOptions options = sweep_eval_options(a.full_path);
  std::map<std::string, PathStats> paths;
  std::map<std::string, PathStats> reasons;
  int fits = 0;
  int evaluated = 0;
  int errors = 0;
  int mismatches = 0;
  double cpu_total = 0.0;
  double cpu_max = 0.0;
  std::string slowest;
  long faults = 0;
  Phases phases;
  for (std::size_t i = 0; i < points.size(); i += static_cast<std::size_t>(a.stride)) {
    const SpacePoint& p = points[i];
    if (!a.only.empty() && p.label != a.only) continue;
    const long f0 = minor_faults();
    const double t0 = thread_cpu_s();
    sim::Result<models::Evaluation> e = models::evaluate(p.scenario, options);
    const double dt = thread_cpu_s() - t0;
    faults += minor_faults() - f0;
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
    if (a.reasons) fmt::print("point {}: {} ({:.2f} ms)\n", p.label, path_of(*e), 1e3 * dt);
    if (a.reasons && path_of(*e) == "full") {
      fmt::print("why {}: {}\n", p.label, e->full_path_reason);
      PathStats& rs = reasons[reason_class(e->full_path_reason)];
      ++rs.points;
      rs.cpu_s += dt;
    }
    if (a.phases && path_of(*e) == "full") time_phases(p.scenario, phases);
    if (a.check) {
      const std::string diff = compare_with_full_path(p.scenario, *e);
      if (!diff.empty()) {
        ++mismatches;
        fmt::print(stderr, "{}: MISMATCH {}\n", p.label, diff);
      }
    }
  }
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
  for (const auto& [why, rs] : reasons) {
    fmt::print("full  {:5} points, {:8.2f} ms per point: {}\n", rs.points,
               1e3 * rs.cpu_s / rs.points, why);
  }
  if (phases.points > 0) {
    const double n = phases.points;
    fmt::print(
        "phases of {} full-path points: build {:.2f} ms, simulate {:.2f} ms, free {:.2f} "
        "ms per point; {:.0f} ops per point, {:.2f} us per op\n",
        phases.points, 1e3 * phases.build_s / n, 1e3 * phases.simulate_s / n,
        1e3 * phases.free_s / n, phases.ops / n,
        1e6 * (phases.build_s + phases.simulate_s + phases.free_s) / phases.ops);
  }
  if (a.space == Space::kB) {
    if (const int rc = time_reference_step(options); rc != 0) return rc;
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
    } else if (arg == "--only") {
      if (i + 1 >= argc) return usage("--only: expected a point's label");
      a.only = argv[++i];
    } else if (arg == "--reasons") {
      a.reasons = true;
    } else if (arg == "--phases") {
      a.phases = true;
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
  offsim::models::retain_freed_memory();  // as a sweep does (scenarios/cli/main.cc)
  return run(a);
}
