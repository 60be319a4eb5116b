// offsim: the command-line tool. Subcommands run, sweep, plan, validate, list, replay, compare
// and calibrate; see `offsim --help` and `offsim <command> --help`.
//
// Exit status: 0 ok, 2 input errors (bad scenario, bad option, missing file), 1 other failures.
// Errors go to stderr, one clear line first.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "backends/gpu_plugin.h"
#include "backends/replay.h"
#include "calibrate/calibrate.h"
#include "models/evaluate.h"
#include "scenarios/break_even.h"
#include "scenarios/cli/import_command.h"
#include "scenarios/cli/sweep_mpi.h"
#include "scenarios/importers/jax_memory.h"
#include "scenarios/memory_advice.h"
#include "scenarios/output_paths.h"
#include "scenarios/policy_search.h"
#include "scenarios/report_format.h"
#include "scenarios/resource_limits.h"
#include "scenarios/scenario_loader.h"
#include "scenarios/sweep_runner.h"
#include "sim/core/escape.h"
#include "sim/core/file_io.h"
#include "sim/plan/plan_json.h"
#include "sim/platform/host.h"
#include "sim/platform/profile.h"
#include "sim/platform/system.h"
#include "sim/trace/compare.h"
#include "sim/trace/timeline_json.h"

namespace offsim::cli {
namespace {

using scenarios::NamedReport;
using scenarios::ResourceLimits;
using scenarios::ScenarioFile;

int exit_code(const sim::Error& error) {
  switch (error.code) {
    case sim::ErrorCode::kInvalidInput:
    case sim::ErrorCode::kNotFound:
    case sim::ErrorCode::kLimitExceeded:
      return 2;
    default:
      return 1;
  }
}

// Every message may quote user input: invisible and control characters are shown as escapes.
int report(const sim::Error& error) {
  fmt::print(stderr, "offsim: error: {}\n", sim::escape_message_keep_lines(error.message));
  return exit_code(error);
}

int usage_error(const std::string& message) {
  fmt::print(stderr, "offsim: error: {}\n", sim::escape_message_keep_lines(message));
  return 2;
}

// A scenario loaded, mapped and checked; input errors come back as kInvalidInput.
struct Loaded {
  ScenarioFile file;
  models::Scenario scenario;
};

// `max_points` bounds the file's sweep block: run, plan and replay evaluate only the base
// scenario, so their default is no bound; validate checks every point (its --max-points).
sim::Result<Loaded> load_checked(
    const std::string& path, const std::vector<std::string>& sets,
    std::int64_t max_points = std::numeric_limits<std::int64_t>::max()) {
  Loaded loaded;
  scenarios::LoadOptions load;
  load.max_sweep_points = max_points;
  OFFSIM_ASSIGN_OR_RETURN(loaded.file, scenarios::load_scenario_file(path, sets, load));
  OFFSIM_ASSIGN_OR_RETURN(
      loaded.scenario, scenarios::scenario_from_document(loaded.file.base, loaded.file.base_dir));
  OFFSIM_RETURN_IF_ERROR(scenarios::check_loaded(loaded.scenario, loaded.file.base));
  return loaded;
}

// Model errors that come from the scenario's content are input errors.
sim::Error eval_error(const sim::Error& error, const std::string& path) {
  return sim::Error{error.code, fmt::format("{}: {}", path, error.message)};
}

// The plan-size and memory flags of run, sweep, plan, replay and validate; --time-limit where
// `time_help` is given.
// A number in [lo, hi] (an integer when `integer`), checked on the text before CLI11 converts
// it, so that values beyond the option's type (1e30 for an int64, 1e10 s for a clock in
// nanoseconds) are refused with the range instead of overflowing. CLI11 prefixes the option name.
CLI::Validator in_range(double lo, double hi, bool integer, const std::string& unit,
                        bool above_lo = false) {
  const std::string range = integer
                                ? fmt::format("an integer from {:.0f} to {:.0f}{}", lo, hi, unit)
                                : fmt::format("a number {} {} and at most {}{}",
                                              above_lo ? "above" : "from", lo, hi, unit);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        try {
          std::size_t used = 0;
          const double v = std::stod(text, &used);
          const bool whole = text.find_first_of(".eE") == std::string::npos;
          if (used == text.size() && std::isfinite(v) && (above_lo ? v > lo : v >= lo) && v <= hi &&
              (!integer || whole)) {
            return {};
          }
        } catch (const std::exception&) {
        }
        return "expected " + range + ", got " + sim::escape_for_message(text);
      },
      range);
}

// The time limit's watchdog counts in nanoseconds of a 64-bit clock (about 9.2e9 s); 1e9 s
// (31 years) is below that with room for the start time.
constexpr double kMaxTimeLimitS = 1e9;

// Threads: more than 4096 is more than any machine's cores and only costs memory (each thread
// keeps its own simulator state).
constexpr double kMaxJobs = 4096;

void add_limit_options(CLI::App* cmd, ResourceLimits& limits, const char* time_help) {
  // Ops: 1e12 is 50 000 times the default and beyond any memory; bytes: 2^60 (1 EiB).
  cmd->add_option("--max-plan-ops", limits.max_plan_ops,
                  fmt::format("refuse scenarios whose step has more ops than this, estimated "
                              "before building it (default {})",
                              scenarios::kDefaultMaxPlanOps))
      ->check(in_range(1, 1e12, true, ""));
  cmd->add_option("--max-memory", limits.max_memory_bytes,
                  "refuse scenarios whose plan and timeline would take more bytes than this, "
                  "estimated before building (default: half of physical memory)")
      ->check(in_range(1, 1152921504606846976.0, true, " bytes"));
  if (time_help != nullptr) {
    cmd->add_option("--time-limit", limits.time_limit_s, time_help)
        ->check(in_range(0, kMaxTimeLimitS, false, " seconds", /*above_lo=*/true));
  }
}

