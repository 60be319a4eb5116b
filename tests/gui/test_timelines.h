// Small hand-built Timelines for the GUI model tests.
//
//   sim::Timeline t = gui::testing::TimelineBuilder({{"rank0.compute", 0, sim::LaneRole::kCompute},
//                                                     {"rank0.h2d", 0, sim::LaneRole::kH2D}})
//                         .span("c0", 0, sim::OpKind::kGemm, 0, 10)   // lane 0, [0, 10) ns
//                         .build();
#pragma once

#include <string>
#include <vector>

#include "sim/trace/timeline.h"

namespace offsim::gui::testing {

// A lane: its name and typed identity (rank -1 and kOther: a lane without identity).
struct Lane {
  Lane(const char* lane_name) : name(lane_name) {}  // NOLINT(google-explicit-constructor)
  Lane(const char* lane_name, int lane_rank, sim::LaneRole lane_role)
      : name(lane_name), rank(lane_rank), role(lane_role) {}
  std::string name;
  int rank = -1;
  sim::LaneRole role = sim::LaneRole::kOther;
};

class TimelineBuilder {
 public:
  // The timeline carries lane identity when any lane has one.
  explicit TimelineBuilder(const std::vector<Lane>& lanes, std::string source = "predicted") {
    bool typed = false;
    for (const Lane& l : lanes) {
      timeline_.lanes.push_back(l.name);
      timeline_.lane_identity.push_back({.rank = l.rank, .stage = -1, .role = l.role});
      typed = typed || l.rank >= 0 || l.role != sim::LaneRole::kOther;
    }
    if (!typed) timeline_.lane_identity.clear();
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
