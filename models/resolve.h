// resolve: a Scenario checked once and bound to its hardware (target offsim_models).
//
// resolve() runs the scenario's consistency checks (check_scenario, the GPU count of its system),
// finds the system, reads the calibration profile once, applies hardware.nodes, the host and
// hardware.overrides, and works out every layer's offload and recompute policy
// (resolve_layer_policies, layer_policy.h). A ResolvedScenario can only come from resolve() or
// resolve_variant(), so whatever takes one (build_step, evaluate, static_memory_report) neither
// checks the scenario again nor parses its profile again, nor works out a layer's policy again.
//
//   OFFSIM_ASSIGN_OR_RETURN(models::ResolvedScenario r, models::resolve(scenario));
//   OFFSIM_ASSIGN_OR_RETURN(models::Evaluation e, models::evaluate(r, {}));
//   fmt::print("{} on {} nodes of {}, profile {}\n", r.scenario().name, r.system().nodes,
//              r.system().name, r.profile().provenance.profile_name);
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "models/layer_policy.h"
#include "models/scenario.h"
#include "sim/core/result.h"
#include "sim/platform/profile.h"
#include "sim/platform/system.h"

namespace offsim::models {

struct ResolveOptions {
  // Maps a message that starts with a key path ("parallelism.tp: ...") to one that also names
  // where the key is in the input (scenarios::locate_message); applied to the errors of the
  // checks, not to those of the catalogue. Empty: messages as they are.
  std::function<std::string(const std::string&)> locate;
};

class ResolvedScenario {
 public:
  const Scenario& scenario() const { return scenario_; }
  // The system with hardware.nodes, the host and the overrides applied.
  const sim::platform::System& system() const { return *system_; }
  // The calibration profile (hardware.profile or the GPU's default) with the host and the
  // overrides applied.
  const sim::platform::CalibrationProfile& profile() const { return *profile_; }
  // Every layer's offload and recompute policy and the placement of the groups outside the
  // layers (resolve_layer_policies); the step builder and the plan-size estimate read them here.
  const LayerPolicies& layer_policies() const { return *policies_; }

 private:
  friend sim::Result<ResolvedScenario> resolve(const Scenario& scenario,
                                               const ResolveOptions& options);
  friend sim::Result<ResolvedScenario> resolve_variant(const ResolvedScenario& base,
                                                       const Scenario& scenario,
                                                       const ResolveOptions& options);
  ResolvedScenario() = default;

  Scenario scenario_;
  // Shared, immutable: the variants of one base (sweep points, search candidates) hold the
  // base's hardware without copying it.
  std::shared_ptr<const sim::platform::System> system_;
  std::shared_ptr<const sim::platform::CalibrationProfile> profile_;
  // Shared by the copies of one resolved scenario; a variant has its own.
  std::shared_ptr<const LayerPolicies> policies_;
};

sim::Result<ResolvedScenario> resolve(const Scenario& scenario, const ResolveOptions& options = {});

// A variant of a resolved scenario (a sweep point, a policy-search candidate): checked again,
// its hardware taken from `base` when the keys that choose it (hardware.system, nodes, profile,
// host, overrides) are the same, resolved afresh otherwise.
sim::Result<ResolvedScenario> resolve_variant(const ResolvedScenario& base,
                                              const Scenario& scenario,
                                              const ResolveOptions& options = {});

}  // namespace offsim::models
