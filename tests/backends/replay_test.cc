#include "backends/replay.h"

#include <algorithm>
#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sim/trace/memory_ledger.h"

namespace offsim::backends {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

sim::Op gemm_op(const std::string& name, sim::LaneId lane) {
  sim::Op op{.name = name, .lane = lane, .kind = sim::OpKind::kGemm};
  op.sizes.gemm = sim::GemmShape{.m = 48, .n = 48, .k = 48, .dtype = sim::DType::kBf16};
  op.sizes.flops = 2.0 * 48 * 48 * 48;
  return op;
}

sim::Op copy_op(const std::string& name, sim::LaneId lane, sim::CopyDirection dir,
                std::int64_t bytes) {
  sim::Op op{.name = name, .lane = lane, .kind = sim::OpKind::kCopy};
  op.sizes.bytes = bytes;
  op.sizes.copy_direction = dir;
  return op;
}

// One rank: compute lane g0 → e1 → g2 → g3, an offload of g0's activation on the d2h lane and
// its prefetch on the h2d lane:
//   g0 allocs act0 (1 MiB); c_d2h (after g0) frees act0, allocs act0.host (pinned);
//   e1 (after c_d2h) allocs act1 (2 MiB); g2 frees act1;
//   h_h2d (after g2) allocs act0.back (1 MiB); g3 (after h_h2d) frees act0.back.
// Weights (4 MiB) are initial. HBM peak: act0 is freed before act1 is taken and act1 before
// act0.back, so the peak is 4 + 2 = 6 MiB, during e1..g2.
struct OffloadPlan {
  sim::Plan plan;
  std::map<std::string, sim::OpId> ids;
};

OffloadPlan offload_plan() {
  sim::PlanBuilder b;
  sim::LaneId compute = b.lane("rank0.compute", {.rank = 0, .role = sim::LaneRole::kCompute});
  sim::LaneId d2h = b.lane("rank0.d2h", {.rank = 0, .role = sim::LaneRole::kD2H});
  sim::LaneId h2d = b.lane("rank0.h2d", {.rank = 0, .role = sim::LaneRole::kH2D});
  sim::PoolId hbm = b.pool("rank0.hbm", 64 * kMiB, sim::PoolKind::kHbm, 0);
  sim::PoolId pinned = b.pool("host0.pinned", 64 * kMiB, sim::PoolKind::kPinnedHost, 0);
  sim::TensorId weights = b.tensor("weights", hbm, 4 * kMiB, sim::TensorCategory::kParams);
  sim::TensorId act0 = b.tensor("act0", hbm, kMiB, sim::TensorCategory::kActivations);
  sim::TensorId act0_host = b.tensor("act0.host", pinned, kMiB, sim::TensorCategory::kActivations);
  sim::TensorId act1 = b.tensor("act1", hbm, 2 * kMiB, sim::TensorCategory::kActivations);
  sim::TensorId act0_back = b.tensor("act0.back", hbm, kMiB, sim::TensorCategory::kActivations);
  b.initial(weights);
  OffloadPlan p;
  sim::Op g0 = gemm_op("g0", compute);
  g0.allocs = {act0};
  p.ids["g0"] = b.op(g0);
  sim::Op c = copy_op("c_d2h", d2h, sim::CopyDirection::kD2H, kMiB);
  c.deps = {p.ids["g0"]};
  c.allocs = {act0_host};
  c.frees = {act0};
  p.ids["c_d2h"] = b.op(c);
  sim::Op e1{.name = "e1", .lane = compute, .kind = sim::OpKind::kElementwise};
  e1.sizes.bytes = 2 * kMiB;
  e1.deps = {p.ids["c_d2h"]};
  e1.allocs = {act1};
  p.ids["e1"] = b.op(e1);
  sim::Op g2 = gemm_op("g2", compute);
  g2.frees = {act1};
  p.ids["g2"] = b.op(g2);
  sim::Op h = copy_op("h_h2d", h2d, sim::CopyDirection::kH2D, kMiB);
  h.deps = {p.ids["g2"]};
  h.allocs = {act0_back};
  p.ids["h_h2d"] = b.op(h);
  sim::Op g3 = gemm_op("g3", compute);
  g3.deps = {p.ids["h_h2d"]};
  g3.frees = {act0_back};
  p.ids["g3"] = b.op(g3);
  p.plan = std::move(b).build();
  return p;
}

std::map<std::size_t, sim::Span> spans_by_op(const sim::Timeline& t) {
  std::map<std::size_t, sim::Span> out;
  for (const sim::Span& s : t.spans) out[s.op.index()] = s;
  return out;
}

TEST(ReplayTest, EveryOpTimedInLaneOrderAndAfterItsDeps) {
  OffloadPlan p = offload_plan();
  ReplayOptions o;
  o.measured_steps = 3;
  sim::Result<ReplayResult> r = replay(p.plan, o);
  ASSERT_TRUE(r) << r.error().message;
  const sim::Timeline& t = r->timeline;
  EXPECT_EQ(t.source, "measured");
  ASSERT_EQ(t.spans.size(), p.plan.ops.size());
  auto spans = spans_by_op(t);
  sim::TimePoint last_end = sim::kTimeZero;
  for (const auto& [op, span] : spans) {
    EXPECT_LE(span.start, span.end) << p.plan.ops[op].name;
    last_end = std::max(last_end, span.end);
  }
  EXPECT_EQ(t.makespan, last_end);
  // Lane order: g0, e1, g2, g3 on the compute lane.
  for (auto [a, b] : {std::pair{"g0", "e1"}, {"e1", "g2"}, {"g2", "g3"}}) {
    EXPECT_GE(spans[p.ids[b].index()].start, spans[p.ids[a].index()].end) << a << " -> " << b;
  }
  // Cross-lane dependencies.
  for (const sim::Op& op : p.plan.ops) {
    for (sim::OpId dep : op.deps) {
      const sim::OpId self = p.ids[op.name];
      EXPECT_GE(spans[self.index()].start, spans[dep.index()].end) << op.name;
    }
  }
  EXPECT_EQ(r->step_times.size(), 3u);
  EXPECT_EQ(r->ranks, std::vector<int>{0});
  EXPECT_EQ(r->skipped_ops, 0);
}

TEST(ReplayTest, MemoryEffectsAndHighWaterMark) {
  OffloadPlan p = offload_plan();
  ReplayOptions o;
  o.measured_steps = 2;
  sim::Result<ReplayResult> r = replay(p.plan, o);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(r->timeline.pools.size(), 2u);
  const sim::PoolTrace& hbm = r->timeline.pools[0];
  EXPECT_EQ(hbm.name, "rank0.hbm");
  EXPECT_EQ(hbm.peak_bytes, 6 * kMiB);  // weights 4 MiB + act1 2 MiB (see offload_plan)
  ASSERT_FALSE(hbm.live_at_peak.empty());
  EXPECT_EQ(hbm.live_at_peak[0].name, "weights");
  EXPECT_EQ(hbm.live_at_peak[1].name, "act1");
  ASSERT_FALSE(hbm.samples.empty());
  // At g0's start the weights and act0 are in use.
  const sim::TimePoint g0_start = spans_by_op(r->timeline)[p.ids["g0"].index()].start;
  auto at_g0 = std::find_if(hbm.samples.begin(), hbm.samples.end(),
                            [&](const sim::MemorySample& m) { return m.time == g0_start; });
  ASSERT_NE(at_g0, hbm.samples.end());
  EXPECT_EQ(at_g0->bytes_in_use, 4 * kMiB + kMiB);
  EXPECT_EQ(hbm.samples.back().bytes_in_use, 4 * kMiB);  // everything else freed
  const sim::PoolTrace& host = r->timeline.pools[1];
  EXPECT_EQ(host.peak_bytes, kMiB);  // act0.host, never freed
  ASSERT_EQ(r->pools.size(), 1u);
  EXPECT_EQ(r->pools[0].pool, "rank0.hbm");
  EXPECT_EQ(r->pools[0].planned_peak_bytes, 6 * kMiB);
  EXPECT_EQ(r->pools[0].used_high_bytes, 6 * kMiB);
  // The measured memory events replay through the memory ledger to the same pools.
  ASSERT_FALSE(r->timeline.memory_events.empty());
  sim::Result<sim::MemoryLedger> ledger = sim::MemoryLedger::replay(r->timeline);
  ASSERT_TRUE(ledger) << ledger.error().message;
  std::vector<sim::PoolTrace> pools = r->timeline.pools;
  sim::fill_pool_traces(*ledger, r->timeline.tensors, pools);
  EXPECT_EQ(pools[0].peak_bytes, r->pools[0].planned_peak_bytes);
  EXPECT_EQ(pools[0].live_at_peak, hbm.live_at_peak);
  EXPECT_EQ(pools[0].samples, hbm.samples);
  EXPECT_EQ(pools[1].live_at_peak, host.live_at_peak);
}

TEST(ReplayTest, PoolOneByteTooSmallFailsWithRequestedAndInUseBytes) {
  OffloadPlan p = offload_plan();
  ReplayOptions o;
  o.cpu.pool_capacity_bytes = 6 * kMiB - 1;
  sim::Result<ReplayResult> r = replay(p.plan, o);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, sim::ErrorCode::kLimitExceeded);
  // e1 asks for act1 (2 MiB) while the weights (4 MiB) are in use.
  EXPECT_THAT(r.error().message, HasSubstr("op 'e1' requested 2097152 bytes"));
  EXPECT_THAT(r.error().message, HasSubstr("4194304 bytes in use"));
  EXPECT_THAT(r.error().message, HasSubstr("rank0.compute"));
}

