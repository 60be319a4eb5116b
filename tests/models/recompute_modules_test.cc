// Selective recompute by module, as Megatron-Core's recompute_modules names them: what each
// module stops keeping (bytes by hand), which forward ops the backward then re-runs, MLA's
// up-projection recompute (its FLOPs by hand for DeepSeek-V3), the ops the step builder emits for
// them and the plan-size estimate of those plans.
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "models/formulas.h"
#include "models/plan_size.h"
#include "models/scenario.h"
#include "models/step_builder.h"
#include "tests/common/moe_scenarios.h"

namespace offsim::models {
namespace {

using Mode = RecomputeConfig::Mode;
using M = RecomputeModule;

RecomputeModules modules(std::initializer_list<RecomputeModule> list) {
  RecomputeModules out;
  out.bits = 0;
  for (RecomputeModule m : list) out.add(m);
  return out;
}

ModelArch catalogue(const char* name) {
  auto m = find_model(name);
  EXPECT_TRUE(m.has_value()) << name;
  return m ? *m : ModelArch{};
}

// Llama 3 70B layer, t = 1, b = 1, s = 4096 (flash, no dropout).
LayerDims dense_dims() {
  const ModelArch m = catalogue("llama3-70b");
  const TrainingConfig t{.global_batch = 8, .micro_batch = 1, .seq_len = 4096};
  return layer_dims(m, t, ParallelConfig{});
}

int op(FwdOp o) { return static_cast<int>(o); }

TEST(RecomputeModules, LayernormDropsBothNormOutputs) {
  const LayerDims d = dense_dims();
  const LayerActivations none = layer_activations(d, Mode::kNone, {});
  const LayerActivations ln = layer_activations(d, Mode::kSelective, modules({M::kLayernorm}), {});
  const std::int64_t s = 4096, h = 8192;
  EXPECT_EQ(none.saved_bytes(d) - ln.saved_bytes(d), 2 * (2 * s * h));
  for (int o = 0; o < kNumFwdOps; ++o) {
    EXPECT_EQ(ln.recompute[o], o == op(FwdOp::kLn1) || o == op(FwdOp::kLn2)) << o;
  }
}

TEST(RecomputeModules, DenseMlpIsCheckpointedFromItsInput) {
  const LayerDims d = dense_dims();
  const LayerActivations none = layer_activations(d, Mode::kNone, {});
  const LayerActivations mlp = layer_activations(d, Mode::kSelective, modules({M::kMlp}), {});
  const std::int64_t s = 4096, f = 28672;
  // The gate and up outputs (2 · 2sf) and the activation output (2sf).
  EXPECT_EQ(none.saved_bytes(d) - mlp.saved_bytes(d), 2 * 2 * s * f + 2 * s * f);
  for (int o = 0; o < kNumFwdOps; ++o) {
    EXPECT_EQ(mlp.recompute[o], o == op(FwdOp::kMlpWi) || o == op(FwdOp::kAct)) << o;
  }
  // moe and moe_act leave a dense layer alone; an empty list recomputes nothing.
  EXPECT_EQ(
      layer_activations(d, Mode::kSelective, modules({M::kMoe, M::kMoeAct}), {}).saved_bytes(d),
      none.saved_bytes(d));
  EXPECT_EQ(layer_activations(d, Mode::kSelective, modules({}), {}).saved_bytes(d),
            none.saved_bytes(d));
  // The default is Megatron's ["core_attn"].
  EXPECT_EQ(layer_activations(d, Mode::kSelective, {}).saved_bytes(d),
            layer_activations(d, Mode::kSelective, modules({M::kCoreAttn}), {}).saved_bytes(d));
}

Scenario small_moe() { return fixtures::small_moe_scenario(); }

// DeepSeek-V3 cut to 3 layers (one dense, two MoE with one shared expert) on the small MoE
// fixture's 8 H100s, TP 2 with sequence parallelism, EP 2.
Scenario small_deepseek() {
  Scenario s = small_moe();
  s.model = catalogue("deepseek-v3");
  s.model.layers = 3;
  s.model.mtp_layers = 0;
  s.model.moe.first_k_dense = 1;
  s.parallelism.ep = 2;
  return s;
}

// small_deepseek() with selective recompute of `list`, checked.
Scenario selective_deepseek(std::initializer_list<RecomputeModule> list) {
  Scenario s = small_deepseek();
  s.recompute.mode = Mode::kSelective;
  s.recompute.modules = modules(list);
  EXPECT_TRUE(check_scenario(s).has_value());
  return s;
}

TEST(RecomputeModules, MoeActAndMoeOnAnMoeLayer) {
  const Scenario s = small_moe();
  const LayerDims d = layer_dims(s.model, s.training, s.parallelism, 0);
  ASSERT_TRUE(d.moe);
  const LayerActivations none = layer_activations(d, Mode::kNone, {});
  // moe_act: the experts' activation output, routed rows × expert FFN in bf16.
  const LayerActivations act = layer_activations(d, Mode::kSelective, modules({M::kMoeAct}), {});
  EXPECT_EQ(none.saved_bytes(d) - act.saved_bytes(d), d.routed * d.fe * 2);
  EXPECT_TRUE(moe_activation_only(act));
  // moe: everything the MoE FFN keeps of its own (FC1 outputs, activation, dispatched tokens,
  // router probabilities); its input (the norm's output) stays.
  const LayerActivations moe = layer_activations(d, Mode::kSelective, modules({M::kMoe}), {});
  const std::int64_t fc1 = d.routed * d.fe * 2 * 2;
  const std::int64_t dispatched = d.routed * d.h * 2 + d.moe_tokens * d.experts * 4;
  EXPECT_EQ(none.saved_bytes(d) - moe.saved_bytes(d), fc1 + d.routed * d.fe * 2 + dispatched);
  EXPECT_TRUE(moe.recompute[op(FwdOp::kMlpWi)]);
  EXPECT_FALSE(moe_activation_only(moe));
  EXPECT_TRUE(moe.saved[static_cast<int>(Act::kLn2Out)]);
}

TEST(RecomputeModules, MlaUpProjectionKeepsTheLatents) {
  const ModelArch m = catalogue("deepseek-v3");
  const TrainingConfig t{.global_batch = 8, .micro_batch = 1, .seq_len = 4096};
  const LayerDims d = layer_dims(m, t, ParallelConfig{});
  const std::int64_t tok = 4096;
  // q_lora 1536 -> 128 heads x 192; kv_lora 512 -> 128 heads x (128 + 128).
  const double up_weights = 1536.0 * 128 * 192 + 512.0 * 128 * 256;
  const LayerActivations none = layer_activations(d, Mode::kNone, {});
  const LayerActivations up = layer_activations(d, Mode::kSelective, modules({M::kMlaUpProj}), {});
  EXPECT_TRUE(up.mla_up_proj);
  // Latents kept: q 1536 + kv 512 + rotary key 64 per token, bf16.
  EXPECT_EQ(up.latent_bytes, tok * (1536 + 512 + 64) * 2);
  const std::int64_t qkv = act_bytes(d, Act::kQ) + act_bytes(d, Act::kK) + act_bytes(d, Act::kV);
  EXPECT_EQ(none.saved_bytes(d) - up.saved_bytes(d), qkv - up.latent_bytes);
  for (int o = 0; o < kNumFwdOps; ++o) EXPECT_EQ(up.recompute[o], o == op(FwdOp::kQkv)) << o;
  const double flops = recompute_op_flops(d, up, FwdOp::kQkv);
  EXPECT_NEAR(flops / (2.0 * tok * up_weights), 1.0, 1e-3);
  // Under 80% of the whole projection's (the down projections are not re-run).
  EXPECT_LT(flops, 0.8 * fwd_op_flops(d, FwdOp::kQkv, false));
  // Without mla_up_proj the projection re-runs whole.
  const LayerActivations full = layer_activations(d, Mode::kFull, {});
  EXPECT_EQ(recompute_op_flops(d, full, FwdOp::kQkv), fwd_op_flops(d, FwdOp::kQkv, false));
}

// The plan-size estimate counts the recompute's ops exactly: its change from the scenario
// without recompute equals the plan's.
void expect_estimate_counts_the_recompute(const Scenario& s) {
  Scenario none = s;
  none.recompute = RecomputeConfig{};
  auto with = build_step(s);
  auto without = build_step(none);
  ASSERT_TRUE(with.has_value() && without.has_value());
  const double plan_more =
      static_cast<double>(with->plan.ops.size()) - static_cast<double>(without->plan.ops.size());
  EXPECT_GT(plan_more, 0.0);
  EXPECT_EQ(estimate_plan_size(s, {}).ops - estimate_plan_size(none, {}).ops, plan_more);
}

bool has_op(const sim::Plan& plan, const std::string& name) {
  for (const sim::Op& o : plan.ops) {
    if (o.name == name) return true;
  }
  return false;
}

TEST(RecomputeModules, StepReRunsOnlyTheChosenModules) {
  Scenario s = small_moe();
  s.recompute.mode = Mode::kSelective;
  s.recompute.modules = modules({M::kLayernorm, M::kMoeAct});
  ASSERT_TRUE(check_scenario(s).has_value());
  auto step = build_step(s);
  ASSERT_TRUE(step.has_value()) << step.error().message;
  EXPECT_TRUE(has_op(step->plan, "mb0.l0.ln1.recompute"));
  EXPECT_TRUE(has_op(step->plan, "mb0.l0.experts.act.recompute"));
  EXPECT_FALSE(has_op(step->plan, "mb0.l0.moe.dispatch.alltoall.recompute"));
  EXPECT_FALSE(has_op(step->plan, "mb0.l0.attn.recompute"));
  expect_estimate_counts_the_recompute(s);

  // The whole MoE FFN with module moe.
  s.recompute.modules = modules({M::kMoe});
  step = build_step(s);
  ASSERT_TRUE(step.has_value()) << step.error().message;
  EXPECT_TRUE(has_op(step->plan, "mb0.l0.moe.dispatch.alltoall.recompute"));
  EXPECT_FALSE(has_op(step->plan, "mb0.l0.ln1.recompute"));
  // The whole MoE FFN's recompute is estimated as full recompute's is (within 5%).
  EXPECT_NEAR(estimate_plan_size(s, {}).ops / static_cast<double>(step->plan.ops.size()), 1.0,
              0.05);
}

TEST(RecomputeModules, MlaUpProjectionStep) {
  Scenario s = selective_deepseek({M::kMlaUpProj});
  auto step = build_step(s);
  ASSERT_TRUE(step.has_value()) << step.error().message;
  EXPECT_TRUE(has_op(step->plan, "mb0.l1.mla_up_proj.recompute"));
  EXPECT_FALSE(has_op(step->plan, "mb0.l1.qkv.recompute"));
  EXPECT_FALSE(has_op(step->plan, "mb0.l1.qkv.tp_allgather.recompute"));
  expect_estimate_counts_the_recompute(s);
  // Refused on a model without MLA, as Megatron-Core refuses it.
  Scenario gqa = small_moe();
  gqa.recompute = s.recompute;
  auto st = check_scenario(gqa);
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("recompute.modules: mla_up_proj"), std::string::npos);
}

TEST(RecomputeModules, SharedExpertsDropTheirFc1AndActivation) {
  const Scenario s = small_deepseek();
  const LayerDims d = layer_dims(s.model, s.training, s.parallelism, 1);
  ASSERT_TRUE(d.moe);
  ASSERT_GT(d.fs, 0);
  // One shared expert of FFN 2048 over TP 2: 1024 columns per rank; 4096 tokens, bf16.
  EXPECT_EQ(d.fs, 1024);
  const std::int64_t tok = 4096;
  const LayerActivations none = layer_activations(d, Mode::kNone, {});
  const LayerActivations se =
      layer_activations(d, Mode::kSelective, modules({M::kSharedExperts}), {});
  EXPECT_TRUE(se.shared_experts);
  // Gate and up outputs (2 · 2 bytes) and the activation output (2 bytes) per token and column.
  EXPECT_EQ(se.shared_bytes, tok * 1024 * (2 * 2 + 2));
  EXPECT_EQ(none.saved_bytes(d) - se.saved_bytes(d), se.shared_bytes);
  EXPECT_EQ(se.recomputed_bytes(d), se.shared_bytes);
  for (int o = 0; o < kNumFwdOps; ++o) EXPECT_FALSE(se.recompute[o]) << o;
  // With moe_act the activation output is dropped already: the shared experts add their FC1.
  const LayerActivations both =
      layer_activations(d, Mode::kSelective, modules({M::kMoeAct, M::kSharedExperts}), {});
  EXPECT_EQ(both.shared_bytes, tok * 1024 * 2 * 2);
  EXPECT_EQ(none.saved_bytes(d) - both.saved_bytes(d),
            act_bytes(d, Act::kActOut) + tok * 1024 * 2 * 2);
  // With moe the whole MoE FFN re-runs, the shared experts with it.
  const LayerActivations moe =
      layer_activations(d, Mode::kSelective, modules({M::kMoe, M::kSharedExperts}), {});
  EXPECT_FALSE(moe.shared_experts);
  EXPECT_EQ(moe.saved_bytes(d),
            layer_activations(d, Mode::kSelective, modules({M::kMoe}), {}).saved_bytes(d));
  // A dense layer and a model without shared experts are left alone.
  const LayerDims dense = layer_dims(s.model, s.training, s.parallelism, 0);
  EXPECT_FALSE(
      layer_activations(dense, Mode::kSelective, modules({M::kSharedExperts}), {}).shared_experts);
  const Scenario q = small_moe();
  const LayerDims qd = layer_dims(q.model, q.training, q.parallelism, 0);
  EXPECT_FALSE(
      layer_activations(qd, Mode::kSelective, modules({M::kSharedExperts}), {}).shared_experts);
}

TEST(RecomputeModules, SharedExpertsStep) {
  Scenario s = selective_deepseek({M::kSharedExperts});
  auto step = build_step(s);
  ASSERT_TRUE(step.has_value()) << step.error().message;
  // The shared experts' forward re-runs with its tensor-parallel collectives; nothing else.
  for (const char* name :
       {"shared.tp_allgather", "shared.mlpwi", "shared.act", "shared.mlpwo", "shared.tp_reduce"}) {
    EXPECT_TRUE(has_op(step->plan, std::string("mb0.l1.") + name + ".recompute")) << name;
  }
  EXPECT_FALSE(has_op(step->plan, "mb0.l1.experts.act.recompute"));
  EXPECT_FALSE(has_op(step->plan, "mb0.l1.moe.dispatch.alltoall.recompute"));
  EXPECT_FALSE(has_op(step->plan, "mb0.l0.shared.mlpwi.recompute"));
  expect_estimate_counts_the_recompute(s);
  // With moe_act: the experts' activation and the shared experts, the shared activation once.
  s.recompute.modules = modules({M::kMoeAct, M::kSharedExperts});
  step = build_step(s);
  ASSERT_TRUE(step.has_value()) << step.error().message;
  int shared_act = 0;
  for (const sim::Op& o : step->plan.ops) shared_act += o.name == "mb0.l1.shared.act.recompute";
  EXPECT_EQ(shared_act, 1);
  EXPECT_TRUE(has_op(step->plan, "mb0.l1.experts.act.recompute"));
  expect_estimate_counts_the_recompute(s);
  // Refused with the overlapped shared experts, as Megatron-Core refuses it.
  s.parallelism.moe_shared_expert_overlap = true;
  auto st = check_scenario(s);
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("recompute.modules: shared_experts"), std::string::npos);
}

