// CostModel: turns op sizes into engine flows (sim::OpCost) on the resources of a platform.
//
// create() registers, for every simulated rank, its compute resources ("rank0.sm",
// "rank0.hbm_bw"), the routed host-link resources ("node0.gpu0.pcie.h2d", "node0.socket0.rc",
// "node0.socket0.dram", ...), NVLink/NIC resources and the memory pools. Each cost function then
// returns a flow: `work` in natural units (FLOPs, bytes), `max_rate` = the op's achievable rate
// alone, `uses` = resource units per work unit, `latency` = fixed terms, `multiplicity` = the
// rank's multiplicity.
//
//   sim::PlanBuilder b;
//   auto cm = models::CostModel::create(system, profile, {{.rank = 0, .multiplicity = 8}}, b);
//   sim::OpCost c = cm->gemm(0, {.m = 4096, .n = 4096, .k = 4096});
//   sim::Duration t = cm->alone(c);     // time on idle resources
//   sim::PoolId hbm = cm->hbm_pool(0);  // "rank0.hbm"
//
// gemm() and collective() remember their results (a step asks for the same few shapes once per
// layer and micro-batch), so one CostModel is not for concurrent use.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "models/scenario.h"
#include "sim/core/result.h"
#include "sim/core/time.h"
#include "sim/plan/plan.h"
#include "sim/platform/profile.h"
#include "sim/platform/system.h"
#include "sim/platform/topology.h"

namespace offsim::models {

// A representative rank standing for k identical ranks. The represented ranks are
// rank, rank + stride, ..., rank + (k-1)·stride; stride 0 means gpu_count / k (replicas spread
// evenly over the machine, as data-parallel replicas on the outer mesh axis are).
struct SimRank {
  int rank = 0;
  int multiplicity = 1;
  int stride = 0;
};

enum class CollectiveAlgorithm { kRing, kTree, kNvls, kNvlsTree, kNone };
const char* to_string(CollectiveAlgorithm algorithm);
// NCCL's protocols: LL (8 data bytes per 16-byte line with a flag), LL128 (120 of 128 bytes),
// Simple (bulk copies with fences).
enum class NcclProtocol { kLL, kLL128, kSimple };
const char* to_string(NcclProtocol protocol);

// How collective() priced a collective: for reports and tests.
struct CollectivePlan {
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::kNone;
  double bus_bytes_per_byte = 0.0;  // bytes each rank sends per buffer byte
  double alg_bytes_per_s = 0.0;     // buffer bytes per second (algorithm bandwidth)
  sim::Duration latency{0};
  bool crosses_nodes = false;
  // Across units: the group's fewest ranks in one unit (node, or NVLink domain), whose NICs
  // the ring's channels leave the unit through (1 for an all-to-all: each rank its own), and
  // the bytes each rank's NIC port carries per buffer byte (its share of the unit's ring
  // traffic).
  int ranks_per_unit = 0;
  double nic_bytes_per_byte = 0.0;
  NcclProtocol protocol = NcclProtocol::kSimple;
};

// The classic attention of one layer (forward or backward) as the kernels it runs: FLOPs of its
// batched GEMMs (the full s_q × s_kv product), HBM bytes of all its kernels, and the time alone.
struct ClassicAttentionTime {
  double flops = 0.0;
  double bytes = 0.0;
  double seconds = 0.0;
  int kernels = 0;
};

// How a token picks its experts, for the traffic of a deduplicating dispatcher: top_k of
// `experts`, inside the `group_topk` of `groups` equal groups of consecutive experts it scores
// highest (model.moe.router_groups; 0: no groups). Each pick is taken as uniform (force-balanced
// routing: the router's choice does not follow where the experts sit).
struct ExpertRouting {
  std::int64_t experts = 0;
  std::int64_t top_k = 1;
  std::int64_t groups = 0;
  std::int64_t group_topk = 0;
};

// The chance that experts [first, first + count) hold none of a token's picks: over the
// groups' uniform choice of group_topk of them, C(N - x, k) / C(N, k) for the x of the range's
// experts inside the chosen groups' N = group_topk · experts / groups (without groups N = E,
// x = count: the hypergeometric miss).
double expert_range_miss_probability(const ExpertRouting& routing, std::int64_t first,
                                     std::int64_t count);

class CostModel {
 public:
  // Registers resources and pools for the simulated ranks in `builder`. Fails when a rank is out
  // of range or simulated twice, or the system is inconsistent.
  static sim::Result<CostModel> create(const sim::platform::System& system,
                                       const sim::platform::CalibrationProfile& profile,
                                       const std::vector<SimRank>& ranks,
                                       sim::PlanBuilder& builder);

