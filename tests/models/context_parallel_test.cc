// Context parallelism (parallelism.cp): the ring (p2p) and all-to-all (a2a) forms of attention,
// the per-rank work and memory, the gradient group, the plan-size estimate and the checks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "models/evaluate.h"
#include "models/formulas.h"
#include "models/plan_size.h"
#include "models/step_builder.h"

namespace offsim::models {
namespace {

using CpComm = ParallelConfig::CpCommType;

// Llama-3-8B (4 layers) on one DGX H100 (8 GPUs): TP2 × CP × DP, 8192-token sequences, two
// micro-batches per rank whatever cp.
Scenario cp_scenario(int cp, CpComm comm = CpComm::kP2P) {
  Scenario s;
  s.name = "cp";
  s.model = *find_model("llama3-8b");
  s.model.layers = 4;
  s.hardware.system = "dgx-h100";
  s.training = {.global_batch = 2 * (4 / cp), .micro_batch = 1, .seq_len = 8192};
  s.parallelism = {.dp = 4 / cp, .tp = 2, .sequence_parallel = true, .zero_stage = 1};
  s.parallelism.cp = cp;
  s.parallelism.cp_comm_type = comm;
  return s;
}

std::vector<const sim::Op*> ops_named(const sim::Plan& plan, const std::string& part) {
  std::vector<const sim::Op*> out;
  for (const sim::Op& op : plan.ops) {
    if (op.name.find(part) != std::string::npos) out.push_back(&op);
  }
  return out;
}

// The span of the op named `name` (spans are in completion order; each names its op).
sim::Span span_of(const sim::Timeline& t, const std::string& name) {
  for (const sim::Span& sp : t.spans) {
    if (t.ops[sp.op.index()].name == name) return sp;
  }
  ADD_FAILURE() << "no op " << name;
  return sim::Span{};
}

double attention_flops(const sim::Plan& plan) {
  double flops = 0;
  for (const sim::Op& op : plan.ops) {
    if (op.kind == sim::OpKind::kAttention) flops += op.sizes.flops;
  }
  return flops;
}

TEST(ContextParallel, RingSplitsAttentionIntoCpKernelsAndOverlapsTheKvTransfers) {
  const Scenario s = cp_scenario(2);
  auto step = build_step(s);
  ASSERT_TRUE(step) << step.error().message;
  ASSERT_TRUE(sim::validate(step->plan));
  // One representative for tp · cp · dp = 8 ranks; the gradient group is dp · cp = 4 ranks.
  EXPECT_EQ(step->ranks.front().multiplicity, 8);
  EXPECT_EQ(step->gpus, 8);
  // Forward of micro-batch 0, layer 1: two kernels, one K,V transfer on the CP lane (cp − 1).
  const auto kernels = ops_named(step->plan, "mb0.l1.attn.fwd.cp");
  const auto kv = ops_named(step->plan, "mb0.l1.attn.fwd.cp_kv");
  ASSERT_EQ(kv.size(), 1u);
  ASSERT_EQ(kernels.size(), 3u);  // cp0, cp1 and the transfer cp_kv1
  EXPECT_EQ(kv.front()->kind, sim::OpKind::kP2P);
  EXPECT_EQ(kv.front()->sizes.peer, 2);  // the ring successor: rank + tp
  // K and V of this rank's 4096 tokens: 2 · 4096 · (8 kv heads / tp 2) · 128 · 2 bytes.
  EXPECT_EQ(kv.front()->sizes.bytes, 2 * 4096 * 4 * 128 * 2);
  // Each kernel is a causal 4096 × 4096 attention over the rank's 16 query heads.
  const sim::Op* k0 = ops_named(step->plan, "mb0.l1.attn.fwd.cp0").front();
  EXPECT_EQ(k0->sizes.attention.seq_q, 4096);
  EXPECT_EQ(k0->sizes.attention.seq_kv, 4096);
  EXPECT_EQ(k0->sizes.attention.heads, 16);
  // Backward: two K,V transfers' worth (cp − 1 K,V and cp dK,dV).
  EXPECT_EQ(ops_named(step->plan, "mb0.l1.attn.bwd.cp_kv").size(), 1u);
  EXPECT_EQ(ops_named(step->plan, "mb0.l1.attn.bwd.cp_dkv").size(), 2u);

  // The per-rank attention work is 1/cp of the whole sequence's (the product s × s split over
  // cp ranks), so two CP ranks together do what one rank without CP does.
  auto base = build_step(cp_scenario(1));
  ASSERT_TRUE(base);
  const double per_rank_cp = attention_flops(step->plan);
  const double per_rank_no_cp = attention_flops(base->plan);
  EXPECT_NEAR(per_rank_cp * 2 / per_rank_no_cp, 1.0, 1e-12);
  // Model FLOPs per token do not depend on the layout.
  EXPECT_DOUBLE_EQ(step->model_flops_per_step / static_cast<double>(step->tokens_per_step),
                   base->model_flops_per_step / static_cast<double>(base->tokens_per_step));
}

TEST(ContextParallel, TransferOverlapsTheFirstKernelAndTheSecondWaitsForIt) {
  EvalOptions options;
  options.keep_timeline = true;
  auto e = evaluate(cp_scenario(2), options);
  ASSERT_TRUE(e) << e.error().message;
  const sim::Timeline& t = *e->timeline;
  const auto span = [&](const std::string& name) { return span_of(t, name); };
  const sim::Span kv = span("mb0.l1.attn.fwd.cp_kv1");
  const sim::Span k0 = span("mb0.l1.attn.fwd.cp0");
  const sim::Span k1 = span("mb0.l1.attn.fwd.cp1");
  // Both start when K and V are ready; the 8 MB transfer over NVLink is shorter than the
  // 4096² kernel, so the second kernel follows the first without a gap.
  EXPECT_EQ(kv.start, k0.start);
  EXPECT_LT(kv.end, k0.end);
  EXPECT_EQ(k1.start, k0.end);
}

TEST(ContextParallel, ActivationsPerGpuScaleWithTheLocalTokens) {
  const LayerDims one = layer_dims(cp_scenario(1));
  const LayerDims two = layer_dims(cp_scenario(2));
  EXPECT_EQ(two.s, one.s / 2);
  const LayerActivations a1 = layer_activations(one, RecomputeConfig::Mode::kNone, {});
  const LayerActivations a2 = layer_activations(two, RecomputeConfig::Mode::kNone, {});
  EXPECT_EQ(a2.saved_bytes(two) * 2, a1.saved_bytes(one));
  // Attention FLOPs per rank: s_local queries against all cp · s_local keys.
  EXPECT_DOUBLE_EQ(fwd_op_flops(two, FwdOp::kCore, false) * 2,
                   fwd_op_flops(one, FwdOp::kCore, false));
}

TEST(ContextParallel, OptimizerStateIsShardedOverDpTimesCp) {
  // ZeRO-1 over dp · cp = 4 ranks in both layouts: the same optimizer bytes per rank.
  const ParallelConfig p1 = cp_scenario(1).parallelism;
  const ParallelConfig p2 = cp_scenario(2).parallelism;
  EXPECT_EQ(grad_dp(p1), 4);
  EXPECT_EQ(grad_dp(p2), 4);
  EXPECT_EQ(static_memory(1'000'000, p2, true, sim::DType::kBf16).optimizer_bytes,
            static_memory(1'000'000, p1, true, sim::DType::kBf16).optimizer_bytes);
  auto step = build_step(cp_scenario(2));
  ASSERT_TRUE(step);
  bool found = false;
  for (const sim::Op& op : step->plan.ops) {
    if (op.sizes.collective.kind == sim::CollectiveKind::kReduceScatter &&
        op.category == sim::OpCategory::kComm && op.sizes.collective.group.size() == 4 &&
        op.sizes.collective.group[1] == 2) {
      found = true;  // the gradient reduce-scatter over ranks 0, 2, 4, 6
    }
  }
  EXPECT_TRUE(found);
}

TEST(ContextParallel, AllToAllRunsAttentionOverTheWholeSequenceForHeadsOverCp) {
  auto step = build_step(cp_scenario(2, CpComm::kA2A));
  ASSERT_TRUE(step) << step.error().message;
  ASSERT_TRUE(sim::validate(step->plan));
  const auto a2a = ops_named(step->plan, "mb0.l1.attn.fwd.cp_a2a");
  ASSERT_EQ(a2a.size(), 2u);
  EXPECT_EQ(a2a.front()->sizes.collective.kind, sim::CollectiveKind::kAllToAll);
  EXPECT_EQ(a2a.front()->sizes.collective.group, (std::vector<int>{0, 2}));
  // Q, K, V of the rank's 4096 tokens: (16 + 2 · 4) heads · 128 · 2 bytes per token.
  EXPECT_EQ(a2a.front()->sizes.bytes, 4096 * (16 + 2 * 4) * 128 * 2);
  const sim::Op* kernel = ops_named(step->plan, "mb0.l1.attn.fwd").at(1);
  EXPECT_EQ(kernel->kind, sim::OpKind::kAttention);
  EXPECT_EQ(kernel->sizes.attention.seq_q, 8192);
  EXPECT_EQ(kernel->sizes.attention.heads, 8);
  EXPECT_EQ(kernel->sizes.attention.kv_heads, 2);
  auto base = build_step(cp_scenario(1));
  ASSERT_TRUE(base);
  EXPECT_NEAR(attention_flops(step->plan) * 2 / attention_flops(base->plan), 1.0, 1e-12);
}

TEST(ContextParallel, PlanSizeEstimateCountsTheCpOps) {
  for (CpComm comm : {CpComm::kP2P, CpComm::kA2A}) {
    for (RecomputeConfig::Mode mode :
         {RecomputeConfig::Mode::kNone, RecomputeConfig::Mode::kSelective}) {
      Scenario s = cp_scenario(2, comm);
      s.recompute.mode = mode;
      s.parallelism.cp = 4;
      s.parallelism.dp = 1;
      if (comm == CpComm::kA2A) {
        s.parallelism.tp = 2;  // 16 heads and 4 kv heads per rank, both divisible by cp 4
      }
      auto step = build_step(s);
      ASSERT_TRUE(step) << step.error().message;
      const PlanSize est = estimate_plan_size(s);
      EXPECT_DOUBLE_EQ(est.ops, static_cast<double>(step->plan.ops.size()))
          << to_string(comm) << " " << to_string(mode);
      EXPECT_DOUBLE_EQ(est.tensors, static_cast<double>(step->plan.tensors.size()));
    }
  }
}

TEST(ContextParallel, RingAcrossNodesIsPricedOnTheNic) {
  // TP8 × CP2 on two DGX H100 nodes: the CP peer is on the other node.
  Scenario s = cp_scenario(2);
  s.hardware.nodes = 2;
  s.parallelism = {.dp = 1, .tp = 8, .sequence_parallel = true, .zero_stage = 1};
  s.parallelism.cp = 2;
  auto across = evaluate(s, {.keep_timeline = true});
  ASSERT_TRUE(across) << across.error().message;
  Scenario inside = s;
  inside.hardware.nodes = 1;
  inside.parallelism.tp = 4;
  auto within = evaluate(inside, {.keep_timeline = true});
  ASSERT_TRUE(within) << within.error().message;
  const auto duration = [](const sim::Timeline& t, const std::string& name) {
    const sim::Span sp = span_of(t, name);
    return sp.end - sp.start;
  };
  // Per byte, a NIC (50 GB/s) is several times slower than NVLink; the TP8 block is half the
  // TP4 one, so the transfer still takes longer across nodes.
  EXPECT_GT(duration(*across->timeline, "mb0.l1.attn.fwd.cp_kv1"),
            duration(*within->timeline, "mb0.l1.attn.fwd.cp_kv1"));
}

TEST(ContextParallel, SameScenarioSameResult) {
  auto a = evaluate(cp_scenario(2));
  auto b = evaluate(cp_scenario(2));
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->report.step_time_s, b->report.step_time_s);
  EXPECT_EQ(a->report.hbm_peak_bytes, b->report.hbm_peak_bytes);
}

TEST(ContextParallel, ChecksNameTheKey) {
  const auto error = [](const Scenario& s) {
    auto st = check_scenario(s);
    return st ? std::string() : st.error().message;
  };
  Scenario s = cp_scenario(2);
  s.training.seq_len = 8190;  // not 4 equal chunks
  EXPECT_NE(error(s).find("parallelism.cp: 2 needs training.seq_len 8190"), std::string::npos)
      << error(s);
  s = cp_scenario(2);
  s.model.attention = ModelArch::AttentionImpl::kClassic;
  EXPECT_NE(error(s).find("parallelism.cp: 2 needs model.attention flash"), std::string::npos);
  s = cp_scenario(2, CpComm::kA2A);
  s.parallelism.cp = 4;
  s.parallelism.dp = 1;
  s.parallelism.tp = 4;  // 2 kv heads per rank do not split over 4
  EXPECT_NE(error(s).find("parallelism.cp: 4 does not divide the attention heads"),
            std::string::npos)
      << error(s);
  s = cp_scenario(2);
  s.parallelism.cp = 0;
  EXPECT_NE(error(s).find("parallelism.cp"), std::string::npos);
  s = cp_scenario(2);
  s.hardware.gpus = 4;
  EXPECT_NE(error(s).find("dp × tp × pp × cp = 2 × 2 × 1 × 2 = 8 does not equal hardware.gpus 4"),
            std::string::npos)
      << error(s);
  s = cp_scenario(2);
  s.hardware.nodes = 2;
  auto st = check_scenario(s, 8);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("dp × tp × pp × cp = 8 does not equal the 16 GPUs"),
            std::string::npos)
      << st.error().message;
}

}  // namespace
}  // namespace offsim::models
