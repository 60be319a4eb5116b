// Pins the one definition of a compute lane's idle intervals (sim::idle_intervals) and the time
// split built on it, on a small hand-built timeline.
#include "sim/trace/analysis.h"

#include <gtest/gtest.h>

namespace offsim::sim {
namespace {

TimePoint at(std::int64_t ns) { return TimePoint{Duration{ns}}; }

// Rank 0: compute, h2d, comm, cpu and d2h lanes; rank 1: a compute lane that runs to 120 ns.
//   c0   compute [0,10)
//   load h2d     [5,30)           c1 waits on it: [10,30) exposed offload
//   c1   compute [30,40)  deps load
//   ar   comm    [35,60)
//   c2   compute [60,70)  deps ar, load: ar ended last, [40,60) exposed comm
//   c3   compute [75,80)  no deps: [70,75) other
//   adam cpu     [78,100)
//   save d2h     [80,90)          tail [80,100): adam (host compute outranks the copy)
//   r1   rank1   [0,120)          tail [100,120): nothing of rank 0 runs: bubble
struct Fixture {
  Plan plan;
  Timeline timeline;
  LaneId compute;
};

Fixture fixture() {
  PlanBuilder b;
  const LaneId compute = b.lane("rank0.compute", {.rank = 0, .role = LaneRole::kCompute});
  const LaneId h2d = b.lane("rank0.h2d", {.rank = 0, .role = LaneRole::kH2D});
  const LaneId comm = b.lane("rank0.comm", {.rank = 0, .role = LaneRole::kComm});
  const LaneId cpu = b.lane("rank0.cpu", {.rank = 0, .role = LaneRole::kCpu});
  const LaneId d2h = b.lane("rank0.d2h", {.rank = 0, .role = LaneRole::kD2H});
  const LaneId other = b.lane("rank1.compute", {.rank = 1, .role = LaneRole::kCompute});
  struct Spec {
    const char* name;
    LaneId lane;
    OpKind kind;
    OpCategory category;
    std::vector<OpId> deps;
    std::int64_t start, end;
  };
  const std::vector<Spec> specs = {
      {"c0", compute, OpKind::kGemm, OpCategory::kCompute, {}, 0, 10},
      {"load", h2d, OpKind::kCopy, OpCategory::kOffload, {}, 5, 30},
      {"c1", compute, OpKind::kGemm, OpCategory::kRecompute, {OpId{1}}, 30, 40},
      {"ar", comm, OpKind::kCollective, OpCategory::kComm, {}, 35, 60},
      {"c2", compute, OpKind::kGemm, OpCategory::kCompute, {OpId{3}, OpId{1}}, 60, 70},
      {"c3", compute, OpKind::kElementwise, OpCategory::kCompute, {}, 75, 80},
      {"adam", cpu, OpKind::kHostCompute, OpCategory::kCpuOptimizer, {}, 78, 100},
      {"save", d2h, OpKind::kCopy, OpCategory::kOffload, {}, 80, 90},
      {"r1", other, OpKind::kGemm, OpCategory::kCompute, {}, 0, 120},
  };
  for (const Spec& s : specs) {
    b.op({.name = s.name, .lane = s.lane, .kind = s.kind, .category = s.category, .deps = s.deps});
  }
  Fixture f{std::move(b).build(), {}, compute};
  f.timeline = timeline_skeleton(f.plan);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    f.timeline.spans.push_back({OpId{i}, specs[i].lane, at(specs[i].start), at(specs[i].end)});
  }
  f.timeline.makespan = at(120);
  return f;
}

std::vector<IdleInterval> expected() {
  return {{at(10), at(30), IdleCause::kExposedOffload, OpId{1}},
          {at(40), at(60), IdleCause::kExposedComm, OpId{3}},
          {at(70), at(75), IdleCause::kOther, OpId{}},
          {at(80), at(100), IdleCause::kCpuOptimizer, OpId{6}},
          {at(100), at(120), IdleCause::kBubble, OpId{}}};
}

TEST(IdleIntervals, GapsGoToTheLastDependencyAndTheTailToTheMostTellingOp) {
  const Fixture f = fixture();
  EXPECT_EQ(idle_intervals(f.plan, f.timeline, f.compute), expected());
}

TEST(IdleIntervals, TimelineAloneGivesTheSameIntervals) {
  const Fixture f = fixture();
  std::vector<int> lane_rank;
  for (const LaneIdentity& id : f.timeline.lane_identity) lane_rank.push_back(id.rank);
  EXPECT_EQ(idle_intervals(f.timeline, f.compute, lane_rank), expected());
  // Without dependencies there is nothing to attribute a gap to; the tail is by timing alone.
  Timeline bare = f.timeline;
  for (OpInfo& op : bare.ops) op.deps.clear();
  std::vector<IdleInterval> got = idle_intervals(bare, f.compute, lane_rank);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0].cause, IdleCause::kOther);
  EXPECT_EQ(got[1].cause, IdleCause::kOther);
  EXPECT_EQ(got[3], expected()[3]);
}