TEST(ReplayTest, InjectedAllocationFailure) {
  OffloadPlan p = offload_plan();
  ReplayOptions o;
  // Allocation calls: 0 weights (initial), 1 act0 in g0 of the warm-up step.
  o.cpu.fail_alloc_at = 1;
  sim::Result<ReplayResult> r = replay(p.plan, o);
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error().message, HasSubstr("op 'g0' requested 1048576 bytes with 4194304 bytes"));
  EXPECT_THAT(r.error().message, HasSubstr("injected"));
}

// Two ranks, each: compute g → comm all-reduce (dep) → compute g; plus a p2p pair.
sim::Plan two_rank_plan() {
  sim::PlanBuilder b;
  std::vector<sim::OpId> ar;
  sim::OpId send;
  for (int r = 0; r < 2; ++r) {
    sim::LaneId compute =
        b.lane(fmt::format("rank{}.compute", r), {.rank = r, .role = sim::LaneRole::kCompute});
    sim::LaneId comm =
        b.lane(fmt::format("rank{}.comm", r), {.rank = r, .role = sim::LaneRole::kComm});
    sim::OpId g = b.op(gemm_op(fmt::format("r{}.g", r), compute));
    sim::Op a{
        .name = fmt::format("r{}.allreduce", r), .lane = comm, .kind = sim::OpKind::kCollective};
    a.sizes.bytes = 64 * 1024;
    a.sizes.collective = sim::CollectiveSpec{sim::CollectiveKind::kAllReduce, {0, 1}};
    a.deps = {g};
    sim::OpId aid = b.op(a);
    sim::Op g2 = gemm_op(fmt::format("r{}.g2", r), compute);
    g2.deps = {aid};
    b.op(g2);
    // Names say nothing: the role and the pair id make rank 0's op a send and rank 1's its
    // receive.
    sim::Op p{.name = fmt::format("r{}.p2p", r), .lane = comm, .kind = sim::OpKind::kP2P};
    p.sizes.bytes = 32 * 1024;
    p.sizes.peer = 1 - r;
    p.sizes.p2p_role = r == 0 ? sim::P2PRole::kSend : sim::P2PRole::kRecv;
    p.sizes.p2p_pair = 0;
    if (r == 1) p.deps = {send};
    const sim::OpId id = b.op(p);
    if (r == 0) send = id;
  }
  return std::move(b).build();
}

