#include "calibrate/fit.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sim/platform/profile.h"

namespace offsim::calibrate {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
namespace platform = sim::platform;

std::vector<std::int64_t> copy_sizes() {
  std::vector<std::int64_t> v;
  for (std::int64_t b = 4096; b <= (std::int64_t{1} << 30); b *= 4) v.push_back(b);
  return v;  // 4 KiB, 16 KiB, ..., 1 GiB
}

TEST(FitTest, ExactLatencyBandwidthIsRecovered) {
  // t = 10 µs + bytes / 50 GB/s.
  std::vector<double> x, t;
  for (std::int64_t b : copy_sizes()) {
    x.push_back(static_cast<double>(b));
    t.push_back(10e-6 + static_cast<double>(b) / 50e9);
  }
  auto fit = fit_latency_bandwidth(x, t);
  ASSERT_TRUE(fit) << fit.error().message;
  EXPECT_NEAR(fit->latency_s, 10e-6, 1e-12);
  EXPECT_NEAR(fit->bytes_per_s / 50e9, 1.0, 1e-9);
  EXPECT_LT(fit->max_relative_residual, 1e-9);
  EXPECT_EQ(fit->points, static_cast<int>(x.size()));
}

TEST(FitTest, NoisySamplesStayClose) {
  // ±1% alternating noise on t = 5 µs + bytes / 25 GB/s.
  std::vector<double> x, t;
  int i = 0;
  for (std::int64_t b : copy_sizes()) {
    x.push_back(static_cast<double>(b));
    t.push_back((5e-6 + static_cast<double>(b) / 25e9) * (i++ % 2 ? 1.01 : 0.99));
  }
  auto fit = fit_latency_bandwidth(x, t);
  ASSERT_TRUE(fit);
  EXPECT_NEAR(fit->bytes_per_s / 25e9, 1.0, 0.02);
  EXPECT_NEAR(fit->latency_s / 5e-6, 1.0, 0.05);
}

TEST(FitTest, NegativeInterceptRefitsThroughTheOrigin) {
  // Pure bandwidth with the small size slightly fast: the unconstrained fit would go below 0.
  std::vector<double> x{1e3, 1e6, 1e9};
  std::vector<double> t{0.9e-8, 1e-5, 1e-2};
  auto fit = fit_latency_bandwidth(x, t);
  ASSERT_TRUE(fit);
  EXPECT_EQ(fit->latency_s, 0.0);
  EXPECT_GT(fit->bytes_per_s, 0.0);
}

TEST(FitTest, RejectsUnfittableSamples) {
  EXPECT_FALSE(fit_latency_bandwidth({1e6, 1e6}, {1e-3, 1e-3}));  // one distinct size
  EXPECT_FALSE(fit_latency_bandwidth({1e6, 2e6}, {1e-3}));        // lengths differ
  EXPECT_FALSE(fit_latency_bandwidth({1e6, 2e6}, {1e-3, -1.0}));  // negative time
  auto r = fit_latency_bandwidth({1e3, 1e9}, {1e-3, 1e-6});       // faster when larger
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error().message, HasSubstr("does not grow with size"));
}

