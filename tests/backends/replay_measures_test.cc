// The replay measures what it claims, on the CPU device: each attention op names the kernel it
// ran on (and why a fallback), the watchdog scales with the forecast and names the op it waited
// for, and the memory split sums with high-water marks that follow the device's op order.
#include <algorithm>
#include <chrono>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "backends/replay.h"

namespace offsim::backends {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

sim::AttentionShape attention_shape(bool backward, std::int64_t head_dim) {
  return sim::AttentionShape{.batch = 1,
                             .heads = 4,
                             .kv_heads = 2,
                             .seq_q = 64,
                             .seq_kv = 64,
                             .head_dim = head_dim,
                             .causal = true,
                             .backward = backward};
}

// One rank, one compute lane: fwd (allocs act 3 MiB) → recompute (allocs tmp 1 MiB) → bwd (frees
// tmp and act) → fwd2 with an odd head_dim (allocs and frees x 2 MiB). Weights 4 MiB initial.
// In use after each op: 7, 8, 4, 4 MiB; the high-water mark (8 MiB) is after the recompute's
// allocations. Each op's cost predicts 1 ms.
sim::Plan attention_plan() {
  sim::PlanBuilder b;
  sim::LaneId compute = b.lane("rank0.compute", {.rank = 0, .role = sim::LaneRole::kCompute});
  sim::PoolId hbm = b.pool("rank0.hbm", 64 * kMiB, sim::PoolKind::kHbm, 0);
  sim::TensorId w = b.tensor("weights", hbm, 4 * kMiB, sim::TensorCategory::kParams);
  sim::TensorId act = b.tensor("act", hbm, 3 * kMiB, sim::TensorCategory::kActivations);
  sim::TensorId tmp = b.tensor("tmp", hbm, kMiB, sim::TensorCategory::kActivations);
  sim::TensorId x = b.tensor("x", hbm, 2 * kMiB, sim::TensorCategory::kWorkspace);
  b.initial(w);
  auto attn = [&](const char* name, sim::OpCategory category, bool backward, std::int64_t dim) {
    sim::Op op{.name = name, .lane = compute, .kind = sim::OpKind::kAttention};
    op.category = category;
    op.sizes.attention = attention_shape(backward, dim);
    op.cost.work = 1e9;
    op.cost.max_rate = 1e12;  // 1 ms in isolation
    return op;
  };
  sim::Op fwd = attn("l0.attn.fwd", sim::OpCategory::kCompute, false, 64);
  fwd.allocs = {act};
  b.op(fwd);
  sim::Op re = attn("l0.attn.recompute", sim::OpCategory::kRecompute, false, 64);
  re.allocs = {tmp};
  b.op(re);
  sim::Op bwd = attn("l0.attn.bwd", sim::OpCategory::kCompute, true, 64);
  bwd.frees = {tmp, act};
  b.op(bwd);
  sim::Op odd = attn("l1.attn.fwd", sim::OpCategory::kCompute, false, 60);
  odd.allocs = {x};
  odd.frees = {x};
  b.op(odd);
  return std::move(b).build();
}

// "Fused" unless head_dim is not a multiple of 8, as cuDNN's SDPA graphs require.
std::string fallback_unless_dim_multiple_of_8(const sim::AttentionShape& s) {
  return s.head_dim % 8 == 0 ? std::string()
                             : "shape unsupported: head_dim " + std::to_string(s.head_dim);
}

TEST(ReplayMeasuresTest, EveryAttentionOpNamesItsKernelAndWhyAFallbackRan) {
  sim::Plan plan = attention_plan();
  ReplayOptions o;
  o.measured_steps = 1;
  o.cpu.attention_fallback = fallback_unless_dim_multiple_of_8;
  sim::Result<ReplayResult> r = replay(plan, o);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(r->attention.size(), 4u);
  EXPECT_EQ(r->attention[0].op, "l0.attn.fwd");
  EXPECT_TRUE(r->attention[0].kernel.fused);
  EXPECT_EQ(r->attention[1].category, sim::OpCategory::kRecompute);
  EXPECT_TRUE(r->attention[1].kernel.fused);
  EXPECT_TRUE(r->attention[2].backward);
  EXPECT_TRUE(r->attention[2].kernel.fused);
  EXPECT_FALSE(r->attention[3].kernel.fused);
  EXPECT_EQ(r->attention[3].kernel.reason, "shape unsupported: head_dim 60");
  const std::string text = replay_report_text(*r);
  EXPECT_THAT(text, HasSubstr("3 op(s) on cpu reference (as fused) (fused)"));
  EXPECT_THAT(text, HasSubstr("1 op(s) on cpu reference (as fallback) (FALLBACK), because shape "
                              "unsupported: head_dim 60: l1.attn.fwd"));
  auto meta =
      std::find_if(r->timeline.metadata.begin(), r->timeline.metadata.end(),
                   [](const auto& kv) { return kv.first == "replay.attention_fallback_ops"; });
  ASSERT_NE(meta, r->timeline.metadata.end());
  EXPECT_EQ(meta->second, "1");

  // Without the bookkeeping function the CPU device's reference kernel is a fallback, said so.
  o.cpu.attention_fallback = nullptr;
  r = replay(plan, o);
  ASSERT_TRUE(r) << r.error().message;
  for (const AttentionOpKernel& a : r->attention) {
    EXPECT_FALSE(a.kernel.fused) << a.op;
    EXPECT_THAT(a.kernel.reason, HasSubstr("scaled-down reference"));
  }
}

// 4 ops of 1 ms each on one lane: the step is predicted at 4 ms. 10x that is 40 ms; the one op on
// the fallback kernel adds (150 - 10) x 1 ms. A floor of 20 ms leaves the scaled deadline.
TEST(ReplayMeasuresTest, WatchdogDeadlineScalesWithTheForecastAndTheFallbackKernel) {
  sim::Plan plan = attention_plan();
  ReplayOptions o;
  o.measured_steps = 1;
  o.watchdog_timeout = 20ms;
  o.cpu.attention_fallback = fallback_unless_dim_multiple_of_8;
  sim::Result<ReplayResult> r = replay(plan, o);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->watchdog_deadline, std::chrono::milliseconds(40 + 140));

