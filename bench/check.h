// check: how the benchmarks evaluate a point, which path it took, and whether a shortcut's
// report agrees with the full simulation's (target offsim_bench_spaces).
//
//   models::EvalOptions o = bench::sweep_eval_options(false);
//   auto e = models::evaluate(scenario, o);
//   std::string diff = bench::compare_with_full_path(scenario, *e);  // empty: exact
#pragma once

#include <string>

#include "models/evaluate.h"
#include "models/scenario.h"

namespace offsim::bench {

// The options `offsim sweep` and `offsim plan` evaluate points with; full_path: none of the
// shortcuts (the whole step is always built and simulated).
models::EvalOptions sweep_eval_options(bool full_path);

// "early", "steady" or "full".
std::string path_of(const models::Evaluation& e);

// Evaluates `scenario` on the full path and compares its report with `shortcut`'s: the whole
// report for the steady-state path; for an early answer every field it can know (see
// models/static_memory.h). Empty when they agree, else what differs.
std::string compare_with_full_path(const models::Scenario& scenario,
                                   const models::Evaluation& shortcut);

}  // namespace offsim::bench
