#include "scenarios/sweep_runner.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "scenarios/progress.h"
#include "scenarios/report_format.h"

namespace offsim::scenarios {
namespace {

using sim::ErrorCode;

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

nlohmann::ordered_json node_json(const Node& node) {
  switch (node.kind) {
    case NodeKind::kNull:
      return nullptr;
    case NodeKind::kScalar: {
      if (node.quoted) return node.scalar;
      if (is_null_scalar(node)) return nullptr;
      if (auto b = scalar_bool(node)) return *b;
      // Integers as integers, other numbers as doubles, anything else as a string.
      if (node.scalar.find_first_of(".eE") == std::string::npos) {
        if (auto i = scalar_int(node)) return *i;
      }
      if (auto d = scalar_double(node)) return *d;
      return node.scalar;
    }
    case NodeKind::kSequence: {
      auto a = nlohmann::ordered_json::array();
      for (const Node& item : node.items) a.push_back(node_json(item));
      return a;
    }
    case NodeKind::kMap: {
      auto o = nlohmann::ordered_json::object();
      for (const auto& [k, v] : node.entries) o[k] = node_json(v);
      return o;
    }
  }
  return nullptr;
}

}  // namespace

PointOutcome evaluate_document(const Node& doc, const std::string& base_dir,
                               const models::EvalOptions& options, const ResourceLimits& limits,
                               const models::ResolvedScenario* hardware_base) {
  PointOutcome out;
  auto scenario = scenario_from_document(doc, base_dir);
  if (!scenario) {
    out.error = scenario.error().message;
    out.input_error = true;
    return out;
  }
  models::ResolveOptions located;
  located.locate = [&doc](const std::string& message) { return locate_message(message, doc); };
  auto resolved = hardware_base != nullptr
                      ? models::resolve_variant(*hardware_base, *scenario, located)
                      : models::resolve(*scenario, located);
  if (!resolved) {
    out.error = resolved.error().message;
    return out;
  }
  if (auto status =
          check_plan_size(*resolved, limits, {.with_memory_samples = options.keep_timeline});
      !status) {
    out.error = status.error().message;
    return out;
  }
  auto eval = models::evaluate(*resolved, options);
  if (!eval) {
    out.error = eval.error().message;
    return out;
  }
  out.report = std::move(eval->report);
  return out;
}

std::vector<std::string> sweep_columns(const std::vector<std::string>& axis_paths) {
  std::vector<std::string> columns = {"index"};
  for (const std::string& path : axis_paths) columns.push_back("axes." + path);
  for (const std::string& c : report_columns()) columns.push_back(c);
  columns.push_back("error");
  return columns;
}

RowFormat row_format_for(const std::string& path) {
  auto ends_with = [&](std::string_view s) {
    return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
  };
  return ends_with(".jsonl") || ends_with(".ndjson") ? RowFormat::kJsonl : RowFormat::kCsv;
}

nlohmann::ordered_json point_record(std::int64_t index, const std::vector<SweepAssignment>& axes,
                                    const PointOutcome& outcome) {
  nlohmann::ordered_json record = nlohmann::ordered_json::object();
  record["index"] = index;
  for (const SweepAssignment& a : axes) {
    nlohmann::ordered_json value = node_json(a.value);
    if (value.is_array() || value.is_object()) {
      value = value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    }
    record["axes." + a.path] = std::move(value);
  }
  if (outcome.report) {
    const nlohmann::ordered_json flat = flat_report(*outcome.report);
    for (auto it = flat.begin(); it != flat.end(); ++it) record[it.key()] = it.value();
    record["error"] = nullptr;
  } else {
    for (const std::string& c : report_columns()) record[c] = nullptr;
    record["error"] = one_line(outcome.error);
  }
  return record;
}

std::string format_row(RowFormat format, std::int64_t index,
                       const std::vector<SweepAssignment>& axes, const PointOutcome& outcome) {
  const nlohmann::ordered_json record = point_record(index, axes, outcome);
  if (format == RowFormat::kJsonl) return json_line(record);
  // CSV: the axes as written in the scenario (these cells are also the row's resume key).
  std::string row = std::to_string(index);
  for (const SweepAssignment& a : axes) row += "," + csv_field(emit_flow(a.value));
  for (auto it = record.begin(); it != record.end(); ++it) {
    if (it.key() == "index" || it.key().rfind("axes.", 0) == 0) continue;
    row += "," + csv_cell(it.value());
  }
  return row;
}

sim::Status run_ordered(
    std::int64_t n, int jobs, const std::function<std::string(std::int64_t)>& work,
    const std::function<sim::Status(std::int64_t, std::vector<std::string>&)>& sink,
    const std::function<void(std::int64_t)>& tick, std::int64_t window) {
  if (jobs <= 0) jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  jobs = static_cast<int>(std::min<std::int64_t>(jobs, std::max<std::int64_t>(n, 1)));
  if (window <= 0) window = 8 * static_cast<std::int64_t>(jobs) + 64;

  std::mutex mu;
  std::condition_variable ready;  // a result arrived (to the writer)
  std::condition_variable space;  // the writer advanced (to the workers)
  std::map<std::int64_t, std::string> done;
  std::int64_t next = 0;
  std::int64_t written = 0;
  bool stop = false;

  auto worker = [&] {
    while (true) {
      std::int64_t i = 0;
      {
        std::unique_lock lock(mu);
        space.wait(lock, [&] { return stop || next >= n || next - written < window; });
        if (stop || next >= n) return;
        i = next++;
      }
      std::string row = work(i);
      {
        std::lock_guard lock(mu);
        done.emplace(i, std::move(row));
      }
      ready.notify_one();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(jobs));
  for (int t = 0; t < jobs; ++t) threads.emplace_back(worker);

  sim::Status status = sim::ok();
  while (written < n) {
    std::vector<std::string> batch;
    {
      std::unique_lock lock(mu);
      ready.wait_for(lock, std::chrono::milliseconds(200), [&] { return done.count(written) > 0; });
      for (auto it = done.begin();
           it != done.end() && it->first == written + static_cast<std::int64_t>(batch.size());) {
        batch.push_back(std::move(it->second));
        it = done.erase(it);
      }
    }
    if (!batch.empty()) {
      const std::int64_t first = written;
      const auto count = static_cast<std::int64_t>(batch.size());
      status = sink(first, batch);
      {
        std::lock_guard lock(mu);
        written += count;
        if (!status) stop = true;
      }
      space.notify_all();
      if (!status) break;
    }
    if (tick) tick(written);
  }
  {
    std::lock_guard lock(mu);
    stop = true;
  }
  space.notify_all();
  for (std::thread& t : threads) t.join();
  return status;
}

std::string PreparedSweep::row(std::int64_t k, bool* error) const {
  const std::int64_t index = points[static_cast<std::size_t>(k)];
  const auto axes = spec.point(index);
  PointOutcome outcome;
  auto doc = apply_point(file->base, axes);
  if (!doc) {
    outcome.error = doc.error().message;
  } else {
    outcome = evaluate_document(*doc, file->base_dir, eval, limits,
                                hardware_base ? &*hardware_base : nullptr);
  }
  if (error != nullptr) *error = !outcome.report.has_value();
  return format_row(format, index, axes, outcome);
}

sim::Result<PreparedSweep> prepare_sweep(const ScenarioFile& file, const SweepRunOptions& options) {
  if (options.shard_count < 1 || options.shard_index < 0 ||
      options.shard_index >= options.shard_count) {
    return sim::fail(ErrorCode::kInvalidInput, "--shard {}/{}: expected I/N with 0 <= I < N",
                     options.shard_index, options.shard_count);
  }
  PreparedSweep p;
  p.file = &file;
  p.eval = options.eval;
  p.limits = options.limits;
  p.spec = file.sweep.value_or(SweepSpec{});
  for (std::int64_t i = options.shard_index; i < p.spec.size(); i += options.shard_count)
    p.points.push_back(i);

  // Every point must at least be a well-formed scenario; a schema error is the sweep's fault.
  for (std::int64_t i : p.points) {
    OFFSIM_ASSIGN_OR_RETURN(Node doc, apply_point(file.base, p.spec.point(i)));
    auto scenario = scenario_from_document(doc, file.base_dir);
    if (!scenario) {
      return sim::fail(scenario.error().code, "sweep point {}: {}", i, scenario.error().message);
    }
  }

  if (auto base = resolve_document(file.base, file.base_dir)) p.hardware_base = std::move(*base);

  const std::vector<std::string> axis_paths = p.spec.axis_paths();
  p.to_stdout = options.out_path.empty() || options.out_path == "-";
  p.format = p.to_stdout ? RowFormat::kCsv : row_format_for(options.out_path);
  if (p.format == RowFormat::kCsv) {
    for (const std::string& c : sweep_columns(axis_paths)) {
      p.header += (p.header.empty() ? "" : ",") + csv_field(c);
    }
  }
  // The key function owns copies: PreparedSweep is returned by value.
  const SweepSpec spec = p.spec;
  const std::vector<std::int64_t> points = p.points;
  const RowFormat format = p.format;
  auto expected_key = [spec, points, format](std::int64_t row) {
    const std::int64_t index = points[static_cast<std::size_t>(row)];
    const auto axes = spec.point(index);
    if (format == RowFormat::kJsonl) {
      // The same members jsonl_row_key() takes from a written line.
      const nlohmann::ordered_json record = point_record(index, axes, PointOutcome{});
      auto key = nlohmann::ordered_json::object();
      for (auto it = record.begin(); it != record.end(); ++it) {
        if (it.key() == "index" || it.key().rfind("axes.", 0) == 0) key[it.key()] = it.value();
      }
      return key.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    }
    std::string key = std::to_string(index);
    for (const SweepAssignment& a : axes) key += "," + csv_field(emit_flow(a.value));
    return key;
  };
  p.file_spec = ResultsFile::Spec{.path = options.out_path,
                                  .header = p.header,
                                  .expected_rows = static_cast<std::int64_t>(p.points.size()),
                                  .expected_key = expected_key,
                                  .row_key = format == RowFormat::kJsonl
                                                 ? jsonl_row_key()
                                                 : csv_row_key(1 + axis_paths.size())};
  p.mode = options.resume      ? OpenMode::kResume
           : options.overwrite ? OpenMode::kOverwrite
                               : OpenMode::kCreate;
  return p;
}

sim::Result<SweepSummary> run_sweep(const ScenarioFile& file, const SweepRunOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  OFFSIM_ASSIGN_OR_RETURN(PreparedSweep p, prepare_sweep(file, options));
  SweepSummary summary;
  summary.points_total = p.spec.size();
  summary.shard_points = static_cast<std::int64_t>(p.points.size());

  std::optional<ResultsFile> out;
  if (!p.to_stdout) {
    OFFSIM_ASSIGN_OR_RETURN(ResultsFile f, ResultsFile::open(p.file_spec, p.mode));
    summary.resumed = f.rows_done();
    out.emplace(std::move(f));
  } else {
    std::fputs((p.header + "\n").c_str(), stdout);
  }

  const std::int64_t first = summary.resumed;
  const std::int64_t todo = summary.shard_points - first;
  // The whole sweep's time limit: the watchdog cancels the evaluations in flight, and no row
  // produced after it fired is written (it may come from a cancelled evaluation).
  std::atomic<bool> cancel{false};
  if (options.limits.time_limit_s > 0.0) p.eval.cancel = &cancel;
  Watchdog watchdog(options.limits.time_limit_s, cancel);
  std::int64_t written = 0;
  std::atomic<std::int64_t> errors{0};
  auto work = [&](std::int64_t k) {
    if (cancel.load()) return std::string();
    bool error = false;
    std::string row = p.row(first + k, &error);
    if (error) errors.fetch_add(1, std::memory_order_relaxed);
    return row;
  };
  auto sink = [&](std::int64_t, std::vector<std::string>& rows) -> sim::Status {
    if (cancel.load()) {
      const std::int64_t done = first + written;
      return sim::fail(time_limit_error(
          options.limits.time_limit_s,
          fmt::format("sweeping: {} of {} points done{}", done, summary.shard_points,
                      out ? fmt::format(" and kept in {}; rerun with --resume to continue",
                                        options.out_path)
                          : "")));
    }
    if (out) {
      OFFSIM_RETURN_IF_ERROR(out->append(rows));
      written += static_cast<std::int64_t>(rows.size());
      return sim::ok();
    }
    written += static_cast<std::int64_t>(rows.size());
    for (const std::string& row : rows) std::fputs((row + "\n").c_str(), stdout);
    std::fflush(stdout);
    return sim::ok();
  };
  Progress progress(todo, options.progress, options.progress_interval_s);
  auto tick = [&](std::int64_t done) { progress.update(done); };
  if (sim::Status st = run_ordered(todo, options.jobs, work, sink, tick); !st) {
    progress.finish(written);
    return sim::fail(st.error());
  }
  progress.finish(todo);

  summary.evaluated = todo;
  summary.errors = errors.load();
  summary.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return summary;
}

}  // namespace offsim::scenarios
