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
  auto t = TimelineBuilder({"rank0.compute", "rank1.compute"})
               .span("fwd", 0, sim::OpKind::kGemm, 10, 20)
               .span("other_rank", 1, sim::OpKind::kGemm, 10, 20)
               .build();
  sim::PoolTrace pool;
  pool.name = "rank0.hbm";
  pool.capacity_bytes = 1000;
  pool.samples = {{at(0), 100}, {at(10), 300}, {at(10), 250}, {at(20), 50}};
  pool.peak_bytes = 250;
  pool.peak_time = at(10);
  pool.live_at_peak = {{"l0.act", "activations", 150}, {"w", "params", 100}};
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
  sim::Timeline t =
      TimelineBuilder({"rank0.compute"}).span("fwd", 0, sim::OpKind::kGemm, 10, 20).build();
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
              (std::vector<LiveEntry>{{"l0.act", "activations", 150}, {"w", "params", 100}}));
  }
}

TEST(MemoryModel, LiveSetElsewhereIsInferredFromChanges) {
  const sim::Timeline t = pool_timeline();
  MemoryModel model = MemoryModel::build(t, 0);
  // Before the peak: only the 100 B present at t=0, when no op started.
  LiveSet before = model.live_at(t, 0, 5);
  EXPECT_FALSE(before.exact);
  EXPECT_EQ(before.entries, (std::vector<LiveEntry>{{"initial tensors", "", 100}}));
  // After 20: 200 B freed, no allocation of exactly 200 B, so the latest (fwd's 150 B) goes
  // first, then 50 B of the initial 100 B: 50 B of the initial tensors remain.
  LiveSet after = model.live_at(t, 0, 25);
  EXPECT_FALSE(after.exact);
  EXPECT_EQ(after.bytes_in_use, 50);
  EXPECT_EQ(after.entries, (std::vector<LiveEntry>{{"initial tensors", "", 50}}));
}

TEST(MemoryModel, InferredAllocationIsNamedAfterTheOpOnThePoolsRank) {
  sim::Timeline t = pool_timeline();
  t.pools[0].live_at_peak.clear();  // no recorded live set: infer at the peak too
  MemoryModel model = MemoryModel::build(t, 0);
  LiveSet live = model.live_at(t, 0, 15);
  EXPECT_FALSE(live.exact);
  // 150 B allocated at 10 by "fwd" (rank 0); "other_rank" also started at 10 but on rank 1.
  EXPECT_EQ(live.entries, (std::vector<LiveEntry>{{"fwd", "", 150}, {"initial tensors", "", 100}}));
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
