// Sweep runner: evaluates every point of a scenario's sweep on a thread pool and writes one row
// per point, in point order, to a crash-safe CSV or JSON-lines file (results_file.h).
//
// A row is a flat record (sweep_columns()): `index`, one `axes.<path>` column per sweep axis, the
// report's columns (report_format.h: report_columns(), `limited_by` included) and `error`. CSV and
// JSON lines carry the same columns in the same order; an error row has null report columns
// (empty CSV cells) and the message in `error`, a row that ran has `error` null.
//
// Results do not depend on --jobs: rows are buffered until every earlier row is written, so the
// file is byte-identical for any number of threads, and a sweep killed at any moment resumes to
// exactly the rows of an uninterrupted run. `shard_index/shard_count` keep the points with
// index % count == shard_index.
//
//   scenarios::SweepRunOptions opt{.out_path = "sweep.csv", .jobs = 8, .resume = true};
//   OFFSIM_ASSIGN_OR_RETURN(scenarios::ScenarioFile f, scenarios::load_scenario_file("s.yaml"));
//   OFFSIM_ASSIGN_OR_RETURN(scenarios::SweepSummary sum, scenarios::run_sweep(f, opt));
//   fmt::print("{} points, {:.0f} points/s\n", sum.evaluated, sum.evaluated / sum.wall_s);
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/evaluate.h"
#include "scenarios/document.h"
#include "scenarios/resource_limits.h"
#include "scenarios/results_file.h"
#include "scenarios/scenario_loader.h"
#include "sim/core/result.h"

namespace offsim::scenarios {

// One scenario document evaluated. `report` is set when the simulation ran (fitting or not);
// `error` holds the message when the point is impossible or failed.
struct PointOutcome {
  std::optional<models::Report> report;
  std::string error;
  bool input_error = false;  // a schema error: the sweep itself is wrong, not this point
};

// A point whose estimated plan exceeds `limits` (check_plan_size) is an error row. With
// `hardware_base`, a point of the same hardware keys takes its system and profile from it
// (models::resolve_variant) instead of reading the profile again.
PointOutcome evaluate_document(const Node& doc, const std::string& base_dir,
                               const models::EvalOptions& options = {},
                               const ResourceLimits& limits = {},
                               const models::ResolvedScenario* hardware_base = nullptr);

enum class RowFormat { kCsv, kJsonl };

// The columns of a sweep row: index, "axes.<path>" per axis path, report_columns(), error.
std::vector<std::string> sweep_columns(const std::vector<std::string>& axis_paths);

struct SweepRunOptions {
  std::string out_path;  // .csv or .jsonl (.ndjson); "-" writes CSV to stdout
  int jobs = 0;          // 0 = every hardware thread
  bool resume = false;
  bool overwrite = false;
  int shard_index = 0;
  int shard_count = 1;
  bool progress = true;  // on stderr: a bar on a terminal, a line every few s otherwise
  double progress_interval_s = 5.0;
  models::EvalOptions eval{.early_answers = true};  // static-memory early answers (static_memory.h)
  // Plan-size limits per point (over them: an error row); time_limit_s bounds the whole sweep:
  // rows finished by then stay in the file and run_sweep fails with kLimitExceeded.
  ResourceLimits limits;
};

struct SweepSummary {
  std::int64_t points_total = 0;  // points of the whole sweep
  std::int64_t shard_points = 0;  // points this run is responsible for
  std::int64_t resumed = 0;       // rows already in the file
  std::int64_t evaluated = 0;     // points evaluated now
  std::int64_t errors = 0;        // of those, error rows
  double wall_s = 0.0;
};

RowFormat row_format_for(const std::string& path);

// The flat record of a point (keys: sweep_columns() of the axes' paths) and its row (without
// '\n'). Axis values are typed in JSON (numbers, booleans, strings; a list or map as its JSON
// text); in CSV they are written as in the scenario (YAML flow).
nlohmann::ordered_json point_record(std::int64_t index, const std::vector<SweepAssignment>& axes,
                                    const PointOutcome& outcome);
std::string format_row(RowFormat format, std::int64_t index,
                       const std::vector<SweepAssignment>& axes, const PointOutcome& outcome);

sim::Result<SweepSummary> run_sweep(const ScenarioFile& file, const SweepRunOptions& options);

// A sweep ready to run: the points of this shard, the row format and the results file spec.
// run_sweep() and the MPI driver share it.
struct PreparedSweep {
  const ScenarioFile* file = nullptr;
  SweepSpec spec;
  std::vector<std::int64_t> points;  // point indices of this shard, ascending
  RowFormat format = RowFormat::kCsv;
  bool to_stdout = false;
  std::string header;  // CSV header line (sweep_columns()); empty for JSONL
  ResultsFile::Spec file_spec;
  OpenMode mode = OpenMode::kCreate;
  models::EvalOptions eval{.early_answers = true};  // static-memory early answers (static_memory.h)
  ResourceLimits limits;
  // The file's base scenario resolved, when it resolves: the points' system and profile.
  std::optional<models::ResolvedScenario> hardware_base;

  // Evaluates the k-th point of this shard and formats its row; `error` tells whether the row
  // is an error row.
  std::string row(std::int64_t k, bool* error = nullptr) const;
};

// Checks the shard and every point's schema; the result refers to `file`, which must outlive it.
sim::Result<PreparedSweep> prepare_sweep(const ScenarioFile& file, const SweepRunOptions& options);

// Runs work(i) for i in [0, n) on `jobs` threads and hands results to sink() in index order, in
// batches of consecutive indices (first index, results). At most `window` results wait in memory.
// `tick(done)` is called from the calling thread after each batch and about every 200 ms.
sim::Status run_ordered(
    std::int64_t n, int jobs, const std::function<std::string(std::int64_t)>& work,
    const std::function<sim::Status(std::int64_t, std::vector<std::string>&)>& sink,
    const std::function<void(std::int64_t)>& tick = {}, std::int64_t window = 0);

}  // namespace offsim::scenarios
