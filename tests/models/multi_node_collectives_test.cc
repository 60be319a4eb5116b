// Data-parallel collectives across nodes, end to end: a ring whose group has k ranks in each
// node leaves the node through their k NICs (NCCL's channels; see CostModel::plan_collective),
// and the simulated step runs it at that rate, with one simulated rank standing for the others
// (the NIC resources they share do not throttle it). All-reduce on NVLink SHARP systems takes
// NVLSTree when it is faster.
#include <algorithm>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "models/evaluate.h"
#include "models/formulas.h"
#include "models/plan_size.h"
#include "models/step_builder.h"
#include "sim/core/time.h"

namespace offsim::models {
namespace {

// Llama-3-8B (2 layers) with FSDP over two DGX H100 nodes: dp · tp = 16.
Scenario fsdp_two_nodes(int tp) {
  Scenario s;
  s.name = "fsdp across nodes";
  s.model = *find_model("llama3-8b");
  s.model.layers = 2;
  s.hardware.system = "dgx-h100";
  s.hardware.nodes = 2;
  s.training = {.global_batch = 16 / tp, .micro_batch = 1, .seq_len = 4096};
  s.parallelism = {.dp = 16 / tp, .tp = tp, .sequence_parallel = tp > 1, .fsdp = true};
  return s;
}

// Seconds the op named `name` ran in the simulated step, and its bytes.
std::pair<double, double> duration_of(const Scenario& s, const std::string& name) {
  EvalOptions options;
  options.keep_timeline = true;
  auto e = evaluate(s, options);
  EXPECT_TRUE(e) << e.error().message;
  if (!e) return {0.0, 0.0};
  auto step = build_step(s);
  EXPECT_TRUE(step) << step.error().message;
  for (const sim::Span& sp : e->timeline->spans) {
    const sim::Op& op = step->plan.ops[sp.op.index()];
    if (op.name != name) continue;
    return {sim::to_seconds(sp.end - sp.start), static_cast<double>(op.sizes.bytes)};
  }
  ADD_FAILURE() << "no op " << name;
  return {0.0, 0.0};
}

// The op runs alone on the network (nothing else crosses it meanwhile): its time is NCCL's
// latency plus bytes over the algorithm bandwidth.
void expect_at(const Scenario& s, const std::string& name, double alg_bytes_per_s) {
  const auto [seconds, bytes] = duration_of(s, name);
  const double transfer = bytes / alg_bytes_per_s;
  EXPECT_GT(seconds, transfer);
  EXPECT_LT(seconds, transfer + 200e-6) << "latency beyond NCCL's steps";
}

// An all-gather's algorithm bandwidth is busbw · n / (n - 1).
void expect_all_gather_at(const Scenario& s, double busbw) {
  const int n = s.parallelism.dp;
  expect_at(s, "l0.mb0.fwd.params_allgather", busbw * n / (n - 1));
}

TEST(MultiNodeCollectives, EightRanksPerNodeRunAtTheNvlinkRingCap) {
  // 8 × 50 GB/s × 0.94 = 376 GB/s of NICs, capped by the 365 GB/s NVLink ring.
  expect_all_gather_at(fsdp_two_nodes(1), 365e9);
}

TEST(MultiNodeCollectives, FourRanksPerNodeUseTheirFourNics) {
  // TP2: each data-parallel group holds 4 ranks of each node: 4 × 47 GB/s.
  expect_all_gather_at(fsdp_two_nodes(2), 4 * 47e9);
}

TEST(MultiNodeCollectives, DataParallelAllReduceTakesNvlsTreeOnHopper) {
  // Plain data parallelism: each layer's gradient all-reduce over 16 ranks on two nodes runs
  // NVLSTree, NVLink SHARP in each node (477.5 GB/s busbw) and the NICs between the two (twice
  // 376 GB/s for two nodes, as NCCL counts them): algbw 477.5 · 16 / 30.
  Scenario s = fsdp_two_nodes(1);
  s.parallelism.fsdp = false;
  expect_at(s, "mb0.l0.grad_allreduce", 477.5e9 * 16 / 30);
}

// Hybrid sharding (FSDP's HSDP) over the two nodes: shard groups of the 8 ranks of a node,
// replicated across the nodes. Parameters are gathered in the node, over NVLink, faster than the
// all-gather over all 16 ranks; each layer's gradient shard is all-reduced between the two
// replicas on a stream of its own; every rank holds an eighth of the state instead of a
// sixteenth.
TEST(MultiNodeCollectives, HybridShardingGathersInTheNodeAndReducesAcrossReplicas) {
  Scenario s = fsdp_two_nodes(1);
  s.parallelism.fsdp_shard = 8;
  ASSERT_TRUE(check_scenario(s).has_value()) << check_scenario(s).error().message;
  auto step = build_step(s);
  ASSERT_TRUE(step) << step.error().message;
  const std::int64_t layer = layer_parameter_count_per_rank(s.model, 1, 0);
  std::int64_t params = -1;
  for (const sim::Tensor& t : step->plan.tensors) {
    if (t.name == "l0.params") params = t.bytes;
  }
  EXPECT_EQ(params, 2 * ((layer + 7) / 8));
  int replica_reduces = 0;
  for (const sim::Op& op : step->plan.ops) {
    if (op.name == "l0.mb0.fwd.params_allgather") {
      EXPECT_EQ(op.sizes.collective.group, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
    }
    if (op.name == "mb0.l0.grad_reducescatter") {
      EXPECT_EQ(op.sizes.collective.group.size(), 8U);
    }
    if (op.name.ends_with(".grad_replica_allreduce")) {
      ++replica_reduces;
      EXPECT_EQ(op.sizes.collective.group, (std::vector<int>{0, 8}));
      EXPECT_EQ(op.sizes.collective.kind, sim::CollectiveKind::kAllReduce);
      EXPECT_TRUE(step->plan.lanes[op.lane.index()].name.ends_with(".replica"));
    }
  }
  // Layers, embedding and head, in each of the step's micro-batches.
  EXPECT_EQ(replica_reduces, 4);
  const PlanSize est = estimate_plan_size(s, {});
  EXPECT_NEAR(est.ops / static_cast<double>(step->plan.ops.size()), 1.0, 0.05);
  const double hybrid = duration_of(s, "l0.mb0.fwd.params_allgather").first;
  const double full = duration_of(fsdp_two_nodes(1), "l0.mb0.fwd.params_allgather").first;
  EXPECT_LT(hybrid, full);
  // Groups that do not divide the data-parallel ranks, or without sharded parameters, are
  // refused with the key.
  s.parallelism.fsdp_shard = 3;
  EXPECT_NE(check_scenario(s).error().message.find("parallelism.fsdp_shard: 3"), std::string::npos);
  s.parallelism.fsdp_shard = 8;
  s.parallelism.fsdp = false;
  EXPECT_NE(check_scenario(s).error().message.find("expected parallelism.fsdp true"),
            std::string::npos);
}

// Hybrid sharding with FSDP2's CPUOffloadPolicy: each rank keeps its shard group's share (an
// eighth, not a sixteenth) of the parameters, gradients and Adam state on the host, and a
// gradient goes down only once the replicas have all-reduced it. DeepSpeed's CPU steps (flat
// partition, ZenFlow, SuperOffload) stay refused.
TEST(MultiNodeCollectives, HybridShardingWithTheOptimizerOnTheHost) {
  Scenario s = fsdp_two_nodes(1);
  s.parallelism.fsdp_shard = 8;
  s.offload = *offload_preset("fsdp2_cpu_offload_policy", {});
  ASSERT_TRUE(check_scenario(s).has_value()) << check_scenario(s).error().message;
  auto step = build_step(s);
  ASSERT_TRUE(step) << step.error().message;
  const std::int64_t layer = layer_parameter_count_per_rank(s.model, 1, 0);
  std::int64_t host_params = -1;
  for (const sim::Tensor& t : step->plan.tensors) {
    if (t.name == "l0.params" && t.pool == step->ranks.front().host_pool) host_params = t.bytes;
  }
  EXPECT_GE(host_params, 2 * ((layer + 7) / 8));
  std::map<std::string, sim::OpId> by_name;
  for (std::size_t i = 0; i < step->plan.ops.size(); ++i) {
    by_name[step->plan.ops[i].name] = sim::OpId{static_cast<std::uint32_t>(i)};
  }
  ASSERT_EQ(by_name.count("mb0.l0.grads_d2h"), 1U);
  ASSERT_EQ(by_name.count("mb0.l0.grad_replica_allreduce"), 1U);
  const sim::Op& down = step->plan.ops[by_name.at("mb0.l0.grads_d2h").index()];
  EXPECT_NE(
      std::find(down.deps.begin(), down.deps.end(), by_name.at("mb0.l0.grad_replica_allreduce")),
      down.deps.end());
  auto e = evaluate(s);
  ASSERT_TRUE(e) << e.error().message;
  Scenario full = s;
  full.parallelism.fsdp_shard = 0;
  auto f = evaluate(full);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_GT(e->report.host_peak_bytes, f->report.host_peak_bytes);
  s.offload = *offload_preset("zero_offload", {});
  EXPECT_NE(check_scenario(s).error().message.find("parallelism.fsdp_shard"), std::string::npos);
}

}  // namespace
}  // namespace offsim::models
