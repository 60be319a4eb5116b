// static_memory: the exact early answer for a step whose static memory does not fit (target
// offsim_models_eval).
//
// The static state is what is alive at t = 0 on each pool: weights, gradients, optimizer moments
// and master weights, the workspace term. build_step(static_only) lowers only that — the same
// tensors on the same pools in the same order as the full step, no ops — and the engine
// allocates it exactly as it does at the start of the full step (run past capacity). If a pool
// overflows there, the full step's outcome is out of memory with the same first failure
// (op "initial_tensors", pool, time 0, requested, in use, capacity, live set), the same pools
// failing at t = 0 in the same order, the same flags, metadata and capacities: the report says
// so without building or simulating the step. What only the full simulation knows — the step
// run to its end with the pools unbounded — is not claimed: pools that fail later are absent,
// demand_bytes and the peaks are the static memory (lower bounds, over_capacity entries carry
// demand_is_lower_bound), plan_ops is 0, and a flag says all this.
//
//   std::optional<models::Report> r = models::static_memory_report(resolved, {});
//   if (r) fmt::print("{} does not fit: {}\n", r->scenario, r->oom->pool);
#pragma once

#include <optional>

#include "models/report.h"
#include "models/scenario.h"
#include "models/step_builder.h"

namespace offsim::models {

// The early report, or nullopt when the static state fits every pool, when the scenario has a
// framework runtime (hardware.runtime: the allocator replay needs the whole step), or when the
// static state cannot be built (the full path then reports the error).
std::optional<Report> static_memory_report(const ResolvedScenario& scenario,
                                           const BuildOptions& build);

// The flag an early report carries (last of its flags).
inline constexpr const char* kStaticMemoryFlag =
    "static memory exceeds a pool at t = 0: answered before building the step (not simulated); "
    "peaks, live sets and demand_bytes are the static memory, lower bounds of the step's; "
    "offsim run gives the true demand";

}  // namespace offsim::models
