// `offsim run` (see commands.h): one training step of each scenario, reports side by side.

#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "models/evaluate.h"
#include "scenarios/break_even.h"
#include "scenarios/cli/commands.h"
#include "scenarios/cli/common.h"
#include "scenarios/importers/jax_memory.h"
#include "scenarios/memory_advice.h"
#include "scenarios/output_paths.h"
#include "scenarios/report_format.h"
#include "scenarios/resource_limits.h"
#include "scenarios/results_file.h"
#include "scenarios/scenario_loader.h"
#include "sim/core/escape.h"
#include "sim/plan/plan_json.h"
#include "sim/trace/timeline_json.h"

namespace offsim::cli {
namespace {

using scenarios::NamedReport;

// Flag combinations run refuses before reading any file; empty when the flags go together.
std::string flags_error(const RunArgs& a) {
  if (a.break_even && a.format != "table") {
    return "--break-even: prints a line under the table; use --format table";
  }
  const bool single_outputs = !a.trace.empty() || !a.plan_out.empty() || !a.timeline_out.empty();
  if (single_outputs && a.scenarios.size() != 1) {
    return "--trace, --plan-out and --timeline-out take one scenario; got " +
           std::to_string(a.scenarios.size());
  }
  if (!a.jax_memory.empty() && (a.scenarios.size() != 1 || a.format == "csv")) {
    return "--jax-memory takes one scenario and the table or json format";
  }
  return {};
}

// Every scenario loaded and checked; a note for each sweep block that run leaves out.
sim::Result<std::vector<Loaded>> load_all(const RunArgs& a) {
  std::vector<Loaded> loaded;
  for (const std::string& path : a.scenarios) {
    OFFSIM_ASSIGN_OR_RETURN(Loaded l, load_checked(path, a.sets));
    if (l.file.sweep && !a.print_effective) {
      fmt::print(stderr,
                 "offsim: note: {} has a sweep block of {} points; run evaluates the base "
                 "scenario (use `offsim sweep` for the points)\n",
                 path, l.file.sweep->size());
    }
    loaded.push_back(std::move(l));
  }
  return loaded;
}

void print_effective(const std::vector<Loaded>& loaded) {
  for (const Loaded& l : loaded) {
    if (loaded.size() > 1) fmt::print("# {}\n", l.file.path);
    fmt::print("{}", scenarios::emit_yaml(scenarios::scenario_to_document(l.scenario())));
    if (l.file.sweep) {
      fmt::print("# sweep: {} points over {}\n", l.file.sweep->size(),
                 fmt::join(l.file.sweep->axis_paths(), ", "));
    }
  }
}

// Writes the trace, timeline and plan files asked for, and replaces their destinations.
sim::Status write_outputs(const RunArgs& a, const models::Evaluation& eval,
                          scenarios::OutputFiles& outputs) {
  if (!a.trace.empty()) {
    const std::vector<const sim::Timeline*> timelines = {&*eval.timeline};
    OFFSIM_RETURN_IF_ERROR(outputs.write(a.trace, sim::chrome_trace_json(timelines)));
  }
  if (!a.timeline_out.empty()) {
    OFFSIM_RETURN_IF_ERROR(
        outputs.write(a.timeline_out, sim::timeline_to_json(*eval.timeline).dump()));
  }
  if (!a.plan_out.empty()) {
    OFFSIM_RETURN_IF_ERROR(outputs.write(a.plan_out, sim::plan_to_json(*eval.plan).dump()));
  }
  OFFSIM_RETURN_IF_ERROR(outputs.commit());
  if (!a.trace.empty()) {
    fmt::print(stderr, "offsim: wrote the Chrome/Perfetto trace to {}\n",
               sim::escape_for_message(a.trace));
  }
  return sim::ok();
}

// Simulates each scenario. Outputs are checked and their temporary files created before
// simulating; they replace their destinations together at the end.
sim::Result<std::vector<NamedReport>> evaluate_all(const RunArgs& a,
                                                   const std::vector<Loaded>& loaded) {
  std::vector<std::string> inputs = a.scenarios;
  for (const Loaded& l : loaded) {
    for (const std::string& f : l.read_files()) inputs.push_back(f);
  }
  if (!a.jax_memory.empty()) inputs.push_back(a.jax_memory);
  scenarios::OutputFiles outputs(inputs);
  for (const auto& [flag, path] :
       {std::pair("--trace", &a.trace), std::pair("--timeline-out", &a.timeline_out),
        std::pair("--plan-out", &a.plan_out)}) {
    OFFSIM_RETURN_IF_ERROR(outputs.reserve(flag, *path, {".json"}));
  }
  std::vector<NamedReport> reports;
  for (const Loaded& l : loaded) {
    models::EvalOptions options;
    options.keep_timeline = !a.trace.empty() || !a.timeline_out.empty();
    options.keep_plan = !a.plan_out.empty();
    if (auto st = scenarios::check_plan_size(l.resolved, a.limits,
                                             {.with_memory_samples = options.keep_timeline});
        !st) {
      return sim::fail(eval_error(st.error(), l.file.path));
    }
    OFFSIM_ASSIGN_OR_RETURN(models::Evaluation eval,
                            evaluate_limited(l.resolved, options, a.limits, l.file.path));
    OFFSIM_RETURN_IF_ERROR(write_outputs(a, eval, outputs));
    reports.push_back({l.scenario().name, std::move(eval.report)});
  }
  return reports;
}

// The table, and under it what dominates memory and what must move for each configuration
// that does not fit.
void print_table(const std::vector<Loaded>& loaded, const std::vector<NamedReport>& reports,
                 const std::optional<scenarios::JaxMemory>& jax) {
  fmt::print("{}", scenarios::format_table(reports));
  if (jax) fmt::print("{}", scenarios::format_jax_memory(*jax, reports.front().report));
  for (std::size_t i = 0; i < reports.size(); ++i) {
    if (reports[i].report.fits) continue;
    auto advice = scenarios::memory_advice(loaded[i].scenario(), reports[i].report);
    if (advice && !advice->empty()) {
      fmt::print("{}{}\n", reports.size() > 1 ? reports[i].name + ": " : "why:  ", *advice);
    }
  }
}

void print_reports(const RunArgs& a, const std::vector<Loaded>& loaded,
                   const std::vector<NamedReport>& reports,
                   const std::optional<scenarios::JaxMemory>& jax) {
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
    print_table(loaded, reports, jax);
  }
}

sim::Status print_break_even(const std::vector<Loaded>& loaded) {
  for (const Loaded& l : loaded) {
    auto be = scenarios::break_even_host_bandwidth(l.scenario());
    if (!be) return sim::fail(sim::Error{be.error().code, l.file.path + ": " + be.error().message});
    fmt::print("{}break-even host bandwidth: {}\n",
               loaded.size() > 1 ? l.scenario().name + ": " : "", scenarios::describe(*be));
  }
  return sim::ok();
}

}  // namespace