  // Kernels are rooflines: FLOPs at efficiency × dense peak on "rank<r>.sm" (capacity 1 = the
  // whole GPU) and their bytes through "rank<r>.hbm_bw", after the launch gap. GEMM efficiency
  // comes from the profile's surface; A, B and C cross HBM once.
  sim::OpCost gemm(int rank, const sim::GemmShape& shape) const;
  // The GEMMs of a rank's local experts, `groups` in issue order (each `batch` experts of one
  // shape). `streams` 0: one grouped kernel over every expert's tiles (CUTLASS grouped GEMM,
  // torch._grouped_mm): each group at the GEMM surface's efficiency for its shape batched over
  // all the experts (the kernel's waves hold every expert's tiles). `streams` S > 0: one kernel
  // per expert on S streams (Transformer Engine's multi-stream cuBLAS path; S = 1: one after
  // another), so S experts' GEMMs run at a time: each expert's GEMM at the surface's efficiency
  // for S concurrent copies of its shape (the waves of S GEMMs' tiles), the last round's at as
  // many copies as it holds. The times add up, after the launch gap of each stream's kernels.
  sim::OpCost grouped_gemm(int rank, const std::vector<sim::GemmShape>& groups,
                           int streams = 0) const;
  // A kernel `c` of `rank` (gemm, grouped_gemm) `scale` times as long on the same resources: its
  // rate bound divided by `scale`, its use of the rank's SMs per unit of work multiplied by it
  // (its HBM bytes per unit of work kept). See fp8_recipe_gemm_time_scale.
  sim::OpCost scale_kernel_time(int rank, sim::OpCost c, double scale) const;
  // The framework's host thread (one per rank) issues every GPU op in program order; the
  // step builder charges each op the host time below on the rank's host lane, and an op starts
  // no earlier than the CPU issued it (see models/README.md, "Host issue thread"). Counts of
  // what one simulated op stands for in the framework's Python: `eager` PyTorch ops (forward,
  // recompute and optimizer: Python dispatch plus one launch each), `autograd` backward nodes
  // (the engine's dispatch of a node plus its launch) and `launches`: the local experts of a
  // grouped linear, each charged Transformer Engine's measured host time per expert (its
  // backward figure when the op is a backward node, see cost_model.cc).
  struct HostOps {
    double eager = 0.0;
    double autograd = 0.0;
    double launches = 0.0;
  };
  double host_issue_s(const HostOps& ops) const;
  // A device-to-host synchronisation (.item(), .tolist(), event.synchronize() after a D2H copy):
  // the host waits for the stream, then for the copy's round trip.
  sim::Duration host_sync_latency() const;
  // Flash: one fused kernel at the profile's flash efficiency (flash2: its FlashAttention-2
  // curves, see AttentionEfficiency::flash2); Q, K, V, O (and gradients) cross HBM once. Classic
  // (Megatron 2021): the kernels it really runs, one after another (see
  // classic_attention_time): batched GEMMs over the full s×s product at the GEMM surface's
  // efficiency for their shapes, and memory-bound passes over the score matrix (softmax, and
  // with `dropout` the attention-dropout kernel and its one-byte mask).
  sim::OpCost attention(int rank, const sim::AttentionShape& shape, ModelArch::AttentionImpl impl,
                        bool dropout = false) const;
  ClassicAttentionTime classic_attention_time(const sim::AttentionShape& shape, bool dropout) const;
  // Bytes at the profile's memory-bound efficiency (by size) of HBM peak; FLOPs at the fp32 rate.
  sim::OpCost memory_bound(int rank, std::int64_t hbm_bytes, double flops) const;
  // H2D/D2H: every link direction of the route, the link's duplex cap, the socket's root complex
  // and DRAM, plus HBM (the interference figure per byte); pageable copies at the pageable rate.
  sim::OpCost copy(int rank, sim::CopyDirection dir, std::int64_t bytes, bool pinned = true) const;
  // `bytes` = the full (unsharded) buffer; `group` = global ranks in ring order. Priced by
  // message size as NCCL's tuner prices it (NVIDIA/nccl src/graph/tuning.cc): every protocol
  // (LL, LL128, Simple) of every algorithm costs base + steps × per-step latency + bytes /
  // (protocol share × algorithm bandwidth), and the fastest wins; the profile's
  // nvlink.latency_s is the floor. Inside one NVLink domain: ring at the profile's bus
  // bandwidth (algbw = busbw / (2(n-1)/n) for all-reduce, / ((n-1)/n) for all-gather and
  // reduce-scatter), or NVLink SHARP for all-reduce of more than 2 ranks when the profile has
  // it. Across domains: NIC-bound bus bandwidth, ring (2(n-1) steps for all-reduce, of which
  // 2(m-1) cross the network for m domains) or, for all-reduce, tree (2·((n/m-1) + log2 m)
  // steps). Loads the NVLink (or PCIe) and NIC directions and a share of the SMs.
  sim::OpCost collective(int rank, sim::CollectiveKind kind, const std::vector<int>& group,
                         std::int64_t bytes) const;
  CollectivePlan plan_collective(sim::CollectiveKind kind, const std::vector<int>& group,
                                 std::int64_t bytes) const;
  sim::OpCost p2p(int src_rank, int dst_rank, std::int64_t bytes) const;
  // Where one token of an expert-parallel group goes under DeepEP's deduplicated exchange
  // (Megatron-Core's flex dispatcher, deepseek-ai/DeepEP "normal" kernels): the expected bytes
  // per token byte over NVLink and over the NICs, for the routing's experts spread evenly over
  // the group's ranks in order. A token crosses InfiniBand once per other node (NVLink domain)
  // that holds at least one of its experts, to the GPU of the same local index, and NVLink once
  // per other rank of a unit that holds one (sent inside its own unit, forwarded inside the
  // others): per rank, nvlink = p_rank · (n - U), nic = p_unit · (U - 1), for n ranks in U
  // units, p the chance that a rank's or a unit's experts hold one of the token's picks
  // (expert_range_miss_probability).
  struct DeepEpTraffic {
    double nvlink_bytes_per_byte = 0.0;
    double nic_bytes_per_byte = 0.0;
    int remote_units = 0;  // the other NVLink domains of the group (U - 1)
    bool crosses_nodes() const { return remote_units > 0; }
  };
  DeepEpTraffic deepep_traffic(const std::vector<int>& group, const ExpertRouting& routing) const;
  // The expert-parallel kernels that move the tokens: DeepEP's normal kernels (Megatron-Core's
  // deep_ep.Buffer) or NVIDIA's HybridEP.
  enum class EpKernels { kDeepEp, kHybridEp };
  // The share of the NIC line rate the kernels' RDMA sends reach with `remote_units` other
  // NVLink domains in the group, from the libraries' own benchmarks on ConnectX-7 NDR (4096
  // tokens, hidden 7168, top-8 of uniformly routed experts; their "logical" bandwidths count
  // the local node's share, taken out here). With three or more other domains both reach 0.87:
  // HybridEP on H100 (deepseek-ai/DeepEP docs/README_Hybrid-EP.md, kernel only, 16 SMs, BF16
  // dispatch / combine at 32 ranks 57.69 / 57.46 GB/s, 3/4 of it remote: 43.3 / 43.1 GB/s, at 64
  // ranks 49.97 / 49.77, 7/8 remote: 43.7 / 43.5) and DeepEP on H800 (deepseek-ai/DeepEP README,
  // V1 normal kernels, EP32 58 / 57 GB/s: 43.5 / 42.8, EP64 51 / 50: 44.6 / 43.8): 43.5 GB/s
  // of 50. With one other domain (two nodes, half of the logical bytes remote) each GPU sends
  // to a single peer and both fall short of that: HybridEP 0.673 (16 ranks: 71.71 / 62.95 GB/s:
  // 35.9 / 31.5), DeepEP 0.43 (EP16: 43 / 43 GB/s: 21.5). Two other domains: halfway. Never
  // above the profile's inter_node.efficiency (NCCL's rate on the same NICs).
  double ep_rdma_efficiency(EpKernels kernels, int remote_units) const;
  // The rate at which the kernels move tokens out of (and into) a GPU over NVLink: 0.68 of the
  // per-direction NVLink rate, no more than NCCL's ring. The libraries' own intranode
  // benchmarks, kernel time, their logical bandwidths less the GPU's own share (1/n of n
  // ranks): DeepEP V1 on H800 (README, EP8: 153 / 158 GB/s, 134 / 138 of 200: 0.68), HybridEP
  // on B200 (docs/README_Hybrid-EP.md, 8 ranks, 16 SMs: 735 / 674 GB/s, 643 / 590 of 900: 0.685)
  // and on GB200 over 8-36 ranks of one NVLink domain (16 SMs: 0.59-0.73, mean 0.651; 32 SMs:
  // 0.64-0.74, mean 0.695), DeepEP V2 on B200 (README, EP8 at 64 SMs: 726 / 740 GB/s: 0.71).
  double ep_nvlink_bytes_per_s() const;
  // One DeepEP or HybridEP dispatch or combine of `tokens` tokens of `token_bytes` each on
  // `rank`, whose group sends `t` (deepep_traffic) per token byte: the NVLink part at
  // ep_nvlink_bytes_per_s, the NIC part at the NIC rate times ep_rdma_efficiency, both at once
  // (the kernels pipeline the RDMA sends with the NVLink forwarding), the slower setting the
  // time.
  sim::OpCost deepep(int rank, const DeepEpTraffic& t, std::int64_t tokens,
                     std::int64_t token_bytes, EpKernels kernels) const;
  // CPU work of the rank: streams `dram_bytes` through host DRAM, `flops` on its cores. The rank
  // gets its share of the node's physical cores, c = floor(cores per node / local ranks), or
  // fewer with `threads`; bound (DeepSpeed --bind_cores_to_rank), its threads span the
  // k = ceil(c / cores per socket) sockets its cores lie on, unbound they migrate over every
  // socket of the node, while its pinned buffers stay on one socket. A thread then spends
  // (k-1)/k of its time on remote DRAM, each byte taking remote_dram_time_ratio (r) times as
  // long: rate = c · adam_bytes_per_s_per_core / (1 + (k-1)/k · (r-1)), and no more than the
  // socket's DRAM allows.
  struct CpuThreads {
    bool bind_cores = true;
    int threads = 0;      // OMP_NUM_THREADS; 0 = every core of the rank's share
    int local_ranks = 0;  // ranks of the job on one node; 0 = every GPU of the node
    // The part of the rank's cores these threads get (a ZenFlow optimizer worker's share).
    double core_fraction = 1.0;
    // Core time per byte relative to DeepSpeed's CPU Adam, the host figure's own kernel
    // (cpu_adam_time_factor()).
    double time_factor = 1.0;
  };
  // How much longer than DeepSpeed's CPU Adam an optimizer implementation takes per byte.
  static double cpu_adam_time_factor(OffloadPolicy::CpuAdam adam);
  sim::OpCost host_compute(int rank, std::int64_t dram_bytes, double flops,
                           const CpuThreads& threads) const;
  sim::OpCost host_compute(int rank, std::int64_t dram_bytes, double flops) const {
    return host_compute(rank, dram_bytes, flops, CpuThreads{});
  }

