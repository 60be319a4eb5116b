// Engine throughput: items_per_second is ops simulated per second (plan building excluded).
#include <cstdint>
#include <random>
#include <string>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include "sim/engine/simulator.h"

namespace offsim::sim {
namespace {

// One lane, each op a flow on one link after a 1 µs launch latency.
Plan chain_plan(std::int64_t ops) {
  PlanBuilder b;
  ResourceId link = b.resource("link", 25e9);
  LaneId lane = b.lane("rank0.compute");
  for (std::int64_t i = 0; i < ops; ++i) {
    Op op{.name = fmt::format("op{}", i), .lane = lane, .kind = OpKind::kCopy};
    op.cost.work = 1e6 + static_cast<double>(i % 7) * 1e5;
    op.cost.uses = {{link, 1.0}};
    op.cost.latency = Duration{1'000};
    b.op(std::move(op));
  }
  return std::move(b).build();
}

// `lanes` lanes over `resources` shared resources, split into `groups` (think GPUs: lane l and
// its resources belong to group l % groups). Each op moves 1..100 MB over two distinct resources
// of its group drawn at random, so the flows of a group contend on overlapping pairs and share
// at several levels. Every eighth op also waits on the op issued just before it (another lane,
// usually another group). With groups = 1 every flow in flight is in one component, re-solved
// at every op end: the worst case for the incremental solver.
Plan contended_plan(std::int64_t ops, int lanes, int resources, int groups, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int per_group = resources / groups;
  std::uniform_int_distribution<int> pick(0, per_group - 1);
  std::uniform_int_distribution<int> size(1, 100);
  PlanBuilder b;
  std::vector<ResourceId> res;
  for (int r = 0; r < resources; ++r) {
    res.push_back(b.resource(fmt::format("res{}", r), (10.0 + r) * 1e9));
  }
  std::vector<LaneId> lane_ids;
  for (int l = 0; l < lanes; ++l) lane_ids.push_back(b.lane(fmt::format("lane{}", l)));
  for (std::int64_t i = 0; i < ops; ++i) {
    const int lane = static_cast<int>(i % lanes);
    const int base = (lane % groups) * per_group;
    Op op{.name = fmt::format("op{}", i),
          .lane = lane_ids[static_cast<std::size_t>(lane)],
          .kind = OpKind::kCopy};
    op.cost.work = static_cast<double>(size(rng)) * 1e6;
    const int r0 = pick(rng);
    int r1 = pick(rng);
    if (r1 == r0) r1 = (r0 + 1) % per_group;
    op.cost.uses = {{res[static_cast<std::size_t>(base + r0)], 1.0},
                    {res[static_cast<std::size_t>(base + r1)], 1.0}};
    if (i % 8 == 7) op.deps = {OpId{static_cast<std::size_t>(i - 1)}};
    b.op(std::move(op));
  }
  return std::move(b).build();
}

void run(benchmark::State& state, const Plan& plan, bool validate) {
  SimOptions options;
  options.validate_plan = validate;
  std::int64_t ops = 0;
  for (auto _ : state) {
    Result<SimResult> r = simulate(plan, options);
    if (!r || r->timeline.outcome.kind != OutcomeKind::kCompleted) {
      state.SkipWithError("simulation failed");
      return;
    }
    ops += r->stats.ops_executed;
    benchmark::DoNotOptimize(r->timeline.makespan);
    state.counters["flows_per_solve"] =
        static_cast<double>(r->stats.flows_resolved) / static_cast<double>(r->stats.flow_solves);
  }
  state.SetItemsProcessed(ops);
}

void BM_SingleLaneChain(benchmark::State& state) {
  const Plan plan = chain_plan(state.range(0));
  run(state, plan, false);
}
BENCHMARK(BM_SingleLaneChain)->Arg(100'000)->Unit(benchmark::kMillisecond);

// 64 lanes over 16 resources in 4 groups of 16 lanes and 4 resources.
void BM_Contended64Lanes16Resources(benchmark::State& state) {
  const Plan plan = contended_plan(state.range(0), 64, 16, 4, 42);
  run(state, plan, false);
}
BENCHMARK(BM_Contended64Lanes16Resources)->Arg(200'000)->Unit(benchmark::kMillisecond);

// The same with every op free to use any two of the 16 resources: one component of ~64 flows.
void BM_Contended64Lanes16ResourcesOneComponent(benchmark::State& state) {
  const Plan plan = contended_plan(state.range(0), 64, 16, 1, 42);
  run(state, plan, false);
}
BENCHMARK(BM_Contended64Lanes16ResourcesOneComponent)->Arg(200'000)->Unit(benchmark::kMillisecond);

// A million ops (the grouped contended plan), with and without validation (Boost.Graph
// topological sort) in the measured time.
void BM_MillionOps(benchmark::State& state) {
  const Plan plan = contended_plan(1'000'000, 64, 16, 4, 7);
  run(state, plan, state.range(0) != 0);
}
BENCHMARK(BM_MillionOps)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("validate")
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2);

}  // namespace
}  // namespace offsim::sim

BENCHMARK_MAIN();
