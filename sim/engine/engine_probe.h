// EngineProbe: an observer of the engine's flows, for tests that check the sharing invariants
// (no resource above capacity, every op's work delivered) against the engine's own decisions.
//
//   struct Recorder : sim::detail::EngineProbe {
//     void on_rate(sim::TimePoint now, sim::OpId op, double rate) override { ... }
//     void on_flow_end(sim::TimePoint now, sim::OpId op) override { ... }
//   } recorder;
//   auto result = sim::detail::simulate_with_probe(plan, {}, &recorder);
#pragma once

#include "sim/core/ids.h"
#include "sim/core/time.h"
#include "sim/engine/simulator.h"

namespace offsim::sim::detail {

class EngineProbe {
 public:
  virtual ~EngineProbe() = default;
  // The flow of `op` runs at `rate` work units per second from `now` on (first call: it starts).
  // Ops with no work never call this; ops whose flow uses no resource call it once.
  virtual void on_rate(TimePoint now, OpId op, double rate) = 0;
  // The flow of `op` ended at `now`.
  virtual void on_flow_end(TimePoint now, OpId op) = 0;
};

// sim::simulate with a probe (nullptr: exactly sim::simulate).
Result<SimResult> simulate_with_probe(const Plan& plan, const SimOptions& options,
                                      EngineProbe* probe);

}  // namespace offsim::sim::detail