  sim::PoolId hbm_pool(int rank) const;  // "rank<r>.hbm", capacity = usable HBM
  // "node<n>.pinned": the host memory of the node, scaled for representatives: an allocation of
  // a rank of multiplicity k stands for k GPUs spread over m nodes, so the pool holds
  // host memory × m / k per representative on it (exactly the node's memory when k = 1).
  sim::PoolId host_pool(int rank) const;
  double peak_flops(sim::DType dtype) const;  // per GPU, for MFU

  // The time an op takes alone on idle resources (its multiplicity's k flows together).
  sim::Duration alone(const sim::OpCost& cost) const;

  // FLOPs of an attention (QK^T and PV, halved when causal; backward 2.5x forward).
  static double attention_flops(const sim::AttentionShape& shape);

  const sim::platform::System& system() const { return system_; }
  const sim::platform::CalibrationProfile& profile() const { return profile_; }
  const sim::platform::Topology& topology() const { return topology_; }
  bool simulated(int rank) const { return ranks_.count(rank) != 0; }

 private:
  struct RankResources {
    int multiplicity = 1;
    sim::ResourceId sm;
    sim::ResourceId hbm_bw;
    std::vector<sim::ResourceId> h2d;  // routed host-link resources, DRAM to GPU
    std::vector<sim::ResourceId> d2h;  // GPU to DRAM
    sim::ResourceId link_h2d;          // the GPU's own host link, per direction (PCIe or C2C)
    sim::ResourceId link_d2h;
    sim::ResourceId link_duplex;  // invalid when the link has no duplex cap
    sim::ResourceId host_cpu;     // "node<n>.socket<s>.cpu"
    sim::ResourceId host_dram;    // "node<n>.socket<s>.dram"
    sim::ResourceId nvlink_tx;    // invalid when the GPU has no NVLink peers
    sim::ResourceId nvlink_rx;
    sim::ResourceId nic_tx;  // invalid on single-node systems
    sim::ResourceId nic_rx;
    sim::PoolId hbm_pool;
    sim::PoolId host_pool;
  };

