// `offsim validate` (see commands.h): a scenario and every point of its sweep checked without
// simulating.

#include <string>

#include <fmt/format.h>

#include "models/evaluate.h"
#include "scenarios/cli/commands.h"
#include "scenarios/cli/common.h"
#include "scenarios/resource_limits.h"
#include "scenarios/scenario_loader.h"

namespace offsim::cli {
namespace {

// Checks every sweep point; the first five that cannot run are printed, all are counted.
int validate_sweep(const ValidateArgs& a, const Loaded& l) {
  const auto& spec = *l.file.sweep;
  std::int64_t impossible = 0;
  for (std::int64_t i = 0; i < spec.size(); ++i) {
    auto doc = scenarios::apply_point(l.file.base, spec.point(i));
    if (!doc) return report(doc.error());
    auto point = scenarios::scenario_from_document(*doc, l.file.base_dir);
    if (!point)
      return report(sim::Error{point.error().code,
                               fmt::format("sweep point {}: {}", i, point.error().message)});
    sim::Status st = scenarios::check_loaded(*point, *doc);
    if (st) st = scenarios::check_plan_size(*point, a.limits);
    if (!st) {
      if (impossible < 5) fmt::print("  point {}: {}\n", i, st.error().message);
      ++impossible;
    }
  }
  fmt::print("{}: sweep of {} points over {}; {} impossible (they become error rows)\n", a.scenario,
             spec.size(), fmt::join(spec.axis_paths(), ", "), impossible);
  return 0;
}

}  // namespace

CLI::App* add_validate_command(CLI::App& app, ValidateArgs& validate) {
  auto* cmd = app.add_subcommand(
      "validate",
      "Check a scenario (and every point of its sweep) without simulating.\n\nExamples:\n"
      "  offsim validate ex.yaml\n  offsim validate ex.yaml --set parallelism.tp=3");
  cmd->add_option("scenario", validate.scenario, "scenario file")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", validate.sets, "override a key: key.path=value (repeatable)");
  add_limit_options(cmd, validate.limits, nullptr);
  cmd->add_option("--max-points", validate.max_points,
                  "refuse sweeps larger than this (each point is checked; default 1000000)")
      ->check(in_range(1, 1e12, true, ""));
  return cmd;
}

int cmd_validate(const ValidateArgs& a) {
  const std::string& path = a.scenario;
  auto l = load_checked(path, a.sets, a.max_points);
  if (!l) return report(l.error());
  const models::Scenario& s = l->scenario();
  if (auto st = scenarios::check_plan_size(s, a.limits); !st) {
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
  return validate_sweep(a, *l);
}

}  // namespace offsim::cli
