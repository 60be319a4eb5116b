#include "models/resolve.h"

#include <utility>

#include <fmt/format.h>

#include "models/cost_model.h"
#include "sim/platform/host.h"

namespace offsim::models {

namespace {

using sim::ErrorCode;

// A check's error, with its key path located in the input when the caller can.
sim::Error located(const sim::Error& error, const ResolveOptions& options) {
  if (!options.locate) return error;
  return sim::Error{error.code, options.locate(error.message)};
}

// The calibration profile: hardware.profile or the default of the system's GPU. A profile that
// does not read, or whose figures cannot describe the system, is an error of hardware.profile.
sim::Result<sim::platform::CalibrationProfile> read_profile(const Scenario& s,
                                                            const sim::platform::System& system,
                                                            const ResolveOptions& options) {
  const HardwareConfig& h = s.hardware;
  if (h.profile_path.empty()) return sim::platform::default_profile(system.gpu);
  sim::Result<sim::platform::CalibrationProfile> profile =
      sim::platform::read_profile_file(h.profile_path);
  if (!profile) {
    return sim::fail(located(
        sim::Error{ErrorCode::kInvalidInput, "hardware.profile: " + profile.error().message},
        options));
  }
  if (system.host_link != sim::platform::HostLinkKind::kNvlinkC2c &&
      !(profile->host_link.switch_uplink_bytes_per_s.value > 0.0)) {
    // 0 means "no PCIe switch" in a profile, but this system's GPUs reach the host through one.
    return sim::fail(located(
        sim::Error{ErrorCode::kInvalidInput,
                   fmt::format("hardware.profile: {}: $.host_link.switch_uplink_bytes_per_s.value: "
                               "value 0 is not allowed for system {}, whose GPUs reach the CPU "
                               "through PCIe switches (expected a bandwidth in bytes/s > 0)",
                               h.profile_path, h.system)},
        options));
  }
  return profile;
}

// The system, its profile, the host and the overrides, for a scenario that passed
// check_scenario(s).
sim::Status resolve_hardware_of(const Scenario& s, const ResolveOptions& options,
                                sim::platform::System& system,
                                sim::platform::CalibrationProfile& profile) {
  const HardwareConfig& h = s.hardware;
  OFFSIM_ASSIGN_OR_RETURN(system, sim::platform::find_system(h.system));
  if (sim::Status gpus = check_gpu_count(s, system.gpus_per_node); !gpus) {
    return sim::fail(located(gpus.error(), options));
  }
  OFFSIM_ASSIGN_OR_RETURN(profile, read_profile(s, system, options));
  if (h.nodes != system.nodes) system = system.with_nodes(h.nodes);
  sim::Result<sim::platform::ResolvedHardware> hw =
      sim::platform::resolve_hardware(system, profile, h.host, h.overrides);
  if (!hw) {
    // The catalogue's own host cannot fail to attach; a named host or an override can.
    const bool from_input = !h.host.empty() || !h.overrides.empty();
    return sim::fail(from_input ? located(hw.error(), options) : hw.error());
  }
  system = std::move(hw->system);
  profile = std::move(hw->profile);
  return sim::ok();
}

// FP8: the GPU must have FP8 tensor cores; an unset training.fp8_recipe takes Transformer
// Engine's default for the GPU's compute capability; MXFP8 needs data-centre Blackwell's
// block-scaled tensor cores. All three as TE decides them (cost_model.h).
sim::Status bind_fp8_recipe(Scenario& s, const sim::platform::System& system,
                            const sim::platform::CalibrationProfile& profile,
                            const ResolveOptions& options) {
  if (s.training.compute_dtype != sim::DType::kFp8) return sim::ok();
  const int cc = profile.gpu.compute_capability_x10();
  const auto refuse = [&](const std::string& message) {
    return sim::fail(located(sim::Error{ErrorCode::kInvalidInput, message}, options));
  };
  if (!fp8_supported(cc)) {
    return refuse(fmt::format(
        "training.precision: fp8 needs FP8 tensor cores (compute capability 8.9 or later: "
        "Ada, Hopper, Blackwell), system {} has {} with compute capability {}.{}; expected bf16 "
        "or fp16",
        system.name, system.gpu, cc / 10, cc % 10));
  }
  if (!s.training.fp8_recipe) s.training.fp8_recipe = default_fp8_recipe(cc);
  if (*s.training.fp8_recipe == TrainingConfig::Fp8Recipe::kMxfp8 && !mxfp8_supported(cc)) {
    return refuse(fmt::format(
        "training.fp8_recipe: mxfp8 needs compute capability 10.x (b200, gb200, b300, gb300), "
        "system {} has {} with {}.{}; expected delayed, current or blockwise",
        system.name, system.gpu, cc / 10, cc % 10));
  }
  return sim::ok();
}

// The keys resolve_hardware_of() reads.
bool same_hardware(const HardwareConfig& a, const HardwareConfig& b) {
  return a.system == b.system && a.nodes == b.nodes && a.profile_path == b.profile_path &&
         a.host == b.host && a.overrides == b.overrides;
}

}  // namespace

sim::Result<ResolvedScenario> resolve(const Scenario& scenario, const ResolveOptions& options) {
  if (sim::Status checked = check_scenario(scenario); !checked) {
    return sim::fail(located(checked.error(), options));
  }
  sim::platform::System system;
  sim::platform::CalibrationProfile profile;
  OFFSIM_RETURN_IF_ERROR(resolve_hardware_of(scenario, options, system, profile));
  ResolvedScenario out;
  out.system_ = std::make_shared<const sim::platform::System>(std::move(system));
  out.profile_ = std::make_shared<const sim::platform::CalibrationProfile>(std::move(profile));
  out.scenario_ = scenario;
  OFFSIM_RETURN_IF_ERROR(bind_fp8_recipe(out.scenario_, *out.system_, *out.profile_, options));
  out.policies_ = std::make_shared<const LayerPolicies>(resolve_layer_policies(out.scenario_));
  return out;
}

sim::Result<ResolvedScenario> resolve_variant(const ResolvedScenario& base,
                                              const Scenario& scenario,
                                              const ResolveOptions& options) {
  if (!same_hardware(base.scenario().hardware, scenario.hardware)) {
    return resolve(scenario, options);
  }
  if (sim::Status checked = check_scenario(scenario); !checked) {
    return sim::fail(located(checked.error(), options));
  }
  if (sim::Status gpus = check_gpu_count(scenario, base.system().gpus_per_node); !gpus) {
    return sim::fail(located(gpus.error(), options));
  }
  ResolvedScenario out = base;
  out.scenario_ = scenario;
  OFFSIM_RETURN_IF_ERROR(bind_fp8_recipe(out.scenario_, *out.system_, *out.profile_, options));
  out.policies_ = std::make_shared<const LayerPolicies>(resolve_layer_policies(out.scenario_));
  return out;
}

}  // namespace offsim::models