  // Every kernel fused: 10 x 4 ms.
  o.cpu.attention_fallback = [](const sim::AttentionShape&) { return std::string(); };
  r = replay(plan, o);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->watchdog_deadline, 40ms);

  // A forecast timeline: its makespan (6 ms) and spans replace the costs.
  sim::Timeline forecast = sim::timeline_skeleton(plan);
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    const sim::TimePoint start = sim::kTimeZero + sim::Duration{std::int64_t(i) * 1'500'000};
    forecast.spans.push_back(
        sim::Span{sim::OpId{i}, plan.ops[i].lane, start, start + sim::Duration{1'500'000}});
  }
  forecast.makespan = sim::kTimeZero + sim::Duration{6'000'000};
  o.forecast = &forecast;
  r = replay(plan, o);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->watchdog_deadline, 60ms);

  // The floor wins over a small prediction.
  o.watchdog_timeout = 500ms;
  r = replay(plan, o);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->watchdog_deadline, 500ms);
}

// An attention kernel that never ends: the step fails within the scaled-down deadline with an
// error naming the op, its prediction, its budget and the time waited; no hang.
TEST(ReplayMeasuresTest, HungOpEndsInAWatchdogErrorThatNamesIt) {
  sim::Plan plan = attention_plan();
  ReplayOptions o;
  o.warmup_steps = 0;
  o.measured_steps = 1;
  o.watchdog_timeout = 10ms;
  o.watchdog_factor = 5.0;
  o.fallback_attention_factor = 30.0;
  o.cpu.attention_fallback = fallback_unless_dim_multiple_of_8;
  o.cpu.stall_attention_at = 3;  // l1.attn.fwd, on the fallback kernel
  const auto began = std::chrono::steady_clock::now();
  sim::Result<ReplayResult> r = replay(plan, o);
  const auto took = std::chrono::steady_clock::now() - began;
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, sim::ErrorCode::kDevice);
  const std::string& m = r.error().message;
  // Deadline: max(10 ms, 5 x 4 ms + 25 x 1 ms) = 45 ms.
  EXPECT_THAT(m, HasSubstr("watchdog"));
  EXPECT_THAT(m, HasSubstr("op 'l1.attn.fwd' (attention on the fallback attention kernel) did "
                           "not finish: predicted 1.000 ms (cost in isolation), its budget "
                           "30.000 ms (30x)"));
  EXPECT_THAT(m, HasSubstr("deadline 45 ms"));
  EXPECT_THAT(m, HasSubstr("waited "));
  EXPECT_LT(took, 30s);  // ended by the watchdog, not a hang
}

