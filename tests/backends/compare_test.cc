// Tests for sim/trace/compare.h (kept with the replay tests: compare joins replay output with
// predictions).
#include "sim/trace/compare.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sim/trace/memory_ledger.h"

namespace offsim::sim {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TimePoint us(std::int64_t micros) { return kTimeZero + Duration{micros * 1000}; }

// Lanes: 0 compute, 1 d2h. Ops: a (compute), b (compute), c (d2h, after a), d (compute, after c).
Timeline make(const std::vector<std::pair<std::int64_t, std::int64_t>>& times,
              std::int64_t hbm_peak) {
  Timeline t;
  t.lanes = {"rank0.compute", "rank0.d2h"};
  for (const char* name : {"a", "b", "c", "d"}) t.ops.push_back(OpInfo{.name = name});
  const LaneId lanes[] = {LaneId{0}, LaneId{0}, LaneId{1}, LaneId{0}};
  for (std::size_t i = 0; i < times.size(); ++i) {
    if (times[i].first < 0) continue;  // no span
    t.spans.push_back(Span{OpId{i}, lanes[i], us(times[i].first), us(times[i].second)});
    t.makespan = std::max(t.makespan, us(times[i].second));
  }
  PoolTrace hbm;
  hbm.name = "rank0.hbm";
  hbm.peak_bytes = hbm_peak;
  hbm.samples.push_back(MemorySample{kTimeZero, hbm_peak});
  t.pools.push_back(hbm);
  return t;
}

TEST(CompareTest, HandComputedErrors) {
  // predicted: a 0-10, b 10-20, c 10-40, d 40-50 → step 50 µs, path a → c → d.
  Timeline p = make({{0, 10}, {10, 20}, {10, 40}, {40, 50}}, 1000);
  // measured:  a 0-10, b 10-30, c 10-25, d 30-42 → step 42 µs, path a → b → d.
  Timeline m = make({{0, 10}, {10, 30}, {10, 25}, {30, 42}}, 800);
  Result<TimelineComparison> r = compare_timelines(p, m, CompareOptions{.top_ops = 3});
  ASSERT_TRUE(r) << r.error().message;
  // (50 - 42) / 42 = 0.190476...
  EXPECT_EQ(r->predicted_step, Duration{50'000});
  EXPECT_EQ(r->measured_step, Duration{42'000});
  EXPECT_NEAR(r->step_relative_error, 8.0 / 42.0, 1e-12);
  EXPECT_EQ(r->matched_ops, 4);
  // Errors: a 0, b 10-20 = -10 µs, c 30-15 = +15 µs, d 10-12 = -2 µs → c, b, d.
  ASSERT_EQ(r->top_ops.size(), 3u);
  EXPECT_EQ(r->top_ops[0].name, "c");
  EXPECT_EQ(r->top_ops[0].error, Duration{15'000});
  EXPECT_NEAR(r->top_ops[0].relative_error, 1.0, 1e-12);  // 15 / 15
  EXPECT_EQ(r->top_ops[1].name, "b");
  EXPECT_EQ(r->top_ops[2].name, "d");
  // Busy: compute predicted 10+10+10 = 30, measured 10+20+12 = 42 → -12/42; d2h 30 vs 15 → +1.
  ASSERT_EQ(r->lanes.size(), 2u);
  EXPECT_EQ(r->lanes[0].predicted_busy, Duration{30'000});
  EXPECT_EQ(r->lanes[0].measured_busy, Duration{42'000});
  EXPECT_NEAR(r->lanes[0].relative_error, -12.0 / 42.0, 1e-12);
  EXPECT_NEAR(r->lanes[1].relative_error, 1.0, 1e-12);
  // Peak: (1000 - 800) / 800 = 0.25.
  ASSERT_EQ(r->pools.size(), 1u);
  EXPECT_NEAR(r->pools[0].relative_error, 0.25, 1e-12);
  EXPECT_NEAR(r->max_abs_pool_relative_error, 0.25, 1e-12);
}

TEST(CompareTest, CriticalPathsAndTheirDifference) {
  Timeline p = make({{0, 10}, {10, 20}, {10, 40}, {40, 50}}, 1);
  Timeline m = make({{0, 10}, {10, 30}, {10, 25}, {30, 42}}, 1);
  // Predicted: d starts at 40 when c ends (c: 10-40); c starts at 10 when a and b... a ended at
  // 10 on compute, and nothing else ended by 10 → a → c → d (busy 10 + 30 + 10 = 50 µs).
  CriticalPath cp = critical_path(p);
  EXPECT_THAT(cp.ops, ElementsAre(OpId{0}, OpId{2}, OpId{3}));
  EXPECT_EQ(cp.busy, Duration{50'000});
  // Measured: d starts at 30 when b ends → a → b → d.
  CriticalPath cm = critical_path(m);
  EXPECT_THAT(cm.ops, ElementsAre(OpId{0}, OpId{1}, OpId{3}));
  Result<TimelineComparison> r = compare_timelines(p, m);
  ASSERT_TRUE(r);
  EXPECT_THAT(r->only_on_predicted_path, ElementsAre("c"));
  EXPECT_THAT(r->only_on_measured_path, ElementsAre("b"));
}

// With dependencies in the timeline (every plan-made one), the path follows them and lane order
// only: d does not wait for c, so c is not on the path although it ended after b.
TEST(CompareTest, CriticalPathFollowsTheTimelinesDependencies) {
  Timeline t = make({{0, 10}, {10, 20}, {22, 28}, {30, 42}}, 1);
  EXPECT_THAT(critical_path(t).ops, ElementsAre(OpId{0}, OpId{1}, OpId{2}, OpId{3}));  // timing
  t.ops[2].deps = {OpId{0}};  // c after a; d only after b (lane order)
  EXPECT_THAT(critical_path(t).ops, ElementsAre(OpId{0}, OpId{1}, OpId{3}));
}

TEST(CompareTest, SameLanePreferredOnTies) {
  // a (compute 0-10) and c (d2h 0-10) both end at 10; d (compute) starts at 10 → a is chosen.
  Timeline t = make({{0, 10}, {-1, -1}, {0, 10}, {10, 20}}, 1);
  EXPECT_THAT(critical_path(t).ops, ElementsAre(OpId{0}, OpId{3}));
}

TEST(CompareTest, OpsWithoutMeasuredSpansAreCountedNotCompared) {
  Timeline p = make({{0, 10}, {10, 20}, {10, 40}, {40, 50}}, 1);
  Timeline m = make({{0, 10}, {10, 30}, {-1, -1}, {30, 42}}, 1);
  Result<TimelineComparison> r = compare_timelines(p, m);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->matched_ops, 3);
  EXPECT_EQ(r->only_predicted_ops, 1);
  ASSERT_EQ(r->lanes.size(), 1u);  // the d2h lane has no measured span
  EXPECT_EQ(r->lanes[0].lane, "rank0.compute");
}

TEST(CompareTest, DifferentPlansAreRefused) {
  Timeline p = make({{0, 10}}, 1);
  Timeline m = p;
  m.ops[2].name = "other";
  Result<TimelineComparison> r = compare_timelines(p, m);
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error().message, HasSubstr("op 2 is 'c'"));
  m.ops.pop_back();
  EXPECT_FALSE(compare_timelines(p, m));
}

// Exposed transfer time per compute lane, by the report's definition: d waits on the copy c.
// Predicted: b ends at 20, c at 40, so the compute lane waits [20, 40) on the copy. Measured: c
// ends at 25, before b (30), so d starts right after b and nothing is exposed.
TEST(CompareTest, ExposedTransferPerComputeLane) {
  auto typed = [](Timeline t) {
    t.lane_identity = {{.rank = 0, .role = LaneRole::kCompute},
                       {.rank = 0, .role = LaneRole::kD2H}};
    t.ops[2].kind = OpKind::kCopy;
    t.ops[3].deps = {OpId{2}};
    return t;
  };
  Timeline p = typed(make({{0, 10}, {10, 20}, {10, 40}, {40, 50}}, 1000));
  Timeline m = typed(make({{0, 10}, {10, 30}, {10, 25}, {30, 42}}, 1000));
  Result<TimelineComparison> r = compare_timelines(p, m);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(r->exposed.size(), 1u);
  EXPECT_EQ(r->exposed[0].lane, "rank0.compute");
  EXPECT_EQ(r->exposed[0].predicted, us(40) - us(20));
  EXPECT_EQ(r->exposed[0].measured, Duration{0});
  EXPECT_THAT(comparison_to_text(*r), HasSubstr("exposed transfer time per compute lane"));
  EXPECT_EQ(comparison_to_json(*r)["exposed"][0]["predicted_ns"], 20'000);
  // Without typed lane identity there is no compute lane to name: nothing is compared.
  Result<TimelineComparison> untyped =
      compare_timelines(make({{0, 10}, {10, 20}, {10, 40}, {40, 50}}, 1000),
                        make({{0, 10}, {10, 30}, {10, 25}, {30, 42}}, 1000));
  ASSERT_TRUE(untyped);
  EXPECT_TRUE(untyped->exposed.empty());
}

TEST(CompareTest, TextAndJsonRenderings) {
  Timeline p = make({{0, 10}, {10, 20}, {10, 40}, {40, 50}}, 1 << 20);
  Timeline m = make({{0, 10}, {10, 30}, {10, 25}, {30, 42}}, 1 << 20);
  Result<TimelineComparison> r = compare_timelines(p, m);
  ASSERT_TRUE(r);
  const std::string text = comparison_to_text(*r);
  EXPECT_THAT(text, HasSubstr("predicted 0.050 ms  measured 0.042 ms  error +19.0%"));
  EXPECT_THAT(text, HasSubstr("only on the predicted path: c"));
  const nlohmann::json j = comparison_to_json(*r);
  EXPECT_EQ(j["predicted_step_ns"], 50'000);
  EXPECT_EQ(j["top_ops"][0]["name"], "c");
  EXPECT_EQ(j["pools"][0]["measured_peak_bytes"], 1 << 20);
  EXPECT_EQ(j["critical_path"]["only_on_measured"][0], "b");
}

// Memory through the ledger: the predicted order frees w before taking x (peak 600 B: w), the
// measured order takes x first (peak 1000 B: w and x); the device's high-water says 1024 B.
TEST(CompareTest, MemoryEventsThroughTheLedger) {
  auto with_events = [](bool x_first, std::int64_t peak) {
    Timeline t = make({{0, 10}}, peak);
    t.tensors = {{"w", sim::TensorCategory::kParams, 600, PoolId{0}},
                 {"x", sim::TensorCategory::kActivations, 400, PoolId{0}}};
    const MemoryEvent alloc_w{us(0), TensorId{0}, 600, PoolId{0}};
    const MemoryEvent free_w{us(5), TensorId{0}, -600, PoolId{0}};
    const MemoryEvent alloc_x{us(5), TensorId{1}, 400, PoolId{0}};
    t.memory_events = x_first ? std::vector<MemoryEvent>{alloc_w, alloc_x, free_w}
                              : std::vector<MemoryEvent>{alloc_w, free_w, alloc_x};
    Result<MemoryLedger> l = MemoryLedger::replay(t);
    EXPECT_TRUE(l.has_value());
    fill_pool_traces(*l, t.tensors, t.pools);
    t.pools[0].peak_bytes = peak;  // as the replay does with the allocator's high-water
    return t;
  };
  const Timeline p = with_events(false, 600);
  const Timeline m = with_events(true, 1024);
  Result<TimelineComparison> r = compare_timelines(p, m);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(r->pools.size(), 1u);
  const PoolError& e = r->pools[0];
  EXPECT_EQ(e.measured_peak_bytes, 1024);
  EXPECT_EQ(e.measured_ledger_peak_bytes, 1000);
  EXPECT_EQ(e.predicted_peak_time, us(0));
  EXPECT_EQ(e.measured_peak_time, us(5));
  ASSERT_EQ(e.categories.size(), 2u);
  EXPECT_EQ(e.categories[0].category, sim::TensorCategory::kActivations);
  EXPECT_EQ(e.categories[0].predicted_bytes, 0);
  EXPECT_EQ(e.categories[0].measured_bytes, 400);
  EXPECT_EQ(e.categories[1].category, sim::TensorCategory::kParams);
  EXPECT_EQ(e.categories[1].predicted_bytes, 600);
  EXPECT_EQ(e.categories[1].measured_bytes, 600);
  const nlohmann::json j = comparison_to_json(*r);
  EXPECT_EQ(j["pools"][0]["measured_ledger_peak_bytes"], 1000);
  EXPECT_EQ(j["pools"][0]["categories_at_peak"][0]["measured_bytes"], 400);
  EXPECT_THAT(comparison_to_text(*r), HasSubstr("measured alloc/free order gives"));
}

TEST(CompareTest, EmptyTimelines) {
  Timeline p = make({}, 0);
  p.pools[0].samples.clear();
  Result<TimelineComparison> r = compare_timelines(p, p);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->step_relative_error, 0.0);
  EXPECT_TRUE(r->predicted_path.ops.empty());
  EXPECT_TRUE(r->pools.empty());  // no peak and no samples
}

}  // namespace
}  // namespace offsim::sim
