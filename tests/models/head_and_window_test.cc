// The chunked cross entropy (training.loss_chunks) and the offload back-pressure window: exact
// bytes and FLOPs for the head, and bounded activation memory behind a slow host link.
#include <gtest/gtest.h>

#include <algorithm>

#include "models/evaluate.h"
#include "models/step_builder.h"

namespace offsim::models {
namespace {

Scenario gemma_on_a100(std::int64_t micro_batch, std::int64_t loss_chunks) {
  Scenario s;
  s.name = "head";
  s.model = *find_model("gemma-2b");
  s.hardware.system = "a100-80gb-1gpu";
  s.training = {.global_batch = 2 * micro_batch, .micro_batch = micro_batch, .seq_len = 2048};
  s.training.loss_chunks = loss_chunks;
  return s;
}

Report run(const Scenario& s) {
  auto e = evaluate(s, {});
  EXPECT_TRUE(e) << (e ? "" : e.error().message);
  return e ? e->report : Report{};
}

// Largest single tensor named "<prefix>..." in the plan.
std::int64_t largest_tensor(const sim::Plan& plan, const std::string& prefix) {
  std::int64_t bytes = 0;
  for (const sim::Tensor& t : plan.tensors) {
    if (t.name.rfind(prefix, 0) == 0) bytes = std::max(bytes, t.bytes);
  }
  return bytes;
}

double op_flops(const sim::Plan& plan) {
  double total = 0.0;
  for (const sim::Op& op : plan.ops) total += op.sizes.flops;
  return total;
}

TEST(LossChunks, OnlyOneChunkOfLogitsIsLive) {
  // Gemma 2B: vocabulary 256000, hidden 2048. A micro-batch of 2 × 2048 = 4096 tokens.
  // Unchunked, the head keeps 2 residuals (2·4096·2048·2 bytes) plus the fp32 logits
  // (4096·256000·4 bytes = 4,194,304,000). With 8 chunks it keeps 3 residuals and each chunk's
  // logits are 512·256000·4 = 524,288,000 bytes.
  const std::int64_t residual = 4096 * 2048 * 2;
  auto whole = build_step(gemma_on_a100(2, 1), {});
  auto chunked = build_step(gemma_on_a100(2, 8), {});
  ASSERT_TRUE(whole && chunked);
  EXPECT_EQ(largest_tensor(whole->plan, "mb0.head.act"), 2 * residual + 4096LL * 256000 * 4);
  EXPECT_EQ(largest_tensor(chunked->plan, "mb0.head.act"), 3 * residual);
  EXPECT_EQ(largest_tensor(chunked->plan, "mb0.head.chunk"), 512LL * 256000 * 4);
  // The same GEMMs, split by tokens, and the same loss passes: the FLOPs differ only by the
  // backward's scaling pass over tokens × hidden (one FLOP per element, per micro-batch).
  EXPECT_NEAR(op_flops(chunked->plan) - op_flops(whole->plan), 2.0 * 4096 * 2048,
              1e-9 * op_flops(whole->plan));
}

TEST(LossChunks, LowersThePeakByTheLogits) {
  const Report whole = run(gemma_on_a100(4, 1));
  const Report chunked = run(gemma_on_a100(4, 8));
  ASSERT_TRUE(whole.fits && chunked.fits);
  // 8192 tokens: logits 8192·256000·4 = 8.39 GB unchunked, one eighth of that chunked, plus a
  // third residual saved (8192·2048·2 = 33.6 MB).
  const std::int64_t logits = 8192LL * 256000 * 4;
  EXPECT_LE(chunked.hbm_peak_bytes, whole.hbm_peak_bytes - logits + logits / 8 + 8192 * 2048 * 2);
  // Same FLOPs; the chunks' GEMMs have an eighth of the rows, so they run a little less
  // efficiently on the GEMM surface (wave quantisation): a few percent, not more.
  EXPECT_NEAR(chunked.step_time_s, whole.step_time_s, 0.08 * whole.step_time_s);
}

TEST(LossChunks, InvalidCountsAreRefused) {
  Scenario s = gemma_on_a100(1, 0);
  EXPECT_FALSE(build_step(s, {}));
  s.training.loss_chunks = 2049;  // more chunks than the micro-batch's 2048 tokens
  auto r = build_step(s, {});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("training.loss_chunks"), std::string::npos);
}

TEST(OffloadWindow, SlowLinkBoundsActivationsOnHbm) {
  // Gemma 2B on one A100 (PCIe Gen4): a layer's saved activations take several times longer to
  // copy to the host than its forward takes to compute. The forward waits for the copies of
  // the layer two back, so at most a few layers' activations are on HBM at once, whatever the
  // micro-batch; the price is exposed offload time.
  Scenario s = gemma_on_a100(16, 8);
  ASSERT_FALSE(run(s).fits);        // micro-batch 16 does not fit on 80 GB without offload
  s.hardware.system = "h200-1gpu";  // 141 GB: the same activations, all kept on HBM
  const Report keep = run(s);
  s.hardware.system = "a100-80gb-1gpu";
  s.offload = *offload_preset("megatron_activation_offload", {});
  const Report off = run(s);
  ASSERT_TRUE(keep.fits) << keep.outcome;
  ASSERT_TRUE(off.fits) << off.outcome;
  // 18 layers; the offloaded run holds at most 4 layers' share of the kept activations (the
  // layer being computed, the two whose copies may still run, one being reloaded) plus one
  // chunk of logits (2048 tokens · 256000 · 4 bytes = 2.1 GB).
  EXPECT_GT(off.time.exposed_offload_s, 0.5 * off.step_time_s);
  EXPECT_LT(off.memory.activations_bytes,
            keep.memory.activations_bytes * 4 / 18 + 2048LL * 256000 * 4);
}

}  // namespace
}  // namespace offsim::models
