// EngineProbe: an observer of the engine's flows, for tests that check the sharing invariants
// (no resource above capacity, every op's work delivered) against the engine's own decisions.
//
//   struct Recorder : sim::detail::EngineProbe {
//     void on_rate(sim::TimePoint now, sim::OpId op, double rate) override { ... }
//     void on_flow_end(sim::TimePoint now, sim::OpId op) override { ... }
//   } recorder;
//   auto result = sim::detail::simulate_with_probe(plan, {}, &recorder);
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

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

// PeriodProbe: fingerprints of the complete engine state at chosen boundaries, for proving that
// a run is periodic (models/evaluate.cc extrapolates steps of identical micro-batches with it).
//
// A boundary is the end of the instant at which op `first_op` (the first op of a period) starts.
// Ops in [op_lo, op_hi) and tensors in [tensor_lo, tensor_hi) (the periodic region) are written
// relative to the boundary's `first_op` / `first_tensor`; others by their absolute id. Two
// boundaries whose `state` vectors are equal have equal engine states up to the shift in time
// and in period: lane positions, running ops and their flows (remaining work, rates, completion
// times), the sharing solver, pending events, pool levels and live tensors, which finished ops
// unstarted ops still depend on, and on each of `timed_lanes` the end of its last op and the
// start of its running one.
//
// Ended ops' times are otherwise left out: the engine never reads when an op ended, and an op
// that has not started at a boundary starts after it, later than every dependency that has
// ended, so neither its start nor which dependency a gap before it waited on (the time split's
// walk of a compute lane, sim::split_time) depends on them. Nor does the engine read when a
// running op started (its flow or latency timer is written). What the walk does read is the end
// of its lane's previous op (where a gap starts) and when its running op started: the caller
// names the lanes it walks.
//
//   sim::detail::PeriodProbe probe{.op_lo = 0, .op_hi = n, .tensor_lo = t0, .tensor_hi = t1};
//   probe.boundaries = {{.first_op = a1, .first_tensor = b1, .prev_first_op = a0,
//                        .next_first_op = a2}, ...};
//   auto r = sim::detail::simulate_with_periods(plan, {}, &probe);
//   bool periodic = probe.snapshots[0].quiet && probe.snapshots[0].state ==
//   probe.snapshots[1].state;
//
// With `segments` (a pipeline's tasks) the periodic region is a set of numbered runs of ops
// instead: each run (one task: its ops and the tensors created with them) has a kind and a
// period index, the same task of the next period has the same kind and index + period. An op
// or tensor of a segment is written as (kind, index - boundary.index, offset in the segment);
// op_lo..tensor_hi and prev/next_first_op are then unused, and a boundary is quiet when every
// lane's next op to end, if it belongs to a segment, has index >= min_index, and every op that
// has started or ended belongs to a segment of index <= max_index and <= the segment's own `hi`
// (ops outside the segments, such as the optimizer's, may only wait). `hi` is the top of the
// segment's window (a pipeline stage's steady indices end at different indices); the snapshot's
// `highest_over` is the largest index - hi among started ops.
struct PeriodProbe {
  std::uint32_t op_lo = 0;
  std::uint32_t op_hi = 0;
  std::uint32_t tensor_lo = 0;
  std::uint32_t tensor_hi = 0;
  struct Segment {
    std::uint32_t op_begin = 0;  // ops [op_begin, op_end)
    std::uint32_t op_end = 0;
    std::uint32_t tensor_begin = 0;  // tensors [tensor_begin, tensor_end)
    std::uint32_t tensor_end = 0;
    std::uint32_t kind = 0;
    std::int64_t index = 0;
    std::int64_t hi = std::numeric_limits<std::int64_t>::max() / 2;  // its window's top index
  };
  std::vector<Segment> segments;  // sorted by op_begin, disjoint; tensor ranges disjoint
  struct Boundary {
    std::uint32_t first_op = 0;
    std::uint32_t first_tensor = 0;
    std::uint32_t prev_first_op = 0;  // every op before it must have ended at the boundary
    std::uint32_t next_first_op = 0;  // no op from it on may have started at the boundary
    std::int64_t index = 0;           // with segments: the boundary's period index
    std::int64_t min_index = 0;       // and the window of indices that may be in flight
    std::int64_t max_index = 0;
  };
  std::vector<Boundary> boundaries;  // in the order their first ops start

  struct Snapshot {
    bool taken = false;
    bool quiet = false;  // the prev/next conditions above held
    std::int64_t time_ns = 0;
    std::vector<std::uint64_t> state;
    // With segments: the lowest index among lanes' next ops and the highest among started ops
    // (what the window had to allow; for choosing the reduced step's size).
    std::int64_t lowest_index = 0;
    std::int64_t highest_index = 0;
    std::int64_t highest_over = 0;  // the largest index - Segment::hi among started ops
  };
  std::vector<Snapshot> snapshots;  // filled by the engine, one per boundary
  // Called once, right after the last boundary's snapshot; returning false stops the run there
  // (the simulation fails with ErrorCode::kCancelled and `stopped` is set): the caller found no
  // boundary pair it can use, so the rest of the run (the cool-down) would be wasted.
  std::function<bool(const PeriodProbe&)> keep_running;
  bool stopped = false;
  // Per pool: the tensors live at its peak (ids, in pool order), as in Timeline::live_at_peak.
  std::vector<std::vector<std::uint32_t>> live_at_peak;
  // The lanes whose last ended op's end is part of the state (those the caller walks after the
  // run, e.g. a rank's compute lane for the time split); empty: every lane.
  std::vector<LaneId> timed_lanes;
  // Leave pool levels and live tensors out of the snapshots: when pools run past capacity
  // (SimOptions::run_past_capacity) the engine's timing never reads them, so equal timing-only
  // states evolve identically in time while their memory may differ (e.g. two layers of one
  // pass, the second holding one more layer's activations). Memory then needs its own argument.
  bool timing_only = false;
};

// sim::simulate, filling `probe` (nullptr: exactly sim::simulate).
Result<SimResult> simulate_with_periods(const Plan& plan, const SimOptions& options,
                                        PeriodProbe* probe);

// Where two snapshots' states (PeriodProbe::Snapshot::state) first differ, for a diagnosis:
// "a lane's ops", "the transfers in flight", "the shared-resource groups", "the pending events",
// "the memory in use", "the state's size", or "nothing".
const char* first_difference(const std::vector<std::uint64_t>& a,
                             const std::vector<std::uint64_t>& b);

}  // namespace offsim::sim::detail
