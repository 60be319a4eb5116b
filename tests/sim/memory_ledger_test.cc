#include "sim/trace/memory_ledger.h"

#include <gtest/gtest.h>

#include "sim/engine/simulator.h"
#include "sim/trace/timeline_json.h"

namespace offsim::sim {
namespace {

TimePoint at(std::int64_t ns) { return TimePoint{Duration{ns}}; }

std::vector<std::string> names(const std::vector<LiveTensor>& live) {
  std::vector<std::string> out;
  for (const LiveTensor& t : live) out.push_back(t.name);
  return out;
}

// Two pools; tensors a (pool 0, 100 B), b (pool 0, 60 B), c (pool 1, 30 B), d (pool 0, 60 B).
std::vector<TensorInfo> tensors() {
  return {{"a", sim::TensorCategory::kParams, 100, PoolId{0}},
          {"b", sim::TensorCategory::kActivations, 60, PoolId{0}},
          {"c", sim::TensorCategory::kBuffers, 30, PoolId{1}},
          {"d", sim::TensorCategory::kActivations, 60, PoolId{0}}};
}

TEST(MemoryLedgerTest, PeakIsTheFirstEventThatReachesTheMaximum) {
  const std::vector<TensorInfo> t = tensors();
  MemoryLedger l(2, {.record_samples = true, .record_events = true});
  l.alloc(at(0), TensorId{0}, PoolId{0}, 100);  // 100
  l.alloc(at(5), TensorId{1}, PoolId{0}, 60);   // 160: the peak, at 5
  l.alloc(at(5), TensorId{2}, PoolId{1}, 30);   // pool 1: 30 at 5
  l.free(at(7), TensorId{1}, PoolId{0}, 60);    // 100
  l.alloc(at(7), TensorId{3}, PoolId{0}, 60);   // 160 again at 7: not a new peak
  l.free(at(9), TensorId{0}, PoolId{0}, 100);   // 60
  EXPECT_EQ(l.pool(PoolId{0}).peak_bytes, 160);
  EXPECT_EQ(l.pool(PoolId{0}).peak_time, at(5));
  EXPECT_EQ(l.pool(PoolId{1}).peak_bytes, 30);
  EXPECT_EQ(l.in_use(PoolId{0}), 60);
  // Samples: (0, 0) first; at 7 the free and the alloc leave 160 — the same value as at 5, so
  // the instant adds no sample.
  const std::vector<MemorySample> expected = {{at(0), 100}, {at(5), 160}, {at(9), 60}};
  EXPECT_EQ(l.pool(PoolId{0}).samples, expected);
  const std::vector<std::vector<TensorId>> peaks = l.live_at_peaks();
  EXPECT_EQ(names(describe_live(t, peaks[0])), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(names(describe_live(t, peaks[1])), (std::vector<std::string>{"c"}));
  // Live set at any time: after every event at or before it.
  EXPECT_TRUE(l.live_at(PoolId{0}, at(-1)).empty());
  EXPECT_EQ(names(describe_live(t, l.live_at(PoolId{0}, at(7)))),
            (std::vector<std::string>{"a", "d"}));
  EXPECT_EQ(names(describe_live(t, l.live_at(PoolId{0}, at(100)))),
            (std::vector<std::string>{"d"}));
  EXPECT_EQ(l.bytes_at(PoolId{0}, at(6)), 160);
  EXPECT_EQ(l.bytes_at(PoolId{1}, at(4)), 0);
  // Largest first, ties in tensor id order.
  EXPECT_EQ(names(describe_live(t, {TensorId{3}, TensorId{1}, TensorId{0}})),
            (std::vector<std::string>{"a", "d", "b"}));
}

TEST(MemoryLedgerTest, ReplayChecksEveryEvent) {
  Timeline t;
  t.pools.resize(2);
  t.tensors = tensors();
  t.memory_events = {{at(0), TensorId{0}, 100, PoolId{0}}, {at(3), TensorId{0}, -100, PoolId{0}}};
  ASSERT_TRUE(MemoryLedger::replay(t).has_value());
  struct Case {
    MemoryEvent second;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {{at(3), TensorId{9}, -100, PoolId{0}}, "memory_events[1]: tensor index 9 is out of range"},
      {{at(3), TensorId{0}, -100, PoolId{1}}, "memory_events[1]: pool 1 is not the pool of tensor"},
      {{at(-1), TensorId{0}, -100, PoolId{0}}, "memory_events[1]: time -1 ns is before"},
      {{at(3), TensorId{0}, 100, PoolId{0}},
       "memory_events[1]: expected -100 bytes (a free, as it is live"},
      {{at(3), TensorId{1}, -60, PoolId{0}},
       "memory_events[1]: expected 60 bytes (an alloc, as it is not live"},
  };
  for (const Case& c : cases) {
    t.memory_events[1] = c.second;
    Result<MemoryLedger> r = MemoryLedger::replay(t);
    ASSERT_FALSE(r.has_value()) << c.expected;
    EXPECT_EQ(r.error().message.rfind(c.expected, 0), 0u) << r.error().message;
  }
}

// The engine's memory events are ordered as it applied them: at 10 ms the end of `a` frees x
// before `c` starts and allocates z; replaying them gives the engine's pool traces exactly.
TEST(MemoryLedgerTest, EngineEventsReplayToTheEnginesPools) {
  PlanBuilder b;
  PoolId hbm = b.pool("hbm", 1 << 20);
  TensorId x = b.tensor("x", hbm, 100, sim::TensorCategory::kActivations);
  TensorId y = b.tensor("y", hbm, 70, sim::TensorCategory::kActivations);
  TensorId z = b.tensor("z", hbm, 50, sim::TensorCategory::kActivations);
  TensorId w = b.tensor("w", hbm, 10, sim::TensorCategory::kParams);
  b.initial(w);
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
  Result<SimResult> r = simulate(plan);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const Timeline& t = r->timeline;
  const std::vector<MemoryEvent> expected = {
      {at(0), w, 10, hbm},          {at(0), x, 100, hbm},
      {at(0), y, 70, hbm},          {at(10'000'000), x, -100, hbm},
      {at(10'000'000), z, 50, hbm}, {at(15'000'000), y, -70, hbm},
      {at(20'000'000), z, -50, hbm}};
  EXPECT_EQ(t.memory_events, expected);
  EXPECT_EQ(t.tensors, tensor_infos(plan));
  Result<MemoryLedger> ledger = MemoryLedger::replay(t);
  ASSERT_TRUE(ledger.has_value()) << ledger.error().message;
  std::vector<PoolTrace> pools = t.pools;
  for (PoolTrace& p : pools) p = PoolTrace{p.name, p.kind, p.owner, p.capacity_bytes};
  fill_pool_traces(*ledger, t.tensors, pools);
  EXPECT_EQ(pools, t.pools);
  EXPECT_EQ(t.pools[0].peak_bytes, 180);
  EXPECT_EQ(names(t.pools[0].live_at_peak), (std::vector<std::string>{"x", "y", "w"}));
  // Live set at 12 ms: w, y and z.
  EXPECT_EQ(names(describe_live(t.tensors, ledger->live_at(hbm, at(12'000'000)))),
            (std::vector<std::string>{"y", "z", "w"}));

  // Not recorded: no events, no tensors; the same peaks.
  SimOptions quiet;
  quiet.record_memory = false;
  Result<SimResult> q = simulate(plan, quiet);
  ASSERT_TRUE(q.has_value());
  EXPECT_TRUE(q->timeline.memory_events.empty());
  EXPECT_TRUE(q->timeline.tensors.empty());
  EXPECT_EQ(q->timeline.pools[0].peak_bytes, t.pools[0].peak_bytes);
  EXPECT_EQ(q->timeline.pools[0].peak_time, t.pools[0].peak_time);
  EXPECT_EQ(q->timeline.pools[0].live_at_peak, t.pools[0].live_at_peak);

  // The JSON keeps them.
  Result<Timeline> back = timeline_from_json(timeline_to_json(t), "t.json");
  ASSERT_TRUE(back.has_value()) << back.error().message;
  EXPECT_EQ(back->memory_events, t.memory_events);
  EXPECT_EQ(back->tensors, t.tensors);
}

}  // namespace
}  // namespace offsim::sim