TEST(FitTest, BusFactorsAndAttentionFlops) {
  EXPECT_DOUBLE_EQ(bus_factor(sim::CollectiveKind::kAllReduce, 8), 2.0 * 7.0 / 8.0);
  EXPECT_DOUBLE_EQ(bus_factor(sim::CollectiveKind::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(sim::CollectiveKind::kBroadcast, 4), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(sim::CollectiveKind::kAllReduce, 1), 1.0);
  sim::AttentionShape a{.batch = 2,
                        .heads = 4,
                        .kv_heads = 4,
                        .seq_q = 1024,
                        .seq_kv = 1024,
                        .head_dim = 128,
                        .causal = false};
  // 4 · 2 · 4 · 1024 · 1024 · 128 = 4,294,967,296.
  EXPECT_DOUBLE_EQ(attention_flops(a), 4294967296.0);
  a.causal = true;
  EXPECT_DOUBLE_EQ(attention_flops(a), 2147483648.0);
  a.backward = true;
  EXPECT_DOUBLE_EQ(attention_flops(a), 2.5 * 2147483648.0);
}

TEST(FitTest, GpuKindFromName) {
  EXPECT_EQ(*gpu_kind_from_name("NVIDIA H200"), "h200");
  EXPECT_EQ(*gpu_kind_from_name("NVIDIA H100 80GB HBM3"), "h100-sxm");
  EXPECT_EQ(*gpu_kind_from_name("NVIDIA H100 PCIe"), "h100-pcie");
  EXPECT_EQ(*gpu_kind_from_name("NVIDIA H800"), "h800");
  EXPECT_EQ(*gpu_kind_from_name("NVIDIA A100-SXM4-80GB"), "a100-80gb");
  EXPECT_EQ(*gpu_kind_from_name("NVIDIA A100-PCIE-40GB"), "a100-40gb");
  EXPECT_EQ(*gpu_kind_from_name("NVIDIA GH200 480GB"), "gh200");
  EXPECT_EQ(*gpu_kind_from_name("NVIDIA B200"), "b200");
  EXPECT_EQ(*gpu_kind_from_name("NVIDIA L4"), "l4");
  EXPECT_EQ(*gpu_kind_from_name("NVIDIA L40S"), "l40s");
  EXPECT_EQ(*gpu_kind_from_name("NVIDIA GeForce RTX 4090"), "rtx4090");
  EXPECT_EQ(*gpu_kind_from_name("NVIDIA GeForce RTX 5090"), "rtx5090");
  EXPECT_EQ(*gpu_kind_from_name("NVIDIA RTX 6000 Ada Generation"), "rtx6000ada");
  EXPECT_EQ(*gpu_kind_from_name("NVIDIA B300 SXM6 AC"), "b300");
  EXPECT_EQ(*gpu_kind_from_name("NVIDIA GB300"), "gb300");
  auto r = gpu_kind_from_name("Tesla T4");
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error().message, HasSubstr("Tesla T4"));
}

// Samples from known figures: the fitted profile must give them back, tagged as measured.
Samples synthetic(const platform::CalibrationProfile& base) {
  Samples s;
  s.machine = {.gpu_name = "NVIDIA H200",
               .gpu_count = 8,
               .driver_version = "580.00",
               .cuda_version = "13.0",
               .cublas_version = "13.0.0",
               .nccl_version = "2.28.9",
               .clocks = "sm 1980 MHz",
               .context_bytes = 512 << 20,
               .compute_capability = 9.0};
  for (std::int64_t b : copy_sizes()) {
    const double x = static_cast<double>(b);
    s.copies.push_back({CopyLink::kH2D, true, b, 8e-6 + x / 52e9});
    s.copies.push_back({CopyLink::kD2H, true, b, 12e-6 + x / 48e9});
    s.copies.push_back({CopyLink::kH2D, false, b, 20e-6 + x / 20e9});
    s.copies.push_back({CopyLink::kD2H, false, b, 20e-6 + x / 16e9});
    s.copies.push_back({CopyLink::kBidirectional, true, b, 15e-6 + 2 * x / 70e9});
    s.copies.push_back({CopyLink::kD2D, true, b, 3e-6 + 2 * x / 4.2e12});
    // Four GPUs at once share a 100 GB/s cap: each gets 25 GB/s.
    s.copies.push_back({CopyLink::kH2D, true, b, 8e-6 + x / 25e9, 4});
    const double n = 8.0;
    s.collectives.push_back(
        {sim::CollectiveKind::kAllReduce, 8, b, 20e-6 + x * 2 * (n - 1) / n / 360e9});
    s.collectives.push_back(
        {sim::CollectiveKind::kAllGather, 8, b, 15e-6 + x * (n - 1) / n / 380e9});
    s.memory_kernels.push_back(
        {b, x / (base.gpu.hbm_peak_bytes_per_s.value * (b < (1 << 20) ? 0.2 : 0.85))});
  }
  // bf16 GEMMs at 70% of the dense peak, shapes multiples of every tile and alignment.
  for (std::int64_t d : {1024, 2048, 4096, 8192}) {
    sim::GemmShape g{.m = d, .n = d, .k = d, .dtype = sim::DType::kBf16};
    const double flops = 2.0 * d * d * d;
    s.gemms.push_back({g, flops / (0.7 * base.gpu.dense_flops_bf16.value)});
  }
  sim::AttentionShape a{.batch = 1,
                        .heads = 32,
                        .kv_heads = 8,
                        .seq_q = 4096,
                        .seq_kv = 4096,
                        .head_dim = 128,
                        .causal = true};
  s.attention_fwd.push_back({a, attention_flops(a),
                             attention_flops(a) / (0.4 * base.gpu.dense_flops_bf16.value),
                             AttentionKernel::kCudnnSdpa});
  // A 3 GB memory-bound pass: 1.0 ms alone (3 TB/s); with a 50 GB/s copy it loses 50 GB/s of
  // HBM (one HBM byte per copy byte): 3e9 / (3e12 - 50e9) s.
  s.interference.push_back(
      {"h2d+memory_kernel", 50e9 * 2e-3, 3e9, 2e-3, 1e-3, 2e-3, 3e9 / (3e12 - 50e9)});
  s.allocator.push_back({1000 << 20, 1100 << 20});
  s.kernel_launch_s = {4e-6, 5e-6, 6e-6};
  s.copy_submit_s = {2e-6, 3e-6, 2.5e-6};
  return s;
}

