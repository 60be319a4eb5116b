// The discrete-event simulator: executes a Plan and returns the predicted Timeline.
//
// Lanes have CUDA-stream semantics; each op's cost is a flow over resources shared max-min
// fairly (see flow_solver.h); every alloc and free is applied to the memory ledger
// (sim/trace/memory_ledger.h), which gives each pool's bytes in use, peak and live set, and an
// alloc over capacity ends the run with an out-of-memory outcome (or, with run_past_capacity, is
// recorded and the run goes on to measure the demand). Identical input gives bit-identical
// output.
//
//   sim::SimOptions options;
//   sim::Result<sim::SimResult> r = sim::simulate(plan, options);
//   if (!r) { ... r.error().message ... }        // invalid plan or a limit was hit
//   const sim::Timeline& t = r->timeline;       // t.outcome says completed / OOM / deadlock
//   double step_s = sim::to_seconds(t.makespan);
#pragma once

#include <atomic>
#include <cstdint>

#include "sim/core/result.h"
#include "sim/plan/plan.h"
#include "sim/trace/timeline.h"

namespace offsim::sim {

struct SimOptions {
  bool record_spans = true;   // false: only makespan, outcome and pool peaks (fast sweeps)
  bool record_memory = true;  // false: no samples, memory events, tensors (peaks still kept)
  bool validate_plan = true;  // run validate() first
  std::int64_t max_events = std::int64_t{1} << 40;  // ends the run with kLimitExceeded
  const std::atomic<bool>* cancel = nullptr;        // polled; set to stop with kCancelled
  // An alloc over a pool's capacity records the pool's first failing allocation and goes on as
  // if the pool were unbounded, so the run reaches its end and each pool's peak is its demand;
  // the outcome is still kOutOfMemory (outcome.oom is the first failure over all pools).
  bool run_past_capacity = false;
  // false: Timeline::ops (each op's name, category and deps, copied for display and analysis)
  // is left empty; for callers that read the Plan instead (models::evaluate without a timeline).
  bool record_op_infos = true;
};

struct SimStats {
  std::int64_t ops_executed = 0;
  std::int64_t flow_solves = 0;     // times the sharing was re-solved
  std::int64_t flows_resolved = 0;  // flows whose rate was recomputed, summed over solves
};

struct SimResult {
  Timeline timeline;
  SimStats stats;
};

Result<SimResult> simulate(const Plan& plan, const SimOptions& options = {});

}  // namespace offsim::sim
