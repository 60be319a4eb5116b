// Timeline analysis shared by the report, compare, the replay and the GUI, so predicted and
// measured views are worked out by one implementation. Today: the critical path.
//
//   std::vector<std::uint32_t> path = sim::critical_path_spans(timeline);  // span indices
//   for (std::uint32_t i : path) fmt::print("{}\n",
//   timeline.ops[timeline.spans[i].op.index()].name);
#pragma once

#include <cstdint>
#include <vector>

#include "sim/core/ids.h"
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

}  // namespace offsim::sim