CLI::App* add_run_command(CLI::App& app, RunArgs& run) {
  auto* cmd = app.add_subcommand(
      "run",
      "Simulate one training step of each scenario and print its report.\n"
      "Several scenarios are shown side by side.\n\nExamples:\n"
      "  offsim run ex.yaml\n"
      "  offsim run ex.yaml --set training.micro_batch=2 --format json\n"
      "  offsim run no-offload.yaml offload.yaml          # side-by-side comparison\n"
      "  offsim run ex.yaml --trace step.json             # open in ui.perfetto.dev\n"
      "  offsim run ex.yaml --print-effective             # every field, defaults applied\n"
      "  offsim run big.yaml --max-plan-ops 50000000 --time-limit 600");
  cmd->add_option("scenario", run.scenarios, "scenario files (YAML or JSON)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", run.sets, "override a key: key.path=value (repeatable)");
  cmd->add_option("--format", run.format,
                  "table, json (a list of flat records), jsonl (one record per line) or csv")
      ->check(CLI::IsMember({"table", "json", "jsonl", "csv"}));
  cmd->add_option("--trace", run.trace, "write the Chrome/Perfetto trace JSON here");
  cmd->add_option("--plan-out", run.plan_out, "write the Plan JSON here");
  cmd->add_option("--timeline-out", run.timeline_out, "write the Timeline JSON here");
  cmd->add_flag("--print-effective", run.print_effective,
                "print the effective scenario (defaults and overrides applied) as YAML");
  cmd->add_option("--jax-memory", run.jax_memory,
                  "JAX compiled.memory_analysis() sizes as JSON (scenarios/importers/"
                  "jax_memory.h), shown beside the forecast")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--break-even", run.break_even,
                "for a scenario with activation offload: the host bandwidth per GPU above "
                "which it beats full recomputation");
  add_limit_options(cmd, run.limits,
                    "stop each scenario's simulation after this many seconds (exit 2)");
  return cmd;
}

int cmd_run(const RunArgs& a) {
  if (std::string error = flags_error(a); !error.empty()) return usage_error(error);
  std::optional<scenarios::JaxMemory> jax;
  if (!a.jax_memory.empty()) {
    auto j = scenarios::read_jax_memory(a.jax_memory);
    if (!j) return report(j.error());
    jax = std::move(*j);
  }
  auto loaded = load_all(a);
  if (!loaded) return report(loaded.error());
  if (a.print_effective) {
    print_effective(*loaded);
    return 0;
  }
  auto reports = evaluate_all(a, *loaded);
  if (!reports) return report(reports.error());
  print_reports(a, *loaded, *reports, jax);
  if (a.break_even) {
    if (auto st = print_break_even(*loaded); !st) return report(st.error());
  }
  return 0;
}

}  // namespace offsim::cli
