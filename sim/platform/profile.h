// CalibrationProfile: every number the cost model uses for one GPU kind, each tagged with where
// it comes from (datasheet, published measurement, assumption, or measured by calibrate).
//
// Defaults come from `shared/reference/hardware.md` (built into the binary); a measured profile
// under `calibrate/profiles/<gpu>.json` replaces them when present.
//
//   auto p = sim::platform::default_profile("h100-sxm");
//   if (!p) { ... p.error().message ... }                 // unknown GPU kind
//   double eff = p->gemm.efficiency({.m = 8192, .n = 8192, .k = 8192});
//   double peak = p->gpu.dense_flops(sim::DType::kBf16);  // FLOP/s
//   std::string text = sim::platform::profile_to_json(*p).dump(2);
//   auto back = sim::platform::profile_from_json_text(text, "h100.json");  // errors name the key
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/core/result.h"
#include "sim/plan/plan.h"

namespace offsim::sim::platform {

enum class Origin { kDatasheet, kPublished, kAssumption, kMeasured };

const char* to_string(Origin origin);
std::optional<Origin> origin_from_string(std::string_view name);

// One number with its provenance. JSON: {"value": 1.5e12, "origin": "published", "source": "..."}.
struct Figure {
  double value = 0.0;
  Origin origin = Origin::kAssumption;
  std::string source;
  bool operator==(const Figure&) const = default;
};

struct Provenance {
  std::string profile_name;  // "h100-sxm" (the GPU kind the profile is for)
  std::string gpu_name;      // as the driver reports it, or the marketing name for defaults
  int gpu_count = 0;         // GPUs on the machine that was measured (0 for defaults)
  std::string driver_version;
  std::string cuda_version;
  std::string cublas_version;
  std::string nccl_version;
  std::string clocks;                 // "sm 1980 MHz, mem 2619 MHz" or "" for defaults
  std::string date;                   // ISO 8601
  std::string command_line;           // how the profile was produced
  std::vector<std::string> measured;  // JSON keys of the figures that were measured
  bool operator==(const Provenance&) const = default;
};

// A measured GEMM: efficiency = achieved FLOP/s / dense peak of its dtype.
struct GemmPoint {
  std::int64_t m = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  DType dtype = DType::kBf16;
  Figure efficiency;
  bool operator==(const GemmPoint&) const = default;
};

// One knot of an efficiency curve over an op's size: `size` in FLOPs (GEMM) or bytes (memory).
struct CurveKnot {
  double size = 0.0;
  Figure efficiency;
  bool operator==(const CurveKnot&) const = default;
};

// Piecewise-linear in log(size), clamped to the first/last knot outside their range.
// Knots must be sorted by strictly increasing size (validated when loading).
double interpolate_log(const std::vector<CurveKnot>& knots, double size);

// GEMM efficiency surface (fraction of the dtype's dense peak).
//
// Model: e(shape) = curve(flops) · shape(m, n, k, batch) / shape(r, r, r, 1) · align(m, n, k):
//  * curve is the fallback curve, piecewise linear in log(2·m·n·k·batch);
//  * shape = fill(m, n, batch) · depth(k), divided by its value at the cube of side
//    `reference_dim` where the curve's top was measured (1 when reference_dim is 0);
//  * fill, without an SM count: tile(m) · tile(n) with tile(d) = d / (ceil(d / tile_size) ·
//    tile_size), the tile-quantization loss of an output dimension that does not fill its last
//    tile. With `sm_count` > 0, tile and wave quantization together: output tiles of
//    wave_tile_m × wave_tile_n (or transposed, whichever fills better) run in waves of sm_count
//    tiles, fill = m·n·batch / (ceil(tiles / sm_count) · sm_count · tile area);
//  * depth(k) = k / (k + k_overhead_elements): a tile's epilogue (writing its C tile) and
//    prologue cost about as much as k_overhead_elements steps of its main loop, so shallow
//    products (attention's head_dim 64-128) run well below deep ones; 1 when the figure is 0;
//  * with `stream_k` = 1 (and sm_count > 0), fill · depth is instead the stream-K work model:
//    the tiles' main-loop steps are divided evenly over the SMs (fewer tiles than SMs split
//    along k, at least one 64-deep k-block per SM), each SM paying k_overhead_elements steps per
//    tile segment it touches: m·n·k·batch / (S · tile area · (T·k / active + segments · k0))
//    with T tiles, active = min(S, T · ceil(k / 64)) SMs and segments = ceil(T / active);
//  * with reference_dim set, curve · shape / shape(r, r, r, 1) is held at the curve's top knot:
//    the top is the best GEMM of a shape sweep (MAMF), so no shape, however deep its k or full
//    its last wave, runs faster;
//  * align = misaligned_factor when any of m, n, k is not a multiple of `alignment_elements`
//    (tensor cores then fall back to slower paths), else 1.
// The wave and depth figures are optional in profile JSON (0 when absent: the curve-and-tile
// model of format 1 profiles written before they existed).
// Measured points of the same dtype correct the model: an exact shape match returns the measured
// value; otherwise the model is scaled by the inverse-distance-weighted (in log m, log n, log k)
// mean of measured/model ratios of the points.
struct GemmEfficiency {
  std::vector<GemmPoint> points;
  std::vector<CurveKnot> curve;  // by FLOPs
  Figure tile_size;              // elements
  Figure alignment_elements;     // elements
  Figure misaligned_factor;      // multiplier (0, 1]
  Figure sm_count;               // SMs of the GPU; 0: no wave quantization
  Figure wave_tile_m;            // output tile of the wave model, elements
  Figure wave_tile_n;
  Figure k_overhead_elements;  // depth-equivalent of a tile's prologue/epilogue; 0: none
  // The same for FP8 GEMMs (twice the tensor rate, bf16 output); 0: k_overhead_elements.
  Figure k_overhead_elements_fp8;
  Figure reference_dim;  // cube side of the curve's top measurement; 0: no normalisation
  // 1: tiles spread over the SMs stream-K style (no wave quantization; see shape_factor);
  // 0: tiles run in whole waves of sm_count.
  Figure stream_k;
  double efficiency(const GemmShape& shape) const;
  double model_efficiency(const GemmShape& shape) const;  // curve and penalties, no points
  double shape_factor(const GemmShape& shape) const;      // fill · depth, not normalised
  bool operator==(const GemmEfficiency&) const = default;
};

// Attention efficiency: fraction of the dtype's dense peak reached on the attention FLOPs
// (2 GEMMs forward: QK^T and PV; 2.5x that backward). The classic form also moves the s×s score
// matrix through HBM; the cost model adds that traffic on the HBM resource.
//
// Flash attention by shape: `flash_fwd_by_seq` / `flash_bwd_by_seq` (optional, JSON section
// "attention_by_seq") are causal-attention efficiencies by KV sequence length (knot size =
// tokens), piecewise linear in log(sequence) and clamped outside the knots, as published
// benchmarks give them. When present they replace the single flash_fwd / flash_bwd figure, unless
// that figure was measured (origin "measured", written by calibrate): a measurement of the
// user's machine wins over a published curve.
//
// FlashAttention-2 by shape: `flash2_fwd_by_seq` / `flash2_bwd_by_seq` (optional, in the same
// section) are the same kind of curve for FlashAttention-2's kernels, which run Ampere code on
// later GPUs (scenario `model.attention: flash2`); a profile without them prices flash2 as
// flash.
struct AttentionEfficiency {
  Figure flash_fwd;
  Figure flash_bwd;
  Figure classic_fwd;
  Figure classic_bwd;
  std::vector<CurveKnot> flash_fwd_by_seq;
  std::vector<CurveKnot> flash_bwd_by_seq;
  std::vector<CurveKnot> flash2_fwd_by_seq;
  std::vector<CurveKnot> flash2_bwd_by_seq;
  double flash(bool backward, double seq_kv) const;
  double flash2(bool backward, double seq_kv) const;
  bool operator==(const AttentionEfficiency&) const = default;
};

struct GpuFigures {
  Figure hbm_usable_bytes;  // visible to the allocator
  Figure hbm_peak_bytes_per_s;
  Figure hbm_achievable_bytes_per_s;  // large copy kernel / STREAM
  Figure dense_flops_bf16;            // FLOP/s
  Figure dense_flops_fp16;
  Figure dense_flops_fp8;
  Figure dense_flops_fp32;
  Figure kernel_launch_s;  // gap between back-to-back kernels in one stream
  // CUDA compute capability as major.minor (8.0 A100, 8.9 Ada, 9.0 Hopper, 10.0 B200, 10.3 B300,
  // 12.0 RTX 5090): the architecture, for the rules frameworks key on it (cuBLAS workspace).
  Figure compute_capability;
  double dense_flops(DType dtype) const;
  int compute_capability_major() const;
  // 10 · major + minor, as Transformer Engine's get_device_compute_capability() encodes it: 90
  // for 9.0, 103 for 10.3.
  int compute_capability_x10() const;
  bool operator==(const GpuFigures&) const = default;
};

// The host link of one GPU (PCIe or NVLink-C2C), measured per direction with pinned memory.
struct HostLinkFigures {
  Figure h2d_bytes_per_s;
  Figure d2h_bytes_per_s;
  Figure duplex_bytes_per_s;         // both directions at once, combined cap
  Figure pageable_bytes_per_s;       // per direction through pageable host memory
  Figure latency_s;                  // link latency of one copy
  Figure submit_overhead_s;          // host cost of one cudaMemcpyAsync
  Figure switch_uplink_bytes_per_s;  // PCIe switch to CPU root port, per direction
  Figure root_complex_bytes_per_s;   // per CPU socket, all its GPUs together
  bool operator==(const HostLinkFigures&) const = default;
};

// CPU side. The CPU optimizer's host step on c cores runs at
//   min(c · adam_bytes_per_s_per_core / numa, the rank's share of dram_bytes_per_s_per_socket)
// bytes streamed per second, or slower when its FLOPs need more than c · flops_per_s_per_core;
// numa = 1 + (k-1)/k · (remote_dram_time_ratio - 1) when its threads run on k sockets while its
// memory is on one (models/cost_model.h).
struct HostFigures {
  Figure dram_bytes_per_s_per_socket;
  Figure cores_per_socket;
  Figure adam_bytes_per_s_per_core;
  Figure flops_per_s_per_core;    // sustained fp32 vector FLOP/s of one core on streaming code
  Figure remote_dram_time_ratio;  // time per byte from another socket's DRAM over local DRAM
  bool operator==(const HostFigures&) const = default;
};

// NVLink and NCCL bus bandwidths (nccl-tests busbw, large messages) inside one NVLink domain.
struct NvlinkFigures {
  Figure bytes_per_s_per_gpu;  // per direction; 0 when the GPU has no NVLink
  Figure ring_all_gather_bus_bytes_per_s;
  Figure ring_reduce_scatter_bus_bytes_per_s;
  Figure ring_all_reduce_bus_bytes_per_s;
  Figure nvls_all_reduce_bus_bytes_per_s;  // NVLink SHARP; 0 when not available
  Figure latency_s;                        // small-message collective latency
  bool operator==(const NvlinkFigures&) const = default;
};

struct InterNodeFigures {
  Figure nic_bytes_per_s_per_gpu;  // per direction
  Figure efficiency;               // achieved bus bandwidth / NIC rate, large messages
  Figure hop_latency_s;            // per network step of a ring or tree
  bool operator==(const InterNodeFigures&) const = default;
};

struct InterferenceFigures {
  Figure copy_hbm_bytes_per_byte;  // HBM bytes a host-link copy byte costs
  Figure nccl_compute_slowdown;    // fraction of SM throughput an SM-based collective takes
  bool operator==(const InterferenceFigures&) const = default;
};

struct AllocatorFigures {
  Figure overhead_fraction;  // extra bytes per byte allocated (fragmentation, rounding)
  Figure fixed_bytes;        // CUDA context, library workspaces
  bool operator==(const AllocatorFigures&) const = default;
};

struct CalibrationProfile {
  Provenance provenance;
  GpuFigures gpu;
  GemmEfficiency gemm;
  AttentionEfficiency attention;
  std::vector<CurveKnot> memory_bound;  // fraction of HBM peak, by bytes moved
  HostLinkFigures host_link;
  HostFigures host;
  NvlinkFigures nvlink;
  InterNodeFigures inter_node;
  InterferenceFigures interference;
  AllocatorFigures allocator;
  double memory_bound_efficiency(double bytes) const {
    return interpolate_log(memory_bound, bytes);
  }
  bool operator==(const CalibrationProfile&) const = default;
};

inline constexpr int kProfileFormatVersion = 1;

nlohmann::json profile_to_json(const CalibrationProfile& profile);
// Every key is required; unknown keys, wrong types, negative or non-finite values and unsorted
// curves are rejected with "<source>: <json path>: <what was expected>".
Result<CalibrationProfile> profile_from_json(const nlohmann::json& json, const std::string& source);
Result<CalibrationProfile> profile_from_json_text(const std::string& text,
                                                  const std::string& source);
Result<CalibrationProfile> read_profile_file(const std::string& path);
Status write_profile_file(const std::string& path, const CalibrationProfile& profile);

// GPU kinds with built-in defaults: "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h800",
// "h200", "gh200", "b200", "gb200", "b300", "gb300" and the PCIe parts (l4, l40s, rtx4090,
// rtx5090, rtx6000ada).
std::vector<std::string> known_gpu_kinds();

// The figures from hardware.md for a GPU kind, compiled in (no file access).
Result<CalibrationProfile> builtin_profile(std::string_view gpu_kind);

// The measured profile `calibrate/profiles/<gpu_kind>.json` when one exists (looked up under
// $OFFSIM_PROFILE_DIR, then the source tree OFFSIM_SOURCE_DIR, then <prefix>/share/offsim/profiles
// beside the running executable's bin/ folder),
// else builtin_profile(). A profile file that exists but does not parse is an error.
Result<CalibrationProfile> default_profile(std::string_view gpu_kind);

}  // namespace offsim::sim::platform
