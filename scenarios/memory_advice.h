// Memory advice: for a configuration that does not fit, what dominates memory and which tensor
// class must move. A report that does not fit comes from a step run to its end with the full pools
// unbounded (models::evaluate), so its peak breakdown is the whole demand by class, not only what
// was live when the first allocation failed.
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
// each class needs at the peak of the demand and what to move or shard.
sim::Result<std::string> memory_advice(const models::Scenario& scenario,
                                       const models::Report& report);

}  // namespace offsim::scenarios
