// detail::PeriodProbe: equal fingerprints at the starts of two periods when a run is periodic,
// and a refusal when a lane falls further behind every period.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "sim/engine/engine_probe.h"

namespace offsim::sim {
namespace {

constexpr int kBlocks = 5;

// Block i: a 1 ms kernel ("c<i>", 1e9 flop on a 1e12 flop/s SM) that allocates an activation
// of `bytes`, then its D2H copy ("d<i>", `bytes` over a 25 GB/s link) that frees it.
Plan blocks(double bytes) {
  PlanBuilder b;
  const LaneId compute = b.lane("compute");
  const LaneId d2h = b.lane("d2h");
  const ResourceId sm = b.resource("sm", 1e12);
  const ResourceId link = b.resource("pcie", 25e9);
  const PoolId hbm = b.pool("hbm", std::int64_t{1} << 40);
  b.initial(b.tensor("weights", hbm, 1000, sim::TensorCategory::kParams));
  for (int i = 0; i < kBlocks; ++i) {
    const TensorId act = b.tensor(fmt::format("a{}", i), hbm, static_cast<std::int64_t>(bytes),
                                  sim::TensorCategory::kActivations);
    Op c{.name = fmt::format("c{}", i), .lane = compute, .kind = OpKind::kGemm};
    c.cost.work = 1e9;
    c.cost.uses = {{sm, 1.0}};
    c.allocs = {act};
    const OpId cid = b.op(std::move(c));
    Op d{.name = fmt::format("d{}", i), .lane = d2h, .kind = OpKind::kCopy};
    d.cost.work = bytes;
    d.cost.uses = {{link, 1.0}};
    d.deps = {cid};
    d.frees = {act};
    b.op(std::move(d));
  }
  return std::move(b).build();
}

// Ops 2i, 2i + 1 and tensor 1 + i belong to block i; blocks 0..3 are the periodic region.
// Block 1 is the first whose start can look like a later one's (at block 0's start the copy
// lane has no finished op yet).
detail::PeriodProbe probe_blocks_2_and_3() {
  detail::PeriodProbe probe{.op_lo = 0, .op_hi = 8, .tensor_lo = 1, .tensor_hi = 5};
  for (std::uint32_t i = 2; i <= 3; ++i) {
    probe.boundaries.push_back({.first_op = 2 * i,
                                .first_tensor = 1 + i,
                                .prev_first_op = 2 * (i - 1),
                                .next_first_op = 2 * (i + 1)});
  }
  return probe;
}

TEST(PeriodProbeTest, EqualStatesWhenTheCopyKeepsUp) {
  // 10 MB at 25 GB/s = 0.4 ms < 1 ms of compute: when c<i> starts at i ms, d<i-1> has just
  // started with all its 10 MB left and d<i-2> ended 0.6 ms ago, in both periods.
  const Plan plan = blocks(10e6);
  detail::PeriodProbe probe = probe_blocks_2_and_3();
  auto r = detail::simulate_with_periods(plan, {}, &probe);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(probe.snapshots.size(), 2u);
  for (const auto& s : probe.snapshots) {
    EXPECT_TRUE(s.taken);
    EXPECT_TRUE(s.quiet);
  }
  EXPECT_EQ(probe.snapshots[0].time_ns, 2'000'000);
  EXPECT_EQ(probe.snapshots[1].time_ns, 3'000'000);
  EXPECT_EQ(probe.snapshots[0].state, probe.snapshots[1].state);
  // The probe does not change the run: same timeline as sim::simulate.
  auto plain = simulate(plan, {});
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->timeline.makespan, r->timeline.makespan);
  EXPECT_EQ(plain->timeline.spans, r->timeline.spans);
  // Peak: weights + a0 + a1 (c1 allocates at 1 ms while d0 still holds a0).
  ASSERT_EQ(probe.live_at_peak.size(), 1u);
  EXPECT_EQ(probe.live_at_peak[0], (std::vector<std::uint32_t>{0, 1, 2}));
}

TEST(PeriodProbeTest, NoPeriodWhenTheCopyFallsBehind) {
  // 50 MB at 25 GB/s = 2 ms > 1 ms: d0 runs from 1 to 3 ms and d1 from 3 to 5 ms, so when c2
  // starts at 2 ms and c3 at 3 ms an op two blocks back is still running: the copy queue
  // grows by one op every period.
  const Plan plan = blocks(50e6);
  detail::PeriodProbe probe = probe_blocks_2_and_3();
  auto r = detail::simulate_with_periods(plan, {}, &probe);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_TRUE(probe.snapshots[0].taken);
  ASSERT_TRUE(probe.snapshots[1].taken);
  EXPECT_FALSE(probe.snapshots[0].quiet);
  EXPECT_FALSE(probe.snapshots[1].quiet);
  EXPECT_NE(probe.snapshots[0].state, probe.snapshots[1].state);
  // The diagnosis names the part of the states that differs first.
  EXPECT_STREQ(detail::first_difference(probe.snapshots[0].state, probe.snapshots[1].state),
               "a lane's ops");
  EXPECT_STREQ(detail::first_difference(probe.snapshots[0].state, probe.snapshots[0].state),
               "nothing");
  std::vector<std::uint64_t> longer = probe.snapshots[0].state;
  longer.push_back(0);
  EXPECT_STREQ(detail::first_difference(probe.snapshots[0].state, longer), "the state's size");
}

TEST(PeriodProbeTest, StopsAtTheLastBoundaryWhenTheCallerHasNoUseForTheRest) {
  // The copy falls behind (as above): the caller sees unequal states once both snapshots are
  // taken and stops the run at the second boundary (3 ms) instead of its end (11 ms).
  const Plan plan = blocks(50e6);
  detail::PeriodProbe probe = probe_blocks_2_and_3();
  int calls = 0;
  probe.keep_running = [&calls](const detail::PeriodProbe& p) {
    ++calls;
    EXPECT_TRUE(p.snapshots[1].taken);
    return p.snapshots[0].state == p.snapshots[1].state;
  };
  auto r = detail::simulate_with_periods(plan, {}, &probe);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kCancelled);
  EXPECT_NE(r.error().message.find("last period boundary at 3"), std::string::npos)
      << r.error().message;
  EXPECT_TRUE(probe.stopped);
  EXPECT_EQ(calls, 1);
}

