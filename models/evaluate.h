// evaluate: builds a scenario's step (step_builder.h), simulates it with the sim/ engine and
// turns the Timeline into a Report (target offsim_models_eval, which links the engine).
//
//   models::EvalOptions options{.keep_timeline = true};
//   OFFSIM_ASSIGN_OR_RETURN(models::ResolvedScenario r, models::resolve(scenario));
//   OFFSIM_ASSIGN_OR_RETURN(models::Evaluation e, models::evaluate(r, options));
//   fmt::print("{:.3f} s, MFU {:.1f}%\n", e.report.step_time_s, 100 * e.report.mfu);
//   if (e.timeline) write_chrome_trace(*e.timeline, "step.json");
#pragma once

#include <atomic>
#include <optional>
#include <string>

#include "models/report.h"
#include "models/resolve.h"
#include "models/scenario.h"
#include "models/step_builder.h"
#include "sim/core/result.h"
#include "sim/plan/plan.h"
#include "sim/trace/timeline.h"

namespace offsim::models {

struct EvalOptions {
  bool keep_timeline = false;  // return the predicted Timeline (spans and memory samples)
  bool keep_plan = false;      // return the Plan
  // Simulate only a few micro-batches and extrapolate exactly when the step provably reaches a
  // periodic steady state (see models/README.md); the report is bit-identical to the full
  // simulation's. Never with keep_timeline or keep_plan.
  bool steady_state = true;
  // Answer a step whose static memory exceeds a pool before building it (static_memory.h):
  // exact in every field the full simulation shares, demand and peaks as lower bounds. Sweeps
  // and the policy search use it; `offsim run` does not, so it reports the true demand.
  bool early_answers = false;
  BuildOptions build;
  // Polled by the engine in every simulation evaluate() runs (the reduced steps of the steady
  // state included); set: fails with kCancelled.
  const std::atomic<bool>* cancel = nullptr;
};

struct Evaluation {
  Report report;
  std::optional<sim::Timeline> timeline;
  std::optional<sim::Plan> plan;
  bool steady_state = false;     // the report came from the steady-state fast path
  bool early_answer = false;     // the report came from static_memory_report()
  std::string full_path_reason;  // otherwise, why the full step was simulated
};

sim::Result<Evaluation> evaluate(const ResolvedScenario& scenario, const EvalOptions& options = {});

// Resolves the scenario (resolve.h), then evaluates it.
sim::Result<Evaluation> evaluate(const Scenario& scenario, const EvalOptions& options = {});

// For a process that evaluates many steps in a row (sweeps, searches, benchmarks): freed memory
// stays with the process's allocator for the next step instead of going back to the kernel.
// A step's plan and timeline take hundreds of MB in blocks large enough that glibc's malloc
// maps and unmaps them per step (and trims its heap after each), so without this every step
// page-faults all its memory in again. Results do not change (only where memory comes from);
// the process keeps its peak footprint. A no-op outside glibc.
void retain_freed_memory();

// The report of a simulated step (exposed for tests and for the replay's measured timelines).
Report make_report(const Scenario& scenario, const BuiltStep& step, const sim::Timeline& timeline);

}  // namespace offsim::models