// The replay's scalar fallback kernel is far slower than flash attention: its samples never
// reach the attention.flash_* efficiencies the forecast uses, fused cuDNN samples do.
TEST(FitTest, FallbackAttentionNeverSetsTheFlashEfficiencies) {
  auto base = platform::builtin_profile("h200");
  ASSERT_TRUE(base) << base.error().message;
  Samples s = synthetic(*base);
  for (AttentionSample& a : s.attention_fwd) {
    a.kernel = AttentionKernel::kFallback;
    a.seconds *= 100.0;  // 0.4 % of the peak, as the scalar kernel measures
  }
  s.attention_bwd = s.attention_fwd;
  auto fitted = fit_profile(s, *base);
  ASSERT_TRUE(fitted) << fitted.error().message;
  EXPECT_EQ(fitted->attention.flash_fwd, base->attention.flash_fwd);
  EXPECT_EQ(fitted->attention.flash_bwd, base->attention.flash_bwd);
  EXPECT_THAT(fitted->provenance.measured, Not(Contains("attention.cudnn_sdpa.fwd")));
  EXPECT_THAT(fitted->provenance.measured, Not(Contains("attention.flash_fwd")));
  // The samples file still names the kernel of each sample.
  const nlohmann::json j = samples_to_json(s);
  EXPECT_EQ(j["attention_fwd"][0]["kernel"], "fallback");

  s.attention_fwd[0].kernel = AttentionKernel::kCudnnSdpa;
  s.attention_fwd[0].seconds /= 100.0;
  fitted = fit_profile(s, *base);
  ASSERT_TRUE(fitted) << fitted.error().message;
  EXPECT_NEAR(fitted->attention.flash_fwd.value, 0.4, 1e-9);
  EXPECT_THAT(fitted->provenance.measured, Contains("attention.cudnn_sdpa.fwd"));
  EXPECT_EQ(fitted->attention.flash_bwd, base->attention.flash_bwd);  // all bwd were fallback
}

