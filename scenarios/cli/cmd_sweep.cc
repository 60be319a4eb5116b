// `offsim sweep` (see commands.h): every point of a scenario's sweep block, one row each.

#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "scenarios/cli/commands.h"
#include "scenarios/cli/common.h"
#include "scenarios/cli/sweep_mpi.h"
#include "scenarios/output_paths.h"
#include "scenarios/scenario_loader.h"
#include "scenarios/sweep_runner.h"

namespace offsim::cli {
namespace {

sim::Status parse_shard(const std::string& text, int& index, int& count) {
  const auto slash = text.find('/');
  try {
    if (slash == std::string::npos) throw std::invalid_argument("no slash");
    std::size_t used = 0;
    index = std::stoi(text.substr(0, slash), &used);
    if (used != slash) throw std::invalid_argument("index");
    count = std::stoi(text.substr(slash + 1), &used);
    if (used != text.size() - slash - 1) throw std::invalid_argument("count");
  } catch (const std::exception&) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "--shard {}: expected I/N, e.g. 0/4", text);
  }
  if (count < 1 || index < 0 || index >= count) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "--shard {}: expected 0 <= I < N", text);
  }
  return sim::ok();
}

void print_summary(const SweepArgs& a, const scenarios::SweepRunOptions& o,
                   const scenarios::SweepSummary& summary) {
  fmt::print(stderr,
             "offsim: sweep of {} points{}: {} already done, {} evaluated ({} errors) in {:.2f} "
             "s, {:.1f} points/s{}\n",
             summary.points_total,
             o.shard_count > 1 ? fmt::format(" (shard {}/{}: {} points)", o.shard_index,
                                             o.shard_count, summary.shard_points)
                               : "",
             summary.resumed, summary.evaluated, summary.errors, summary.wall_s,
             summary.wall_s > 0 ? static_cast<double>(summary.evaluated) / summary.wall_s : 0,
             a.out.empty() || a.out == "-" ? "" : " -> " + a.out);
}

}  // namespace

CLI::App* add_sweep_command(CLI::App& app, SweepArgs& sweep) {
  auto* cmd = app.add_subcommand(
      "sweep",
      "Evaluate every point of a scenario's sweep block; one row per point, in point order.\n"
      "Rows are flushed durably as they finish; --resume continues a killed sweep.\n\nExamples:\n"
      "  offsim sweep sweep.yaml --out results.csv\n"
      "  offsim sweep sweep.yaml --out results.jsonl --jobs 8 --resume\n"
      "  offsim sweep sweep.yaml --out part0.csv --shard 0/4\n"
      "  offsim sweep sweep.yaml --out results.csv --time-limit 3600   # then --resume\n"
      "  mpirun -n 4 offsim sweep sweep.yaml --out results.csv --mpi");
  cmd->add_option("scenario", sweep.scenario, "scenario file with a sweep block")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", sweep.sets, "override a key: key.path=value (repeatable)");
  cmd->add_option("--jobs,-j", sweep.jobs, "threads (default: all cores)")
      ->check(in_range(0, kMaxJobs, true, ""));
  cmd->add_option("--out,-o", sweep.out, "FILE.csv or FILE.jsonl (default: CSV on stdout)");
  cmd->add_flag("--resume", sweep.resume, "continue an existing output file");
  cmd->add_flag("--overwrite", sweep.overwrite, "replace an existing output file");
  cmd->add_option("--shard", sweep.shard, "I/N: evaluate the points with index % N == I");
  cmd->add_flag("--mpi", sweep.mpi,
                "split the points over MPI ranks; rank 0 writes the merged file");
  cmd->add_flag("--quiet,-q", sweep.quiet, "no progress on stderr");
  cmd->add_option("--max-points", sweep.max_points, "refuse sweeps larger than this")
      ->check(in_range(1, 1e12, true, ""));
  add_limit_options(cmd, sweep.limits,
                    "stop the whole sweep after this many seconds; finished rows stay in --out "
                    "and --resume continues (exit 2)");
  return cmd;
}

int cmd_sweep(const SweepArgs& a) {
  if (!a.out.empty() && a.out != "-") {
    if (auto st = scenarios::check_output_path("--out", a.out, {".csv", ".jsonl", ".ndjson"},
                                               {a.scenario});
        !st) {
      return report(st.error());
    }
  }
  scenarios::LoadOptions load;
  load.max_sweep_points = a.max_points;
  auto file = scenarios::load_scenario_file(a.scenario, a.sets, load);
  if (!file) return report(file.error());
  scenarios::SweepRunOptions o;
  o.out_path = a.out;
  o.jobs = a.jobs;
  o.resume = a.resume;
  o.overwrite = a.overwrite;
  o.progress = !a.quiet;
  o.limits = a.limits;
  if (!a.shard.empty()) {
    auto st = parse_shard(a.shard, o.shard_index, o.shard_count);
    if (!st) return report(st.error());
  }
  if (a.resume && (a.out.empty() || a.out == "-")) {
    return usage_error("--resume needs --out FILE.csv or FILE.jsonl");
  }
  if (a.mpi) return run_sweep_mpi(*file, o);
  auto summary = scenarios::run_sweep(*file, o);
  if (!summary) return report(summary.error());
  if (!a.quiet) print_summary(a, o, *summary);
  return 0;
}

}  // namespace offsim::cli
