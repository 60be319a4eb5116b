// Timeline analysis shared by the report, compare, the replay and the GUI, so predicted and
// measured views are worked out by one implementation: the critical path and the report's time
// split (where a rank's compute lane spent the step).
//
//   std::vector<std::uint32_t> path = sim::critical_path_spans(timeline);  // span indices
//   for (std::uint32_t i : path) fmt::print("{}\n",
//   timeline.ops[timeline.spans[i].op.index()].name);
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "sim/core/ids.h"
#include "sim/plan/plan.h"
#include "sim/trace/timeline.h"

namespace offsim::sim {

// The critical path by span timing: from the span that ends last (latest end, then latest start,
// then highest op id), repeatedly step to the latest-ending span that ended no later than the
// current one started, among the previous span on the same lane (preferred on ties) and the
// current op's dependencies: `deps` by op id when given, else the timeline's own
// (OpInfo::deps) when it has any, else every span of any lane (timing alone). Returns span
// indices, first to last.
std::vector<std::uint32_t> critical_path_spans(const Timeline& timeline,
                                               const std::vector<std::vector<OpId>>& deps = {});

// Where a rank's compute lane spent the step, in integer nanoseconds (sums are exact).
struct TimeSplitNs {
  std::int64_t compute = 0;
  std::int64_t recompute = 0;
  std::int64_t exposed_comm = 0;
  std::int64_t exposed_offload = 0;
  std::int64_t bubble = 0;
  std::int64_t cpu_optimizer = 0;
  std::int64_t other = 0;
  std::int64_t moe_alltoall = 0;  // of exposed_comm: all-to-all collectives on the compute lane
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

// A time window (after, upto]: only compute ops starting in it count, and not the tail.
struct StartWindow {
  TimePoint after;
  TimePoint upto;
};

// Attributes the time of one rank's compute lane: busy time by the running op's category
// ("recompute", "comm", else compute), idle time by the kind of the dependency that ended last
// before the next op could start (copy: exposed offload, host compute: CPU optimizer, p2p:
// bubble, collective: exposed comm, else other); without a window, the tail after the last
// compute op by the most telling op of the rank still running (by Lane::rank).
TimeSplitNs split_time(const Plan& plan, const Timeline& t, LaneId compute_lane,
                       std::optional<StartWindow> window = {});

}  // namespace offsim::sim
