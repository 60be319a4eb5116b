// DeepSpeed SuperOffload (offload.cpu.superoffload) on ZeRO-3: which groups keep their optimizer
// on the GPU, the bytes its host side moves, and its overlap against ZeRO-Offload's step.
#include <gtest/gtest.h>

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
