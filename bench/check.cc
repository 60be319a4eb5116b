#include "bench/check.h"

#include <fmt/format.h>

#include "models/report.h"

namespace offsim::bench {

models::EvalOptions sweep_eval_options(bool full_path) {
  models::EvalOptions o;
  o.steady_state = !full_path;
  return o;
}

std::string path_of(const models::Evaluation& e) { return e.steady_state ? "steady" : "full"; }

std::string compare_with_full_path(const models::Scenario& scenario,
                                   const models::Evaluation& shortcut) {
  sim::Result<models::Evaluation> full = models::evaluate(scenario, sweep_eval_options(true));
  if (!full) return "full path: " + full.error().message;
  const std::string a = models::report_to_json(full->report).dump();
  const std::string b = models::report_to_json(shortcut.report).dump();
  if (a != b) return fmt::format("report differs:\n full     {}\n shortcut {}", a, b);
  return {};
}

}  // namespace offsim::bench