// Full recompute as a reentrant checkpoint runs it (Megatron-Core, DeepSpeed): the whole layer,
// the MLP output projection and its tensor-parallel reduction included; as JAX remat and
// PyTorch's non-reentrant checkpoint run it, only what the backward needs.
TEST(RecomputeRerun, WholeLayerReRunsTheLastGemmAndItsReduction) {
  const LayerDims d = dense_dims();
  const LayerActivations needed = layer_activations(d, Mode::kFull, {});
  EXPECT_FALSE(needed.recompute[op(FwdOp::kMlpWo)]);
  EXPECT_FALSE(needed.whole_layer);
  const LayerActivations whole =
      layer_activations(d, Mode::kFull, modules({}), {}, RecomputeConfig::Rerun::kLayer);
  for (int o = 0; o < kNumFwdOps; ++o) EXPECT_TRUE(whole.recompute[o]) << o;
  EXPECT_TRUE(whole.whole_layer);
  EXPECT_EQ(whole.saved_bytes(d), needed.saved_bytes(d));
  // Selective recompute is not changed by it.
  EXPECT_FALSE(layer_activations(d, Mode::kSelective, modules({M::kCoreAttn}), {},
                                 RecomputeConfig::Rerun::kLayer)
                   .whole_layer);

  Scenario s;
  s.name = "dense";
  s.model = catalogue("llama3-8b");
  s.model.layers = 2;
  s.hardware.system = "dgx-h100";
  s.training = {.global_batch = 8, .micro_batch = 1, .seq_len = 4096};
  s.parallelism = {.dp = 4, .tp = 2, .pp = 1, .sequence_parallel = true, .zero_stage = 1};
  s.recompute.mode = Mode::kFull;
  auto step = build_step(s);
  ASSERT_TRUE(step.has_value()) << step.error().message;
  EXPECT_FALSE(has_op(step->plan, "mb0.l0.mlpwo.recompute"));
  expect_estimate_counts_the_recompute(s);
  s.recompute.rerun = RecomputeConfig::Rerun::kLayer;
  step = build_step(s);
  ASSERT_TRUE(step.has_value()) << step.error().message;
  EXPECT_TRUE(has_op(step->plan, "mb0.l0.mlpwo.recompute"));
  EXPECT_TRUE(has_op(step->plan, "mb0.l0.mlpwo.tp_reduce.recompute"));
  EXPECT_TRUE(has_op(step->plan, "mb0.l0.res2.recompute"));
  expect_estimate_counts_the_recompute(s);
}

}  // namespace
}  // namespace offsim::models