// Fused samples at two lengths pin the efficiency-by-length curve there; elsewhere the base
// curve keeps its shape, scaled by the measured ratio (log-interpolated, held beyond the ends).
TEST(FitTest, FusedAttentionSamplesScaleTheCurveByLength) {
  auto base = platform::builtin_profile("h200");
  ASSERT_TRUE(base) << base.error().message;
  const auto& curve = base->attention.flash_bwd_by_seq;
  ASSERT_FALSE(curve.empty());
  Samples s = synthetic(*base);
  s.attention_fwd.clear();
  const double peak = base->gpu.dense_flops_bf16.value;
  // 0.8x the base curve at 2,048 tokens, 1.0x at 8,192.
  for (const auto& [seq, ratio] : {std::pair{2048.0, 0.8}, std::pair{8192.0, 1.0}}) {
    const auto n = static_cast<std::int64_t>(seq);
    const sim::AttentionShape a{.batch = 16384 / n,
                                .heads = 32,
                                .kv_heads = 8,
                                .seq_q = n,
                                .seq_kv = n,
                                .head_dim = 128,
                                .causal = true,
                                .backward = true};
    const double eff = ratio * platform::interpolate_log(curve, seq);
    s.attention_bwd.push_back(
        {a, attention_flops(a), attention_flops(a) / (eff * peak), AttentionKernel::kCudnnSdpa});
  }
  auto fitted = fit_profile(s, *base);
  ASSERT_TRUE(fitted) << fitted.error().message;
  const platform::AttentionEfficiency& at = fitted->attention;
  EXPECT_NEAR(at.flash(true, 2048), 0.8 * platform::interpolate_log(curve, 2048), 1e-9);
  EXPECT_NEAR(at.flash(true, 8192), platform::interpolate_log(curve, 8192), 1e-9);
  // 4,096 tokens: halfway in log length, so 0.9x the base curve there.
  EXPECT_NEAR(at.flash(true, 4096), 0.9 * platform::interpolate_log(curve, 4096), 1e-9);
  EXPECT_NEAR(at.flash(true, 512), 0.8 * platform::interpolate_log(curve, 512), 1e-9);
  EXPECT_NEAR(at.flash(true, 16384), platform::interpolate_log(curve, 16384), 1e-9);
  EXPECT_EQ(at.flash_bwd_by_seq.front().efficiency.origin, platform::Origin::kMeasured);
  EXPECT_THAT(fitted->provenance.measured, Contains("attention_by_seq.flash_bwd"));
  // No fused forward sample: the forward curve is the base one.
  EXPECT_EQ(at.flash_fwd_by_seq, base->attention.flash_fwd_by_seq);
  EXPECT_THAT(fitted->provenance.measured, Not(Contains("attention_by_seq.flash_fwd")));
  // The measured curve survives the profile file.
  auto back = platform::profile_from_json(platform::profile_to_json(*fitted), "fitted");
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->attention.flash_bwd_by_seq, at.flash_bwd_by_seq);
  EXPECT_NEAR(back->attention.flash(true, 4096), at.flash(true, 4096), 1e-12);
}

TEST(FitTest, SamplesKeepEveryBenchmarksNoiseAndNvmlReadings) {
  Samples s;
  s.timings.push_back({"gemm 4096x4096x4096 bf16", 1e-3, 0.9e-3, 0.004, 12, true});
  s.nvml_before = "sm 1980 MHz";
  const nlohmann::json j = samples_to_json(s);
  ASSERT_EQ(j["timings"].size(), 1u);
  EXPECT_EQ(j["timings"][0]["what"], "gemm 4096x4096x4096 bf16");
  EXPECT_DOUBLE_EQ(j["timings"][0]["noise"].get<double>(), 0.004);
  EXPECT_EQ(j["timings"][0]["samples"], 12);
  EXPECT_EQ(j["nvml_before"], "sm 1980 MHz");
}

