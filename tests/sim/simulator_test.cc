// Hand-computed engine cases: each states the arithmetic it expects.
#include "sim/engine/simulator.h"

#include <atomic>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace offsim::sim {
namespace {

constexpr double kGB = 1e9;

std::int64_t ns(TimePoint t) { return t.time_since_epoch().count(); }

// A copy of `bytes` over `links`, one byte of each link per byte of work.
Op copy_op(const std::string& name, LaneId lane, double bytes, std::vector<ResourceId> links) {
  Op op{.name = name, .lane = lane, .kind = OpKind::kCopy};
  op.cost.work = bytes;
  for (ResourceId r : links) op.cost.uses.push_back({r, 1.0});
  return op;
}

const Span& span_of(const Timeline& t, OpId op) {
  for (const Span& s : t.spans) {
    if (s.op == op) return s;
  }
  ADD_FAILURE() << "no span for op " << op.value();
  static const Span kNone{};
  return kNone;
}

SimResult run_ok(const Plan& plan, const SimOptions& options = {}) {
  Result<SimResult> r = simulate(plan, options);
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
  return r ? std::move(*r) : SimResult{};
}

TEST(SimulatorTest, OneFlowAlone) {
  // 1 GB on a 25 GB/s link: 1e9 / 25e9 = 0.04 s = 40,000,000 ns.
  PlanBuilder b;
  ResourceId link = b.resource("link", 25 * kGB);
  OpId a = b.op(copy_op("a", b.lane("l0"), 1 * kGB, {link}));
  SimResult r = run_ok(std::move(b).build());
  EXPECT_EQ(r.timeline.outcome.kind, OutcomeKind::kCompleted);
  ASSERT_EQ(r.timeline.spans.size(), 1u);
  EXPECT_EQ(ns(span_of(r.timeline, a).start), 0);
  EXPECT_EQ(ns(span_of(r.timeline, a).end), 40'000'000);
  EXPECT_EQ(ns(r.timeline.makespan), 40'000'000);
  EXPECT_EQ(r.stats.ops_executed, 1);
}

TEST(SimulatorTest, TwoFlowsShareALink) {
  // Two 1 GB copies on one 25 GB/s link each get 12.5 GB/s and both end at 80 ms.
  PlanBuilder b;
  ResourceId link = b.resource("link", 25 * kGB);
  OpId x = b.op(copy_op("x", b.lane("l0"), 1 * kGB, {link}));
  OpId y = b.op(copy_op("y", b.lane("l1"), 1 * kGB, {link}));
  SimResult r = run_ok(std::move(b).build());
  EXPECT_EQ(ns(span_of(r.timeline, x).end), 80'000'000);
  EXPECT_EQ(ns(span_of(r.timeline, y).end), 80'000'000);
  // Equal end times: spans in op id order.
  ASSERT_EQ(r.timeline.spans.size(), 2u);
  EXPECT_EQ(r.timeline.spans[0].op, x);
  EXPECT_EQ(r.timeline.spans[1].op, y);
}

TEST(SimulatorTest, FlowCrossingTwoLinksOfDifferentCapacity) {
  // a crosses L0 (25 GB/s) and L1 (10 GB/s); b uses L0 only. L1 is a's bottleneck: a = 10,
  // b = 25 - 10 = 15 GB/s. b: 1e9 / 15e9 s = 66,666,666.67 ns, rounded up to 66,666,667.
  // a stays at 10 (L1) after b ends: 1e9 / 10e9 = 100 ms.
  PlanBuilder b;
  ResourceId l0 = b.resource("l0", 25 * kGB);
  ResourceId l1 = b.resource("l1", 10 * kGB);
  OpId a = b.op(copy_op("a", b.lane("lane_a"), 1 * kGB, {l0, l1}));
  OpId c = b.op(copy_op("b", b.lane("lane_b"), 1 * kGB, {l0}));
  SimResult r = run_ok(std::move(b).build());
  EXPECT_EQ(ns(span_of(r.timeline, c).end), 66'666'667);
  EXPECT_EQ(ns(span_of(r.timeline, a).end), 100'000'000);
}

TEST(SimulatorTest, DuplexLinkWithACombinedCap) {
  // H2D and D2H are separate 25 GB/s directions with a 40 GB/s combined cap. Alone, a 1 GB
  // H2D copy takes 1e9 / 25e9 = 40 ms. Together each gets min(25, 40 / 2) = 20 GB/s: 50 ms.
  PlanBuilder b;
  ResourceId h2d = b.resource("pcie.h2d", 25 * kGB);
  ResourceId d2h = b.resource("pcie.d2h", 25 * kGB);
  ResourceId duplex = b.resource("pcie.duplex", 40 * kGB);
  OpId up = b.op(copy_op("h2d", b.lane("h2d"), 1 * kGB, {h2d, duplex}));
  OpId down = b.op(copy_op("d2h", b.lane("d2h"), 1 * kGB, {d2h, duplex}));
  OpId alone = b.op(copy_op("h2d.alone", b.lane("h2d"), 1 * kGB, {h2d, duplex}));
  SimResult r = run_ok(std::move(b).build());
  EXPECT_EQ(ns(span_of(r.timeline, up).end), 50'000'000);
  EXPECT_EQ(ns(span_of(r.timeline, down).end), 50'000'000);
  // The third copy runs alone from 50 ms: 50 + 40 = 90 ms.
  EXPECT_EQ(ns(span_of(r.timeline, alone).start), 50'000'000);
  EXPECT_EQ(ns(span_of(r.timeline, alone).end), 90'000'000);
}

TEST(SimulatorTest, MultiplicityActsAsKIdenticalFlows) {
  // Four GPUs offloading through one 100 GB/s CPU socket, simulated as one flow with k = 4,
  // plus one other 1 GB flow: 100 / (4 + 1) = 20 GB/s each, 1e9 / 20e9 = 50 ms.
  PlanBuilder b;
  ResourceId socket = b.resource("socket", 100 * kGB);
  Op four = copy_op("x4", b.lane("rank0.d2h"), 1 * kGB, {socket});
  four.cost.multiplicity = 4;
  OpId a = b.op(four);
  OpId c = b.op(copy_op("other", b.lane("other"), 1 * kGB, {socket}));
  SimResult r = run_ok(std::move(b).build());
  EXPECT_EQ(ns(span_of(r.timeline, a).end), 50'000'000);
  EXPECT_EQ(ns(span_of(r.timeline, c).end), 50'000'000);
}

TEST(SimulatorTest, MaxRateBound) {
  // a is bounded at 5 GB/s on a 25 GB/s link; b gets 20 GB/s: 1e9 / 20e9 = 50 ms. a keeps 5
  // (its bound) throughout: 1e9 / 5e9 = 200 ms.
  PlanBuilder b;
  ResourceId link = b.resource("link", 25 * kGB);
  Op bounded = copy_op("a", b.lane("l0"), 1 * kGB, {link});
  bounded.cost.max_rate = 5 * kGB;
  OpId a = b.op(bounded);
  OpId c = b.op(copy_op("b", b.lane("l1"), 1 * kGB, {link}));
  // A bound with no resource: a pure duration. 3e12 flop at 1e15 flop/s = 3 ms.
  Op pure{.name = "pure", .lane = b.lane("l2"), .kind = OpKind::kGemm};
  pure.cost.work = 3e12;
  pure.cost.max_rate = 1e15;
  OpId p = b.op(pure);
  SimResult r = run_ok(std::move(b).build());
  EXPECT_EQ(ns(span_of(r.timeline, c).end), 50'000'000);
  EXPECT_EQ(ns(span_of(r.timeline, a).end), 200'000'000);
  EXPECT_EQ(ns(span_of(r.timeline, p).end), 3'000'000);
}

TEST(SimulatorTest, DependenciesAcrossLanes) {
  // lane0: a = 1 GB at 25 GB/s, 0..40 ms. lane1: c = 2e12 flop at 1e14 flop/s = 20 ms, then
  // b waits for a (cross-lane dep) and c (lane order): starts at max(40, 20) = 40 ms and moves
  // 1 GB on its own 10 GB/s link: 40 + 100 = 140 ms.
  PlanBuilder b;
  ResourceId link = b.resource("link", 25 * kGB);
  ResourceId other = b.resource("other", 10 * kGB);
  LaneId l1 = b.lane("l1");
  OpId a = b.op(copy_op("a", b.lane("l0"), 1 * kGB, {link}));
  Op compute{.name = "c", .lane = l1, .kind = OpKind::kGemm};
  compute.cost.work = 2e12;
  compute.cost.max_rate = 1e14;
  OpId c = b.op(compute);
  Op dependent = copy_op("b", l1, 1 * kGB, {other});
  dependent.deps = {a};
  OpId d = b.op(dependent);
  SimResult r = run_ok(std::move(b).build());
  EXPECT_EQ(ns(span_of(r.timeline, c).end), 20'000'000);
  EXPECT_EQ(ns(span_of(r.timeline, d).start), 40'000'000);
  EXPECT_EQ(ns(span_of(r.timeline, d).end), 140'000'000);
  EXPECT_EQ(ns(r.timeline.makespan), 140'000'000);
}

TEST(SimulatorTest, LatencyTerms) {
  // a: 5 µs latency, then 1 GB at 25 GB/s: 5,000 + 40,000,000 = 40,005,000 ns.
  // b (same lane): latency only (no work): 40,005,000 + 7,000 = 40,012,000 ns.
  // c waits on b across lanes: latency 1,000 ns + 1e9 / 25e9 s => 40,012,000 + 1,000 +
  // 40,000,000 = 80,013,000 ns.
  PlanBuilder b;
  ResourceId link = b.resource("link", 25 * kGB);
  LaneId l0 = b.lane("l0");
  Op first = copy_op("a", l0, 1 * kGB, {link});
  first.cost.latency = Duration{5'000};
  OpId a = b.op(first);
  Op wait{.name = "b", .lane = l0, .kind = OpKind::kMarker};
  wait.cost.latency = Duration{7'000};
  OpId w = b.op(wait);
  Op third = copy_op("c", b.lane("l1"), 1 * kGB, {link});
  third.cost.latency = Duration{1'000};
  third.deps = {w};
  OpId c = b.op(third);
  SimResult r = run_ok(std::move(b).build());
  EXPECT_EQ(ns(span_of(r.timeline, a).end), 40'005'000);
  EXPECT_EQ(ns(span_of(r.timeline, w).start), 40'005'000);
  EXPECT_EQ(ns(span_of(r.timeline, w).end), 40'012'000);
  EXPECT_EQ(ns(span_of(r.timeline, c).start), 40'012'000);
  EXPECT_EQ(ns(span_of(r.timeline, c).end), 80'013'000);
}

TEST(SimulatorTest, PoolHittingItsCapacity) {
  // Pool of 1000 bytes; weights (600) live from time zero. a allocates act (300): 900 in use.
  // a takes 1e12 flop at 1e14 flop/s = 10 ms. b then allocates 200: 900 + 200 > 1000, so the
  // run stops at 10 ms with b's OOM; live set largest first: weights, act.
  PlanBuilder b;
  PoolId hbm = b.pool("hbm", 1000);
  TensorId weights = b.tensor("weights", hbm, 600, sim::TensorCategory::kParams);
  TensorId act = b.tensor("act", hbm, 300, sim::TensorCategory::kActivations);
  TensorId big = b.tensor("big", hbm, 200, sim::TensorCategory::kWorkspace);
  b.initial(weights);
  LaneId lane = b.lane("compute");
  Op first{.name = "a", .lane = lane, .kind = OpKind::kGemm};
  first.cost.work = 1e12;
  first.cost.max_rate = 1e14;
  first.allocs = {act};
  OpId a = b.op(first);
  Op second{.name = "b", .lane = lane, .kind = OpKind::kGemm};
  second.allocs = {big};
  second.frees = {big};
  OpId bad = b.op(second);
  SimResult r = run_ok(std::move(b).build());
  const Timeline& t = r.timeline;
  ASSERT_EQ(t.outcome.kind, OutcomeKind::kOutOfMemory);
  ASSERT_TRUE(t.outcome.oom.has_value());
  const OutOfMemory& oom = *t.outcome.oom;
  EXPECT_EQ(oom.op, bad);
  EXPECT_EQ(oom.op_name, "b");
  EXPECT_EQ(oom.pool, "hbm");
  EXPECT_EQ(ns(oom.time), 10'000'000);
  EXPECT_EQ(oom.requested_bytes, 200);
  EXPECT_EQ(oom.in_use_bytes, 900);
  EXPECT_EQ(oom.capacity_bytes, 1000);
  ASSERT_EQ(oom.live.size(), 2u);
  EXPECT_EQ(oom.live[0].name, "weights");
  EXPECT_EQ(oom.live[1].name, "act");
  EXPECT_NE(t.outcome.message.find("'b'"), std::string::npos) << t.outcome.message;
  // What happened until then is kept: a's span, the peak of 900 reached at time zero.
  ASSERT_EQ(t.spans.size(), 1u);
  EXPECT_EQ(t.spans[0].op, a);
  EXPECT_EQ(t.pools[0].peak_bytes, 900);
  EXPECT_EQ(ns(t.pools[0].peak_time), 0);
  EXPECT_EQ(r.stats.ops_executed, 1);
}

TEST(SimulatorTest, RunPastCapacityMeasuresTheDemand) {
  // The plan of PoolHittingItsCapacity, run past capacity. b's alloc of 200 with 900 of 1000 in
  // use still fails first (10 ms, same live set), but the run goes on: c's later alloc of 50
  // with 1100 in use is not a second failure of the same pool, the pool peaks at
  // 600 + 300 + 200 + 50 = 1150 bytes during c (demand; over by 150), and the host pool (c's
  // other alloc, 30 of 20) records its own first failure.
  PlanBuilder b;
  PoolId hbm = b.pool("hbm", 1000);
  PoolId host = b.pool("host", 20);
  TensorId weights = b.tensor("weights", hbm, 600, sim::TensorCategory::kParams);
  TensorId act = b.tensor("act", hbm, 300, sim::TensorCategory::kActivations);
  TensorId big = b.tensor("big", hbm, 200, sim::TensorCategory::kWorkspace);
  TensorId more = b.tensor("more", hbm, 50, sim::TensorCategory::kWorkspace);
  TensorId staged = b.tensor("staged", host, 30, sim::TensorCategory::kActivations);
  b.initial(weights);
  LaneId lane = b.lane("compute");
  Op first{.name = "a", .lane = lane, .kind = OpKind::kGemm};
  first.cost.work = 1e12;
  first.cost.max_rate = 1e14;
  first.allocs = {act};
  b.op(first);
  Op second{.name = "b", .lane = lane, .kind = OpKind::kGemm};
  second.allocs = {big};
  OpId bad = b.op(second);
  Op third{.name = "c", .lane = lane, .kind = OpKind::kGemm};
  third.allocs = {more, staged};
  third.frees = {big, more, staged};
  b.op(third);
  SimOptions options;
  options.run_past_capacity = true;
  SimResult r = run_ok(std::move(b).build(), options);
  const Timeline& t = r.timeline;
  ASSERT_EQ(t.outcome.kind, OutcomeKind::kOutOfMemory);
  ASSERT_TRUE(t.outcome.oom.has_value());
  EXPECT_EQ(t.outcome.oom->op, bad);
  EXPECT_EQ(ns(t.outcome.oom->time), 10'000'000);
  EXPECT_EQ(t.outcome.oom->in_use_bytes, 900);
  EXPECT_EQ(t.outcome.oom->live.size(), 2u);
  EXPECT_EQ(r.stats.ops_executed, 3);
  EXPECT_EQ(t.spans.size(), 3u);
  EXPECT_EQ(t.pools[0].peak_bytes, 1150);  // 600 + 300 + 200 + 50 during c
  EXPECT_EQ(t.pools[1].peak_bytes, 30);
  ASSERT_EQ(t.outcome.over_capacity.size(), 2u);
  EXPECT_EQ(t.outcome.over_capacity[0].pool, "hbm");
  EXPECT_EQ(t.outcome.over_capacity[0].op_name, "b");
  EXPECT_EQ(t.outcome.over_capacity[1].pool, "host");
  EXPECT_EQ(t.outcome.over_capacity[1].op_name, "c");
  EXPECT_EQ(t.outcome.over_capacity[1].in_use_bytes, 0);
  EXPECT_NE(t.outcome.message.find("at 10.000 ms"), std::string::npos) << t.outcome.message;
}

TEST(SimulatorTest, InitialTensorsOverCapacity) {
  PlanBuilder b;
  PoolId hbm = b.pool("hbm", 100);
  b.initial(b.tensor("w0", hbm, 60, sim::TensorCategory::kParams));
  b.initial(b.tensor("w1", hbm, 60, sim::TensorCategory::kParams));
  b.op(Op{.name = "x", .lane = b.lane("l"), .kind = OpKind::kMarker});
  SimResult r = run_ok(std::move(b).build());
  ASSERT_EQ(r.timeline.outcome.kind, OutcomeKind::kOutOfMemory);
  EXPECT_FALSE(r.timeline.outcome.oom->op.valid());
  EXPECT_EQ(r.timeline.outcome.oom->op_name, "initial_tensors");
  EXPECT_EQ(r.timeline.outcome.oom->in_use_bytes, 60);
  EXPECT_TRUE(r.timeline.spans.empty());
}

TEST(SimulatorTest, MemoryCurvePeakAndLiveSetAtPeak) {
  // l0: a allocs x (100) for 10 ms (1e12 at 1e14), frees it at its end; then c allocs z (50)
  //     for 10 ms and frees it.
  // l1: b allocs y (70) at 0, runs 15 ms, frees y at 15 ms.
  // Curve: 0 ns: 170 (x + y); 10 ms: x freed, z taken in the same instant -> 120;
  // 15 ms: y freed -> 50; 20 ms: z freed -> 0. Peak 170 at 0 with {x, y}.
  PlanBuilder b;
  PoolId hbm = b.pool("hbm", 1 << 20);
  TensorId x = b.tensor("x", hbm, 100, sim::TensorCategory::kActivations);
  TensorId y = b.tensor("y", hbm, 70, sim::TensorCategory::kActivations);
  TensorId z = b.tensor("z", hbm, 50, sim::TensorCategory::kActivations);
  auto timed = [&](const std::string& name, LaneId lane, double work) {
    Op op{.name = name, .lane = lane, .kind = OpKind::kGemm};
    op.cost.work = work;
    op.cost.max_rate = 1e14;
    return op;
  };
  LaneId l0 = b.lane("l0");
  Op a = timed("a", l0, 1e12);
  a.allocs = {x};
  a.frees = {x};
  b.op(a);
  Op c = timed("c", l0, 1e12);
  c.allocs = {z};
  c.frees = {z};
  b.op(c);
  Op op_b = timed("b", b.lane("l1"), 1.5e12);
  op_b.allocs = {y};
  op_b.frees = {y};
  b.op(op_b);
  const Plan plan = std::move(b).build();
  SimResult r = run_ok(plan);
  const PoolTrace& p = r.timeline.pools[0];
  const std::vector<MemorySample> expected = {{TimePoint{Duration{0}}, 170},
                                              {TimePoint{Duration{10'000'000}}, 120},
                                              {TimePoint{Duration{15'000'000}}, 50},
                                              {TimePoint{Duration{20'000'000}}, 0}};
  EXPECT_EQ(p.samples, expected);
  EXPECT_EQ(p.peak_bytes, 170);
  EXPECT_EQ(ns(p.peak_time), 0);
  ASSERT_EQ(p.live_at_peak.size(), 2u);
  EXPECT_EQ(p.live_at_peak[0].name, "x");
  EXPECT_EQ(p.live_at_peak[1].name, "y");

  // Memory samples off: same peak and live set, no samples.
  SimOptions options;
  options.record_memory = false;
  SimResult quiet = run_ok(plan, options);
  EXPECT_TRUE(quiet.timeline.pools[0].samples.empty());
  EXPECT_EQ(quiet.timeline.pools[0].peak_bytes, 170);
  EXPECT_EQ(quiet.timeline.pools[0].live_at_peak, p.live_at_peak);
}

TEST(SimulatorTest, DeadlockNamesTheStuckOps) {
  // With validation off, a cycle across lanes runs into a deadlock: x runs (1 ms), then a on
  // l0 waits on b (l1), which waits on a.
  PlanBuilder b;
  LaneId l0 = b.lane("l0");
  LaneId l1 = b.lane("l1");
  Op x{.name = "x", .lane = l0, .kind = OpKind::kGemm};
  x.cost.work = 1e11;
  x.cost.max_rate = 1e14;
  b.op(x);
  OpId a = b.op(Op{.name = "a", .lane = l0, .kind = OpKind::kMarker});
  OpId c = b.op(Op{.name = "b", .lane = l1, .kind = OpKind::kMarker});
  b.op_at(a).deps = {c};
  b.op_at(c).deps = {a};
  Plan plan = std::move(b).build();
  EXPECT_FALSE(simulate(plan).has_value());  // validation rejects the cycle
  SimOptions options;
  options.validate_plan = false;
  SimResult r = run_ok(plan, options);
  const Timeline& t = r.timeline;
  ASSERT_EQ(t.outcome.kind, OutcomeKind::kDeadlock);
  ASSERT_TRUE(t.outcome.deadlock.has_value());
  EXPECT_EQ(ns(t.outcome.deadlock->time), 1'000'000);
  ASSERT_EQ(t.outcome.deadlock->stuck_ops.size(), 2u);
  EXPECT_EQ(t.outcome.deadlock->stuck_ops[0], "'a' (lane 'l0') waits on 'b' (lane 'l1')");
  EXPECT_EQ(t.outcome.deadlock->stuck_ops[1], "'b' (lane 'l1') waits on 'a' (lane 'l0')");
  EXPECT_EQ(t.spans.size(), 1u);
  EXPECT_EQ(r.stats.ops_executed, 1);
}

Plan chain_plan(int n) {
  PlanBuilder b;
  ResourceId link = b.resource("link", 1e9);
  LaneId lane = b.lane("l");
  for (int i = 0; i < n; ++i) b.op(copy_op(fmt::format("op{}", i), lane, 1e3, {link}));
  return std::move(b).build();
}

TEST(SimulatorTest, MaxEventsStopsWithAnError) {
  SimOptions options;
  options.max_events = 10;
  Result<SimResult> r = simulate(chain_plan(100), options);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, ErrorCode::kLimitExceeded);
  EXPECT_NE(r.error().message.find("max_events = 10"), std::string::npos) << r.error().message;
}

TEST(SimulatorTest, CancelStopsWithAnError) {
  std::atomic<bool> cancel{true};
  SimOptions options;
  options.cancel = &cancel;
  Result<SimResult> r = simulate(chain_plan(100), options);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, ErrorCode::kCancelled);
  EXPECT_NE(r.error().message.find("cancelled"), std::string::npos) << r.error().message;
  cancel = false;
  EXPECT_TRUE(simulate(chain_plan(100), options).has_value());
}

TEST(SimulatorTest, ChainOfIdenticalFlowsIsSolvedOnce) {
  // 100 ops of 1e3 bytes at 1e9 bytes/s = 1 µs each: 100 µs in all. Each op's flow takes the
  // place of an identical one that ended in the same instant, so only the first is solved.
  Result<SimResult> r = simulate(chain_plan(100));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(ns(r->timeline.makespan), 100'000);
  EXPECT_EQ(r->stats.ops_executed, 100);
  EXPECT_EQ(r->stats.flow_solves, 1);
  EXPECT_EQ(r->stats.flows_resolved, 1);
}

TEST(SimulatorTest, TakingOverAFlowKeepsOthersRates) {
  // Link of 10 GB/s. l0: a (1 GB) then b (1 GB, same uses); l1: c (2 GB). a and c share:
  // 5 GB/s each, a ends at 200 ms; c has 1 GB left. b takes a's place in the same instant, so
  // both stay at 5 GB/s: b and c end at 400 ms. Then d (2 GB, 1 ns latency) runs alone on l0:
  // 400 ms + 1 ns + 2e9 / 10e9 s = 600,000,001 ns.
  PlanBuilder b;
  ResourceId link = b.resource("link", 10 * kGB);
  LaneId l0 = b.lane("l0");
  OpId a = b.op(copy_op("a", l0, 1 * kGB, {link}));
  OpId x = b.op(copy_op("b", l0, 1 * kGB, {link}));
  OpId c = b.op(copy_op("c", b.lane("l1"), 2 * kGB, {link}));
  Op last = copy_op("d", l0, 2 * kGB, {link});
  last.cost.latency = Duration{1};
  OpId d = b.op(last);
  SimResult r = run_ok(std::move(b).build());
  EXPECT_EQ(ns(span_of(r.timeline, a).end), 200'000'000);
  EXPECT_EQ(ns(span_of(r.timeline, x).end), 400'000'000);
  EXPECT_EQ(ns(span_of(r.timeline, c).end), 400'000'000);
  EXPECT_EQ(ns(span_of(r.timeline, d).end), 600'000'001);
  // Solves: {a, c} at 0; none when b takes a's place; d alone at 400 ms + 1 ns.
  EXPECT_EQ(r.stats.flow_solves, 2);
}

TEST(SimulatorTest, InvalidPlanIsAnError) {
  PlanBuilder b;
  Op op{.name = "x", .lane = LaneId{7}, .kind = OpKind::kMarker};
  b.op(op);
  Plan plan = std::move(b).build();
  Result<SimResult> r = simulate(plan);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidInput);
  SimOptions options;
  options.validate_plan = false;
  Result<SimResult> unchecked = simulate(plan, options);
  ASSERT_FALSE(unchecked.has_value());
  EXPECT_NE(unchecked.error().message.find("lane"), std::string::npos);
}

}  // namespace
}  // namespace offsim::sim
