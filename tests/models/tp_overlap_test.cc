// Tensor-parallel communication overlap: Megatron-Core's asynchronous input-gradient reduction
// (parallelism.tp_async_grad_reduce) and Transformer Engine's tp_comm_overlap (ring-exchange
// all-gather and pipelined reduce-scatter around the GEMMs).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "models/evaluate.h"
#include "models/plan_size.h"
#include "models/step_builder.h"

namespace offsim::models {
namespace {

// Llama-3-8B (4 layers) on one DGX H100: TP4 with sequence parallelism, DP2.
Scenario tp_scenario(bool async, bool overlap) {
  Scenario s;
  s.name = "tp";
  s.model = *find_model("llama3-8b");
  s.model.layers = 4;
  s.hardware.system = "dgx-h100";
  s.training = {.global_batch = 4, .micro_batch = 1, .seq_len = 4096};
  s.parallelism = {.dp = 2, .tp = 4, .sequence_parallel = true, .zero_stage = 1};
  s.parallelism.tp_async_grad_reduce = async;
  s.parallelism.tp_comm_overlap = overlap;
  return s;
}

struct Found {
  const sim::Op* op = nullptr;
  sim::Span span;
};
// The op named `name` and its span (spans are in completion order; each names its op).
Found find(const sim::Plan& plan, const sim::Timeline& t, const std::string& name) {
  for (const sim::Span& sp : t.spans) {
    const sim::Op& op = plan.ops[sp.op.index()];
    if (op.name == name) return {&op, sp};
  }
  ADD_FAILURE() << "no op " << name;
  return {};
}

struct Simulated {
  BuiltStep step;
  Evaluation eval;
};
Simulated run(const Scenario& s) {
  auto step = build_step(s);
  EXPECT_TRUE(step) << step.error().message;
  EvalOptions options;
  options.keep_timeline = true;
  auto e = evaluate(s, options);
  EXPECT_TRUE(e) << e.error().message;
  return {std::move(*step), std::move(*e)};
}

TEST(TpOverlap, AsyncGradReduceOverlapsTheWgradGemm) {
  const Simulated r = run(tp_scenario(true, false));
  const sim::Timeline& t = *r.eval.timeline;
  const Found dgrad = find(r.step.plan, t, "mb0.l1.mlpwi.dgrad");
  const Found reduce = find(r.step.plan, t, "mb0.l1.mlpwi.bwd.tp_reduce");
  const Found wgrad = find(r.step.plan, t, "mb0.l1.mlpwi.wgrad");
  const Found next = find(r.step.plan, t, "mb0.l1.res1_ln2.bwd");
  ASSERT_NE(reduce.op, nullptr);
  EXPECT_NE(reduce.op->lane, dgrad.op->lane);  // on the TP lane
  EXPECT_EQ(reduce.op->sizes.collective.kind, sim::CollectiveKind::kReduceScatter);
  // Both start when the dgrad GEMM ends; the next kernel waits for both.
  EXPECT_EQ(reduce.span.start, dgrad.span.end);
  EXPECT_EQ(wgrad.span.start, dgrad.span.end);
  EXPECT_GE(next.span.start, reduce.span.end);
  EXPECT_GE(next.span.start, wgrad.span.end);
}

TEST(TpOverlap, WithoutAsyncTheReductionFollowsTheWgradOnTheComputeStream) {
  const Simulated r = run(tp_scenario(false, false));
  const sim::Timeline& t = *r.eval.timeline;
  const Found wgrad = find(r.step.plan, t, "mb0.l1.mlpwi.wgrad");
  const Found reduce = find(r.step.plan, t, "mb0.l1.mlpwi.bwd.tp_reduce");
  EXPECT_EQ(reduce.op->lane, wgrad.op->lane);
  EXPECT_EQ(reduce.span.start, wgrad.span.end);
  // Overlapping can only shorten the step.
  const Simulated async = run(tp_scenario(true, false));
  EXPECT_LT(async.eval.report.step_time_s, r.eval.report.step_time_s);
}

TEST(TpOverlap, CommOverlapSplitsGemmsIntoTpChunksWithTheSameWork) {
  const Simulated plain = run(tp_scenario(true, false));
  const Simulated over = run(tp_scenario(true, true));
  const sim::Timeline& t = *over.eval.timeline;
  // qkv: the rank's own chunk and 3 chunks from the ring (3 transfers of 1/4 of the gathered
  // 4096 × 4096 bf16 input each).
  double chunk_flops = 0;
  for (int i = 0; i < 4; ++i) {
    const Found g = find(over.step.plan, t, "mb0.l1.qkv.fwd.c" + std::to_string(i));
    ASSERT_NE(g.op, nullptr);
    EXPECT_EQ(g.op->sizes.gemm.m, 1024);
    chunk_flops += g.op->sizes.flops;
    if (i > 0) {
      const Found x = find(over.step.plan, t, "mb0.l1.qkv.tp_allgather" + std::to_string(i));
      EXPECT_EQ(x.op->kind, sim::OpKind::kP2P);
      EXPECT_EQ(x.op->sizes.bytes, 4096 * 4096 * 2 / 4);
      EXPECT_GE(g.span.start, x.span.end);  // each chunk waits for its rows
    }
  }
  const Found whole = find(plain.step.plan, *plain.eval.timeline, "mb0.l1.qkv.fwd");
  EXPECT_DOUBLE_EQ(chunk_flops, whole.op->sizes.flops);
  // The first chunk starts with the first transfer: the all-gather no longer precedes the GEMM.
  const Found c0 = find(over.step.plan, t, "mb0.l1.qkv.fwd.c0");
  const Found x1 = find(over.step.plan, t, "mb0.l1.qkv.tp_allgather1");
  EXPECT_EQ(c0.span.start, x1.span.start);
  // Reduce-scatter after out_proj: pipelined, the next kernel waits for the last chunk's.
  const Found rs3 = find(over.step.plan, t, "mb0.l1.out_proj.tp_reduce3");
  const Found res1 = find(over.step.plan, t, "mb0.l1.res1_ln2.fwd");
  EXPECT_GE(res1.span.start, rs3.span.end);
}

TEST(TpOverlap, PlanSizeEstimateCountsTheChunks) {
  for (bool async : {false, true}) {
    for (bool overlap : {false, true}) {
      for (sim::DType dtype : {sim::DType::kBf16, sim::DType::kFp8}) {
        Scenario s = tp_scenario(async, overlap);
        s.training.compute_dtype = dtype;
        auto step = build_step(s);
        ASSERT_TRUE(step) << step.error().message;
        const PlanSize est = estimate_plan_size(s);
        // Host issue markers depend on the kernels' times; the estimate leaves them out.
        const auto markers =
            std::count_if(step->plan.ops.begin(), step->plan.ops.end(), host_issue_marker);
        EXPECT_DOUBLE_EQ(est.ops,
                         static_cast<double>(step->plan.ops.size()) - static_cast<double>(markers))
            << async << overlap << sim::to_string(dtype);
        EXPECT_DOUBLE_EQ(est.tensors, static_cast<double>(step->plan.tensors.size()));
      }
    }
  }
}

}  // namespace
}  // namespace offsim::models
