// DeepSpeed ZenFlow (offload.cpu.zenflow) on the flat-partition ZeRO-Offload step: the ops it
// adds and their bytes, and the mean step over one update interval against ZeRO-Offload.
#include <gtest/gtest.h>

#include <string>

#include "models/evaluate.h"
#include "models/formulas.h"
#include "models/step_builder.h"

namespace offsim::models {
namespace {

// The core-binding blog's Qwen2.5-3B run (scenarios/validation/10_deepspeed_zenflow): two A100s,
// ZeRO-2, the optimizer on the host.
Scenario qwen3b(bool zenflow, int interval = 4, bool overlap = true) {
  Scenario s;
  s.name = "zenflow";
  s.model = *find_model("qwen2.5-3b");
  s.hardware.system = "dgx-a100-40gb";
  s.hardware.gpus = 2;
  s.training = {.global_batch = 8, .micro_batch = 4, .seq_len = 1024};
  s.parallelism = {.dp = 2, .zero_stage = 2, .overlap_grad_reduce = false};
  s.offload = *offload_preset("zero_offload", {});
  s.offload.cpu_bind_cores = true;
  s.offload.zenflow = {.enabled = zenflow,
                       .topk_ratio = 0.1,
                       .update_interval = interval,
                       .overlap_step = overlap,
                       .reserved_cores = 0.5};
  return s;
}

double step_s(const Scenario& s) {
  auto e = evaluate(s);
  EXPECT_TRUE(e) << e.error().message;
  return e ? e->report.step_time_s : 0.0;
}

std::int64_t bytes_of(const sim::Plan& plan, const std::string& name_part) {
  std::int64_t bytes = 0;
  for (const sim::Op& op : plan.ops) {
    if (op.name.find(name_part) != std::string::npos) bytes += op.sizes.bytes;
  }
  return bytes;
}

TEST(ZenFlow, ChargesOnceAnIntervalWorkAsItsMeanShare) {
  const Scenario s = qwen3b(true);
  auto step = build_step(s);
  ASSERT_TRUE(step) << step.error().message;
  const std::int64_t psi = parameter_count(s.model);
  const std::int64_t shard = psi / 2;
  const std::int64_t slack = 64 * (s.model.layers + 2);
  // The worker's CPU Adam (28 bytes per parameter of the shard) and the training process's clip
  // and narrowing (8 + 6) once in four steps.
  EXPECT_NEAR(bytes_of(step->plan, "zenflow_adam.worker"), 28 * shard / 4, slack);
  EXPECT_NEAR(bytes_of(step->plan, "zenflow_clip_narrow"), 14 * shard / 4, slack);
  // The bf16 partition goes up once an interval; the ZeRO-2 all-gather too.
  EXPECT_NEAR(bytes_of(step->plan, "partition.zenflow.params_h2d"), 2 * shard / 4, slack);
  // Gradients: bf16 down every step plus the fp32 widening once in four; the running sum up on
  // three steps in four.
  EXPECT_NEAR(bytes_of(step->plan, ".grads_d2h"), 2 * shard + 4 * shard / 4, slack);
  EXPECT_NEAR(bytes_of(step->plan, "grad_accum_h2d"), 2 * shard * 3 / 4, slack);
  // The top-k columns of the whole model: all-gathered in bf16 and updated on the GPU.
  EXPECT_NEAR(bytes_of(step->plan, "zenflow.selected_grads_allgather"), 2 * psi / 10, 8);
  EXPECT_GT(bytes_of(step->plan, "zenflow.topk_adam"), 0);
  // Plain ZeRO-Offload has none of these.
  auto plain = build_step(qwen3b(false));
  ASSERT_TRUE(plain);
  EXPECT_EQ(bytes_of(plain->plan, "zenflow"), 0);
}

std::int64_t tensor_bytes(const sim::Plan& plan, const std::string& name) {
  std::int64_t bytes = 0;
  for (const sim::Tensor& t : plan.tensors) {
    if (t.name == name) bytes += t.bytes;
  }
  return bytes;
}

TEST(ZenFlow, HoldsTheSelectedColumnsStateOnTheGpu) {
  const Scenario s = qwen3b(true);
  auto step = build_step(s);
  ASSERT_TRUE(step) << step.error().message;
  // Two bf16 moments per selected element stay on the GPU; each step the selected gradients and
  // a copy of the selected parameters (bf16 each) live from the all-gather to the update. The
  // allocator rounds each block up by at most its granularity.
  const auto selected = static_cast<double>(parameter_count(s.model)) / 10;
  const double slack = 4 << 20;
  EXPECT_NEAR(static_cast<double>(tensor_bytes(step->plan, "zenflow.selected_moments")),
              4 * selected, slack);
  EXPECT_NEAR(static_cast<double>(tensor_bytes(step->plan, "zenflow.selected_grads_and_params")),
              4 * selected, slack);
  // So ZenFlow's HBM peak is above that of the same run without it.
  auto with = evaluate(s);
  auto without = evaluate(qwen3b(false));
  ASSERT_TRUE(with && without);
  EXPECT_GE(with->report.hbm_peak_bytes, without->report.hbm_peak_bytes + 4 * selected - slack);
}

TEST(ZenFlow, OverlappedIntervalBeatsZeroOffloadAndTheLimitsBehave) {
  const double zero_offload = step_s(qwen3b(false));
  const double zenflow = step_s(qwen3b(true));
  // The blog's sign and size: 1,116 ms against 2,497 ms, 2.24x faster.
  EXPECT_LT(zenflow, zero_offload / 1.5);
  // Overlap never hurts, and a longer interval is never slower.
  EXPECT_LE(zenflow, step_s(qwen3b(true, 4, false)));
  EXPECT_LE(step_s(qwen3b(true, 8)), zenflow);
  // An interval of one without overlap is ZeRO-Offload plus the GPU's top-k work: not faster.
  EXPECT_GE(step_s(qwen3b(true, 1, false)), zero_offload * 0.999);
  // Deterministic.
  EXPECT_EQ(step_s(qwen3b(true)), zenflow);
}

TEST(ZenFlow, SteadyStatePathAgreesWithTheFullStep) {
  // Eight micro-batches: the worker's share runs beside all of them; the fast path either proves
  // the step periodic or falls back, and its report is the full simulation's.
  Scenario s = qwen3b(true);
  s.training.global_batch = 16;
  s.training.micro_batch = 1;
  auto fast = evaluate(s);
  ASSERT_TRUE(fast) << fast.error().message;
  auto full = evaluate(s, {.steady_state = false});
  ASSERT_TRUE(full) << full.error().message;
  EXPECT_EQ(fast->report.step_time_s, full->report.step_time_s);
}

}  // namespace
}  // namespace offsim::models
