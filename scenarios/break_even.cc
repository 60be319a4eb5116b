#include "scenarios/break_even.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "models/evaluate.h"
#include "sim/platform/host.h"
#include "sim/platform/profile.h"
#include "sim/platform/system.h"

namespace offsim::scenarios {

namespace {

bool moves_activations(const models::OffloadRule& r) {
  return r.cls == models::TensorClass::kActivations ||
         r.cls == models::TensorClass::kNamedActivation;
}

}  // namespace

sim::Result<BreakEven> break_even_host_bandwidth(const models::Scenario& scenario) {
  const auto& rules = scenario.offload.rules;
  if (std::none_of(rules.begin(), rules.end(), [](const models::OffloadRule& r) {
        return moves_activations(r) && r.where == models::Placement::kHost;
      })) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "break-even host bandwidth: the scenario offloads no activations (offload: "
                     "megatron_activation_offload, a MaxText *_offloaded policy, or rules with "
                     "tensor: activations)");
  }
  // The system's host path as the simulation sees it.
  OFFSIM_ASSIGN_OR_RETURN(models::ResolvedScenario base, models::resolve(scenario));
  const auto& hl = base.profile().host_link;
  BreakEven out;
  out.current_bytes_per_s = hl.h2d_bytes_per_s.value;

  models::Scenario recompute = scenario;
  std::erase_if(recompute.offload.rules, moves_activations);
  recompute.recompute = models::RecomputeConfig{};
  recompute.recompute.mode = models::RecomputeConfig::Mode::kFull;
  OFFSIM_ASSIGN_OR_RETURN(models::ResolvedScenario recompute_resolved,
                          models::resolve_variant(base, recompute));
  OFFSIM_ASSIGN_OR_RETURN(models::Evaluation r, models::evaluate(recompute_resolved));
  OFFSIM_ASSIGN_OR_RETURN(models::Evaluation o, models::evaluate(base));
  out.recompute_step_s = r.report.step_time_s;
  out.offload_step_s = o.report.step_time_s;
  if (!o.report.fits) {
    out.kind = BreakEven::Kind::kOffloadNoFit;
    return out;
  }
  if (!r.report.fits) {
    out.kind = BreakEven::Kind::kRecomputeNoFit;
    return out;
  }
  // Step time of the offload configuration with the host path scaled to B per direction.
  auto step_at = [&](double bytes_per_s) -> sim::Result<double> {
    const double f = bytes_per_s / out.current_bytes_per_s;
    models::Scenario s = scenario;
    auto scale = [&](const char* path, const sim::platform::Figure& figure) {
      if (figure.value > 0.0) s.hardware.overrides.emplace_back(path, figure.value * f);
    };
    scale("profile.host_link.h2d_bytes_per_s", hl.h2d_bytes_per_s);
    scale("profile.host_link.d2h_bytes_per_s", hl.d2h_bytes_per_s);
    scale("profile.host_link.duplex_bytes_per_s", hl.duplex_bytes_per_s);
    scale("profile.host_link.switch_uplink_bytes_per_s", hl.switch_uplink_bytes_per_s);
    scale("profile.host_link.root_complex_bytes_per_s", hl.root_complex_bytes_per_s);
    OFFSIM_ASSIGN_OR_RETURN(models::Evaluation e, models::evaluate(s));
    if (!e.report.fits) return std::numeric_limits<double>::infinity();
    return e.report.step_time_s;
  };
  double lo = 1e9;
  double hi = 1e13;
  OFFSIM_ASSIGN_OR_RETURN(double at_lo, step_at(lo));
  if (at_lo < out.recompute_step_s) {
    out.kind = BreakEven::Kind::kAlways;
    return out;
  }
  OFFSIM_ASSIGN_OR_RETURN(double at_hi, step_at(hi));
  if (at_hi >= out.recompute_step_s) {
    out.kind = BreakEven::Kind::kNever;
    return out;
  }
  while (hi / lo > 1.01) {
    const double mid = std::sqrt(lo * hi);
    OFFSIM_ASSIGN_OR_RETURN(double t, step_at(mid));
    (t < out.recompute_step_s ? hi : lo) = mid;
  }
  out.kind = BreakEven::Kind::kAt;
  out.bytes_per_s = hi;
  return out;
}

std::string describe(const BreakEven& b) {
  const std::string steps = fmt::format("{:.3f} s with offload, {:.3f} s with full recompute",
                                        b.offload_step_s, b.recompute_step_s);
  switch (b.kind) {
    case BreakEven::Kind::kAt:
      return fmt::format(
          "offload beats full recompute above {:.1f} GB/s per GPU per direction (this system: "
          "{:.1f} GB/s; {})",
          b.bytes_per_s / 1e9, b.current_bytes_per_s / 1e9, steps);
    case BreakEven::Kind::kAlways:
      return fmt::format("offload beats full recompute even at 1 GB/s per GPU ({})", steps);
    case BreakEven::Kind::kNever:
      return fmt::format(
          "offload does not beat full recompute at any host bandwidth up to 10 TB/s per GPU "
          "(this system: {:.1f} GB/s; {})",
          b.current_bytes_per_s / 1e9, steps);
    case BreakEven::Kind::kRecomputeNoFit:
      return "full recompute does not fit where offload does: offload wins at any bandwidth";
    case BreakEven::Kind::kOffloadNoFit:
      return "the offload configuration does not fit: no break-even";
  }
  return {};
}

}  // namespace offsim::scenarios
