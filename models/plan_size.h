// plan_size: the size of the Plan build_step() would emit for a scenario, and of the Timeline
// the engine would record for it, estimated in closed form without building anything
// (target offsim_models). Used to refuse enormous scenarios up front.
//
// The count follows step_builder.cc: per represented rank (one per pipeline stage), for every
// micro-batch and every layer the rank holds, the forward and backward ops of one layer pass
// (GEMMs, attention, norms, tensor-parallel collectives, recompute, activation offload copies,
// parameter fetches, gradient reductions), plus the embedding/head ops, the pipeline sends and
// the optimizer ops of every parameter group. Layers are visited once (at most 100 000 in a
// scenario); micro-batches multiply in floating point, so no count overflows.
//
//   models::PlanSize size = models::estimate_plan_size(scenario);
//   if (size.ops > 20e6) fmt::print("{}\n", models::describe(size));
#pragma once

#include <cstdint>
#include <string>

#include "models/scenario.h"

namespace offsim::models {

struct PlanSize {
  double ops = 0.0;      // plan.ops.size()
  double tensors = 0.0;  // plan.tensors.size()
  double deps = 0.0;     // sum of op.deps.size()
  // Approximate bytes of the Plan plus the Timeline the engine records for it (spans and op
  // infos always; memory samples, memory events and tensor infos when `with_memory_samples`):
  // struct sizes from sizeof plus typical heap blocks for names and small vectors (plan_size.cc).
  double bytes = 0.0;
};

struct PlanSizeOptions {
  // The Timeline keeps per-change memory samples and memory events (--trace, --timeline-out).
  bool with_memory_samples = false;
};

// Expects a scenario that passed check_scenario(); for others the figures are still finite.
PlanSize estimate_plan_size(const Scenario& scenario, const PlanSizeOptions& options = {});

// "3.2M ops, 1.1M tensors, 4.0M deps, about 2.1 GiB of plan and timeline"
std::string describe(const PlanSize& size);

}  // namespace offsim::models
