// Built-in default profiles: the figures of shared/reference/hardware.md, each with its origin
// and source. Where hardware.md has no figure, the value is an assumption and its source string
// says how it was derived; `offsim calibrate` replaces these with measured numbers.
#include <cmath>
#include <iterator>
#include <string>
#include <utility>

#include "sim/plan/shape_math.h"
#include "sim/platform/profile.h"

namespace offsim::sim::platform {

namespace {

constexpr double kGB = 1e9;
constexpr double kTFLOP = 1e12;
constexpr double kMiB = 1024.0 * 1024.0;

// Source tags (short, stable strings: profile JSON files carry them).
constexpr const char* kSrcGpuTable =
    "hardware.md GPUs table (NVIDIA datasheets via stas00/ml-engineering compute/accelerator)";
constexpr const char* kSrcMamf =
    "hardware.md GPUs table, best large bf16 GEMM measured (ml-engineering MAMF table)";
// Sustained GEMM throughput with training-like (random) operands at the GPU's power limit.
// Range for profile checks: (0, dense peak].
constexpr double kA100SustainedTflops = 257.0;
constexpr const char* kSrcA100Sustained =
    "sustained large bf16 GEMM with random operands at the 400 W limit: cuBLAS 8192^3 on A100 "
    "SXM with torch.randn inputs 257 TFLOP/s (295 with zeros), H. He, 'Strangely, Matrix "
    "Multiplications on GPUs Run Faster When Given Predictable Data' (thonking.ai, 2024); "
    "consistent with the 1305 MHz clock NVIDIA rates the A100 at under HPL at its power limit "
    "vs 1410 MHz boost (glennklockwood.com/garden/peak-FLOPS): MAMF ~271 x 1305/1410 = 251";
// Hopper at 700 W (H100 SXM, H200): sustained bf16 GEMM throughput on random data, measured.
constexpr double kH200SustainedTflops = 667.0;
constexpr double kH200BurstTflops = 790.0;  // the MAMF-table figure of the same GEMM, short runs
constexpr const char* kSrcH200Sustained =
    "measured: 8192^3 bf16 GEMM (PyTorch 2.11 / cuBLAS, CUDA 13.0, torch.randn operands) run back "
    "to back for 30 s on two H200 SXM GPUs at their 700 W limit: 654-657 TFLOP/s each second at "
    "SM 1440-1485 of 1980 MHz and 689-695 W on one, 675-683 at 1455-1545 MHz and 688-695 W on "
    "the other; their mean, 667 (docs/gpu-check/2026-12-04-h200/sustained-1.json and "
    "sustained-2.json, scripts/gpu-sustained.py). The first GPU's transformer-layer GEMMs "
    "(Llama-3 8B/70B, TP 1-8, 8192 tokens) ran 590-740 TFLOP/s, mostly 655-690; short runs of "
    "the same 8192^3 GEMM reach about 790 (ml-engineering MAMF table) before the power limit "
    "lowers the clock";
constexpr const char* kSrcHostLink =
    "hardware.md GPUs table, host link measured per direction (cuda-samples #357, nvbandwidth)";
constexpr const char* kSrcCalculonMem =
    "Calculon memory efficiency by MB moved (hardware.md kernel-time models): >=100 MB 0.90, "
    ">=10 0.75, >=1 0.60, else 0.30; the last bin placed at 0.1 MB (assumption)";
constexpr const char* kSrcSubmit =
    "hardware.md host side: each cudaMemcpyAsync costs ~5-7 us to submit (rapidsai/cudf #15620; "
    "torchrec #4303, #4315); midpoint";
constexpr const char* kSrcLinkLatency =
    "no separate figure in hardware.md: the ~5-7 us per copy (submit_overhead_s) covers a small "
    "copy's fixed cost; calibrate's small-copy sweep measures both";
constexpr const char* kSrcPageable =
    "hardware.md: pageable ~2.7 GB/s vs ~25 GB/s pinned on H100 PCIe (jax-ml/jax #16905)";
constexpr const char* kSrcNcclLatency =
    "hardware.md: small-message latency ~20 us eager through a framework (NVIDIA/nccl #1264, "
    "#1455, #1807)";
constexpr const char* kSrcHopLatency =
    "assumption: a few us per inter-node ring/tree step (IB switch hop plus NCCL proxy); "
    "not in hardware.md; calibrate's multi-node NCCL sweep measures it";
constexpr const char* kSrcNicEff =
    "hardware.md: large all-reduce across 4 B200 nodes reached ~74% of the NIC rate";
constexpr const char* kSrcCopyHbm =
    "assumption: a host-link copy byte is read or written once in HBM, which gives hardware.md's "
    "~1% of HBM at PCIe rates and ~10% at C2C rates";
constexpr const char* kSrcNcclSlowdown =
    "hardware.md interference: SM-based NCCL overlapped with GEMMs slowed compute ~19% on "
    "average (arXiv 2507.03114)";
constexpr const char* kSrcAllocFraction =
    "assumption: caching-allocator rounding and fragmentation of about 5%; calibrate compares "
    "planned and real high-water marks";
constexpr const char* kSrcAllocFixed =
    "assumption: CUDA context, cuBLAS/NCCL handles and workspaces, about 512 MiB per GPU";
constexpr const char* kSrcComputeCapability =
    "NVIDIA, CUDA GPU Compute Capability table (developer.nvidia.com/cuda-gpus): 8.0 A100; 8.9 "
    "L4, L40S, RTX 6000 Ada, RTX 4090; 9.0 H100, H200, GH200; 10.0 B200, GB200; 10.3 B300, "
    "GB300; 12.0 RTX 5090";
constexpr const char* kSrcLaunch =
    "assumption: back-to-back kernels in one stream leave a gap of ~2 us; hardware.md gives "
    "single-digit us for small launches with CUDA graphs; calibrate's launch benchmark measures it";
constexpr const char* kSrcAdam =
    "published: DeepSpeed PR #735, CPU-Adam 8.2 s per step for an 11.6B-parameter GPT-2 "
    "(ZeRO-Offload, one GPU), host taken as DGX-2's 2x Xeon Platinum 8168 (48 AVX-512 cores): "
    "11.6e9 x 42 B (DeepSpeed's host step) / 8.2 s / 48 cores on a 512-bit core; the system's host "
    "(sim/platform/host.cc) "
    "replaces it, scaled by its vector width";
constexpr const char* kSrcRemote =
    "assumption: a core streaming from the other socket's DRAM takes 1.6x as long per byte; the "
    "system's host (sim/platform/host.cc) replaces it";
constexpr const char* kSrcCpuFlops =
    "assumption: ~32 GFLOP/s fp32 per core on streaming vector code (AVX2/AVX-512 FMA at ~2 GHz, "
    "a quarter of peak); not in hardware.md";
constexpr const char* kSrcAlign =
    "assumption: tensor-core GEMMs want every dimension a multiple of 8 elements (16 bytes in "
    "bf16); misaligned shapes take slower kernels, factor 0.7 until calibrate fits it";
constexpr const char* kSrcWaveTile =
    "NVIDIA Deep Learning Performance Guide, Matrix Multiplication Background: large fp16/bf16 "
    "cuBLAS GEMMs run 256x128 output tiles; spread over the SMs stream-K style (no idle SMs in a "
    "partial last wave: CUTLASS stream-K, Osama et al., PPoPP 2023)";
constexpr const char* kSrcSms = "NVIDIA architecture whitepapers / datasheets: SMs per GPU";
constexpr const char* kSrcReferenceDim =
    "assumption: the best-GEMM figure (MAMF) is reached on large square shapes; taken at 8192^3 "
    "as hardware.md's H200 figure states";
constexpr const char* kSrcTile =
    "assumption: output tiles of 128 elements per dimension, the common cuBLAS/CUTLASS tile";

Figure fig(double value, Origin origin, std::string source) {
  return Figure{.value = value, .origin = origin, .source = std::move(source)};
}

// The GEMM curve is one knot: the GPU's best large GEMM. Smaller GEMMs are slowed by the
// model's tile padding, tile prologue/epilogue and HBM roofline and by the launch gap, not by a
// curve over FLOPs (Calculon's bins, 0.10 of the top below 1 GFLOP, priced a 1 x 6144 x 4096
// GEMM on B200 40x slower than cuBLAS runs it).
std::vector<CurveKnot> best_gemm_curve(double best_fraction, Origin origin,
                                       const std::string& best_source) {
  return {{.size = 128e9, .efficiency = fig(best_fraction, origin, best_source)}};
}

std::vector<CurveKnot> calculon_memory_curve() {
  return {{.size = 1e5, .efficiency = fig(0.30, Origin::kAssumption, kSrcCalculonMem)},
          {.size = 1e6, .efficiency = fig(0.60, Origin::kPublished, kSrcCalculonMem)},
          {.size = 1e7, .efficiency = fig(0.75, Origin::kPublished, kSrcCalculonMem)},
          {.size = 1e8, .efficiency = fig(0.90, Origin::kPublished, kSrcCalculonMem)}};
}

// What every default shares; the per-GPU functions below fill in the rest.
CalibrationProfile common(const std::string& name, const std::string& gpu_name,
                          double compute_capability) {
  CalibrationProfile p;
  p.provenance.profile_name = name;
  p.provenance.gpu_name = gpu_name;
  p.gpu.compute_capability = fig(compute_capability, Origin::kDatasheet, kSrcComputeCapability);
  p.provenance.command_line = "built-in defaults from shared/reference/hardware.md";
  p.gpu.kernel_launch_s = fig(2e-6, Origin::kAssumption, kSrcLaunch);
  p.gemm.tile_size = fig(128, Origin::kAssumption, kSrcTile);
  p.gemm.alignment_elements = fig(8, Origin::kAssumption, kSrcAlign);
  p.gemm.misaligned_factor = fig(0.7, Origin::kAssumption, kSrcAlign);
  p.memory_bound = calculon_memory_curve();
  p.host_link.submit_overhead_s = fig(6e-6, Origin::kPublished, kSrcSubmit);
  p.host_link.latency_s = fig(0.0, Origin::kAssumption, kSrcLinkLatency);
  p.host.adam_bytes_per_s_per_core = fig(11.6e9 * 42.0 / 8.2 / 48.0, Origin::kPublished, kSrcAdam);
  p.host.remote_dram_time_ratio = fig(1.6, Origin::kAssumption, kSrcRemote);
  p.host.flops_per_s_per_core = fig(32e9, Origin::kAssumption, kSrcCpuFlops);
  p.nvlink.latency_s = fig(20e-6, Origin::kPublished, kSrcNcclLatency);
  p.inter_node.hop_latency_s = fig(5e-6, Origin::kAssumption, kSrcHopLatency);
  p.inter_node.efficiency =
      fig(0.74, Origin::kAssumption, std::string(kSrcNicEff) + "; applied to this GPU's fabric");
  p.interference.copy_hbm_bytes_per_byte = fig(1.0, Origin::kAssumption, kSrcCopyHbm);
  p.interference.nccl_compute_slowdown = fig(0.19, Origin::kPublished, kSrcNcclSlowdown);
  p.allocator.overhead_fraction = fig(0.05, Origin::kAssumption, kSrcAllocFraction);
  p.allocator.fixed_bytes = fig(512 * kMiB, Origin::kAssumption, kSrcAllocFixed);
  return p;
}

// Dense tensor-core peaks of the other dtypes from the bf16 peak.
void derived_peaks(CalibrationProfile& p, bool has_fp8) {
  const double bf16 = p.gpu.dense_flops_bf16.value;
  p.gpu.dense_flops_fp16 =
      fig(bf16, Origin::kAssumption,
          "fp16 dense tensor-core rate equals bf16 on A100/H100/H200/B200 (NVIDIA datasheets); "
          "not tabulated in hardware.md");
  p.gpu.dense_flops_fp32 =
      fig(bf16 / 2, Origin::kAssumption,
          "fp32 GEMMs run as TF32 on tensor cores at half the bf16 rate (NVIDIA datasheets); not "
          "tabulated in hardware.md");
  p.gpu.dense_flops_fp8 =
      has_fp8 ? fig(2 * bf16, Origin::kAssumption,
                    "fp8 dense tensor-core rate is twice bf16 on Hopper and Blackwell (NVIDIA "
                    "datasheets); not tabulated in hardware.md")
              : fig(bf16, Origin::kAssumption,
                    "Ampere has no fp8 tensor cores: fp8 GEMMs are taken to run as bf16");
}

// HBM achievable bandwidth where hardware.md has no measurement: the H200's measured copy
// fraction (4.3 of 4.8 TB/s).
Figure achievable_from_h200_ratio(double peak) {
  return fig(peak * (4.3 / 4.8), Origin::kAssumption,
             "hardware.md: H200 copy measured ~4.3 of 4.8 TB/s peak; the same fraction (0.896) "
             "applied to this GPU's peak");
}

void attention_ampere(CalibrationProfile& p, double best_gemm) {
  const char* src =
      "assumption: FlashAttention-2-class kernels on A100 at ~50% of peak forward and ~40% "
      "backward; hardware.md has Hopper figures only (FA3 ~75%, FA2 ~35% on H100)";
  p.attention.flash_fwd = fig(0.50, Origin::kAssumption, src);
  p.attention.flash_bwd = fig(0.40, Origin::kAssumption, src);
  const char* classic =
      "classic attention's batched QK^T and PV GEMMs at the best large-GEMM efficiency; the "
      "s x s score traffic is charged to HBM by the cost model";
  p.attention.classic_fwd = fig(best_gemm, Origin::kAssumption, classic);
  p.attention.classic_bwd = fig(best_gemm, Origin::kAssumption, classic);
}

// Causal attention by sequence length, head dim 128, on H100 SXM5: cuDNN's fused attention, the
// backend Transformer Engine runs on Hopper by default. FlashAttention-3 paper (Shah et al.,
// arXiv 2407.08608, Fig. 5-6; 16k tokens per batch, 16 heads of 128), TFLOP/s at sequence
// 512, 1k, 2k, 4k, 8k, 16k: forward causal 315, 410, 484, 518, 529, 539; forward non-causal
// 497, 574, 617, 609, 600, 595; backward non-causal 305, 408, 465, 499, 518, 516. The paper
// gives the backward without the causal mask only: the causal backward is taken at the
// non-causal backward times the forward's causal/non-causal ratio at the same length.
constexpr double kCudnnSeq[] = {512, 1024, 2048, 4096, 8192, 16384};
constexpr double kCudnnFwdCausal[] = {315, 410, 484, 518, 529, 539};
constexpr double kCudnnFwdFull[] = {497, 574, 617, 609, 600, 595};
constexpr double kCudnnBwdFull[] = {305, 408, 465, 499, 518, 516};
constexpr double kH100SxmBf16Tflops = 989.0;
constexpr const char* kSrcCudnnAttention =
    "FlashAttention-3 paper (arXiv 2407.08608) Fig. 5-6, cuDNN fused attention on H100 SXM5, head "
    "dim 128, causal, bf16: TFLOP/s by sequence over the 989 TFLOP/s peak; Transformer Engine's "
    "default attention backend on Hopper";

// The causal curves from one kernel's published H100 SXM bars (TFLOP/s at kCudnnSeq: causal
// forward, non-causal forward and backward), as fractions of the 989 TFLOP/s peak. `origin`:
// published on H100 SXM; an assumption on the other GPUs, which take the same fractions of
// their own peak (`note` says why).
struct H100AttentionBars {
  const double* fwd_causal;
  const double* fwd_full;
  const double* bwd_full;
  const char* source;
};

void causal_curves(const H100AttentionBars& bars, Origin origin, const std::string& note,
                   std::vector<CurveKnot>& fwd_out, std::vector<CurveKnot>& bwd_out) {
  fwd_out.clear();
  bwd_out.clear();
  const std::string fwd = std::string(bars.source) + note;
  const std::string bwd = std::string(bars.source) +
                          "; causal backward = non-causal backward x the forward's causal / "
                          "non-causal ratio at the same length (assumption: the paper has no "
                          "causal backward)" +
                          note;
  for (std::size_t i = 0; i < std::size(kCudnnSeq); ++i) {
    const double f = bars.fwd_causal[i] / kH100SxmBf16Tflops;
    const double b =
        bars.bwd_full[i] * (bars.fwd_causal[i] / bars.fwd_full[i]) / kH100SxmBf16Tflops;
    fwd_out.push_back({.size = kCudnnSeq[i], .efficiency = fig(f, origin, fwd)});
    bwd_out.push_back({.size = kCudnnSeq[i], .efficiency = fig(b, Origin::kAssumption, bwd)});
  }
}

void attention_by_seq(CalibrationProfile& p, Origin origin, const std::string& note) {
  causal_curves({kCudnnFwdCausal, kCudnnFwdFull, kCudnnBwdFull, kSrcCudnnAttention}, origin, note,
                p.attention.flash_fwd_by_seq, p.attention.flash_bwd_by_seq);
  // The single figures (used where a profile has no curve): the curve's longest sequence.
  p.attention.flash_fwd = p.attention.flash_fwd_by_seq.back().efficiency;
  p.attention.flash_bwd = p.attention.flash_bwd_by_seq.back().efficiency;
}

// FlashAttention-2 (Dao's CUDA kernels, Ampere mma instructions without Hopper's wgmma and TMA)
// on H100 SXM5, head dim 128, from the same figures of the FlashAttention-3 paper: forward causal
// 191, 260, 298, 319, 333, 335 TFLOP/s; forward non-causal 309, 350, 362, 368, 370, 370;
// backward non-causal 214, 260, 291, 310, 318, 322, at the sequence lengths of kCudnnSeq.
constexpr double kFa2FwdCausal[] = {191, 260, 298, 319, 333, 335};
constexpr double kFa2FwdFull[] = {309, 350, 362, 368, 370, 370};
constexpr double kFa2BwdFull[] = {214, 260, 291, 310, 318, 322};
constexpr const char* kSrcFa2Attention =
    "FlashAttention-3 paper (arXiv 2407.08608) Fig. 5-6, FlashAttention-2 on H100 SXM5, head dim "
    "128, causal, bf16: TFLOP/s by sequence over the 989 TFLOP/s peak";

void attention_flash2_by_seq(CalibrationProfile& p, Origin origin, const std::string& note) {
  causal_curves({kFa2FwdCausal, kFa2FwdFull, kFa2BwdFull, kSrcFa2Attention}, origin, note,
                p.attention.flash2_fwd_by_seq, p.attention.flash2_bwd_by_seq);
}

// FlashAttention-2 on B200: its Ampere kernels do not use Blackwell's tensor-core instructions
// and stay near their Hopper throughput. meta-pytorch/tritonbench PR #171 (flash_v2, batch 8, 16
// heads of 128, forward, non-causal): 245, 315, 352, 354, 362, 331 TFLOP/s at the sequence
// lengths of kCudnnSeq. Causal forward and the backward are not published on Blackwell: they are
// taken at H100's FlashAttention-2 ratios (causal / non-causal forward, backward / forward) at
// the same length. As TFLOP/s over this GPU's bf16 peak: the legacy instructions' rate does not
// grow with the peak (B300, GB300: the B200's TFLOP/s, an assumption).
constexpr double kFa2B200FwdFull[] = {245.259, 315.111, 352.104, 353.912, 361.591, 330.587};

void attention_flash2_blackwell(CalibrationProfile& p, Origin origin, const std::string& note) {
  p.attention.flash2_fwd_by_seq.clear();
  p.attention.flash2_bwd_by_seq.clear();
  const double peak = p.gpu.dense_flops_bf16.value / kTFLOP;
  const std::string src =
      "meta-pytorch/tritonbench PR #171: FlashAttention-2 (flash_v2) on B200, head dim 128, "
      "forward non-causal, bf16: TFLOP/s by sequence over this GPU's bf16 peak";
  const std::string ratios =
      "; causal / non-causal and backward / forward at FlashAttention-2's H100 ratios "
      "(FlashAttention-3 paper Fig. 5-6; assumption: not published on Blackwell)";
  for (std::size_t i = 0; i < std::size(kCudnnSeq); ++i) {
    const double causal = kFa2FwdCausal[i] / kFa2FwdFull[i];
    const double f = kFa2B200FwdFull[i] * causal / peak;
    const double b = kFa2B200FwdFull[i] * (kFa2BwdFull[i] / kFa2FwdFull[i]) * causal / peak;
    p.attention.flash2_fwd_by_seq.push_back(
        {.size = kCudnnSeq[i], .efficiency = fig(f, origin, src + ratios + note)});
    p.attention.flash2_bwd_by_seq.push_back(
        {.size = kCudnnSeq[i], .efficiency = fig(b, Origin::kAssumption, src + ratios + note)});
  }
}

void attention_hopper(CalibrationProfile& p, double best_gemm, bool h100_sxm) {
  const Origin origin = h100_sxm ? Origin::kPublished : Origin::kAssumption;
  const std::string note = h100_sxm ? ""
                                    : "; measured on H100 SXM, the same fractions of this Hopper "
                                      "GPU's peak (assumption)";
  attention_by_seq(p, origin, note);
  attention_flash2_by_seq(p, origin, note);
  const char* classic =
      "classic attention's batched QK^T and PV GEMMs at the best large-GEMM efficiency; the "
      "s x s score traffic is charged to HBM by the cost model";
  p.attention.classic_fwd = fig(best_gemm, Origin::kAssumption, classic);
  p.attention.classic_bwd = fig(best_gemm, Origin::kAssumption, classic);
}

// PCIe Gen4 x16 host link of DGX A100 (2 GPUs per switch, 2 switches per socket).
void host_link_gen4(CalibrationProfile& p) {
  p.host_link.h2d_bytes_per_s = fig(25 * kGB, Origin::kPublished, kSrcHostLink);
  p.host_link.d2h_bytes_per_s = fig(25 * kGB, Origin::kPublished, kSrcHostLink);
  p.host_link.duplex_bytes_per_s =
      fig(0.9 * 2 * 25 * kGB, Origin::kAssumption,
          "hardware.md: both directions at once ~90% of 2x on healthy Gen5 hosts, applied to "
          "Gen4; one A100 node measured only 11 + 25 GB/s (nvbandwidth #53)");
  p.host_link.pageable_bytes_per_s =
      fig(2.7 * kGB, Origin::kAssumption, std::string(kSrcPageable) + "; applied to A100");
  p.host_link.switch_uplink_bytes_per_s =
      fig(25 * kGB, Origin::kAssumption,
          "DGX A100 switch uplinks are Gen4 x16 like the GPU links: the measured per-GPU rate");
  p.host_link.root_complex_bytes_per_s =
      fig(2 * 25 * kGB, Origin::kAssumption,
          "no host-side cap measured on DGX A100: the sum of a socket's two switch uplinks");
  p.host.dram_bytes_per_s_per_socket =
      fig(190 * kGB, Origin::kAssumption,
          "DGX A100 sockets (AMD EPYC 7742): 8 DDR4-3200 channels = 204.8 GB/s peak, ~93% "
          "achievable as in hardware.md's DDR5 derivation; not in hardware.md");
  p.host.cores_per_socket =
      fig(64, Origin::kDatasheet, "NVIDIA DGX A100 datasheet: 2x AMD EPYC 7742, 64 cores each");
}

// PCIe Gen5 x16 host links with a dedicated path per GPU and a host-side cap per socket.
void host_link_gen5(CalibrationProfile& p, double h2d, double d2h, Origin origin,
                    const std::string& src) {
  p.host_link.h2d_bytes_per_s = fig(h2d, origin, src);
  p.host_link.d2h_bytes_per_s = fig(d2h, origin, src);
  p.host_link.duplex_bytes_per_s =
      fig(0.9 * (h2d + d2h), Origin::kAssumption,
          "hardware.md: both directions at once ~90% of 2x on healthy Gen5 hosts");
  p.host_link.pageable_bytes_per_s = fig(2.7 * kGB, Origin::kPublished, kSrcPageable);
  p.host_link.switch_uplink_bytes_per_s =
      fig(h2d, Origin::kAssumption,
          "one Gen5 x16 uplink per GPU path (an 8-GPU Gen5 node reached 278 GB/s total H2D, "
          "more than 4 shared uplinks could carry): the GPU link rate");
  p.host_link.root_complex_bytes_per_s =
      fig(278 * kGB / 2, Origin::kPublished,
          "hardware.md: one Gen5 8-GPU node capped at ~278 GB/s total H2D (host side, "
          "cuda-samples #357), split over its 2 sockets");
  p.host.dram_bytes_per_s_per_socket =
      fig(290 * kGB, Origin::kAssumption,
          "hardware.md: 8 DDR5 channels per socket, ~280-300 GB/s per socket (derived); midpoint");
  p.host.cores_per_socket = fig(
      56, Origin::kDatasheet,
      "NVIDIA DGX H100/H200 datasheet: 2x Intel Xeon Platinum 8480C, 56 cores each (also taken for "
      "HGX and DGX B200 hosts)");
}

// NVLink-C2C to a Grace CPU (GH200, GB200), as measured on GH200.
void host_link_c2c(CalibrationProfile& p, Origin origin, const std::string& note) {
  const std::string src =
      "hardware.md: GH200 NVLink-C2C ~346-375 GB/s H2D (midpoint), ~297 GB/s D2H; both at once "
      "about half each, Grace LPDDR5X bound (arXiv 2407.07850, nvbandwidth)" +
      note;
  p.host_link.h2d_bytes_per_s = fig(360 * kGB, origin, src);
  p.host_link.d2h_bytes_per_s = fig(297 * kGB, origin, src);
  p.host_link.duplex_bytes_per_s = fig((360 + 297) * kGB / 2, origin, src);
  p.host_link.pageable_bytes_per_s =
      fig(297 * kGB, Origin::kAssumption,
          "assumption: Grace serves pageable memory over coherent C2C at about the pinned rate");
  p.host_link.switch_uplink_bytes_per_s =
      fig(0.0, Origin::kAssumption, "no PCIe switch on NVLink-C2C systems: unused");
  p.host_link.root_complex_bytes_per_s = fig((360 + 297) * kGB / 2, origin, src);
  p.host.dram_bytes_per_s_per_socket = fig((360 + 297) * kGB / 2, origin, src);
  p.host.cores_per_socket =
      fig(72, Origin::kDatasheet, "NVIDIA Grace CPU datasheet: 72 Arm Neoverse V2 cores");
}

void nvlink_a100(CalibrationProfile& p) {
  const char* src = "hardware.md NVLink table (nccl-tests busbw, large messages)";
  p.nvlink.bytes_per_s_per_gpu = fig(300 * kGB, Origin::kDatasheet, src);
  p.nvlink.ring_all_gather_bus_bytes_per_s = fig(230 * kGB, Origin::kPublished, src);
  p.nvlink.ring_reduce_scatter_bus_bytes_per_s = fig(230 * kGB, Origin::kPublished, src);
  p.nvlink.ring_all_reduce_bus_bytes_per_s = fig(230 * kGB, Origin::kPublished, src);
  p.nvlink.nvls_all_reduce_bus_bytes_per_s =
      fig(0.0, Origin::kDatasheet, "A100 NVSwitch has no NVLink SHARP");
  p.inter_node.nic_bytes_per_s_per_gpu =
      fig(25 * kGB, Origin::kDatasheet, "hardware.md: 25 GB/s per GPU (DGX A100, HDR)");
  p.inter_node.efficiency =
      fig(0.96, Origin::kPublished,
          "NVIDIA/nccl issue 812 (NVIDIA): a DGX A100 with 8 x 200 Gb/s HDR measures 192 GB/s "
          "all-reduce busbw across nodes, 0.96 of its 8 x 25 GB/s; 24 GB/s per HDR NIC is 'what "
          "we see ourselves in general on perfect setups' (NVIDIA/nccl-tests issue 160)");
}

void nvlink_hopper(CalibrationProfile& p) {
  const char* src = "hardware.md NVLink table (nccl-tests busbw, large messages)";
  p.nvlink.bytes_per_s_per_gpu = fig(450 * kGB, Origin::kDatasheet, src);
  p.nvlink.ring_all_gather_bus_bytes_per_s = fig(365 * kGB, Origin::kPublished, src);
  p.nvlink.ring_reduce_scatter_bus_bytes_per_s = fig(365 * kGB, Origin::kPublished, src);
  p.nvlink.ring_all_reduce_bus_bytes_per_s = fig(365 * kGB, Origin::kPublished, src);
  p.nvlink.nvls_all_reduce_bus_bytes_per_s =
      fig(477.5 * kGB, Origin::kPublished, std::string(src) + ": ~475-480, midpoint");
  p.inter_node.nic_bytes_per_s_per_gpu =
      fig(50 * kGB, Origin::kDatasheet, "hardware.md: 50 GB/s per GPU (DGX H100/H200, NDR)");
  p.inter_node.efficiency =
      fig(0.94, Origin::kPublished,
          "NVIDIA/nccl-tests issue 290 (NVIDIA), on H100 nodes with ConnectX-7: 'For NDR @ "
          "400Gbps you should see 46-48GB/s per NIC' through NCCL's rings; 47 of 50 GB/s");
}

void nvlink_blackwell(CalibrationProfile& p) {
  const char* src = "hardware.md NVLink table (nccl-tests busbw, large messages)";
  p.nvlink.bytes_per_s_per_gpu = fig(900 * kGB, Origin::kDatasheet, src);
  const std::string ring = std::string(src) + ": ~700 (model, unconfirmed)";
  p.nvlink.ring_all_gather_bus_bytes_per_s = fig(700 * kGB, Origin::kAssumption, ring);
  p.nvlink.ring_reduce_scatter_bus_bytes_per_s = fig(700 * kGB, Origin::kAssumption, ring);
  p.nvlink.ring_all_reduce_bus_bytes_per_s = fig(700 * kGB, Origin::kAssumption, ring);
  p.nvlink.nvls_all_reduce_bus_bytes_per_s =
      fig(838 * kGB, Origin::kPublished, std::string(src) + ": ~830-846, midpoint");
  p.inter_node.nic_bytes_per_s_per_gpu =
      fig(50 * kGB, Origin::kDatasheet, "hardware.md: 50 GB/s per GPU (DGX B200, NDR)");
  p.inter_node.efficiency = fig(0.74, Origin::kPublished, kSrcNicEff);
}

void no_nvlink(CalibrationProfile& p, double pcie_bytes_per_s, const char* why) {
  p.nvlink.bytes_per_s_per_gpu = fig(0.0, Origin::kAssumption, why);
  const std::string src =
      std::string(why) + "; collectives run over PCIe at about the per-direction link rate";
  p.nvlink.ring_all_gather_bus_bytes_per_s = fig(pcie_bytes_per_s, Origin::kAssumption, src);
  p.nvlink.ring_reduce_scatter_bus_bytes_per_s = fig(pcie_bytes_per_s, Origin::kAssumption, src);
  p.nvlink.ring_all_reduce_bus_bytes_per_s = fig(pcie_bytes_per_s, Origin::kAssumption, src);
  p.nvlink.nvls_all_reduce_bus_bytes_per_s = fig(0.0, Origin::kAssumption, why);
}

// `sms`: the GPU's SM count (datasheet). The depth overhead k0 is derived, not fitted: a tile of
// tm x tn outputs spends 2·tm·tn·k/P on its main loop (P = the SM's share of the dense peak)
// and about tm·tn·e/B writing its C tile (B = the SM's share of HBM bandwidth, e bytes per
// element), so efficiency ~ k / (k + e·P/(2·B)); with e·P the same for bf16, fp16 and fp8 on
// these GPUs, k0 = 2 · bf16 peak / (2 · HBM peak).
void set_gemm(CalibrationProfile& p, double best_tflops, Origin origin, const std::string& src,
              int sms) {
  const double best = best_tflops * kTFLOP / p.gpu.dense_flops_bf16.value;
  p.gemm.curve = best_gemm_curve(best, origin, src);
  p.gemm.sm_count = fig(sms, Origin::kDatasheet, kSrcSms);
  p.gemm.wave_tile_m = fig(256, Origin::kPublished, kSrcWaveTile);
  p.gemm.wave_tile_n = fig(128, Origin::kPublished, kSrcWaveTile);
  const double k0 = 2.0 * p.gpu.dense_flops_bf16.value / (2.0 * p.gpu.hbm_peak_bytes_per_s.value);
  p.gemm.k_overhead_elements =
      fig(std::round(k0), Origin::kAssumption,
          "derived: a tile's C write (e bytes per output at its SM's share of HBM peak) not "
          "overlapped with its main loop (2 FLOPs per output per k at its share of the dense "
          "peak): k0 = e · peak / (2 · HBM peak) with the bf16 peak and e = 2");
  // FP8 GEMMs run their main loop at the FP8 peak and Transformer Engine has them write bf16
  // (general_gemm's output dtype is the activation dtype): the same C tile takes as long to
  // write against a main loop twice as fast.
  const double k0_fp8 =
      2.0 * p.gpu.dense_flops_fp8.value / (2.0 * p.gpu.hbm_peak_bytes_per_s.value);
  p.gemm.k_overhead_elements_fp8 =
      fig(std::round(k0_fp8), Origin::kAssumption,
          "derived as k_overhead_elements with the fp8 peak and e = 2 (bf16 output, Transformer "
          "Engine's FP8 GEMMs write the activation dtype)");
  p.gemm.reference_dim = fig(8192, Origin::kAssumption, kSrcReferenceDim);
  // Hopper and Blackwell GEMMs are persistent kernels with stream-K or split-K scheduling, so a
  // partial last wave of tiles leaves no SMs idle; on earlier GPUs tiles run in whole waves.
  p.gemm.stream_k =
      p.gpu.compute_capability_major() >= 9
          ? fig(1, Origin::kPublished,
                "CUTLASS 3 SM90/SM100 GEMM kernels: persistent, with a stream-K tile scheduler "
                "(Osama et al., Stream-K, PPoPP 2023); cuBLAS bf16 GEMMs on H100 and B200 show no "
                "wave-quantization steps (vllm-project/vllm PRs 23280 and 20646, the GEMM kernel "
                "tables of docs/validation.md: this choice was made after reading them)")
          : fig(0, Origin::kPublished,
                "NVIDIA Deep Learning Performance Guide, Matrix Multiplication Background: "
                "wave quantization measured on A100 (whole waves of 256x128 tiles)");
}

// FP8 GEMMs on Hopper: the same table that gives the bf16 best GEMM (stas00/ml-engineering,
// compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table", FP8
// float8_e4m3fn: torch._scaled_mm, i.e. the cuBLASLt per-tensor-scaled FP8 GEMM that Transformer
// Engine calls; mean of 100 iterations after 50 warm-up, best of a shape sweep). The bf16
// surface takes its table figure at the 8192^3 reference shape, so the FP8 one does too: the
// point stands at 8192^3 and the shape, wave and depth factors scale it as they scale bf16.
// Without a point FP8 GEMMs would run at the bf16 best-GEMM fraction of twice the bf16 peak.
void hopper_fp8_mamf(CalibrationProfile& p, double mamf_tflops, const char* row,
                     Origin origin = Origin::kPublished) {
  p.gemm.points.push_back(
      {.m = 8192,
       .n = 8192,
       .k = 8192,
       .dtype = DType::kFp8,
       .efficiency = fig(mamf_tflops * kTFLOP / p.gpu.dense_flops_fp8.value, origin,
                         std::string("ml-engineering MAMF table, FP8 (float8_e4m3fn, "
                                     "torch._scaled_mm = cuBLASLt): ") +
                             row +
                             "; the best of a shape sweep, taken at the 8192^3 reference "
                             "shape as the bf16 table figure is")});
}

CalibrationProfile a100(bool big) {
  CalibrationProfile p = common(big ? "a100-80gb" : "a100-40gb",
                                big ? "NVIDIA A100-SXM4-80GB" : "NVIDIA A100-SXM4-40GB", 8.0);
  p.gpu.hbm_usable_bytes =
      big ? fig(81920 * kMiB, Origin::kPublished, "hardware.md: 81,920 MiB visible")
          : fig(40441 * kMiB, Origin::kPublished, "hardware.md: 40,441 MiB visible");
  const double peak_bw = (big ? 2039 : 1555) * kGB;
  p.gpu.hbm_peak_bytes_per_s = fig(peak_bw, Origin::kDatasheet, kSrcGpuTable);
  p.gpu.hbm_achievable_bytes_per_s = achievable_from_h200_ratio(peak_bw);
  p.gpu.dense_flops_bf16 = fig(312 * kTFLOP, Origin::kDatasheet, kSrcGpuTable);
  derived_peaks(p, /*has_fp8=*/false);
  // Sustained compute figures (training-like data at the power limit), apart from the host
  // figures above. The MAMF best shape (~271, hardware.md) is measured in short bursts; with
  // random operands an A100 at its 400 W limit runs a large GEMM lower (data-dependent power).
  set_gemm(p, kA100SustainedTflops, Origin::kPublished, kSrcA100Sustained, 108);
  attention_ampere(p, kA100SustainedTflops / 312.0);
  host_link_gen4(p);
  nvlink_a100(p);
  return p;
}

CalibrationProfile h100_sxm() {
  CalibrationProfile p = common("h100-sxm", "NVIDIA H100 80GB HBM3", 9.0);
  p.gpu.hbm_usable_bytes = fig(81090 * kMiB, Origin::kPublished, "hardware.md: 81,090 MiB visible");
  p.gpu.hbm_peak_bytes_per_s = fig(3350 * kGB, Origin::kDatasheet, kSrcGpuTable);
  p.gpu.hbm_achievable_bytes_per_s = achievable_from_h200_ratio(3350 * kGB);
  p.gpu.dense_flops_bf16 = fig(989 * kTFLOP, Origin::kDatasheet, kSrcGpuTable);
  derived_peaks(p, true);
  // The H200's sustained / short-run ratio applied to the H100 SXM's short-run figure: the same
  // GH100 die at the same 700 W limit (assumption; no sustained H100 measurement).
  const double sustained = kH200SustainedTflops / kH200BurstTflops;
  set_gemm(p, 795.0 * sustained, Origin::kAssumption,
           std::string(kSrcMamf) +
               ": ~795 of 989 TFLOP/s in short runs (with normal(0,1) operands cuBLAS reaches "
               "797.8 at 8192^3 on H100 SXM, pranjalssh/fast.cu README, kernel 0), times the "
               "sustained / short-run ratio measured on H200s (667 / 790: " +
               kSrcH200Sustained + ")",
           132);
  hopper_fp8_mamf(p, 1402.6 * sustained,
                  "1402.6 of 1979 TFLOP/s on H100 SXM in short runs, torch 2.7.0+cu126, best shape "
                  "1024x9216x14336, times the bf16 sustained / short-run ratio measured on H200s "
                  "(667 / 790; that FP8 loses the same share at the power limit is an assumption)",
                  Origin::kAssumption);
  attention_hopper(p, 795.0 * sustained / 989.0, /*h100_sxm=*/true);
  host_link_gen5(p, 55.5 * kGB, 56 * kGB, Origin::kPublished,
                 std::string(kSrcHostLink) + ": ~55-56 H2D, ~55-57 D2H, midpoints");
  p.host_link.duplex_bytes_per_s = fig(101 * kGB, Origin::kPublished,
                                       "hardware.md: H100 SXM both directions at once ~101 total");
  nvlink_hopper(p);
  return p;
}

// The H800 SXM5: the H100 SXM5's GH100 die, HBM3 and clocks with NVLink cut to 400 GB/s per GPU
// (200 per direction; NVIDIA H800 datasheet), sold where the H100 was not (DeepSeek's and
// Alibaba's training clusters). Every other figure is the H100 SXM's.
CalibrationProfile h800() {
  CalibrationProfile p = h100_sxm();
  p.provenance.profile_name = "h800";
  p.provenance.gpu_name = "NVIDIA H800";
  p.nvlink.bytes_per_s_per_gpu =
      fig(200 * kGB, Origin::kDatasheet,
          "NVIDIA H800 SXM5 datasheet: NVLink 400 GB/s per GPU, both directions together");
  // DeepSeek-V3 technical report (arXiv 2412.19437, section 3.2.2): on its H800 nodes "NVLink
  // offers a bandwidth of 160 GB/s" per GPU, against 50 GB/s of InfiniBand; DeepEP's intranode
  // kernels reach 153-158 GB/s of it (deepseek-ai/DeepEP README, H800).
  const char* ring =
      "DeepSeek-V3 technical report (arXiv 2412.19437) section 3.2.2: H800 NVLink 'offers a "
      "bandwidth of 160 GB/s' per GPU; deepseek-ai/DeepEP README measures 153-158 GB/s through "
      "NVLink on H800; taken as NCCL's ring bus bandwidth (assumption: the same share of the "
      "line rate as the H100's 365 of 450)";
  p.nvlink.ring_all_gather_bus_bytes_per_s = fig(160 * kGB, Origin::kPublished, ring);
  p.nvlink.ring_reduce_scatter_bus_bytes_per_s = fig(160 * kGB, Origin::kPublished, ring);
  p.nvlink.ring_all_reduce_bus_bytes_per_s = fig(160 * kGB, Origin::kPublished, ring);
  p.nvlink.nvls_all_reduce_bus_bytes_per_s =
      fig(477.5 * kGB * (200.0 / 450.0), Origin::kAssumption,
          "H100 SXM's NVLink SHARP all-reduce busbw (hardware.md, ~475-480) scaled by the line "
          "rates 200 / 450 (assumption: no H800 measurement)");
  return p;
}

CalibrationProfile h100_pcie() {
  CalibrationProfile p = common("h100-pcie", "NVIDIA H100 PCIe", 9.0);
  p.gpu.hbm_usable_bytes = fig(81090 * kMiB, Origin::kAssumption,
                               "assumption: the same visible bytes as H100 SXM (81,090 MiB)");
  p.gpu.hbm_peak_bytes_per_s = fig(2000 * kGB, Origin::kDatasheet, kSrcGpuTable);
  p.gpu.hbm_achievable_bytes_per_s = achievable_from_h200_ratio(2000 * kGB);
  p.gpu.dense_flops_bf16 = fig(756 * kTFLOP, Origin::kDatasheet, kSrcGpuTable);
  derived_peaks(p, true);
  set_gemm(p, 600, Origin::kAssumption, "hardware.md GPUs table: ~600 (assumed 80%)", 114);
  attention_hopper(p, 600.0 / 756.0, /*h100_sxm=*/false);
  host_link_gen5(p, 55.5 * kGB, 56 * kGB, Origin::kAssumption,
                 std::string(kSrcHostLink) + ": the H100 SXM Gen5 x16 measurement applied");
  no_nvlink(p, 55.5 * kGB, "assumption: H100 PCIe server without NVLink bridges");
  p.inter_node.nic_bytes_per_s_per_gpu =
      fig(50 * kGB, Origin::kAssumption, "assumption: one NDR NIC per GPU as on DGX H100");
  return p;
}

CalibrationProfile h200() {
  CalibrationProfile p = common("h200", "NVIDIA H200", 9.0);
  p.gpu.hbm_usable_bytes =
      fig(143771 * kMiB, Origin::kPublished, "hardware.md: 143,771 MiB visible");
  p.gpu.hbm_peak_bytes_per_s = fig(4800 * kGB, Origin::kDatasheet, kSrcGpuTable);
  p.gpu.hbm_achievable_bytes_per_s =
      fig(4300 * kGB, Origin::kPublished, "hardware.md: copy measured ~4.3 TB/s (read+write)");
  p.gpu.dense_flops_bf16 = fig(989 * kTFLOP, Origin::kDatasheet, kSrcGpuTable);
  derived_peaks(p, true);
  set_gemm(p, kH200SustainedTflops, Origin::kMeasured, kSrcH200Sustained, 132);
  p.gemm.points.push_back(
      {.m = 8192,
       .n = 8192,
       .k = 8192,
       .dtype = DType::kBf16,
       .efficiency = fig(kH200SustainedTflops / 989.0, Origin::kMeasured, kSrcH200Sustained)});
  hopper_fp8_mamf(
      p, 1453.4 * kH200SustainedTflops / kH200BurstTflops,
      "1453.4 of 1979 TFLOP/s on H200 SXM in short runs, torch 2.7.1+cu128, best shape "
      "1280x4096x12032, times the bf16 sustained / short-run ratio measured on H200s (667 / "
      "790; that FP8 loses the same share at the power limit is an assumption)",
      Origin::kAssumption);
  attention_hopper(p, kH200SustainedTflops / 989.0, /*h100_sxm=*/false);
  host_link_gen5(p, 55.4 * kGB, 55.1 * kGB, Origin::kPublished,
                 std::string(kSrcHostLink) + ": 55.4 H2D / 55.1 D2H");
  nvlink_hopper(p);
  return p;
}

CalibrationProfile gh200() {
  CalibrationProfile p = common("gh200", "NVIDIA GH200 480GB (96 GB HBM3)", 9.0);
  p.gpu.hbm_usable_bytes =
      fig(96 * 1024 * kMiB * (81090.0 / 81920.0), Origin::kAssumption,
          "96 GB HBM3 part (hardware.md); visible fraction of nominal taken from H100 (81,090 of "
          "81,920 MiB)");
  p.gpu.hbm_peak_bytes_per_s =
      fig(4000 * kGB, Origin::kDatasheet, std::string(kSrcGpuTable) + ": 96 GB HBM3 part");
  p.gpu.hbm_achievable_bytes_per_s =
      fig(3400 * kGB, Origin::kPublished, "hardware.md: STREAM ~3.4 TB/s on the 96 GB part");
  p.gpu.dense_flops_bf16 = fig(989 * kTFLOP, Origin::kDatasheet, kSrcGpuTable);
  derived_peaks(p, true);
  set_gemm(p, 829, Origin::kPublished, std::string(kSrcMamf) + ": ~829 of 989 TFLOP/s", 132);
  hopper_fp8_mamf(p, 1535.0,
                  "1535.0 of 1979 TFLOP/s on GH200 SXM (the 900 W 141 GiB HBM3e part, as the "
                  "bf16 figure), torch 2.6.0+cu126, best shape 1024x14336x14336");
  attention_hopper(p, 829.0 / 989.0, /*h100_sxm=*/false);
  host_link_c2c(p, Origin::kPublished, "");
  no_nvlink(p, 0.0, "one superchip per node: no NVLink peers");
  p.nvlink.ring_all_gather_bus_bytes_per_s.value = 0.0;
  p.nvlink.ring_reduce_scatter_bus_bytes_per_s.value = 0.0;
  p.nvlink.ring_all_reduce_bus_bytes_per_s.value = 0.0;
  p.inter_node.nic_bytes_per_s_per_gpu =
      fig(50 * kGB, Origin::kAssumption, "assumption: one NDR NIC per superchip as on DGX H100");
  return p;
}

CalibrationProfile blackwell(bool grace) {
  CalibrationProfile p =
      common(grace ? "gb200" : "b200", grace ? "NVIDIA GB200" : "NVIDIA B200", 10.0);
  const std::string note =
      grace ? "; GB200's GPU taken as the B200 row of hardware.md (assumption)" : "";
  p.gpu.hbm_usable_bytes = fig(180 * kGB, Origin::kPublished, "hardware.md: ~180 GB visible");
  if (grace) {
    // GB200's GPU carries more HBM3e than the DGX B200's.
    p.gpu.hbm_usable_bytes =
        fig(186 * kGB, Origin::kPublished,
            "NVIDIA/dgxc-benchmarking llama3.1/README.md: GB200 recipes need GPUs 'with at least "
            "186 GB memory each' (B200: 180 GB)");
  }
  p.gpu.hbm_peak_bytes_per_s =
      fig(8000 * kGB, grace ? Origin::kAssumption : Origin::kDatasheet, kSrcGpuTable + note);
  p.gpu.hbm_achievable_bytes_per_s = achievable_from_h200_ratio(8000 * kGB);
  p.gpu.dense_flops_bf16 =
      fig(2250 * kTFLOP, grace ? Origin::kAssumption : Origin::kDatasheet, kSrcGpuTable + note);
  derived_peaks(p, true);
  set_gemm(p, 1745, grace ? Origin::kAssumption : Origin::kPublished,
           std::string(kSrcMamf) + ": ~1,745 of 2,250 TFLOP/s" + note, 148);
  // One run of vLLM's GEMM benchmark on B200 (PR #19566) at 16384x4096x4096, per dtype.
  const auto vllm_19566 = [&](DType dtype, double tflops, const std::string& what) {
    p.gemm.points.push_back(
        {.m = 16384,
         .n = 4096,
         .k = 4096,
         .dtype = dtype,
         .efficiency = fig(tflops * kTFLOP / p.gpu.dense_flops(dtype),
                           grace ? Origin::kAssumption : Origin::kPublished,
                           "vllm-project/vllm PR #19566 (SM100 FP8 CUTLASS tunings; "
                           "benchmarks/kernels/bench_fp8_gemm.py, run on B200 as in PR #18778): " +
                               what + note)});
  };
  // FP8 GEMMs: without a point they would run at the bf16 best-GEMM fraction of the FP8 peak.
  vllm_19566(DType::kFp8, 2544.7,
             "2,545 TFLOP/s for a 16384x4096x4096 per-tensor-scaled FP8 GEMM, quantization not "
             "timed (bf16 at that shape: 1,513)");
  // bf16: the same run's torch (cuBLAS) GEMM, below MAMF's best-of-sweep short-run figure
  // (1,745) that sets the curve's top.
  vllm_19566(DType::kBf16, 1513.0,
             "1,513 TFLOP/s for a 16384x4096x4096 bf16 GEMM (the torch-bf16 column, cuBLAS)");
  attention_by_seq(p, Origin::kAssumption,
                   "; no Blackwell measurement by shape: cuDNN's fused attention on Blackwell "
                   "taken at the same fractions of the dense peak as on H100 (assumption)");
  attention_flash2_blackwell(p, Origin::kAssumption,
                             grace ? "; measured on B200, taken for GB200 (assumption)" : "");
  const char* classic =
      "classic attention's batched QK^T and PV GEMMs at the best large-GEMM efficiency; the "
      "s x s score traffic is charged to HBM by the cost model";
  p.attention.classic_fwd = fig(1745.0 / 2250.0, Origin::kAssumption, classic);
  p.attention.classic_bwd = fig(1745.0 / 2250.0, Origin::kAssumption, classic);
  if (grace) {
    host_link_c2c(p, Origin::kAssumption,
                  "; measured on GH200, taken for GB200's C2C and Grace (assumption)");
  } else {
    host_link_gen5(p, 55 * kGB, 55 * kGB, Origin::kAssumption,
                   "hardware.md: PCIe Gen5 hosts on DGX B200, assume ~55 (unconfirmed)");
    p.host_link.root_complex_bytes_per_s.origin = Origin::kAssumption;
  }
  nvlink_blackwell(p);
  return p;
}

// ---- PCIe workstation/server GPUs and Blackwell Ultra (datasheet figures; no measurements) ----
// L4, L40S, RTX 4090, RTX 5090 and RTX 6000 Ada have no NVLink and reach the host over one PCIe
// x16 link; B300 and GB300 are Blackwell Ultra parts. Where no large-GEMM measurement exists, the
// best GEMM is taken at 80% of the dense peak, as hardware.md assumes for H100 PCIe.

struct PcieGpuSpec {
  const char* kind;
  const char* gpu_name;
  double memory_gib;     // nominal
  double bandwidth_gbs;  // peak memory bandwidth
  double bf16_tflops;    // dense, FP32 accumulate
  int sms;
  bool gen5;
  double compute_capability;  // kSrcComputeCapability
  const char* source;
};

CalibrationProfile pcie_gpu(const PcieGpuSpec& g) {
  CalibrationProfile p = common(g.kind, g.gpu_name, g.compute_capability);
  p.gpu.hbm_usable_bytes =
      fig(g.memory_gib * 1024 * kMiB * (81090.0 / 81920.0), Origin::kAssumption,
          std::string(g.source) +
              "; visible fraction of nominal taken from H100 (81,090 of 81,920 MiB)");
  p.gpu.hbm_peak_bytes_per_s = fig(g.bandwidth_gbs * kGB, Origin::kDatasheet, g.source);
  p.gpu.hbm_achievable_bytes_per_s = achievable_from_h200_ratio(g.bandwidth_gbs * kGB);
  p.gpu.dense_flops_bf16 = fig(g.bf16_tflops * kTFLOP, Origin::kDatasheet,
                               std::string(g.source) + ": dense bf16 with FP32 accumulate");
  derived_peaks(p, true);
  set_gemm(p, 0.8 * g.bf16_tflops, Origin::kAssumption,
           "assumption: best large bf16 GEMM at 80% of the dense peak (hardware.md's H100 PCIe "
           "assumption); no published measurement for this GPU",
           g.sms);
  attention_ampere(p, 0.8);
  if (g.gen5) {
    host_link_gen5(p, 55.5 * kGB, 56 * kGB, Origin::kAssumption,
                   std::string(kSrcHostLink) + ": the H100 SXM Gen5 x16 measurement applied");
  } else {
    host_link_gen4(p);
    p.host_link.switch_uplink_bytes_per_s.source =
        "a PCIe Gen4 x16 switch uplink: the measured per-GPU Gen4 rate (hardware.md, A100)";
  }
  no_nvlink(p, (g.gen5 ? 55.5 : 25.0) * kGB, "PCIe card without NVLink");
  p.inter_node.nic_bytes_per_s_per_gpu =
      fig(25 * kGB, Origin::kAssumption, "assumption: a 200 Gb/s NIC per GPU in PCIe GPU servers");
  return p;
}

const PcieGpuSpec kPcieGpus[] = {
    {"l4", "NVIDIA L4", 24, 300, 121, 58, false, 8.9,
     "NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s, 242 TFLOPS FP16/BF16 with sparsity (121 "
     "dense), PCIe Gen4 x16, 58 SMs"},
    {"l40s", "NVIDIA L40S", 48, 864, 362.05, 142, false, 8.9,
     "NVIDIA L40S datasheet: 48 GB GDDR6 ECC, 864 GB/s, BF16 362.05 TFLOPS dense (733 with "
     "sparsity), PCIe Gen4 x16, 142 SMs"},
    {"rtx4090", "NVIDIA GeForce RTX 4090", 24, 1008, 165.2, 128, false, 8.9,
     "NVIDIA Ada whitepaper (RTX 4090): 24 GB GDDR6X, 1,008 GB/s, 165.2 TFLOPS FP16/BF16 with "
     "FP32 accumulate (330.3 with FP16 accumulate), PCIe Gen4 x16, 128 SMs"},
    {"rtx5090", "NVIDIA GeForce RTX 5090", 32, 1792, 209.5, 170, true, 12.0,
     "NVIDIA RTX Blackwell whitepaper (RTX 5090): 32 GB GDDR7, 1,792 GB/s, 209.5 TFLOPS "
     "FP16/BF16 with FP32 accumulate, PCIe Gen5 x16, 170 SMs"},
    {"rtx6000ada", "NVIDIA RTX 6000 Ada Generation", 48, 960, 364.2, 142, false, 8.9,
     "NVIDIA RTX 6000 Ada datasheet: 48 GB GDDR6 ECC, 960 GB/s, 1,457 TFLOPS FP8 with sparsity "
     "(364.2 bf16 dense), PCIe Gen4 x16, 142 SMs"},
};

// HGX B300's GEMMs as Transformer Engine's GEMM profiling guide measures them on one B300 SXM6
// (NVIDIA/TransformerEngine docs/examples/gemm_profiling/gemm_profiling.rst, benchmarks/gemm/
// benchmark_gemm.py: CUDA events, 10 warm-up and 100 timed iterations; the 12 GEMMs of a hidden
// 4096, FFN 16384 layer at 15,872 tokens). bf16: the four forward shapes' times (M x K x N), which
// are kernel times (bf16 has nothing to quantize). They run 1.49-1.74 PFLOP/s, slower per FLOP as
// the kernel grows (15872x4096x4096 at 1.74, the three larger ones at 1.49-1.53), where B200's
// best-GEMM fraction put B300 at 1.745 for every large shape. FP8: the guide times per-tensor
// (current) scaling's kernels on pre-quantized inputs at 6.812 ms for the whole layer, no shape
// alone, so the FP8 point is placed at the MLP up-projection with the efficiency that makes the
// layer's 12 GEMMs take 6.812 ms on this surface (a fit to the guide's layer total; nothing
// scored uses that layer).
struct MeasuredGemm {
  std::int64_t m, k, n;
  double ms;
  const char* text;
};
constexpr MeasuredGemm kB300Bf16Fprop[] = {
    {15872, 4096, 12288, 1.071, "bf16 15872x4096x12288 (M x K x N) in 1.071 ms"},
    {15872, 4096, 4096, 0.307, "bf16 15872x4096x4096 (M x K x N) in 0.307 ms"},
    {15872, 4096, 16384, 1.393, "bf16 15872x4096x16384 (M x K x N) in 1.393 ms"},
    {15872, 16384, 4096, 1.426, "bf16 15872x16384x4096 (M x K x N) in 1.426 ms"},
};
constexpr double kB300Fp8CurrentLayerMs = 6.812;

void b300_te_gemm_guide(CalibrationProfile& p) {
  const std::string src =
      "NVIDIA/TransformerEngine GEMM profiling guide (docs/examples/gemm_profiling), B300 SXM6 AC";
  p.gemm.points.clear();
  for (const MeasuredGemm& g : kB300Bf16Fprop) {
    const double flops = gemm_flops({.m = g.m, .n = g.n, .k = g.k});
    p.gemm.points.push_back({.m = g.m,
                             .n = g.n,
                             .k = g.k,
                             .dtype = DType::kBf16,
                             .efficiency = fig(flops / (g.ms * 1e-3) / p.gpu.dense_flops_bf16.value,
                                               Origin::kPublished, src + ": " + g.text)});
  }
  // The layer's 12 GEMMs (M x K x N): forward, data gradient, weight gradient.
  const std::int64_t t = 15872;
  const std::int64_t h = 4096;
  const std::int64_t f = 16384;
  const std::int64_t layer[][3] = {{t, h, 3 * h}, {t, h, h}, {t, h, f}, {t, f, h},
                                   {t, 3 * h, h}, {t, h, h}, {t, f, h}, {t, h, f},
                                   {3 * h, t, h}, {h, t, h}, {f, t, h}, {h, t, f}};
  double flops_over_model = 0.0;
  for (const auto& g : layer) {
    const GemmShape s{.m = g[0], .n = g[2], .k = g[1], .dtype = DType::kFp8};
    flops_over_model += gemm_flops(s) / p.gemm.model_efficiency(s);
  }
  const double ratio =
      flops_over_model / (p.gpu.dense_flops_fp8.value * kB300Fp8CurrentLayerMs * 1e-3);
  const GemmShape at{.m = t, .n = f, .k = h, .dtype = DType::kFp8};
  p.gemm.points.push_back(
      {.m = at.m,
       .n = at.n,
       .k = at.k,
       .dtype = DType::kFp8,
       .efficiency =
           fig(ratio * p.gemm.model_efficiency(at), Origin::kPublished,
               src + ": per-tensor FP8 kernels of the layer's 12 GEMMs, pre-quantized, "
                     "6.812 ms per layer; placed at its MLP up-projection, the efficiency "
                     "that gives that layer total on this surface")});
}

// Blackwell Ultra: B300 (HGX, PCIe Gen5 host path) and GB300 (Grace over NVLink-C2C).
CalibrationProfile blackwell_ultra(bool grace) {
  CalibrationProfile p = blackwell(grace);
  p.provenance.profile_name = grace ? "gb300" : "b300";
  p.provenance.gpu_name = grace ? "NVIDIA GB300" : "NVIDIA B300";
  p.gpu.compute_capability = fig(10.3, Origin::kDatasheet, kSrcComputeCapability);
  const char* src =
      "NVIDIA HGX B300 / GB300 NVL72 specifications (glennklockwood.com B300 notes; acecloud.ai "
      "HGX B300 table): 288 GB HBM3e, up to 8 TB/s per GPU";
  p.gpu.hbm_usable_bytes =
      fig(288 * kGB * (180.0 / 192.0), Origin::kAssumption,
          std::string(src) + "; visible fraction of nominal taken from B200 (~180 of 192 GB)");
  if (grace) {
    // The same NVIDIA source that gives GB200 186 GB and B200 180 GB.
    p.gpu.hbm_usable_bytes =
        fig(288 * kGB, Origin::kPublished,
            "NVIDIA/dgxc-benchmarking llama3.1/README.md: GB300 recipes need GPUs 'with at least "
            "288 GB memory each' (GB200: 186 GB, B200: 180 GB)");
  }
  p.gpu.hbm_peak_bytes_per_s = fig(8000 * kGB, Origin::kDatasheet, src);
  p.gpu.hbm_achievable_bytes_per_s = achievable_from_h200_ratio(8000 * kGB);
  const double tflops = grace ? 2500 : 2250;
  p.gpu.dense_flops_bf16 =
      fig(tflops * kTFLOP, Origin::kDatasheet,
          grace ? "GB300 NVL72: 360 PFLOPS dense FP8 for training over 72 GPUs = 5 PFLOPS FP8, 2.5 "
                  "bf16 per GPU (glennklockwood.com B300 notes)"
                : "HGX B300: 36 PFLOPS FP16/BF16 with sparsity over 8 GPUs = 2.25 PFLOPS dense per "
                  "GPU (fibermall.com HGX B300 table; glennklockwood.com)");
  derived_peaks(p, true);
  attention_flash2_blackwell(p, Origin::kAssumption, "; measured on B200, taken for this GPU");
  set_gemm(p, tflops * (1745.0 / 2250.0), Origin::kAssumption,
           std::string(kSrcMamf) + ": B200's ~1,745 of 2,250 TFLOP/s fraction applied", 148);
  for (GemmPoint& g : p.gemm.points) {
    // The B200's FP8 point, as a fraction of this part's FP8 peak.
    g.efficiency.origin = Origin::kAssumption;
    g.efficiency.source += "; B200's fraction applied";
  }
  if (!grace) b300_te_gemm_guide(p);
  return p;
}
}  // namespace

std::vector<std::string> known_gpu_kinds() {
  return {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h800",  "h200",
          "gh200",     "b200",      "gb200",    "b300",      "gb300", "l4",
          "l40s",      "rtx4090",   "rtx5090",  "rtx6000ada"};
}

Result<CalibrationProfile> builtin_profile(std::string_view gpu_kind) {
  if (gpu_kind == "a100-40gb") return a100(false);
  if (gpu_kind == "a100-80gb") return a100(true);
  if (gpu_kind == "h100-sxm") return h100_sxm();
  if (gpu_kind == "h100-pcie") return h100_pcie();
  if (gpu_kind == "h800") return h800();
  if (gpu_kind == "h200") return h200();
  if (gpu_kind == "gh200") return gh200();
  if (gpu_kind == "b200") return blackwell(false);
  if (gpu_kind == "gb200") return blackwell(true);
  if (gpu_kind == "b300") return blackwell_ultra(false);
  if (gpu_kind == "gb300") return blackwell_ultra(true);
  for (const PcieGpuSpec& g : kPcieGpus) {
    if (gpu_kind == g.kind) return pcie_gpu(g);
  }
  std::string known;
  for (const std::string& k : known_gpu_kinds()) known += (known.empty() ? "" : ", ") + k;
  return fail(ErrorCode::kNotFound, "unknown GPU kind '{}' (expected one of: {})", gpu_kind, known);
}

}  // namespace offsim::sim::platform
