// Timeline analysis shared by the report, compare, the replay and the GUI, so
// predicted and measured views are worked out by one implementation: the
// critical path, the idle intervals of a rank's compute lane with what each
// waited for (exposed transfer time is the part that waited on a copy), and the
// report's time split (where a rank's compute lane spent the step).
//
//   std::vector<std::uint32_t> path = sim::critical_path_spans(timeline);  //
//   span indices for (std::uint32_t i : path) fmt::print("{}\n",
//   timeline.ops[timeline.spans[i].op.index()].name);
//   for (const sim::IdleInterval& w : sim::idle_intervals(plan, timeline,
//   compute_lane))
//     if (w.cause == sim::IdleCause::kExposedOffload) exposed += w.end -
//     w.start;
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "sim/core/ids.h"
#include "sim/plan/plan.h"
#include "sim/trace/timeline.h"

namespace offsim::sim {

// The critical path by span timing: from the span that ends last (latest end,
// then latest start, then highest op id), repeatedly step to the latest-ending
// span that ended no later than the current one started, among the previous
// span on the same lane (preferred on ties) and the current op's dependencies:
// `deps` by op id when given, else the timeline's own (OpInfo::deps) when it
// has any, else every span of any lane (timing alone). Returns span indices,
// first to last.
std::vector<std::uint32_t> critical_path_spans(const Timeline& timeline,
                                               const std::vector<std::vector<OpId>>& deps = {});

// Where a rank's compute lane spent the step, in integer nanoseconds (sums are
// exact).
struct TimeSplitNs {
  std::int64_t compute = 0;
  std::int64_t recompute = 0;
  std::int64_t exposed_comm = 0;
  std::int64_t exposed_offload = 0;
  std::int64_t bubble = 0;
  std::int64_t cpu_optimizer = 0;
  std::int64_t other = 0;
  // Of exposed_comm: all-to-all collectives on the compute lane, and the compute lane's waits for
  // one on a stream of its own.
  std::int64_t moe_alltoall = 0;
  std::int64_t grouped_gemm = 0;  // of compute and recompute: grouped GEMMs (GemmShape::grouped)

  void add(const TimeSplitNs& o, std::int64_t times) {
    compute += times * o.compute;
    recompute += times * o.recompute;
    exposed_comm += times * o.exposed_comm;
    exposed_offload += times * o.exposed_offload;
    bubble += times * o.bubble;
    cpu_optimizer += times * o.cpu_optimizer;
    other += times * o.other;
    moe_alltoall += times * o.moe_alltoall;
    grouped_gemm += times * o.grouped_gemm;
  }
};

// A time window (after, upto]: only compute ops starting in it count, and not
// the tail.
struct StartWindow {
  TimePoint after;
  TimePoint upto;
};

// What a rank's compute lane waited for while idle: the kind of the op it
// waited on (copy: exposed offload, host compute: CPU optimizer, p2p: bubble,
// collective: exposed comm, else other); nothing at all (after its last op,
// with no op of the rank running): bubble.
enum class IdleCause { kExposedOffload, kCpuOptimizer, kBubble, kExposedComm, kOther };
IdleCause idle_cause(OpKind waited_on);

// One idle interval [start, end) of a compute lane and the op it waited on.
struct IdleInterval {
  TimePoint start;
  TimePoint end;
  IdleCause cause = IdleCause::kOther;
  OpId blocker;  // the op waited on; invalid when none (cause kOther or kBubble)
  bool operator==(const IdleInterval&) const = default;
};

// The one definition of where a rank's compute lane was idle and why, used by
// the report's time split, compare and the GUI's exposed-transfer marks.
// Walking the lane's ops in issue order, each gap before an op's start (after
// the previous op's end) is attributed to the op's dependency that ended last
// (ties: the later in `deps`); with no dependency, kOther. Without a window,
// the tail after the lane's last op up to the makespan is cut at every start
// and end of the rank's other ops still running (ops on lanes of the same
// rank), and each piece goes to the most telling one running through it (host
// compute, then copy, then collective, then p2p, then anything else); a piece
// with none running is a bubble (waiting on another pipeline stage). With a
// window, only ops starting in it count and there is no tail. Sorted by start,
// disjoint. Exposed transfer time is the sum of the kExposedOffload intervals.
std::vector<IdleInterval> idle_intervals(const Plan& plan, const Timeline& t, LaneId compute_lane,
                                         std::optional<StartWindow> window = {});

// The same from a timeline alone (a measured or loaded one): op kinds and
// dependencies from Timeline::ops, lanes from the spans, and each lane's rank
// from `lane_rank` (by LaneId; -1 or missing: no rank). A timeline without
// dependencies has no blockers for gaps (kOther).
std::vector<IdleInterval> idle_intervals(const Timeline& t, LaneId compute_lane,
                                         const std::vector<int>& lane_rank);

// Attributes the time of one rank's compute lane: busy time by the running op's
// category (recompute, comm, else compute), idle time by idle_intervals()'
// causes.
TimeSplitNs split_time(const Plan& plan, const Timeline& t, LaneId compute_lane,
                       std::optional<StartWindow> window = {});

}  // namespace offsim::sim
