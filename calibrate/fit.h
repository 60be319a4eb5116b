// Calibration samples (what the microbenchmarks measured) and the fitting that turns them into a
// CalibrationProfile. CPU-only code: it is unit-tested on synthetic samples.
//
//   calibrate::Samples s;
//   s.copies.push_back({.link = calibrate::CopyLink::kH2D, .pinned = true,
//                       .bytes = 1 << 30, .seconds = 0.0215});
//   ...
//   auto base = sim::platform::builtin_profile("h200");
//   auto profile = calibrate::fit_profile(s, *base);   // measured figures tagged kMeasured
//
// Every fitted figure gets Origin::kMeasured, a source naming the samples it came from, and its
// JSON key in provenance.measured; figures without samples keep the base profile's value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/core/result.h"
#include "sim/plan/plan.h"
#include "sim/platform/profile.h"

namespace offsim::calibrate {

enum class CopyLink { kH2D, kD2H, kD2D, kBidirectional };
const char* to_string(CopyLink link);

// One copy size, timed as the median of repeated samples. For kBidirectional, `bytes` moves in
// each direction at once and `seconds` is the time until both finished.
struct CopySample {
  CopyLink link = CopyLink::kH2D;
  bool pinned = true;
  std::int64_t bytes = 0;
  double seconds = 0.0;
  int gpus = 1;  // GPUs copying at the same time (each its own `bytes`)
};

struct GemmSample {
  sim::GemmShape shape;
  double seconds = 0.0;
};

// A memory-bound kernel moving `bytes` (read + written) through HBM.
struct MemoryKernelSample {
  std::int64_t bytes = 0;
  double seconds = 0.0;
};

// Which kernel ran an attention sample. Only a fused flash-attention kernel (cuDNN's SDPA
// graph) describes what the forecast's attention.flash_* efficiencies mean; the replay's scalar
// fallback kernel is one to two orders of magnitude slower and must never be stored under them.
enum class AttentionKernel { kFallback, kCudnnSdpa };
const char* to_string(AttentionKernel kernel);  // "fallback", "cudnn_sdpa"

struct AttentionSample {
  sim::AttentionShape shape;
  double flops = 0.0;  // the useful FLOPs of the shape (see attention_flops)
  double seconds = 0.0;
  AttentionKernel kernel = AttentionKernel::kFallback;
};

// Noise of one timed benchmark (nvbench's rule: keep the spread, not only the median).
struct TimingRecord {
  std::string what;  // "gemm 4096x4096x4096 bf16", ...
  double median_s = 0.0;
  double min_s = 0.0;
  double noise = 0.0;  // (p75 - p25) / median
  int samples = 0;
  bool stable = false;
};

struct CollectiveSample {
  sim::CollectiveKind kind = sim::CollectiveKind::kAllReduce;
  int ranks = 0;
  std::int64_t bytes = 0;  // nccl-tests "size": the full buffer
  double seconds = 0.0;
};

// Two things run alone and then together: the slowdown each side sees.
struct InterferenceSample {
  std::string what;           // "h2d+gemm", "h2d+memory_kernel"
  double copy_bytes = 0.0;    // bytes the copy moved
  double kernel_bytes = 0.0;  // HBM bytes the kernel moved (memory-bound kernels)
  double copy_alone_s = 0.0;
  double kernel_alone_s = 0.0;
  double copy_together_s = 0.0;
  double kernel_together_s = 0.0;
};

struct AllocatorSample {
  std::int64_t requested_bytes = 0;  // sum over the allocations made
  std::int64_t reserved_bytes = 0;   // what the pool held for them
};

struct MachineFacts {
  std::string gpu_name;
  int gpu_count = 0;
  std::string driver_version, cuda_version, cublas_version, nccl_version, clocks;
  std::int64_t context_bytes = 0;   // device memory used before the first allocation
  double compute_capability = 0.0;  // major.minor as the driver reports it; 0: unknown
};

struct Samples {
  MachineFacts machine;
  std::vector<CopySample> copies;
  std::vector<GemmSample> gemms;
  std::vector<MemoryKernelSample> memory_kernels;
  std::vector<AttentionSample> attention_fwd;
  std::vector<AttentionSample> attention_bwd;
  std::vector<CollectiveSample> collectives;
  std::vector<InterferenceSample> interference;
  std::vector<AllocatorSample> allocator;
  std::vector<double> kernel_launch_s;  // gap per back-to-back launch
  std::vector<double> copy_submit_s;    // host time of one cudaMemcpyAsync
  std::vector<TimingRecord> timings;    // every benchmark's spread, in the order taken
  // NVML readings ("sm 1980 MHz, mem 3201 MHz, 612 W of 700 W, 61 C") before and after.
  std::string nvml_before, nvml_after;
};

nlohmann::json samples_to_json(const Samples& samples);

// t = latency + bytes / bandwidth, fitted by least squares on relative residuals
// ((fit - t) / t), so small and large sizes weigh alike.
struct LatencyBandwidth {
  double latency_s = 0.0;
  double bytes_per_s = 0.0;
  double max_relative_residual = 0.0;
  int points = 0;
};
sim::Result<LatencyBandwidth> fit_latency_bandwidth(const std::vector<double>& bytes,
                                                    const std::vector<double>& seconds);

// The nccl-tests bus-bandwidth factor: busbw = algbw · factor (all-reduce 2(n-1)/n,
// all-gather and reduce-scatter (n-1)/n, others 1).
double bus_factor(sim::CollectiveKind kind, int ranks);

// Forward attention FLOPs of a shape: QK^T and PV, halved when causal; backward is 2.5x.
double attention_flops(const sim::AttentionShape& shape);

// "NVIDIA H200" → "h200", "NVIDIA H100 80GB HBM3" → "h100-sxm", ...; kNotFound when unknown.
sim::Result<std::string> gpu_kind_from_name(const std::string& gpu_name);

// Replaces the figures `samples` measure in `base`; `command_line` and `date` go to provenance.
sim::Result<sim::platform::CalibrationProfile> fit_profile(
    const Samples& samples, const sim::platform::CalibrationProfile& base,
    const std::string& command_line = "", const std::string& date = "");

}  // namespace offsim::calibrate