TEST(FitTest, ProfileFromSyntheticSamples) {
  auto base = platform::builtin_profile("h200");
  ASSERT_TRUE(base) << base.error().message;
  Samples s = synthetic(*base);
  auto fitted = fit_profile(s, *base, "offsim calibrate --quick", "2026-11-29T20:00:00Z");
  ASSERT_TRUE(fitted) << fitted.error().message;
  const platform::CalibrationProfile& p = *fitted;
  EXPECT_NEAR(p.host_link.h2d_bytes_per_s.value / 52e9, 1.0, 1e-6);
  EXPECT_NEAR(p.host_link.d2h_bytes_per_s.value / 48e9, 1.0, 1e-6);
  EXPECT_NEAR(p.host_link.latency_s.value, 10e-6, 1e-9);                  // mean of 8 and 12 µs
  EXPECT_NEAR(p.host_link.pageable_bytes_per_s.value / 18e9, 1.0, 1e-6);  // mean of 20 and 16
  EXPECT_NEAR(p.host_link.duplex_bytes_per_s.value / 70e9, 1.0, 1e-6);
  EXPECT_NEAR(p.gpu.hbm_achievable_bytes_per_s.value / 4.2e12, 1.0, 1e-6);
  // 4 GPUs × 25 GB/s = 100 GB/s < 0.9 × 4 × 52 GB/s: a shared cap.
  EXPECT_NEAR(p.host_link.root_complex_bytes_per_s.value / 100e9, 1.0, 1e-3);
  EXPECT_NEAR(p.nvlink.ring_all_reduce_bus_bytes_per_s.value / 360e9, 1.0, 1e-6);
  EXPECT_NEAR(p.nvlink.ring_all_gather_bus_bytes_per_s.value / 380e9, 1.0, 1e-6);
  EXPECT_NEAR(p.nvlink.latency_s.value, 17.5e-6, 1e-9);  // median of 20 and 15 µs
  EXPECT_EQ(p.gemm.points.size(), 4u);
  EXPECT_NEAR(p.gemm.efficiency({.m = 4096, .n = 4096, .k = 4096}), 0.7, 1e-9);
  EXPECT_NEAR(p.memory_bound_efficiency(1 << 30), 0.85, 1e-9);
  EXPECT_NEAR(p.memory_bound_efficiency(4096), 0.2, 1e-9);
  EXPECT_NEAR(p.attention.flash_fwd.value, 0.4, 1e-9);
  EXPECT_NEAR(p.interference.copy_hbm_bytes_per_byte.value, 1.0, 1e-6);
  EXPECT_NEAR(p.allocator.overhead_fraction.value, 0.1, 1e-12);
  EXPECT_EQ(p.allocator.fixed_bytes.value, 512 << 20);
  EXPECT_NEAR(p.gpu.kernel_launch_s.value, 5e-6, 1e-15);
  EXPECT_NEAR(p.host_link.submit_overhead_s.value, 2.5e-6, 1e-15);
  EXPECT_EQ(p.gpu.compute_capability.value, 9.0);
  EXPECT_EQ(p.gpu.compute_capability.origin, platform::Origin::kMeasured);
  EXPECT_THAT(p.provenance.measured, Contains("gpu.compute_capability"));
  // Not measured here: kept from the base profile with its own origin.
  EXPECT_EQ(p.host.dram_bytes_per_s_per_socket, base->host.dram_bytes_per_s_per_socket);
  EXPECT_EQ(p.host_link.h2d_bytes_per_s.origin, platform::Origin::kMeasured);
  EXPECT_THAT(p.host_link.h2d_bytes_per_s.source, HasSubstr("offsim calibrate"));
  EXPECT_THAT(p.provenance.measured, Contains("host_link.h2d_bytes_per_s"));
  EXPECT_THAT(p.provenance.measured, Contains("gemm.points"));
  EXPECT_EQ(p.provenance.gpu_count, 8);
  EXPECT_EQ(p.provenance.nccl_version, "2.28.9");
  EXPECT_EQ(p.provenance.command_line, "offsim calibrate --quick");
  EXPECT_EQ(p.provenance.date, "2026-11-29T20:00:00Z");
  // The fitted profile passes the profile reader's validation.
  auto back = platform::profile_from_json(platform::profile_to_json(p), "fitted");
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, p);
}

TEST(FitTest, NoSamplesKeepsTheBase) {
  auto base = platform::builtin_profile("h100-sxm");
  ASSERT_TRUE(base);
  auto fitted = fit_profile(Samples{}, *base);
  ASSERT_TRUE(fitted);
  EXPECT_EQ(fitted->gpu, base->gpu);
  EXPECT_EQ(fitted->host_link, base->host_link);
  EXPECT_EQ(fitted->gemm, base->gemm);
}

TEST(FitTest, BadCopySamplesNameTheLink) {
  auto base = platform::builtin_profile("h200");
  ASSERT_TRUE(base);
  Samples s;
  s.copies.push_back({CopyLink::kD2H, true, 1 << 20, 1e-3});
  s.copies.push_back({CopyLink::kD2H, true, 1 << 30, 1e-6});
  auto fitted = fit_profile(s, *base);
  ASSERT_FALSE(fitted);
  EXPECT_THAT(fitted.error().message, HasSubstr("d2h copies (pinned)"));
}

TEST(FitTest, SamplesToJson) {
  auto base = platform::builtin_profile("h200");
  ASSERT_TRUE(base);
  nlohmann::json j = samples_to_json(synthetic(*base));
  EXPECT_EQ(j["machine"]["gpu_name"], "NVIDIA H200");
  EXPECT_EQ(j["copies"][0]["link"], "h2d");
  EXPECT_EQ(j["gemms"].size(), 4u);
  EXPECT_EQ(j["collectives"][0]["kind"], "all_reduce");
}

}  // namespace
}  // namespace offsim::calibrate
