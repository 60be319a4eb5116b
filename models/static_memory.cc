#include "models/static_memory.h"

#include "models/evaluate.h"
#include "sim/engine/simulator.h"

namespace offsim::models {

std::optional<Report> static_memory_report(const ResolvedScenario& resolved,
                                           const BuildOptions& build) {
  const Scenario& scenario = resolved.scenario();
  if (scenario.hardware.runtime != HardwareConfig::Runtime::kNone) return std::nullopt;
  BuildOptions options = build;
  options.static_only = true;
  sim::Result<BuiltStep> step = build_step(resolved, options);
  if (!step) return std::nullopt;
  sim::SimOptions sim_options;
  sim_options.record_spans = false;
  sim_options.record_memory = false;
  sim_options.validate_plan = false;
  sim_options.run_past_capacity = true;
  sim_options.record_op_infos = false;
  sim::Result<sim::SimResult> result = sim::simulate(step->plan, sim_options);
  if (!result) return std::nullopt;
  const sim::Timeline& t = result->timeline;
  if (t.outcome.kind != sim::OutcomeKind::kOutOfMemory || !t.outcome.oom) return std::nullopt;
  Report r = make_report(scenario, *step, t);
  for (PoolDemand& d : r.over_capacity) d.demand_is_lower_bound = true;
  r.flags.emplace_back(kStaticMemoryFlag);
  return r;
}

}  // namespace offsim::models
