// Memory advice: for a configuration that does not fit, what dominates memory and which tensor
// class must move. The scenario is simulated once more with unbounded HBM and host memory (a
// hardware.overrides of the capacities), so the whole peak is known by class, not only what was
// live when the allocation failed.
//
//   auto advice = scenarios::memory_advice(scenario, report);   // Result<std::string>
//   if (advice && !advice->empty()) fmt::print("why: {}\n", *advice);
//   // "weights, gradients and optimizer state alone need 118.2 GiB of 79.2 GiB per GPU:
//   //  activation offload or recomputation cannot fit this; ..."
#pragma once

#include <string>

#include "models/report.h"
#include "models/scenario.h"
#include "sim/core/result.h"

namespace offsim::scenarios {

// "" when `report` fits. Otherwise one or two sentences naming the pool that ran out, the bytes
// each class needs at the unbounded peak and what to move or shard.
sim::Result<std::string> memory_advice(const models::Scenario& scenario,
                                       const models::Report& report);

}  // namespace offsim::scenarios
