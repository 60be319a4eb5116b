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

std::string axes_json(const std::vector<SweepAssignment>& axes) {
  auto o = nlohmann::ordered_json::object();
  for (const SweepAssignment& a : axes) o[a.path] = node_json(a.value);
  return o.dump();
}

std::string number(double v) { return fmt::format("{}", v); }

}  // namespace

PointOutcome evaluate_document(const Node& doc, const std::string& base_dir,
                               const models::EvalOptions& options, const ResourceLimits& limits) {
  PointOutcome out;
  auto scenario = scenario_from_document(doc, base_dir);
  if (!scenario) {
    out.error = scenario.error().message;
    out.input_error = true;
    return out;
  }
  if (auto status = check_loaded(*scenario, doc); !status) {
    out.error = status.error().message;
    return out;
  }
  if (auto status =
          check_plan_size(*scenario, limits, {.with_memory_samples = options.keep_timeline});
      !status) {
    out.error = status.error().message;
    return out;
  }
  auto eval = models::evaluate(*scenario, options);
  if (!eval) {
    out.error = eval.error().message;
    return out;
  }
  out.report = std::move(eval->report);
  return out;
}

const std::vector<std::string>& csv_report_columns() {
  static const std::vector<std::string> kColumns = {"step_time_s",
                                                    "tokens_per_s",
                                                    "tflops_per_gpu",
                                                    "mfu",
                                                    "fits",
                                                    "hbm_peak_bytes",
                                                    "host_peak_bytes",
                                                    "memory.params_bytes",
                                                    "memory.grads_bytes",
                                                    "memory.optimizer_bytes",
                                                    "memory.activations_bytes",
                                                    "memory.buffers_bytes",
                                                    "memory.workspace_bytes",
                                                    "time.compute_s",
                                                    "time.recompute_s",
                                                    "time.exposed_comm_s",
                                                    "time.exposed_offload_s",
                                                    "time.bubble_s",
                                                    "time.cpu_optimizer_s",
                                                    "time.other_s",
                                                    "outcome",
                                                    "error"};
  return kColumns;
}

std::vector<std::string> csv_report_values(const models::Report& r) {
  return {number(r.step_time_s),
          number(r.tokens_per_s),
          number(r.tflops_per_gpu),
          number(r.mfu),
          r.fits ? "true" : "false",
          std::to_string(r.hbm_peak_bytes),
          std::to_string(r.host_peak_bytes),
          std::to_string(r.memory.params_bytes),
          std::to_string(r.memory.grads_bytes),
          std::to_string(r.memory.optimizer_bytes),
          std::to_string(r.memory.activations_bytes),
          std::to_string(r.memory.buffers_bytes),
          std::to_string(r.memory.workspace_bytes),
          number(r.time.compute_s),
          number(r.time.recompute_s),
          number(r.time.exposed_comm_s),
          number(r.time.exposed_offload_s),
          number(r.time.bubble_s),
          number(r.time.cpu_optimizer_s),
          number(r.time.other_s),
          r.outcome,
          ""};
}

RowFormat row_format_for(const std::string& path) {
  auto ends_with = [&](std::string_view s) {
    return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
  };
  return ends_with(".jsonl") || ends_with(".ndjson") ? RowFormat::kJsonl : RowFormat::kCsv;
}

std::string format_row(RowFormat format, std::int64_t index, const std::string& scenario_path,
                       const std::vector<SweepAssignment>& axes, const PointOutcome& outcome) {
  if (format == RowFormat::kJsonl) {
    std::string row =
        fmt::format("{{\"index\":{},\"scenario\":{},\"axes\":{},", index,
                    nlohmann::json(scenario_path)
                        .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    axes_json(axes));
    if (outcome.report) {
      row += "\"report\":" + models::report_to_json(*outcome.report).dump() + "}";
    } else {
      row += "\"error\":" + nlohmann::json(one_line(outcome.error)).dump() + "}";
    }
    return row;
  }
  std::string row = std::to_string(index);
  for (const SweepAssignment& a : axes) row += "," + csv_field(emit_flow(a.value));
  if (outcome.report) {
    for (const std::string& v : csv_report_values(*outcome.report)) row += "," + csv_field(v);
  } else {
    for (std::size_t i = 0; i + 1 < csv_report_columns().size(); ++i) row += ",";
    row += "," + csv_field(one_line(outcome.error));
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
    outcome = evaluate_document(*doc, file->base_dir, eval, limits);
  }
  if (error != nullptr) *error = !outcome.report.has_value();
  return format_row(format, index, file->path, axes, outcome);
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

  const std::vector<std::string> axis_paths = p.spec.axis_paths();
  p.to_stdout = options.out_path.empty() || options.out_path == "-";
  p.format = p.to_stdout ? RowFormat::kCsv : row_format_for(options.out_path);
  if (p.format == RowFormat::kCsv) {
    p.header = "index";
    for (const std::string& path : axis_paths) p.header += "," + csv_field(path);
    for (const std::string& c : csv_report_columns()) p.header += "," + c;
  }
  // The key function owns copies: PreparedSweep is returned by value.
  const SweepSpec spec = p.spec;
  const std::vector<std::int64_t> points = p.points;
  const RowFormat format = p.format;
  auto expected_key = [spec, points, format](std::int64_t row) {
    const std::int64_t index = points[static_cast<std::size_t>(row)];
    const auto axes = spec.point(index);
    if (format == RowFormat::kJsonl) {
      return nlohmann::ordered_json{{"index", index},
                                    {"axes", nlohmann::ordered_json::parse(axes_json(axes))}}
          .dump();
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