// Evaluates under the time limit of `limits` (a watchdog cancels the engine).
sim::Result<models::Evaluation> evaluate_limited(const models::Scenario& scenario,
                                                 models::EvalOptions options,
                                                 const ResourceLimits& limits,
                                                 const std::string& path) {
  std::atomic<bool> cancel{false};
  scenarios::Watchdog watchdog(limits.time_limit_s, cancel);
  options.cancel = &cancel;
  auto eval = models::evaluate(scenario, options);
  if (!eval) {
    if (watchdog.fired()) {
      return sim::fail(scenarios::time_limit_error(limits.time_limit_s, "simulating " + path));
    }
    return sim::fail(eval_error(eval.error(), path));
  }
  return eval;
}

// ---------------------------------------------------------------------------------------- run

struct RunArgs {
  std::vector<std::string> scenarios;
  std::vector<std::string> sets;
  std::string format = "table";
  std::string trace;
  std::string plan_out;
  std::string timeline_out;
  bool print_effective = false;
  std::string jax_memory;  // JAX memory_analysis() JSON shown beside the forecast
  bool break_even = false;
  ResourceLimits limits;
};

int cmd_run(const RunArgs& a) {
  if (a.break_even && a.format != "table") {
    return usage_error("--break-even: prints a line under the table; use --format table");
  }
  const bool single_outputs = !a.trace.empty() || !a.plan_out.empty() || !a.timeline_out.empty();
  if (single_outputs && a.scenarios.size() != 1) {
    return usage_error("--trace, --plan-out and --timeline-out take one scenario; got " +
                       std::to_string(a.scenarios.size()));
  }
  std::optional<scenarios::JaxMemory> jax;
  if (!a.jax_memory.empty()) {
    if (a.scenarios.size() != 1 || a.format == "csv") {
      return usage_error("--jax-memory takes one scenario and the table or json format");
    }
    auto j = scenarios::read_jax_memory(a.jax_memory);
    if (!j) return report(j.error());
    jax = std::move(*j);
  }
  std::vector<Loaded> loaded;
  for (const std::string& path : a.scenarios) {
    auto l = load_checked(path, a.sets);
    if (!l) return report(l.error());
    if (l->file.sweep && !a.print_effective) {
      fmt::print(stderr,
                 "offsim: note: {} has a sweep block of {} points; run evaluates the base "
                 "scenario (use `offsim sweep` for the points)\n",
                 path, l->file.sweep->size());
    }
    loaded.push_back(std::move(*l));
  }
  if (a.print_effective) {
    for (const Loaded& l : loaded) {
      if (loaded.size() > 1) fmt::print("# {}\n", l.file.path);
      fmt::print("{}", scenarios::emit_yaml(scenarios::scenario_to_document(l.scenario)));
      if (l.file.sweep) {
        fmt::print("# sweep: {} points over {}\n", l.file.sweep->size(),
                   fmt::join(l.file.sweep->axis_paths(), ", "));
      }
    }
    return 0;
  }
  // Outputs are checked and their temporary files created before simulating; they replace
  // their destinations together at the end.
  std::vector<std::string> inputs = a.scenarios;
  for (const Loaded& l : loaded) inputs.push_back(l.scenario.hardware.profile_path);
  if (!a.jax_memory.empty()) inputs.push_back(a.jax_memory);
  scenarios::OutputFiles outputs(inputs);
  for (const auto& [flag, path] :
       {std::pair("--trace", &a.trace), std::pair("--timeline-out", &a.timeline_out),
        std::pair("--plan-out", &a.plan_out)}) {
    if (auto st = outputs.reserve(flag, *path, {".json"}); !st) return report(st.error());
  }
  std::vector<NamedReport> reports;
  for (const Loaded& l : loaded) {
    models::EvalOptions options;
    options.keep_timeline = !a.trace.empty() || !a.timeline_out.empty();
    options.keep_plan = !a.plan_out.empty();
    if (auto st = scenarios::check_plan_size(l.scenario, a.limits,
                                             {.with_memory_samples = options.keep_timeline});
        !st) {
      return report(eval_error(st.error(), l.file.path));
    }
    auto eval = evaluate_limited(l.scenario, options, a.limits, l.file.path);
    if (!eval) return report(eval.error());
    if (!a.trace.empty()) {
      const std::vector<const sim::Timeline*> timelines = {&*eval->timeline};
      auto st = outputs.write(a.trace, sim::chrome_trace_json(timelines));
      if (!st) return report(st.error());
    }
    if (!a.timeline_out.empty()) {
      auto st = outputs.write(a.timeline_out, sim::timeline_to_json(*eval->timeline).dump());
      if (!st) return report(st.error());
    }
    if (!a.plan_out.empty()) {
      auto st = outputs.write(a.plan_out, sim::plan_to_json(*eval->plan).dump());
      if (!st) return report(st.error());
    }
    if (auto st = outputs.commit(); !st) return report(st.error());
    if (!a.trace.empty()) {
      fmt::print(stderr, "offsim: wrote the Chrome/Perfetto trace to {}\n",
                 sim::escape_for_message(a.trace));
    }
    reports.push_back({l.scenario.name, std::move(eval->report)});
  }
  if (a.format == "json") {
    nlohmann::ordered_json records = scenarios::format_json(reports);
    if (jax) {
      // JAX's view of the first scenario, as flat `jax_memory.*` columns of its record.
      const nlohmann::json cmp = scenarios::jax_memory_comparison(*jax, reports.front().report);
      scenarios::flatten_json(cmp, cmp, "jax_memory", records.front());
    }
    fmt::print("{}\n",
               records.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
  } else if (a.format == "jsonl") {
    fmt::print("{}", scenarios::format_jsonl(reports));
  } else if (a.format == "csv") {
    fmt::print("{}", scenarios::format_csv(reports));
  } else {
    fmt::print("{}", scenarios::format_table(reports));
    if (jax) fmt::print("{}", scenarios::format_jax_memory(*jax, reports.front().report));
    // What dominates memory, and what must move, for each configuration that does not fit.
    for (std::size_t i = 0; i < reports.size(); ++i) {
      if (reports[i].report.fits) continue;
      auto advice = scenarios::memory_advice(loaded[i].scenario, reports[i].report);
      if (advice && !advice->empty()) {
        fmt::print("{}{}\n", reports.size() > 1 ? reports[i].name + ": " : "why:  ", *advice);
      }
    }
  }
  if (a.break_even) {
    for (const Loaded& l : loaded) {
      auto be = scenarios::break_even_host_bandwidth(l.scenario);
      if (!be) return report(sim::Error{be.error().code, l.file.path + ": " + be.error().message});
      fmt::print("{}break-even host bandwidth: {}\n",
                 loaded.size() > 1 ? l.scenario.name + ": " : "", scenarios::describe(*be));
    }
  }
  return 0;
}

// -------------------------------------------------------------------------------------- sweep

struct SweepArgs {
  std::string scenario;
  std::vector<std::string> sets;
  int jobs = 0;
  std::string out;
  bool resume = false;
  bool overwrite = false;
  std::string shard;
  bool mpi = false;
  bool quiet = false;
  std::int64_t max_points = 1'000'000;
  ResourceLimits limits;
};

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
  if (!a.quiet) {
    fmt::print(stderr,
               "offsim: sweep of {} points{}: {} already done, {} evaluated ({} errors) in {:.2f} "
               "s, {:.1f} points/s{}\n",
               summary->points_total,
               o.shard_count > 1 ? fmt::format(" (shard {}/{}: {} points)", o.shard_index,
                                               o.shard_count, summary->shard_points)
                                 : "",
               summary->resumed, summary->evaluated, summary->errors, summary->wall_s,
               summary->wall_s > 0 ? static_cast<double>(summary->evaluated) / summary->wall_s : 0,
               a.out.empty() || a.out == "-" ? "" : " -> " + a.out);
  }
  return 0;
}