TEST(ReplayTest, TwoRanksRunCollectivesAndP2P) {
  sim::Plan plan = two_rank_plan();
  ReplayOptions o;
  sim::Result<ReplayResult> r = replay(plan, o);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(r->timeline.spans.size(), plan.ops.size());
}

TEST(ReplayTest, RepresentativeRankRunsAloneAndSkipsItsPeers) {
  sim::Plan plan = two_rank_plan();
  ReplayOptions o;
  o.ranks = {0};
  sim::Result<ReplayResult> r = replay(plan, o);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->skipped_ops, 4);  // rank 1's four ops
  EXPECT_EQ(r->timeline.spans.size(), 4u);
  for (const sim::Span& s : r->timeline.spans) {
    EXPECT_EQ(plan.lanes[s.lane.index()].rank, 0);
  }
}

TEST(ReplayTest, StalledCollectiveEndsInWatchdogError) {
  sim::Plan plan = two_rank_plan();
  ReplayOptions o;
  o.watchdog_timeout = 200ms;
  o.cpu.stall_collective_at = 0;  // rank 0's first all-reduce never reaches the communicator
  sim::Result<ReplayResult> r = replay(plan, o);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, sim::ErrorCode::kDevice);
  EXPECT_THAT(r.error().message, HasSubstr("watchdog"));
  EXPECT_THAT(r.error().message, HasSubstr("r0.allreduce"));
}

