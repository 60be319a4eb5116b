// Break-even host bandwidth: for a configuration that offloads activations, the host-link
// bandwidth per GPU (per direction) above which its step is faster than the same configuration
// with full recomputation instead of activation offload.
//
// Model: the recompute counterpart is the scenario with its activation rules removed and
// recompute.mode full (other rules, e.g. optimizer offload, stay). The offload step is simulated
// with every figure of the host path scaled by one factor — the GPU's link per direction and
// both directions together, the PCIe switch uplink and the socket's root complex — so that the
// link carries B bytes/s per direction; host DRAM, HBM and compute keep their figures. The step
// time falls monotonically with B; bisection in log B over [1 GB/s, 10 TB/s] finds where it
// crosses the recompute step (to 1%).
//
//   auto be = scenarios::break_even_host_bandwidth(scenario);   // Result<BreakEven>
//   if (be && be->kind == scenarios::BreakEven::Kind::kAt)
//     fmt::print("{:.1f} GB/s per GPU\n", be->bytes_per_s / 1e9);
#pragma once

#include <string>

#include "models/scenario.h"
#include "sim/core/result.h"

namespace offsim::scenarios {

struct BreakEven {
  enum class Kind {
    kAt,              // offload is faster above bytes_per_s
    kAlways,          // faster even at 1 GB/s
    kNever,           // slower even at 10 TB/s (compute- or DRAM-bound)
    kRecomputeNoFit,  // full recomputation does not fit: offload wins wherever it fits
    kOffloadNoFit,    // the offload configuration does not fit HBM or host memory
  };
  Kind kind = Kind::kNever;
  double bytes_per_s = 0.0;          // kAt: per GPU and direction
  double current_bytes_per_s = 0.0;  // the system's H2D figure
  double offload_step_s = 0.0;       // at the system's figures
  double recompute_step_s = 0.0;
};

// Fails (kInvalidInput) when the scenario offloads no activations.
sim::Result<BreakEven> break_even_host_bandwidth(const models::Scenario& scenario);

// One line for reports: "offload beats full recompute above 31.2 GB/s per GPU per direction
// (this system: 55.5 GB/s; 9.91 s with offload, 10.80 s with full recompute)".
std::string describe(const BreakEven& b);

}  // namespace offsim::scenarios