// --------------------------------------------------------------------------------------- plan

struct PlanArgs {
  std::string scenario;
  std::vector<std::string> sets;
  std::string objective = "step_time";
  int top = 5;
  std::string search = "pruned";
  std::vector<std::string> joint;
  std::vector<std::string> classes;
  std::vector<double> fractions;
  std::vector<int> prefetch;
  std::vector<std::int64_t> micro_batches;
  int jobs = 0;
  std::string format = "table";
  ResourceLimits limits;
};

int cmd_plan(const PlanArgs& a) {
  auto l = load_checked(a.scenario, a.sets);
  if (!l) return report(l.error());
  scenarios::SearchOptions o;
  o.top_k = a.top;
  o.jobs = a.jobs;
  o.progress = ::isatty(STDERR_FILENO) == 1 && a.format == "table";
  o.objective = a.objective == "tokens_per_s" ? scenarios::Objective::kTokensPerS
                                              : scenarios::Objective::kStepTime;
  o.method = a.search == "exhaustive" ? scenarios::SearchMethod::kExhaustive
                                      : scenarios::SearchMethod::kPruned;
  if (!a.classes.empty()) {
    o.space.classes.clear();
    for (const std::string& c : a.classes) {
      auto cls = models::tensor_class_from_string(c);
      if (!cls || *cls == models::TensorClass::kNamedActivation) {
        return usage_error(
            fmt::format("--classes {}: expected params, grads, optimizer_states, master_weights or "
                        "activations",
                        c));
      }
      o.space.classes.push_back(*cls);
    }
  }
  for (std::size_t i = 0; i < a.fractions.size(); ++i) {
    const double f = a.fractions[i];
    if (!(f >= 0.0 && f <= 1.0)) {
      return usage_error(fmt::format("--fractions {}: expected fractions in [0, 1]", f));
    }
    if (i > 0 && f <= a.fractions[i - 1]) {
      return usage_error(
          fmt::format("--fractions {}: expected distinct fractions in ascending order (after {})",
                      f, a.fractions[i - 1]));
    }
  }
  for (std::size_t i = 0; i < a.prefetch.size(); ++i) {
    const int p = a.prefetch[i];
    if (p < 1 || p > l->scenario.model.layers) {
      return usage_error(
          fmt::format("--prefetch {}: expected a depth in 1..{} (the model's layers)", p,
                      l->scenario.model.layers));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (a.prefetch[j] == p) {
        return usage_error(fmt::format("--prefetch {}: listed twice", p));
      }
    }
  }
  for (std::size_t i = 0; i < a.micro_batches.size(); ++i) {
    const std::int64_t mb = a.micro_batches[i];
    if (mb < 1) return usage_error(fmt::format("--micro-batches {}: expected sizes >= 1", mb));
    for (std::size_t j = 0; j < i; ++j) {
      if (a.micro_batches[j] == mb) {
        return usage_error(fmt::format("--micro-batches {}: listed twice", mb));
      }
    }
  }
  if (!a.fractions.empty()) o.space.fractions = a.fractions;
  if (!a.prefetch.empty()) o.space.prefetch = a.prefetch;
  // "Offload or recompute, and at which micro-batch?" is the question: both are searched unless
  // --joint names a subset (or none).
  std::vector<std::string> joint = a.joint;
  if (joint.empty()) joint = {"micro_batch", "recompute"};
  if (joint == std::vector<std::string>{"none"}) joint.clear();
  if (!a.micro_batches.empty() &&
      std::find(joint.begin(), joint.end(), "micro_batch") == joint.end()) {
    return usage_error("--micro-batches: needs micro_batch in --joint");
  }
  for (const std::string& j : joint) {
    if (j == "micro_batch") {
      if (!a.micro_batches.empty()) {
        o.space.micro_batches = a.micro_batches;
      } else {
        // Every micro-batch that divides the per-rank batch, up to 16.
        const auto& t = l->scenario.training;
        const std::int64_t per_rank = t.global_batch / l->scenario.parallelism.dp;
        for (std::int64_t mb = 1; mb <= std::min<std::int64_t>(per_rank, 16); ++mb)
          if (per_rank % mb == 0) o.space.micro_batches.push_back(mb);
      }
    } else if (j == "recompute") {
      o.space.recompute = {models::RecomputeConfig::Mode::kNone,
                           models::RecomputeConfig::Mode::kSelective,
                           models::RecomputeConfig::Mode::kFull};
    } else {
      return usage_error(
          fmt::format("--joint {}: expected micro_batch and/or recompute, or none", j));
    }
  }
  // The largest plan of the search: the smallest micro-batch (most micro-batches), full
  // recompute when recompute is searched.
  models::Scenario largest = l->scenario;
  if (!o.space.micro_batches.empty()) {
    largest.training.micro_batch =
        *std::min_element(o.space.micro_batches.begin(), o.space.micro_batches.end());
  }
  if (!o.space.recompute.empty()) largest.recompute.mode = models::RecomputeConfig::Mode::kFull;
  if (auto st = scenarios::check_plan_size(largest, a.limits); !st) {
    return report(eval_error(st.error(), a.scenario));
  }
  std::atomic<bool> cancel{false};
  scenarios::Watchdog watchdog(a.limits.time_limit_s, cancel);
  if (a.limits.time_limit_s > 0.0) o.eval.cancel = &cancel;
  auto r = scenarios::search_policies(l->scenario, o);
  if (watchdog.fired()) {
    return report(
        scenarios::time_limit_error(a.limits.time_limit_s, "searching policies for " + a.scenario));
  }
  if (!r) return report(r.error());
  const double share =
      r->valid > 0 ? 100.0 * static_cast<double>(r->evaluated) / static_cast<double>(r->valid)
                   : 0.0;
  if (a.format == "json") {
    nlohmann::json j;
    j["space_size"] = r->space_size;
    j["valid"] = r->valid;
    j["evaluated"] = r->evaluated;
    j["fitting"] = r->fitting;
    j["skipped_bound"] = r->skipped_bound;
    j["skipped_infeasible"] = r->skipped_infeasible;
    j["wall_s"] = r->wall_s;
    j["best"] = nlohmann::json::array();
    for (const auto& c : r->best) {
      auto doc = scenarios::scenario_to_document(c.scenario);
      j["best"].push_back({{"policy", c.policy},
                           {"limit", c.limit},
                           {"offload_yaml", scenarios::emit_yaml(*doc.find("offload"))},
                           {"report", models::report_to_json(c.report)}});
    }
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print(
      "{} search over {} candidates ({} valid): evaluated {} ({:.1f}%), skipped {} by "
      "lower bound and {} known not to fit, in {:.2f} s; {} fit\n\n",
      a.search, r->space_size, r->valid, r->evaluated, share, r->skipped_bound,
      r->skipped_infeasible, r->wall_s, r->fitting);
  if (r->best.empty()) {
    fmt::print("no candidate fits HBM and host memory.\n");
    // Why: the scenario as given, with every offloadable class explained.
    models::Scenario probe = l->scenario;
    if (!o.space.micro_batches.empty()) {
      probe.training.micro_batch =
          *std::min_element(o.space.micro_batches.begin(), o.space.micro_batches.end());
    }
    if (!o.space.recompute.empty()) probe.recompute.mode = models::RecomputeConfig::Mode::kFull;
    if (auto e = models::evaluate(probe); e && !e->report.fits) {
      auto advice = scenarios::memory_advice(probe, e->report);
      if (advice && !advice->empty()) fmt::print("why: {}\n", *advice);
    }
    return 0;
  }
  for (std::size_t i = 0; i < r->best.size(); ++i) {
    const auto& c = r->best[i];
    fmt::print(
        "#{}  {:.3f} s/step  {:.0f} tokens/s  MFU {:.1f}%  HBM {}  host {}\n    {}\n    "
        "limited by: {}\n",
        i + 1, c.report.step_time_s, c.report.tokens_per_s, 100 * c.report.mfu,
        scenarios::format_bytes(c.report.hbm_peak_bytes),
        scenarios::format_bytes(c.report.host_peak_bytes), c.policy, c.limit);
  }
  const auto& best = r->best.front();
  fmt::print("\nbest configuration, as scenario YAML:\n");
  auto doc = scenarios::scenario_to_document(best.scenario);
  scenarios::Node excerpt = scenarios::make_map();
  for (const char* key : {"training", "recompute", "offload"})
    excerpt.entries.emplace_back(key, *doc.find(key));
  fmt::print("{}\n", scenarios::emit_yaml(excerpt));
  fmt::print("{}", scenarios::format_table({{best.scenario.name, best.report}}));
  return 0;
}

// ----------------------------------------------------------------------------------- validate

int cmd_validate(const std::string& path, const std::vector<std::string>& sets,
                 const ResourceLimits& limits, std::int64_t max_points) {
  auto l = load_checked(path, sets, max_points);
  if (!l) return report(l.error());
  const models::Scenario& s = l->scenario;
  if (auto st = scenarios::check_plan_size(s, limits); !st) {
    return report(eval_error(st.error(), path));
  }
  fmt::print(
      "{}: ok: {} ({} layers, {:.1f}B parameters) on {} × {}, dp {} tp {} pp {}, "
      "offload {}\n",
      path, s.name, s.model.layers, static_cast<double>(models::parameter_count(s.model)) / 1e9,
      s.hardware.nodes, s.hardware.system, s.parallelism.dp, s.parallelism.tp, s.parallelism.pp,
      s.offload.preset.empty() ? "custom" : s.offload.preset);
  fmt::print("{}: step size: {}\n", path, models::describe(models::estimate_plan_size(s)));
  if (!l->file.sweep) return 0;
  const auto& spec = *l->file.sweep;
  std::int64_t impossible = 0;
  for (std::int64_t i = 0; i < spec.size(); ++i) {
    auto doc = scenarios::apply_point(l->file.base, spec.point(i));
    if (!doc) return report(doc.error());
    auto point = scenarios::scenario_from_document(*doc, l->file.base_dir);
    if (!point)
      return report(sim::Error{point.error().code,
                               fmt::format("sweep point {}: {}", i, point.error().message)});
    sim::Status st = scenarios::check_loaded(*point, *doc);
    if (st) st = scenarios::check_plan_size(*point, limits);
    if (!st) {
      if (impossible < 5) fmt::print("  point {}: {}\n", i, st.error().message);
      ++impossible;
    }
  }
  fmt::print("{}: sweep of {} points over {}; {} impossible (they become error rows)\n", path,
             spec.size(), fmt::join(spec.axis_paths(), ", "), impossible);
  return 0;
}

// --------------------------------------------------------------------------------------- list

int cmd_list(const std::string& what) {
  if (what == "models") {
    for (const auto& m : models::list_models()) {
      auto arch = models::find_model(m.name);
      fmt::print("{:<22} {:>8.1f}B  {}\n", m.name,
                 arch ? static_cast<double>(models::parameter_count(*arch)) / 1e9 : 0.0, m.source);
    }
  } else if (what == "systems") {
    for (const auto& s : sim::platform::list_systems()) {
      fmt::print("{:<18} {} × {}, host {}  {}\n", s.name, s.gpus_per_node, s.gpu, s.host,
                 s.description);
    }
  } else if (what == "hosts") {
    for (const auto& h : sim::platform::list_hosts()) {
      fmt::print("{:<12} {}; {:.0f} GB/s DRAM per socket achievable, root complex {:.0f} GB/s\n",
                 h.name, h.description, h.dram_bytes_per_s_per_socket.value / 1e9,
                 h.root_complex_bytes_per_s.value / 1e9);
    }
  } else if (what == "presets") {
    for (const auto& p : models::list_presets()) fmt::print("{:<38} {}\n", p.name, p.description);
  } else if (what == "policies") {
    fmt::print(
        "offload rules (offload.rules[]), each a map:\n"
        "  tensor:           params | grads | optimizer_states | master_weights | activations |\n"
        "                    named_activation (with name:) | an activation name directly\n"
        "  name:             {}\n"
        "  layers:           all | [0, 1, ...] | {{fraction: 0.5}} | {{first: 20}}\n"
        "  where:            host | hbm\n"
        "  prefetch_layers:  H2D this many layers ahead of use (default 1)\n"
        "  chunk_bytes:      split copies into chunks of at most this size (0 = whole)\n"
        "offload.optimizer:  gpu | cpu (CPU update of host-resident optimizer state)\n"
        "or a preset: offload: <preset> or offload: {{preset: <name>, num_layers:, fraction:,\n"
        "prefetch_layers:, names: [...]}} — see `offsim list presets`.\n",
        fmt::join(models::activation_names(), ", "));
  } else if (what == "devices") {
    int gpus = 0;
    for (const auto& d : backends::list_devices()) {
      const bool unbounded = d.memory_bytes == std::numeric_limits<std::int64_t>::max();
      fmt::print(
          "{:<5} {}  {} rank(s), {} each{}\n", backends::to_string(d.kind), d.name, d.ranks,
          unbounded ? std::string("unbounded memory") : scenarios::format_bytes(d.memory_bytes),
          d.note.empty() ? "" : "  " + d.note);
      gpus += d.kind == backends::DeviceKind::kCuda ? 1 : 0;
    }
    // No GPU listed: say why instead of listing nothing. A module path set explicitly
    // (OFFSIM_GPU_PLUGIN) that does not load is an input error.
    if (gpus == 0) {
      const char* env = std::getenv("OFFSIM_GPU_PLUGIN");
      const bool explicit_path = env != nullptr && *env != '\0';
      auto gpu = backends::load_gpu_plugin();
      if (!gpu && explicit_path) {
        return report(
            sim::Error{sim::ErrorCode::kInvalidInput,
                       fmt::format("OFFSIM_GPU_PLUGIN={}: {}", env, gpu.error().message)});
      }
      fmt::print("{:<5} none: {}\n", "gpu",
                 gpu ? std::string("the GPU module loaded, but no CUDA GPU is visible")
                     : gpu.error().message);
    }
  } else {
    return usage_error(fmt::format(
        "list {}: expected models, systems, hosts, policies, presets or devices", what));
  }
  return 0;
}

// ------------------------------------------------------------------ replay, compare, calibrate

struct ReplayArgs {
  std::string scenario;
  std::vector<std::string> sets;
  std::string profile;
  std::int64_t layers = 0;
  int steps = 3;
  int warmup = 1;
  std::string device = "auto";
  std::string out;
  std::string predicted_out;
  std::string trace;
  bool all_ranks = false;
  ResourceLimits limits;
};

int cmd_replay(const ReplayArgs& a) {
  std::vector<std::string> sets = a.sets;
  if (a.layers > 0) sets.push_back(fmt::format("model.layers={}", a.layers));
  if (!a.profile.empty()) sets.push_back(fmt::format("hardware.profile={}", a.profile));
  auto l = load_checked(a.scenario, sets);
  if (!l) return report(l.error());
  scenarios::OutputFiles outputs({a.scenario, l->scenario.hardware.profile_path});
  for (const auto& [flag, path] :
       {std::pair("--out", &a.out), std::pair("--predicted-out", &a.predicted_out),
        std::pair("--trace", &a.trace)}) {
    if (auto st = outputs.reserve(flag, *path, {".json"}); !st) return report(st.error());
  }
  models::EvalOptions eo;
  eo.keep_plan = true;
  eo.keep_timeline = true;
  if (auto st = scenarios::check_plan_size(l->scenario, a.limits, {.with_memory_samples = true});
      !st) {
    return report(eval_error(st.error(), a.scenario));
  }
  auto eval = models::evaluate(l->scenario, eo);
  if (!eval) return report(eval_error(eval.error(), a.scenario));
  backends::ReplayOptions ro;
  ro.measured_steps = a.steps;
  ro.warmup_steps = a.warmup;
  ro.all_ranks = a.all_ranks;
  ro.forecast = &*eval->timeline;  // the watchdog scales with it; memory shows its peaks
  if (a.device == "cpu") {
    ro.device = backends::DeviceKind::kCpu;
  } else if (a.device == "cuda") {
    ro.device = backends::DeviceKind::kCuda;
  } else {
    ro.device = backends::DeviceKind::kCpu;
    for (const auto& d : backends::list_devices())
      if (d.kind == backends::DeviceKind::kCuda) ro.device = backends::DeviceKind::kCuda;
    if (ro.device == backends::DeviceKind::kCpu) {
      fmt::print(stderr,
                 "offsim: note: no GPU visible; replaying on the CPU device (its times "
                 "are not comparable with the GPU forecast)\n");
    }
  }
  auto measured = backends::replay(*eval->plan, ro);
  if (!measured) return report(measured.error());
  if (!a.out.empty()) {
    auto st = outputs.write(a.out, sim::timeline_to_json(measured->timeline).dump());
    if (!st) return report(st.error());
  }
  if (!a.predicted_out.empty()) {
    auto st = outputs.write(a.predicted_out, sim::timeline_to_json(*eval->timeline).dump());
    if (!st) return report(st.error());
  }
  if (!a.trace.empty()) {
    const std::vector<const sim::Timeline*> both = {&*eval->timeline, &measured->timeline};
    auto st = outputs.write(a.trace, sim::chrome_trace_json(both));
    if (!st) return report(st.error());
  }
  if (auto st = outputs.commit(); !st) return report(st.error());
  auto cmp = sim::compare_timelines(*eval->timeline, measured->timeline);
  if (!cmp) return report(cmp.error());
  fmt::print("replayed {} on {} ({} measured steps)\n{}", l->scenario.name, measured->device.name,
             a.steps, sim::comparison_to_text(*cmp));
  fmt::print("{}", backends::replay_report_text(*measured));
  return 0;
}

int cmd_compare(const std::string& predicted_path, const std::string& measured_path,
                const std::string& format) {
  auto predicted = sim::read_timeline_file(predicted_path);
  if (!predicted) return report(predicted.error());
  auto measured = sim::read_timeline_file(measured_path);
  if (!measured) return report(measured.error());
  auto cmp = sim::compare_timelines(*predicted, *measured);
  if (!cmp) return report(cmp.error());
  if (format == "json") {
    fmt::print("{}\n", sim::comparison_to_json(*cmp).dump(2));
  } else {
    fmt::print("{}", sim::comparison_to_text(*cmp));
  }
  return 0;
}

int cmd_calibrate(bool quick, int gpus, const std::string& out, const std::string& command_line) {
  // The profile's path is checked and reserved before measuring (minutes of GPU time).
  const std::string path = out.empty() ? "calibration-profile.json" : out;
  scenarios::OutputFiles outputs({});
  if (auto st = outputs.reserve("--out", path, {".json"}); !st) return report(st.error());
  calibrate::CalibrateOptions o;
  o.quick = quick;
  o.gpus = gpus;
  o.command_line = command_line;
  auto run = calibrate::run_calibration(o);
  if (!run) return report(run.error());
  auto st = outputs.write(path, sim::platform::profile_to_json(run->profile).dump(2) + "\n");
  if (st) st = outputs.commit();
  if (!st) return report(st.error());
  fmt::print("wrote the calibration profile to {}\n", path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "offsim: forecast the step time and memory of LLM training with host-offload policies.\n"
      "\nExamples:\n"
      "  offsim run scenarios/examples/llama70b-8xh100-offload.yaml\n"
      "  offsim run scenarios/examples/llama70b-8xh100-no-offload.yaml "
      "scenarios/examples/llama70b-8xh100-offload.yaml\n"
      "  offsim sweep scenarios/examples/2b-1xa100-sweep.yaml --out sweep.csv\n"
      "  offsim plan scenarios/examples/llama70b-8xh100-offload.yaml --top 3\n"
      "  offsim list models\n",
      "offsim"};
  app.set_version_flag("--version", std::string("offsim ") + OFFSIM_VERSION);
  app.require_subcommand(1);
  app.footer(
      "Exit status: 0 ok, 2 input error, 1 other failure. `offsim COMMAND --help` for more.");

  // run
  RunArgs run;
  auto* run_cmd = app.add_subcommand(
      "run",
      "Simulate one training step of each scenario and print its report.\n"
      "Several scenarios are shown side by side.\n\nExamples:\n"
      "  offsim run ex.yaml\n"
      "  offsim run ex.yaml --set training.micro_batch=2 --format json\n"
      "  offsim run no-offload.yaml offload.yaml          # side-by-side comparison\n"
      "  offsim run ex.yaml --trace step.json             # open in ui.perfetto.dev\n"
      "  offsim run ex.yaml --print-effective             # every field, defaults applied\n"
      "  offsim run big.yaml --max-plan-ops 50000000 --time-limit 600");
  run_cmd->add_option("scenario", run.scenarios, "scenario files (YAML or JSON)")
      ->required()
      ->check(CLI::ExistingFile);
  run_cmd->add_option("--set", run.sets, "override a key: key.path=value (repeatable)");
  run_cmd
      ->add_option("--format", run.format,
                   "table, json (a list of flat records), jsonl (one record per line) or csv")
      ->check(CLI::IsMember({"table", "json", "jsonl", "csv"}));
  run_cmd->add_option("--trace", run.trace, "write the Chrome/Perfetto trace JSON here");
  run_cmd->add_option("--plan-out", run.plan_out, "write the Plan JSON here");
  run_cmd->add_option("--timeline-out", run.timeline_out, "write the Timeline JSON here");
  run_cmd->add_flag("--print-effective", run.print_effective,
                    "print the effective scenario (defaults and overrides applied) as YAML");
  run_cmd
      ->add_option("--jax-memory", run.jax_memory,
                   "JAX compiled.memory_analysis() sizes as JSON (scenarios/importers/"
                   "jax_memory.h), shown beside the forecast")
      ->check(CLI::ExistingFile);
  run_cmd->add_flag("--break-even", run.break_even,
                    "for a scenario with activation offload: the host bandwidth per GPU above "
                    "which it beats full recomputation");
  add_limit_options(run_cmd, run.limits,
                    "stop each scenario's simulation after this many seconds (exit 2)");

  // sweep
  SweepArgs sweep;
  auto* sweep_cmd = app.add_subcommand(
      "sweep",
      "Evaluate every point of a scenario's sweep block; one row per point, in point order.\n"
      "Rows are flushed durably as they finish; --resume continues a killed sweep.\n\nExamples:\n"
      "  offsim sweep sweep.yaml --out results.csv\n"
      "  offsim sweep sweep.yaml --out results.jsonl --jobs 8 --resume\n"
      "  offsim sweep sweep.yaml --out part0.csv --shard 0/4\n"
      "  offsim sweep sweep.yaml --out results.csv --time-limit 3600   # then --resume\n"
      "  mpirun -n 4 offsim sweep sweep.yaml --out results.csv --mpi");
  sweep_cmd->add_option("scenario", sweep.scenario, "scenario file with a sweep block")
      ->required()
      ->check(CLI::ExistingFile);
  sweep_cmd->add_option("--set", sweep.sets, "override a key: key.path=value (repeatable)");
  sweep_cmd->add_option("--jobs,-j", sweep.jobs, "threads (default: all cores)")
      ->check(in_range(0, kMaxJobs, true, ""));
  sweep_cmd->add_option("--out,-o", sweep.out, "FILE.csv or FILE.jsonl (default: CSV on stdout)");
  sweep_cmd->add_flag("--resume", sweep.resume, "continue an existing output file");
  sweep_cmd->add_flag("--overwrite", sweep.overwrite, "replace an existing output file");
  sweep_cmd->add_option("--shard", sweep.shard, "I/N: evaluate the points with index % N == I");
  sweep_cmd->add_flag("--mpi", sweep.mpi,
                      "split the points over MPI ranks; rank 0 writes the merged file");
  sweep_cmd->add_flag("--quiet,-q", sweep.quiet, "no progress on stderr");
  sweep_cmd->add_option("--max-points", sweep.max_points, "refuse sweeps larger than this")
      ->check(in_range(1, 1e12, true, ""));
  add_limit_options(sweep_cmd, sweep.limits,
                    "stop the whole sweep after this many seconds; finished rows stay in --out "
                    "and --resume continues (exit 2)");

  // plan
  PlanArgs plan;
  auto* plan_cmd = app.add_subcommand(
      "plan",
      "Search offload policies (tensor classes x layer fraction x prefetch depth x CPU/GPU\n"
      "optimizer) x recompute x micro-batch under HBM and host capacity; when nothing fits,\n"
      "say what dominates memory and which class must move.\n\n"
      "Examples:\n"
      "  offsim plan ex.yaml --top 3\n"
      "  offsim plan ex.yaml --joint none --objective tokens_per_s\n"
      "  offsim plan ex.yaml --classes activations --fractions 0,0.5,1 --search exhaustive");
  plan_cmd->add_option("scenario", plan.scenario, "scenario file")
      ->required()
      ->check(CLI::ExistingFile);
  plan_cmd->add_option("--set", plan.sets, "override a key: key.path=value (repeatable)");
  plan_cmd->add_option("--objective", plan.objective, "step_time or tokens_per_s")
      ->check(CLI::IsMember({"step_time", "tokens_per_s"}));
  plan_cmd->add_option("--top", plan.top, "how many configurations to print")
      ->check(CLI::PositiveNumber);
  plan_cmd->add_option("--search", plan.search, "pruned (default) or exhaustive")
      ->check(CLI::IsMember({"pruned", "exhaustive"}));
  plan_cmd
      ->add_option("--joint", plan.joint,
                   "what to search with the offload policy: micro_batch and/or recompute "
                   "(default both), or none")
      ->delimiter(',');
  plan_cmd
      ->add_option("--classes", plan.classes,
                   "tensor classes to offload (default activations,optimizer_states,params)")
      ->delimiter(',');
  plan_cmd
      ->add_option("--fractions", plan.fractions,
                   "layer fractions, ascending from 0 (default 0,0.25,0.5,0.75,1)")
      ->delimiter(',');
  plan_cmd->add_option("--prefetch", plan.prefetch, "prefetch depths, deepest first (default 2,1)")
      ->delimiter(',');
  plan_cmd
      ->add_option("--micro-batches", plan.micro_batches,
                   "micro-batch sizes for --joint micro_batch (default: divisors up to 16)")
      ->delimiter(',');
  plan_cmd->add_option("--jobs,-j", plan.jobs, "threads (default: all cores)")
      ->check(in_range(0, kMaxJobs, true, ""));
  plan_cmd->add_option("--format", plan.format, "table or json")
      ->check(CLI::IsMember({"table", "json"}));
  add_limit_options(plan_cmd, plan.limits, "stop the search after this many seconds (exit 2)");

  // validate
  std::string validate_path;
  std::vector<std::string> validate_sets;
  auto* validate_cmd = app.add_subcommand(
      "validate",
      "Check a scenario (and every point of its sweep) without simulating.\n\nExamples:\n"
      "  offsim validate ex.yaml\n  offsim validate ex.yaml --set parallelism.tp=3");
  validate_cmd->add_option("scenario", validate_path, "scenario file")
      ->required()
      ->check(CLI::ExistingFile);
  validate_cmd->add_option("--set", validate_sets, "override a key: key.path=value (repeatable)");
  ResourceLimits validate_limits;
  add_limit_options(validate_cmd, validate_limits, nullptr);
  std::int64_t validate_max_points = 1'000'000;
  validate_cmd
      ->add_option("--max-points", validate_max_points,
                   "refuse sweeps larger than this (each point is checked; default 1000000)")
      ->check(in_range(1, 1e12, true, ""));

  // list
  std::string list_what;
  auto* list_cmd = app.add_subcommand(
      "list",
      "List catalogues.\n\nExamples:\n  offsim list models\n  offsim list systems\n"
      "  offsim list hosts\n  offsim list presets\n  offsim list policies\n  offsim list devices");
  list_cmd->add_option("what", list_what, "models, systems, hosts, policies, presets or devices")
      ->required();

  // replay
  ReplayArgs replay;
  auto* replay_cmd = app.add_subcommand(
      "replay",
      "Execute a scenario's Plan for real (CUDA/NCCL, or the CPU device) and compare the\n"
      "measured timeline with the forecast.\n\nExamples:\n"
      "  offsim replay ex.yaml --layers 4 --out measured.json --predicted-out predicted.json\n"
      "  offsim replay ex.yaml --device cpu --steps 2");
  replay_cmd->add_option("scenario", replay.scenario, "scenario file")
      ->required()
      ->check(CLI::ExistingFile);
  replay_cmd->add_option("--set", replay.sets, "override a key: key.path=value (repeatable)");
  replay_cmd->add_option("--profile", replay.profile, "calibration profile JSON");
  // Layers: the scenario's own bound on model.layers (2^16). Steps: each replays a whole step,
  // so 10 000 is hours on any device.
  replay_cmd->add_option("--layers", replay.layers, "keep every layer shape, but only N layers")
      ->check(in_range(1, 65536, true, ""));
  replay_cmd->add_option("--steps", replay.steps, "measured steps")
      ->check(in_range(1, 10000, true, ""));
  replay_cmd->add_option("--warmup", replay.warmup, "warm-up steps")
      ->check(in_range(0, 10000, true, ""));
  replay_cmd->add_option("--device", replay.device, "auto, cuda or cpu")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  replay_cmd->add_option("--out", replay.out, "write the measured Timeline JSON here");
  replay_cmd->add_option("--predicted-out", replay.predicted_out,
                         "write the predicted Timeline JSON here");
  replay_cmd->add_option("--trace", replay.trace, "Chrome trace with predicted and measured");
  replay_cmd->add_flag("--all-ranks", replay.all_ranks,
                       "run every rank the simulated ones stand for (data/tensor-parallel peers)");
  add_limit_options(replay_cmd, replay.limits, nullptr);

  // compare
  std::string cmp_predicted, cmp_measured, cmp_format = "text";
  auto* compare_cmd = app.add_subcommand(
      "compare",
      "Compare a predicted and a measured Timeline JSON of the same Plan.\n\nExamples:\n"
      "  offsim compare predicted.json measured.json\n"
      "  offsim compare predicted.json measured.json --format json");
  compare_cmd->add_option("predicted", cmp_predicted, "predicted Timeline JSON")
      ->required()
      ->check(CLI::ExistingFile);
  compare_cmd->add_option("measured", cmp_measured, "measured Timeline JSON")
      ->required()
      ->check(CLI::ExistingFile);
  compare_cmd->add_option("--format", cmp_format, "text or json")
      ->check(CLI::IsMember({"text", "json"}));

  // calibrate
  bool cal_quick = false;
  int cal_gpus = 0;
  std::string cal_out;
  auto* calibrate_cmd =
      app.add_subcommand("calibrate",
                         "Measure this machine's GPUs into a calibration profile.\n\nExamples:\n"
                         "  offsim calibrate --quick --out h200.json\n"
                         "  offsim run ex.yaml --set hardware.profile=h200.json");
  calibrate_cmd->add_flag("--quick", cal_quick, "fewer sizes; under 3 minutes on one GPU");
  calibrate_cmd->add_option("--gpus", cal_gpus, "GPUs to use (default: all visible)")
      ->check(in_range(0, 1024, true, ""));
  calibrate_cmd->add_option("--out", cal_out, "profile file (default calibration-profile.json)");

  ImportArgs import_args;
  CLI::App* import_cmd = add_import_command(app, import_args);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One clear line first, then the usage hint.
    fmt::print(stderr, "offsim: error: {}\n", e.what());
    fmt::print(stderr, "run `offsim --help` or `offsim COMMAND --help` for usage\n");
    return 2;
  }

  if (run_cmd->parsed()) return cmd_run(run);
  if (sweep_cmd->parsed()) return cmd_sweep(sweep);
  if (plan_cmd->parsed()) return cmd_plan(plan);
  if (validate_cmd->parsed())
    return cmd_validate(validate_path, validate_sets, validate_limits, validate_max_points);
  if (list_cmd->parsed()) return cmd_list(list_what);
  if (replay_cmd->parsed()) return cmd_replay(replay);
  if (compare_cmd->parsed()) return cmd_compare(cmp_predicted, cmp_measured, cmp_format);
  if (import_cmd->parsed()) return cmd_import(import_args);
  if (calibrate_cmd->parsed()) {
    std::string line;
    for (int i = 0; i < argc; ++i) line += (i ? " " : "") + std::string(argv[i]);
    return cmd_calibrate(cal_quick, cal_gpus, cal_out, line);
  }
  return 2;
}

}  // namespace offsim::cli

int main(int argc, char** argv) { return offsim::cli::main(argc, argv); }