TEST(ReplayMeasuresTest, MemorySplitSumsAndHighWaterMarksFollowTheOpOrder) {
  sim::Plan plan = attention_plan();
  ReplayOptions o;
  o.measured_steps = 2;
  sim::Timeline forecast = sim::timeline_skeleton(plan);
  forecast.pools[0].peak_bytes = 8 * kMiB;
  o.forecast = &forecast;
  sim::Result<ReplayResult> r = replay(plan, o);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(r->memory.size(), 1u);
  const RankMemory& m = r->memory[0];
  EXPECT_EQ(m.rank, 0);
  EXPECT_EQ(m.forecast_peak_bytes, 8 * kMiB);
  // Plan tensors: the pool's high-water of the measured steps.
  EXPECT_EQ(m.split.plan_used_high, 8 * kMiB);
  EXPECT_EQ(m.split.plan_reserved_high, 8 * kMiB);
  // The CPU device has no runtime overheads; its scratch is what the replay asked for.
  EXPECT_EQ(m.split.runtime_overheads(), 0);
  EXPECT_GT(m.split.replay_scratch, 0);
  EXPECT_EQ(m.split.total(), m.split.plan_reserved_high + m.split.replay_scratch);

  // Marks: after each op's allocs and after its frees, in the order the device ran them.
  const std::vector<std::int64_t> want_used = {7 * kMiB, 7 * kMiB, 8 * kMiB, 8 * kMiB,
                                               8 * kMiB, 4 * kMiB, 6 * kMiB, 4 * kMiB};
  ASSERT_EQ(m.marks.size(), want_used.size());
  std::int64_t running_high = 0;
  for (std::size_t k = 0; k < m.marks.size(); ++k) {
    EXPECT_EQ(m.marks[k].tag, k) << k;  // one lane: device order is the op order
    EXPECT_EQ(m.marks[k].used_bytes, want_used[k]) << m.mark_ops[k];
    EXPECT_EQ(m.marks[k].reserved_bytes, want_used[k]) << m.mark_ops[k];
    running_high = std::max(running_high, m.marks[k].used_bytes);
  }
  EXPECT_EQ(m.used_high_bytes, running_high);
  EXPECT_EQ(m.used_high_bytes, m.split.plan_used_high);
  EXPECT_EQ(m.used_high_op, "l0.attn.recompute (after allocs)");
  EXPECT_EQ(m.mark_ops.front(), "l0.attn.fwd (after allocs)");
  EXPECT_EQ(m.mark_ops.back(), "l1.attn.fwd (after frees)");

  const std::string text = replay_report_text(*r);
  EXPECT_THAT(text, HasSubstr("rank0: forecast peak 0.01 GiB; measured plan tensors 0.01 GiB "
                              "used high"));
  EXPECT_THAT(text, HasSubstr("marks: 8 samples, used high 0.01 GiB at l0.attn.recompute (after "
                              "allocs)"));

  // Without the marks step there are no marks, and the split is still there.
  o.memory_marks = false;
  r = replay(plan, o);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_TRUE(r->memory[0].marks.empty());
  EXPECT_EQ(r->memory[0].split.plan_used_high, 8 * kMiB);
}

// Two lanes on one rank: marks come back in the order the device reached them, whatever the
// issue order, and each mark's bytes are the pool's at that moment.
TEST(ReplayMeasuresTest, MarksOfTwoLanesFollowDeviceTime) {
  sim::PlanBuilder b;
  sim::LaneId compute = b.lane("rank0.compute", {.rank = 0, .role = sim::LaneRole::kCompute});
  sim::LaneId d2h = b.lane("rank0.d2h", {.rank = 0, .role = sim::LaneRole::kD2H});
  sim::PoolId hbm = b.pool("rank0.hbm", 64 * kMiB, sim::PoolKind::kHbm, 0);
  sim::TensorId a = b.tensor("a", hbm, kMiB, sim::TensorCategory::kActivations);
  sim::TensorId c = b.tensor("c", hbm, 2 * kMiB, sim::TensorCategory::kActivations);
  sim::Op g0{.name = "g0", .lane = compute, .kind = sim::OpKind::kElementwise};
  g0.sizes.bytes = 4096;
  g0.allocs = {a};
  sim::OpId g0_id = b.op(g0);
  sim::Op off{.name = "off", .lane = d2h, .kind = sim::OpKind::kElementwise};
  off.sizes.bytes = 4096;
  off.deps = {g0_id};
  off.frees = {a};
  sim::OpId off_id = b.op(off);
  sim::Op g1{.name = "g1", .lane = compute, .kind = sim::OpKind::kElementwise};
  g1.sizes.bytes = 4096;
  g1.deps = {off_id};
  g1.allocs = {c};
  g1.frees = {c};
  b.op(g1);
  sim::Plan plan = std::move(b).build();
  ReplayOptions o;
  o.measured_steps = 1;
  sim::Result<ReplayResult> r = replay(plan, o);
  ASSERT_TRUE(r) << r.error().message;
  const RankMemory& m = r->memory[0];
  ASSERT_EQ(m.marks.size(), 6u);
  // g0 → off → g1 by dependencies: 1, 1, 1, 0, 2, 0 MiB.
  const std::vector<std::uint64_t> tags = {0, 1, 2, 3, 4, 5};
  const std::vector<std::int64_t> used = {kMiB, kMiB, kMiB, 0, 2 * kMiB, 0};
  for (std::size_t k = 0; k < 6; ++k) {
    EXPECT_EQ(m.marks[k].tag, tags[k]) << k;
    EXPECT_EQ(m.marks[k].used_bytes, used[k]) << m.mark_ops[k];
  }
  EXPECT_EQ(m.used_high_bytes, 2 * kMiB);
}

}  // namespace
}  // namespace offsim::backends
