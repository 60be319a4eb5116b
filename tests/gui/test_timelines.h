// Small hand-built Timelines for the GUI model tests.
//
//   sim::Timeline t = gui::testing::TimelineBuilder({"rank0.compute", "rank0.h2d"})
//                         .span("c0", 0, sim::OpKind::kGemm, 0, 10)   // lane 0, [0, 10) ns
//                         .build();
#pragma once

#include <string>
#include <vector>

#include "sim/trace/timeline.h"

namespace offsim::gui::testing {

class TimelineBuilder {
 public:
  explicit TimelineBuilder(std::vector<std::string> lanes, std::string source = "predicted") {
    timeline_.lanes = std::move(lanes);
    timeline_.source = std::move(source);
  }
  TimelineBuilder& span(const std::string& name, int lane, sim::OpKind kind, std::int64_t start_ns,
                        std::int64_t end_ns, double flops = 0.0, std::int64_t bytes = 0) {
    const sim::OpId op(timeline_.ops.size());
    timeline_.ops.push_back(sim::OpInfo{name, kind, sim::OpCategory::kNone, -1, flops, bytes});
    timeline_.spans.push_back(sim::Span{op, sim::LaneId(lane),
                                        sim::kTimeZero + sim::Duration{start_ns},
                                        sim::kTimeZero + sim::Duration{end_ns}});
    if (timeline_.makespan < timeline_.spans.back().end)
      timeline_.makespan = timeline_.spans.back().end;
    return *this;
  }
  // Op `op` depended on op `on` (both by the order their spans were added).
  TimelineBuilder& dep(std::size_t op, std::size_t on) {
    timeline_.ops.at(op).deps.push_back(sim::OpId(on));
    return *this;
  }
  sim::Timeline build() const { return timeline_; }

 private:
  sim::Timeline timeline_;
};

}  // namespace offsim::gui::testing
