// Data-parallel collectives across nodes, end to end: a ring whose group has k ranks in each
// node leaves the node through their k NICs (NCCL's channels; see CostModel::plan_collective),
// and the simulated step runs it at that rate, with one simulated rank standing for the others
// (the NIC resources they share do not throttle it). All-reduce on NVLink SHARP systems takes
// NVLSTree when it is faster.
#include <gtest/gtest.h>

#include <string>

#include "models/evaluate.h"
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

}  // namespace
}  // namespace offsim::models