TEST(IdleIntervals, AWindowCountsOnlyOpsStartingInItAndNoTail) {
  const Fixture f = fixture();
  // (35, 70]: c2 starts at 60; c1 (30) is before the window and only moves the cursor to 40.
  const std::vector<IdleInterval> got =
      idle_intervals(f.plan, f.timeline, f.compute, StartWindow{at(35), at(70)});
  EXPECT_EQ(got, (std::vector<IdleInterval>{{at(40), at(60), IdleCause::kExposedComm, OpId{3}}}));
}

// A wait on a point-to-point transfer is a pipeline bubble when the transfer is the pipeline's
// (a receive lane, or a send on the compute stream), and exposed communication when it runs on a
// communication stream (context parallelism's K,V ring, tensor parallelism's ring exchange).
TEST(IdleIntervals, PointToPointOnACommunicationStreamIsExposedComm) {
  PlanBuilder b;
  const LaneId compute = b.lane("rank0.compute", {.rank = 0, .role = LaneRole::kCompute});
  const LaneId ring = b.lane("rank0.cp", {.rank = 0, .role = LaneRole::kComm});
  const LaneId recv = b.lane("rank0.recv_from_rank8", {.rank = 0, .role = LaneRole::kRecv});
  b.op({.name = "c0", .lane = compute, .kind = OpKind::kGemm, .category = OpCategory::kCompute});
  b.op({.name = "kv", .lane = ring, .kind = OpKind::kP2P, .category = OpCategory::kComm});
  b.op({.name = "c1",
        .lane = compute,
        .kind = OpKind::kGemm,
        .category = OpCategory::kCompute,
        .deps = {OpId{1}}});
  b.op({.name = "act", .lane = recv, .kind = OpKind::kP2P, .category = OpCategory::kComm});
  b.op({.name = "c2",
        .lane = compute,
        .kind = OpKind::kGemm,
        .category = OpCategory::kCompute,
        .deps = {OpId{3}}});
  Plan plan = std::move(b).build();
  Timeline t = timeline_skeleton(plan);
  const std::vector<std::pair<std::int64_t, std::int64_t>> times = {
      {0, 10}, {0, 20}, {20, 30}, {0, 45}, {45, 50}};
  for (std::size_t i = 0; i < times.size(); ++i) {
    t.spans.push_back({OpId{i}, plan.ops[i].lane, at(times[i].first), at(times[i].second)});
  }
  t.makespan = at(50);
  const std::vector<IdleInterval> want = {{at(10), at(20), IdleCause::kExposedComm, OpId{1}},
                                          {at(30), at(45), IdleCause::kBubble, OpId{3}}};
  EXPECT_EQ(idle_intervals(plan, t, compute), want);
  std::vector<int> lane_rank;
  for (const LaneIdentity& id : t.lane_identity) lane_rank.push_back(id.rank);
  EXPECT_EQ(idle_intervals(t, compute, lane_rank), want);
}

TEST(SplitTime, SumsBusyTimeByCategoryAndIdleTimeByCause) {
  const Fixture f = fixture();
  const TimeSplitNs s = split_time(f.plan, f.timeline, f.compute);
  EXPECT_EQ(s.compute, 25);    // c0, c2, c3
  EXPECT_EQ(s.recompute, 10);  // c1
  EXPECT_EQ(s.exposed_offload, 20);
  EXPECT_EQ(s.exposed_comm, 20);
  EXPECT_EQ(s.other, 5);
  EXPECT_EQ(s.cpu_optimizer, 20);
  EXPECT_EQ(s.bubble, 20);
  EXPECT_EQ(s.compute + s.recompute + s.exposed_offload + s.exposed_comm + s.other +
                s.cpu_optimizer + s.bubble,
            120);
}

}  // namespace
}  // namespace offsim::sim
