#include "gui/model/memory_model.h"

#include <gtest/gtest.h>

#include "tests/gui/test_timelines.h"

namespace offsim::gui {
namespace {

using testing::TimelineBuilder;

sim::TimePoint at(std::int64_t ns) { return sim::kTimeZero + sim::Duration{ns}; }

// rank0.hbm: 100 B at t=0 (no op starts then: the initial tensors); fwd starts at 10 and takes
// 150 B (two samples at 10, the last wins: 250); at 20, 200 B are given back (50 left).
sim::Timeline pool_timeline() {
  auto t = TimelineBuilder({{"rank0.compute", 0, sim::LaneRole::kCompute},
                            {"rank1.compute", 1, sim::LaneRole::kCompute}})
               .span("fwd", 0, sim::OpKind::kGemm, 10, 20)
               .span("other_rank", 1, sim::OpKind::kGemm, 10, 20)
               .build();
  sim::PoolTrace pool;
  pool.name = "rank0.hbm";
  pool.kind = sim::PoolKind::kHbm;
  pool.owner = 0;
  pool.capacity_bytes = 1000;
  pool.samples = {{at(0), 100}, {at(10), 300}, {at(10), 250}, {at(20), 50}};
  pool.peak_bytes = 250;
  pool.peak_time = at(10);
  pool.live_at_peak = {{"l0.act", sim::TensorCategory::kActivations, 150},
                       {"w", sim::TensorCategory::kParams, 100}};
  t.pools.push_back(pool);
  return t;
}

TEST(MemoryModel, StepCurveCollapsesSamplesAtOneTime) {
  const sim::Timeline t = pool_timeline();
  MemoryModel model = MemoryModel::build(t, 0);
  ASSERT_EQ(model.pools().size(), 1u);
  const PoolSeries& p = model.pools()[0];
  EXPECT_EQ(p.name, "rank0.hbm");
  EXPECT_EQ(p.rank, 0);
  EXPECT_EQ(p.capacity_bytes, 1000);
  EXPECT_EQ(p.peak_bytes, 250);
  EXPECT_EQ(p.peak_time_ns, 10);
  EXPECT_EQ(p.steps,
            (std::vector<StepPoint>{{0, 0}, {0, 100}, {10, 100}, {10, 250}, {20, 250}, {20, 50}}));
}

TEST(MemoryModel, StepCurveHoldsItsLastValueToTheStepsEnd) {
  sim::Timeline t = TimelineBuilder({{"rank0.compute", 0, sim::LaneRole::kCompute}})
                        .span("fwd", 0, sim::OpKind::kGemm, 10, 20)
                        .build();
  t.pools = pool_timeline().pools;
  t.makespan = at(35);  // the step ends 15 ns after the last memory change
  const MemoryModel model = MemoryModel::build(t, 0);
  const PoolSeries& p = model.pools()[0];
  ASSERT_FALSE(p.steps.empty());
  EXPECT_EQ(p.steps.back(), (StepPoint{35, 50}));
  EXPECT_EQ(p.steps[p.steps.size() - 2], (StepPoint{20, 50}));
}

TEST(MemoryModel, BytesAtIsTheLastSampleAtOrBefore) {
  MemoryModel model = MemoryModel::build(pool_timeline(), 0);
  EXPECT_EQ(model.bytes_at(0, -1), 0);
  EXPECT_EQ(model.bytes_at(0, 0), 100);
  EXPECT_EQ(model.bytes_at(0, 9), 100);
  EXPECT_EQ(model.bytes_at(0, 10), 250);
  EXPECT_EQ(model.bytes_at(0, 25), 50);
}

TEST(MemoryModel, LiveSetAtThePeakIsTheRecordedOne) {
  const sim::Timeline t = pool_timeline();
  MemoryModel model = MemoryModel::build(t, 0);
  // The peak level holds over [10, 20).
  for (std::int64_t when : {10, 19}) {
    LiveSet live = model.live_at(t, 0, when);
    EXPECT_TRUE(live.exact);
    EXPECT_EQ(live.bytes_in_use, 250);
    EXPECT_EQ(live.entries,
              (std::vector<LiveEntry>{{"l0.act", sim::TensorCategory::kActivations, 150},
                                      {"w", sim::TensorCategory::kParams, 100}}));
  }
}

TEST(MemoryModel, WithoutMemoryEventsOnlyThePeakHasALiveSet) {
  const sim::Timeline t = pool_timeline();
  MemoryModel model = MemoryModel::build(t, 0);
  EXPECT_FALSE(model.has_memory_events());
  LiveSet before = model.live_at(t, 0, 5);
  EXPECT_FALSE(before.exact);
  EXPECT_EQ(before.bytes_in_use, 100);
  EXPECT_TRUE(before.entries.empty());
  LiveSet after = model.live_at(t, 0, 25);
  EXPECT_FALSE(after.exact);
  EXPECT_TRUE(after.entries.empty());
}

// With memory events the live set at any time is the memory ledger's: w (100 B) from 0, act
// (150 B) from 10, w freed at 20 and tmp (50 B) taken at 20.
TEST(MemoryModel, LiveSetAtAnyTimeFromTheMemoryEvents) {
  sim::Timeline t = pool_timeline();
  t.tensors = {{"w", sim::TensorCategory::kParams, 100, sim::PoolId{0}},
               {"act", sim::TensorCategory::kActivations, 150, sim::PoolId{0}},
               {"tmp", sim::TensorCategory::kWorkspace, 50, sim::PoolId{0}}};
  t.memory_events = {{at(0), sim::TensorId{0}, 100, sim::PoolId{0}},
                     {at(10), sim::TensorId{1}, 150, sim::PoolId{0}},
                     {at(20), sim::TensorId{0}, -100, sim::PoolId{0}},
                     {at(20), sim::TensorId{1}, -150, sim::PoolId{0}},
                     {at(20), sim::TensorId{2}, 50, sim::PoolId{0}}};
  MemoryModel model = MemoryModel::build(t, 0);
  EXPECT_TRUE(model.has_memory_events());
  EXPECT_TRUE(model.live_at(t, 0, -1).entries.empty());
  LiveSet before = model.live_at(t, 0, 5);
  EXPECT_TRUE(before.exact);
  EXPECT_EQ(before.entries, (std::vector<LiveEntry>{{"w", sim::TensorCategory::kParams, 100}}));
  EXPECT_EQ(model.live_at(t, 0, 15).entries,
            (std::vector<LiveEntry>{{"act", sim::TensorCategory::kActivations, 150},
                                    {"w", sim::TensorCategory::kParams, 100}}));
  EXPECT_EQ(model.live_at(t, 0, 25).entries,
            (std::vector<LiveEntry>{{"tmp", sim::TensorCategory::kWorkspace, 50}}));
}

TEST(DecimateSteps, KeepsPeaksAndEdges) {
  std::vector<StepPoint> steps;
  // 10,000 points, value = t mod 97, one spike of 5000 at t = 4321.
  for (std::int64_t t = 0; t < 10000; ++t) steps.push_back({t, t == 4321 ? 5000 : t % 97});
  auto out = decimate_steps(steps, 1000, 9000, 10.0);
  // At most 4 points per column over 10 columns, plus the carried edges (columns -1 and 10).
  EXPECT_LE(out.size(), 4u * 12u);
  std::int64_t max = 0;
  for (const StepPoint& p : out) max = std::max(max, p.bytes);
  EXPECT_EQ(max, 5000);
  EXPECT_LE(out.front().time_ns, 1000);
  EXPECT_GE(out.back().time_ns, 9000);
  // Few points: returned as they are.
  auto few = decimate_steps({{0, 1}, {5, 2}}, 0, 10, 100.0);
  EXPECT_EQ(few.size(), 2u);
}

}  // namespace
}  // namespace offsim::gui