  CostModel(sim::platform::System system, sim::platform::CalibrationProfile profile,
            sim::platform::Topology topology)
      : system_(std::move(system)), profile_(std::move(profile)), topology_(std::move(topology)) {}
  const RankResources& at(int rank) const;
  sim::OpCost gemm_uncached(int rank, const sim::GemmShape& shape) const;
  // The group's ranks in each unit that holds some (NVLink domains where there is NVLink,
  // nodes otherwise).
  std::map<int, int> ranks_by_unit(const std::vector<int>& group) const;
  sim::OpCost collective_uncached(int rank, sim::CollectiveKind kind, const std::vector<int>& group,
                                  std::int64_t bytes) const;
  sim::OpCost classic_attention(const RankResources& rr, const sim::AttentionShape& shape,
                                bool dropout) const;

  sim::platform::System system_;
  sim::platform::CalibrationProfile profile_;
  sim::platform::Topology topology_;
  std::map<int, RankResources> ranks_;
  std::vector<double> capacities_;  // by ResourceId index, as registered in the builder

  // Memo of gemm() and collective(): every member above is fixed once create() returns, so each
  // is a pure function of its arguments and a remembered result is the one it would compute.
  struct GemmKey {
    int rank = 0;
    sim::GemmShape shape;
    bool operator==(const GemmKey&) const = default;
  };
  struct CollectiveKey {
    int rank = 0;
    sim::CollectiveKind kind = sim::CollectiveKind::kAllReduce;
    std::int64_t bytes = 0;
    std::vector<int> group;
    bool operator==(const CollectiveKey&) const = default;
  };
  struct CollectiveArgs {  // a CollectiveKey's fields without copying the group (lookups)
    int rank = 0;
    sim::CollectiveKind kind = sim::CollectiveKind::kAllReduce;
    std::int64_t bytes = 0;
    const std::vector<int>* group = nullptr;
  };
  struct KeyHash {
    using is_transparent = void;
    std::size_t operator()(const GemmKey& k) const;
    std::size_t operator()(const CollectiveArgs& k) const;
    std::size_t operator()(const CollectiveKey& k) const;
  };
  struct KeyEqual {
    using is_transparent = void;
    bool operator()(const GemmKey& a, const GemmKey& b) const { return a == b; }
    bool operator()(const CollectiveKey& a, const CollectiveKey& b) const { return a == b; }
    bool operator()(const CollectiveKey& a, const CollectiveArgs& b) const;
    bool operator()(const CollectiveArgs& a, const CollectiveKey& b) const { return (*this)(b, a); }
  };
  mutable std::unordered_map<GemmKey, sim::OpCost, KeyHash, KeyEqual> gemm_memo_;
  mutable std::unordered_map<CollectiveKey, sim::OpCost, KeyHash, KeyEqual> collective_memo_;
};

// ---- FP8 as Transformer Engine runs it (TransformerEngine, transformer_engine/pytorch) ----------

// Keyed on the GPU's compute capability as TE encodes it (10 · major + minor: 90 for H100, 100 for
// B200, 103 for B300, 120 for RTX 5090), the profile's gpu.compute_capability.
//
// FP8 GEMMs run from 8.9 (Ada) on (quantization.py _compute_fp8_support).
bool fp8_supported(int compute_capability_x10);
// GPUs whose FP8 GEMMs take non-TN operand layouts (10.0 <= cc < 12.0, or 13.0 and later;
// utils.py is_non_tn_fp8_gemm_supported): there a per-tensor FP8 tensor needs no transposed copy
// for the backward GEMMs; on Ada, Hopper and 12.x every column-wise use reads a transpose.
bool fp8_non_tn_gemm(int compute_capability_x10);
// MXFP8 (1x32 E8M0 block scales): 10.0 <= cc < 12.0 (quantization.py _compute_mxfp8_support:
// "not supported on 12.0+ architectures yet").
bool mxfp8_supported(int compute_capability_x10);
// TE's get_default_fp8_recipe() (quantization.py): MXFP8BlockScaling where MXFP8 is supported,
// Float8CurrentScaling from 12.0 on, DelayedScaling otherwise.
TrainingConfig::Fp8Recipe default_fp8_recipe(int compute_capability_x10);
// HBM bytes of quantizing `elements` bf16 values to FP8 for the GEMMs that read them: a row-wise
// copy (this GEMM) and a column-wise copy (the backward GEMM that reads the tensor the other way),
// per recipe:
// * delayed: one cast(-transpose) kernel reads 2 bytes, computes the amax on the way
//   (nvte_fp8_transpose_dbias / cast_transpose) and writes 1 byte, plus 1 for the transpose on
//   Hopper. After a norm (`from_norm`) the norm kernel itself writes FP8 (normalization.cpp:
//   "Always used fused kernel for FP8 delayed scaling"), leaving only the transpose (read 1,
//   write 1) on Hopper and nothing on Blackwell.
// * current: the scale needs the tensor's amax first: an amax pass (read 2, nvte_compute_amax),
//   then the cast as above; after a norm, the norm kernel produces the amax as it writes its
//   bf16 output (create_hp_tensor_with_amax, quantize_with_amax), so only the cast remains.
// * mxfp8: one kernel reads 2 and writes row-wise and column-wise data (1 + 1) and their E8M0
//   scales (1 byte per 32 values each way); not fused with the norm unless
//   NVTE_NORM_FWD_USE_CUDNN is set (off by default).
// * blockwise: one kernel reads 2 and writes 1x128-block row-wise and transposed column-wise
//   data (1 + 1) and fp32 scales (4 bytes per 128 values each way); never fused with the norm.
// The scale computation (a one-thread kernel) and, for current scaling with sequence
// parallelism, the scalar amax all-reduce over the TP group are not charged.
std::int64_t fp8_quantize_bytes(TrainingConfig::Fp8Recipe recipe, bool non_tn, bool from_norm,
                                std::int64_t elements);

// How much longer an FP8 GEMM kernel runs under `recipe` than the per-tensor-scaled kernel the
// profile's FP8 surface measures (scale_kernel_time applies it). Measured or derived from
// Transformer Engine's GEMM profiling guide (docs/examples/gemm_profiling/gemm_profiling.rst,
// benchmarks/gemm/benchmark_gemm.py, the 12 GEMMs of a hidden-4096, FFN-16384 layer at 15,872
// tokens; see cost_model.cc): MXFP8 1.051 on Blackwell (also the Float8BlockScaling recipe
// there, which TE runs as MXFP8 GEMMs), blockwise 1.22 on Hopper; 1 for delayed and current
// scaling.
double fp8_recipe_gemm_time_scale(TrainingConfig::Fp8Recipe recipe, int compute_capability_x10);

// Bytes Transformer Engine keeps per FP8 weight of `elements` values, the copies its GEMMs read:
// delayed and current scaling a row-wise copy, and on Ada and Hopper (no non-TN FP8 GEMMs) its
// transpose for the dgrad; mxfp8 row-wise and column-wise data with one E8M0 scale per 32 values
// each way; blockwise row-wise and column-wise data with one fp32 scale per 128x128 block each
// way (Float8BlockScaling's weight blocks). With bf16 parameters these are the workspaces TE
// caches across micro-batches (is_first_microbatch); with FP8 parameters they are the weights.
std::int64_t fp8_weight_copy_bytes(TrainingConfig::Fp8Recipe recipe, bool non_tn,
                                   std::int64_t elements);

}  // namespace offsim::models