TEST(PeriodProbeTest, RunsToTheEndWhenTheCallerKeepsIt) {
  // A periodic run whose caller keeps it: called once, the same timeline as sim::simulate.
  const Plan plan = blocks(10e6);
  detail::PeriodProbe probe = probe_blocks_2_and_3();
  int calls = 0;
  probe.keep_running = [&calls](const detail::PeriodProbe& p) {
    ++calls;
    return p.snapshots[0].state == p.snapshots[1].state;
  };
  auto r = detail::simulate_with_periods(plan, {}, &probe);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_FALSE(probe.stopped);
  EXPECT_EQ(calls, 1);
  auto plain = simulate(plan, {});
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->timeline.makespan, r->timeline.makespan);
  EXPECT_EQ(plain->timeline.spans, r->timeline.spans);
}

// Layers of one pass: kernel i keeps its activation to the end of the step ("release" frees
// them all), so at layer i + 1 one more activation is live than at layer i. Their timing is
// the same shifted; their memory is not.
Plan kept_activations() {
  PlanBuilder b;
  const LaneId compute = b.lane("compute");
  const ResourceId sm = b.resource("sm", 1e12);
  const PoolId hbm = b.pool("hbm", std::int64_t{1} << 40);
  std::vector<TensorId> acts;
  for (int i = 0; i < kBlocks; ++i) {
    acts.push_back(b.tensor(fmt::format("a{}", i), hbm, 1000, sim::TensorCategory::kActivations));
    Op c{.name = fmt::format("c{}", i), .lane = compute, .kind = OpKind::kGemm};
    c.cost.work = 1e9;
    c.cost.uses = {{sm, 1.0}};
    c.allocs = {acts.back()};
    b.op(std::move(c));
  }
  Op release{.name = "release", .lane = compute, .kind = OpKind::kElementwise};
  release.frees = acts;
  b.op(std::move(release));
  return std::move(b).build();
}

TEST(PeriodProbeTest, TimingOnlyStatesLeaveMemoryOut) {
  const Plan plan = kept_activations();
  const auto run = [&](bool timing_only) {
    detail::PeriodProbe probe{.op_lo = 0, .op_hi = kBlocks, .tensor_lo = 0, .tensor_hi = kBlocks};
    for (std::uint32_t i = 2; i <= 3; ++i) {
      probe.boundaries.push_back(
          {.first_op = i, .first_tensor = i, .prev_first_op = i - 1, .next_first_op = i + 1});
    }
    probe.timing_only = timing_only;
    SimOptions options;
    options.run_past_capacity = true;
    auto r = detail::simulate_with_periods(plan, options, &probe);
    EXPECT_TRUE(r) << r.error().message;
    EXPECT_TRUE(probe.snapshots[0].quiet && probe.snapshots[1].quiet);
    EXPECT_EQ(probe.snapshots[1].time_ns - probe.snapshots[0].time_ns, 1'000'000);
    return probe.snapshots[0].state == probe.snapshots[1].state;
  };
  EXPECT_FALSE(run(false));  // 2 vs 3 activations live
  EXPECT_TRUE(run(true));
}

}  // namespace
}  // namespace offsim::sim