TEST(ReplayTest, RejectsBadOptionsAndPlans) {
  sim::Plan plan = two_rank_plan();
  ReplayOptions o;
  o.ranks = {5};
  sim::Result<ReplayResult> r = replay(plan, o);
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error().message, HasSubstr("rank 5"));
  o.ranks = {};
  o.measured_steps = 0;
  EXPECT_FALSE(replay(plan, o));
  // A dependency cycle is refused by validation before anything runs.
  sim::Plan cyclic = plan;
  cyclic.ops[0].deps = {sim::OpId{2}};
  o.measured_steps = 1;
  r = replay(cyclic, o);
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error().message, HasSubstr("invalid plan"));
}

TEST(ReplayTest, TooManyRanksForTheDevice) {
  sim::Plan plan = two_rank_plan();
  CpuDeviceOptions cpu;
  cpu.ranks = 1;
  auto dev = make_cpu_device(cpu);
  sim::Result<ReplayResult> r = replay_on(*dev, plan, ReplayOptions{});
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error().message, HasSubstr("2 ranks to run"));
}

TEST(ReplayTest, ListDevicesStartsWithTheCpu) {
  std::vector<DeviceInfo> devices = list_devices();
  ASSERT_FALSE(devices.empty());
  EXPECT_EQ(devices[0].kind, DeviceKind::kCpu);
}

TEST(ReplayTest, CudaWithoutAGpuIsAClearError) {
  OffloadPlan p = offload_plan();
  ReplayOptions o;
  o.device = DeviceKind::kCuda;
  sim::Result<ReplayResult> r = replay(p.plan, o);
  if (r) GTEST_SKIP() << "a GPU is present; the GPU suite covers this";
  EXPECT_TRUE(r.error().code == sim::ErrorCode::kNoDevice ||
              r.error().code == sim::ErrorCode::kUnsupported)
      << r.error().message;
}

}  // namespace
}  // namespace offsim::backends
