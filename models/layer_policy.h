// layer_policy: where each layer's tensors live and how they move, and what its recompute mode
// saves, worked out once from a scenario's offload rules (target offsim_models).
//
// resolve() (resolve.h) calls resolve_layer_policies() once and keeps the result in the
// ResolvedScenario; the step builder and the plan-size estimate read it from there
// (ResolvedScenario::layer_policies()), and estimate_plan_size of an unresolved scenario calls the
// same function.
//
//   const models::LayerPolicies& lp = resolved.layer_policies();
//   if (lp.of(3).params_on_host) fmt::print("layer 3 streams its weights from the host\n");
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "models/formulas.h"
#include "models/scenario.h"

namespace offsim::models {

// Where one layer's tensors live and how they move: the scenario's offload rules that select
// the layer, applied in order (later rules win), and the activations its recompute mode saves.
struct LayerPolicy {
  LayerActivations acts;
  std::array<bool, kNumActs> on_host{};  // saved activations that go to the host
  int prefetch = 1;                      // activation reload, layers ahead of the backward
  std::int64_t chunk_bytes = 0;          // activation copies split into chunks (0: whole)
  bool params_on_host = false;
  bool grads_on_host = false;
  bool opt_on_host = false;
  bool master_on_host = false;
  // A master-weights rule keeps them on HBM while the moments go to the host (Megatron-Core's
  // HybridDeviceOptimizer under the distributed optimizer); without one they follow the moments.
  bool master_on_hbm = false;
  int param_prefetch = 1;
};
LayerPolicy layer_policy(const Scenario& scenario, const LayerDims& dims, int layer);

// Placement of the parameter groups outside the layers (embedding, head): the rules that select
// all layers.
struct GroupPlacement {
  bool params_on_host = false;
  bool grads_on_host = false;
  bool opt_on_host = false;
  bool master_on_host = false;
  bool master_on_hbm = false;  // as LayerPolicy::master_on_hbm
};
GroupPlacement non_layer_placement(const Scenario& scenario);

// The policies of every layer of a scenario (layers[l] for layer l) and the placement of the
// groups outside the layers.
struct LayerPolicies {
  std::vector<LayerPolicy> layers;
  GroupPlacement outside;
  const LayerPolicy& of(int layer) const { return layers[static_cast<std::size_t>(layer)]; }
};
// layer_policy() of every layer, with its own dimensions (layer_dims(model, training,
// parallelism, l)), and non_layer_placement().
LayerPolicies resolve_layer_policies(const Scenario& scenario);

// How many times layer_policy() has run in this process (thread-safe): tests check that
// building and estimating a resolved scenario's step works out no policy again.
std::int64_t layer_policies_worked_out();

}  // namespace offsim::models
