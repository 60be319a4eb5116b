// DeepSpeed SuperOffload (offload.cpu.superoffload) on ZeRO-3: which groups keep their optimizer
// on the GPU, the bytes its host side moves, and its overlap against ZeRO-Offload's step; the
// per-tensor gradient checks of DeepSpeed's offload paths and its ZeRO-2 GPU step.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "models/evaluate.h"
#include "models/formulas.h"
#include "models/step_builder.h"

namespace offsim::models {
namespace {

// Llama 3 8B on one GH200, ZeRO-3 with the optimizer on Grace, as DeepSpeedExamples'
// finetune_llama-8b_1gpu.sh runs it (batch 4, activation checkpointing; a shorter sequence).
Scenario llama8b_gh200(bool superoffload, double ratio = 0.8) {
  Scenario s;
  s.name = "superoffload";
  s.model = *find_model("llama3-8b");
  s.hardware.system = "gh200";
  s.training = {.global_batch = 4, .micro_batch = 4, .seq_len = 1024};
  s.parallelism = {.dp = 1, .zero_stage = 3, .overlap_grad_reduce = false};
  s.recompute.mode = RecomputeConfig::Mode::kFull;
  s.offload = *offload_preset("zero_offload", {});
  s.offload.superoffload = {.enabled = superoffload,
                            .ratio = ratio,
                            .cpuadam_cores_perc = 0.9,
                            .sub_group_size = 400'000'000};
  return s;
}

std::int64_t bytes_of(const sim::Plan& plan, const std::string& name_part) {
  std::int64_t bytes = 0;
  for (const sim::Op& op : plan.ops) {
    if (op.name.find(name_part) != std::string::npos) bytes += op.sizes.bytes;
  }
  return bytes;
}

// Whether the tensor called `name` lives on a GPU's HBM.
bool on_hbm(const sim::Plan& plan, const std::string& name) {
  for (const sim::Tensor& t : plan.tensors) {
    if (t.name == name) return plan.pools.at(t.pool.index()).kind == sim::PoolKind::kHbm;
  }
  ADD_FAILURE() << "no tensor " << name;
  return false;
}

TEST(SuperOffload, TheFirstSubGroupsKeepTheirOptimizerOnTheGpu) {
  // 8.03e9 parameters in sub-groups of 4e8: 21 sub-groups; ratio 0.8 keeps int(0.2 x 21) = 4 of
  // them (1.6e9 elements) on the GPU: the embedding (0.53e9) and layers 0-4 (0.22e9 each) start
  // within them, layer 5 starts at 1.62e9.
  auto step = build_step(llama8b_gh200(true));
  ASSERT_TRUE(step) << step.error().message;
  for (const std::string g : {"embed", "l0", "l4"}) {
    EXPECT_TRUE(on_hbm(step->plan, g + ".moments")) << g;
    EXPECT_TRUE(on_hbm(step->plan, g + ".master")) << g;
    EXPECT_TRUE(on_hbm(step->plan, g + ".grads")) << g;
  }
  for (const std::string g : {"l5", "l31", "head"}) {
    EXPECT_FALSE(on_hbm(step->plan, g + ".moments")) << g;
    EXPECT_FALSE(on_hbm(step->plan, g + ".master")) << g;
  }
  // ratio 1 (DeepSpeed's default) keeps nothing on the GPU.
  auto all = build_step(llama8b_gh200(true, 1.0));
  ASSERT_TRUE(all);
  EXPECT_FALSE(on_hbm(all->plan, "embed.moments"));
}

TEST(SuperOffload, MovesFp32GradientsDownAndNarrowedParametersUp) {
  const Scenario s = llama8b_gh200(true);
  auto step = build_step(s);
  ASSERT_TRUE(step) << step.error().message;
  const ModelArch& m = s.model;
  const std::int64_t embed = m.vocab_size * m.hidden;
  const std::int64_t layer = layer_parameter_count_per_rank(m, 1, 0);
  const std::int64_t on_gpu = embed + 5 * layer;
  const std::int64_t host = parameter_count(m) - on_gpu;
  const std::int64_t slack = 64;
  // Cast on the GPU, fp32 over C2C; CPU Adam with the worker's copy into its pinned buffer
  // (8 + 28 bytes); the blocking copy_ narrows on the host (6) and sends bf16 up (2).
  EXPECT_NEAR(bytes_of(step->plan, ".grads_d2h"), 4 * host, slack);
  EXPECT_NEAR(bytes_of(step->plan, "superoffload_adam.worker"), 36 * host, slack);
  EXPECT_NEAR(bytes_of(step->plan, "superoffload_narrow"), 6 * host, slack);
  EXPECT_NEAR(bytes_of(step->plan, ".params_h2d"), 2 * host, slack);
  // The groups kept on the GPU update there.
  EXPECT_GT(bytes_of(step->plan, "embed.adam"), 0);
  EXPECT_EQ(bytes_of(step->plan, "l5.adam"), 0);
  // ZeRO-Offload's flat step is gone.
  EXPECT_EQ(bytes_of(step->plan, "partition.adam"), 0);
}

TEST(SuperOffload, OverlapsTheHostUpdateWithTheBackward) {
  // ZeRO-Offload on ZeRO-3 updates once every gradient has arrived; SuperOffload's worker
  // starts with the first completed group and leaves the last ones to the GPU, so its step is
  // shorter on the same Grace cores.
  auto so = evaluate(llama8b_gh200(true));
  auto zo = evaluate(llama8b_gh200(false));
  ASSERT_TRUE(so) << so.error().message;
  ASSERT_TRUE(zo) << zo.error().message;
  EXPECT_TRUE(so->report.fits);
  EXPECT_LT(so->report.step_time_s, zo->report.step_time_s);
}

// The op called exactly `name`.
const sim::Op* op_named(const sim::Plan& plan, const std::string& name) {
  for (const sim::Op& op : plan.ops) {
    if (op.name == name) return &op;
  }
  ADD_FAILURE() << "no op " << name;
  return nullptr;
}

// How many ops on `lane` wait for the op called `name`, besides the optimizer's gradient norm
// (which waits for every gradient).
int waiters_on_lane(const sim::Plan& plan, const std::string& name, sim::LaneId lane) {
  std::optional<sim::OpId> id;
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    if (plan.ops[i].name == name) id = sim::OpId(static_cast<std::uint32_t>(i));
  }
  if (!id) return 0;
  int n = 0;
  for (const sim::Op& op : plan.ops) {
    if (!(op.lane == lane) || op.name == "grad_norm") continue;
    for (const sim::OpId d : op.deps) n += d == *id ? 1 : 0;
  }
  return n;
}

TEST(SuperOffload, ChecksEachGradientOnTheComputeStreamBeforeItsCopy) {
  // ZeRO-3's reduction path per host tensor: the copy into the contiguous bucket, the
  // concatenation and the in-place pre-divide (3 x (2 + 2)); then partition_grads: the copy into
  // the gradient buffer (2 + 2), the fp64 norm (2 + 8 + 8) and the fp32 cast (2 + 4): 40 bytes per
  // parameter, also of the sub-groups kept on the GPU (their fp32 copy stays in HBM: no D2H).
  // Without overlap_comm the copy runs on the compute stream: the next backward kernel waits for
  // it.
  const Scenario s = llama8b_gh200(true);
  auto step = build_step(s);
  ASSERT_TRUE(step) << step.error().message;
  const ModelArch& m = s.model;
  EXPECT_NEAR(bytes_of(step->plan, ".grad_checks"), 40 * parameter_count(m), 64);
  const sim::Op* embed = op_named(step->plan, "embed.grad_checks");  // kept on the GPU
  ASSERT_TRUE(embed != nullptr);
  EXPECT_EQ(embed->sizes.bytes, 40 * m.vocab_size * m.hidden);
  EXPECT_EQ(bytes_of(step->plan, ".embed.grads_d2h"), 0);
  const sim::Op* checks = op_named(step->plan, "l10.grad_checks");
  const sim::Op* copy = op_named(step->plan, "mb0.l10.grads_d2h");
  ASSERT_TRUE(checks != nullptr && copy != nullptr);
  bool copy_waits = false;
  for (const sim::OpId d : copy->deps) {
    copy_waits = copy_waits || step->plan.ops.at(d.index()).name == "l10.grad_checks";
  }
  EXPECT_TRUE(copy_waits);
  EXPECT_EQ(waiters_on_lane(step->plan, "mb0.l10.grads_d2h", checks->lane), 1);
}

TEST(SuperOffload, ZeroOffloadStage2ChecksEachGradientWithAHostSynchronisation) {
  // ZeRO-Offload's (stage_1_and_2.py) copy_grads_in_partition per tensor: the fp64 norm (2 + 8 +
  // 8), the overflow check (2 + 4, 4 + 1, 4 + 1, 2 + 1, 1 + 4, 4) and the fp32 cast (2 + 4): 52
  // bytes per parameter; each tensor's `if inf_or_nan:` waits for the GPU, so the checks take
  // longer than their bytes: 9 tensors per layer x (10 eager ops x 9.02 us + 26.11 us).
  Scenario s = llama8b_gh200(false);
  s.parallelism.zero_stage = 2;
  auto step = build_step(s);
  ASSERT_TRUE(step) << step.error().message;
  EXPECT_NEAR(bytes_of(step->plan, ".grad_checks"), 52 * parameter_count(s.model), 64);
  const sim::Op* checks = op_named(step->plan, "l10.grad_checks");
  ASSERT_TRUE(checks != nullptr);
  EXPECT_GE(sim::to_seconds(checks->cost.latency), 9 * (10 * 9.02e-6 + 26.11e-6) * 0.999);
}

TEST(SuperOffload, DeepSpeedZero2GpuStepStreamsItsExtraPasses) {
  // Without offload, DeepSpeed's stage-2 step per parameter of the partition adds to AdamW's 28
  // bytes: the fp64 norm (16 beyond the generic read), the flat partition (2 + 2), its fp32
  // widening (2 + 4), unscale (4 + 4), Adam reading the fp32 gradient (+2) and the narrowing
  // reading the fp32 master (4): 40 bytes. Megatron's distributed optimizer (stage 1) adds none.
  Scenario s = llama8b_gh200(false);
  s.offload = {};
  s.hardware.system = "dgx-h100";
  s.hardware.gpus = 2;
  s.parallelism.dp = 2;
  s.parallelism.zero_stage = 2;
  s.training.global_batch = 8;
  auto zero2 = build_step(s);
  ASSERT_TRUE(zero2) << zero2.error().message;
  const std::int64_t shard = (layer_parameter_count_per_rank(s.model, 1, 10) + 1) / 2;
  EXPECT_NEAR(bytes_of(zero2->plan, "l10.adam"), (28 + 40) * shard, 68);
  s.parallelism.zero_stage = 1;
  auto zero1 = build_step(s);
  ASSERT_TRUE(zero1) << zero1.error().message;
  EXPECT_NEAR(bytes_of(zero1->plan, "l10.adam"), 28 * shard, 28);
}

TEST(SuperOffload, NeedsZeroStage3AndTheOptimizerOnTheCpu) {
  Scenario s = llama8b_gh200(true);
  s.parallelism.zero_stage = 2;
  const sim::Status st = check_scenario(s);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("offload.cpu.superoffload"), std::string::npos);
  Scenario gpu = llama8b_gh200(true);
  gpu.offload = OffloadPolicy{};
  gpu.offload.superoffload.enabled = true;
  EXPECT_FALSE(check_scenario(gpu));
  Scenario ratio = llama8b_gh200(true, 1.5);
  EXPECT_FALSE(check_scenario(ratio));
}

}  // namespace
}  // namespace offsim::models
