// Closed-form sizes of one transformer layer on one rank: the dimensions after tensor/sequence
// parallel sharding, FLOPs of the forward pass, the activations saved for backward under each
// recompute mode (Korthikanti et al. 2022, generalised to GQA, SwiGLU and FlashAttention), which
// forward ops a backward must re-run, and static memory (parameters, gradients, optimizer state)
// per ZeRO stage. The step builder lowers exactly these sizes, so tests can check both.
//
//   models::LayerDims d = models::layer_dims(scenario);
//   models::LayerActivations a = models::layer_activations(d, RecomputeConfig::Mode::kNone, {});
//   std::int64_t saved = a.saved_bytes();   // = s·b·h·(34 + 5·a·s/h) for GPT, t = 1
//   double flops = models::layer_forward_flops(d, /*causal_attention=*/false);
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "models/scenario.h"

namespace offsim::models {

// Per-rank layer dimensions for one micro-batch.
struct LayerDims {
  std::int64_t b = 0;    // micro-batch (sequences)
  std::int64_t s = 0;    // sequence length on this rank (seq_len / cp)
  std::int64_t cp = 1;   // context-parallel ranks sharing each sequence (attention sees cp·s keys)
  std::int64_t h = 0;    // hidden
  std::int64_t d = 0;    // head dim
  std::int64_t a = 0;    // query heads on this rank (heads / tp)
  std::int64_t kvh = 0;  // key/value heads on this rank (kv_heads / tp)
  std::int64_t f = 0;    // ffn hidden on this rank (ffn_hidden / tp)
  std::int64_t v = 0;    // vocabulary rows on this rank (ceil(vocab / tp))
  std::int64_t t = 1;    // tensor parallel size
  std::int64_t sp = 1;   // divisor of the replicated (b·s·h) tensors: tp with SP, else 1
  std::int64_t e = 2;    // bytes per activation element (bf16/fp16; fp8 GEMMs keep bf16 I/O)
  // Bytes per element of the quantized copy an fp8 GEMM saves of its input for the backward
  // (Transformer Engine's Linear / LayerNormLinear keep the fp8 input, not the bf16 one); 0 for
  // bf16 GEMMs, which save the input itself.
  std::int64_t e_q = 0;
  bool gated = false;  // SwiGLU-style gated MLP (two input projections)
  bool dropout = false;
  bool flash = true;  // fused attention (flash or flash2): O and the logsumexp are saved
  ModelArch::AttentionImpl attention = ModelArch::AttentionImpl::kFlash;
  bool bias = false;
  bool layernorm = true;  // LayerNorm (else RMSNorm)
  // Mixture-of-experts FFN (moe == true): f is then unused; the routed experts process `routed`
  // token rows on this rank (its local experts, after the expert-tensor-parallel gather, at the
  // chosen capacity and load), `max_rows` of them in its most-loaded expert.
  bool moe = false;
  std::int64_t experts = 0;  // routed experts (router width)
  std::int64_t top_k = 1;
  std::int64_t local_experts = 1;  // experts / ep
  std::int64_t fe = 0;             // expert FFN hidden on this rank (expert_ffn_hidden / etp)
  std::int64_t fs = 0;             // shared-expert FFN hidden on this rank (all shared / tp)
  std::int64_t moe_tokens = 0;     // tokens this rank routes (tokens / sp)
  std::int64_t routed = 0;         // token rows of this rank's local experts
  std::int64_t max_rows = 0;       // rows of its most-loaded expert
  std::int64_t ep = 1;
  std::int64_t etp = 1;
  bool padded = false;  // experts padded to capacity: no host synchronisation in the dispatch
  // HybridEP: each forward dispatch all-gathers the routing map over the expert-parallel group
  // first (parallelism.moe_dispatcher hybridep).
  bool routing_gather = false;
  // Megatron-Core's all-to-all dispatcher with more than one local expert: the received tokens
  // are sorted by local expert after the dispatch and back before the combine (a copy each).
  bool sorts_chunks = false;
  // Multi-head latent attention (modelled as attention over `a` heads of head dim d = nope +
  // rope): the query/key/value projection as one GEMM of `qkv_width` output columns with the
  // FLOPs of MLA's down and up projections, and a value head dim `vd`.
  std::int64_t qkv_width = 0;  // 0: q() + 2·kv()
  std::int64_t vd = 0;         // 0: d
  // MLA's up projections (q from its latent, or from the hidden state without one; k and v
  // from the kv latent) as one GEMM of tokens × mla_up_n × mla_up_k with their FLOPs, and the
  // latent elements per token they read (the normalised q and kv latents and the rotary key
  // part): what recompute module mla_up_proj keeps and re-runs. 0 without MLA.
  std::int64_t mla_up_n = 0;
  std::int64_t mla_up_k = 0;
  std::int64_t mla_latent = 0;
  std::int64_t tokens() const { return b * s; }
  std::int64_t qkv_n() const { return qkv_width > 0 ? qkv_width : q() + 2 * kv(); }
  std::int64_t o() const { return a * (vd > 0 ? vd : d); }  // out projection input width
  std::int64_t q() const { return a * d; }                  // query width on this rank
  std::int64_t kv() const { return kvh * d; }               // key (= value) width on this rank
};

LayerDims layer_dims(const ModelArch& m, const TrainingConfig& t, const ParallelConfig& p);
inline LayerDims layer_dims(const Scenario& s) {
  return layer_dims(s.model, s.training, s.parallelism);
}
// The dimensions of layer `layer`: layer_dims() plus, for an MoE layer, its expert sizes on
// the rank that holds the most-loaded expert (`useful`: balanced routing and no capacity limit,
// for model FLOPs).
LayerDims layer_dims(const ModelArch& m, const TrainingConfig& t, const ParallelConfig& p,
                     int layer, bool useful = false);

// Rows of each routed expert on the expert-parallel group of one rank (after the expert-TP
// gather) for one micro-batch, from load_imbalance or expert_loads and the capacity factor.
std::vector<double> expert_rows(const ModelArch& m, const TrainingConfig& t,
                                const ParallelConfig& p);

// Expected number of distinct local experts that at least one token of one micro-batch is
// routed to, on the rank holding the most-loaded block of local experts (the rank layer_dims
// describes). Each of the expert-parallel group's T tokens picks expert j with probability
// q_j = rows_j / T (rows before the capacity limit), so the expert is hit with probability
// 1 − (1 − q_j)^T; uniform routing gives E·(1 − (1 − k/E)^T) over all E experts.
double expected_local_experts_hit(const ModelArch& m, const TrainingConfig& t,
                                  const ParallelConfig& p);

// How host-resident routed experts of one MoE layer come back per micro-batch on that rank
// (OffloadPolicy::expert_fetch): whole experts fetched for the forward (kWhole: every local
// expert; kRouted: expected_local_experts_hit rounded up), of them `with_layer` prefetched with
// the layer's parameters (kWhole: all; kRouted: the predictor's picks, none without one) and
// `after_router` fetched once the router has run (kRouted: all without a predictor, else the
// picked experts it did not name: ⌈(1 − hit) · fetched⌉, at most the local experts left unpicked).
// The backward and a recompute prefetch `fetched` experts with the layer.
struct ExpertFetchCounts {
  double expected_hit = 0.0;  // expected distinct local experts hit
  std::int64_t fetched = 0;
  std::int64_t with_layer = 0;
  std::int64_t after_router = 0;
};
ExpertFetchCounts expert_fetch_counts(const Scenario& s);

// The forward ops of a layer, in order.
enum class FwdOp { kLn1, kQkv, kCore, kOutProj, kRes1, kLn2, kMlpWi, kAct, kMlpWo, kRes2 };
inline constexpr int kNumFwdOps = 10;

// The tensors a layer's forward produces that a backward (or a recompute) may need.
enum class Act {
  kX,          // layer input (decoder_layer_input)
  kLn1Out,     // QKV GEMM input
  kQ,          // query_proj
  kK,          // key_proj
  kV,          // value_proj
  kCoreSaved,  // classic: softmax output (+ dropout mask and output); flash: logsumexp
  kContext,    // attention output = out projection input (context)
  kOutProj,    // out projection output (out_proj), needed only to skip its recompute
  kDrop1,      // dropout mask after attention
  kH1,         // residual stream after attention (LN2 input)
  kLn2Out,     // MLP input
  kMlpWi,      // MLP input projection output(s) (mlpwi)
  kActOut,     // activation output = MLP output projection input
  kMlpWo,      // MLP output projection output (mlpwo), needed only to skip its recompute
  kDrop2,      // dropout mask after the MLP
};
inline constexpr int kNumActs = 15;

const char* to_string(Act a);
// The MaxText name of an activation, "" when it has none.
const char* maxtext_name(Act a);

std::int64_t act_bytes(const LayerDims& d, Act a);

struct LayerActivations {
  std::array<bool, kNumActs> saved{};        // kept from forward to backward
  std::array<bool, kNumFwdOps> recompute{};  // forward ops re-run before the layer's backward
  // Recompute module mla_up_proj on an MLA layer: the recompute of kQkv re-runs only the up
  // projections (LayerDims::mla_up_*), from the latents kept for it (`latent_bytes`, on HBM).
  bool mla_up_proj = false;
  std::int64_t latent_bytes = 0;
  // Full recompute with RecomputeConfig::Rerun::kLayer: every forward op re-runs, the entries a
  // recompute otherwise skips (LayerOpEntry::rerun false) and the collectives it does not re-run
  // (LayerOpEntry::comm_recomputed false) included.
  bool whole_layer = false;
  // Recompute module shared_experts on an MoE layer with shared experts: their FC1 output and
  // activation output (`shared_bytes`, part of Act::kMlpWi and Act::kActOut) are not kept, and
  // the recompute re-runs the shared experts' forward (FC1, activation, FC2 and their
  // tensor-parallel collectives), unless the whole MoE FFN is re-run anyway.
  bool shared_experts = false;
  std::int64_t shared_bytes = 0;
  std::int64_t saved_bytes(const LayerDims& d) const;
  std::int64_t recomputed_bytes(const LayerDims& d) const;  // tensors the recompute re-creates
};

// `named_saved`: MaxText names with a placement rule for this layer; they are saved whatever
// the mode (JAX save/offload-these-names semantics). `modules`: what kSelective re-runs
// (RecomputeModule, Megatron-Core's recompute_modules); without it, core_attn.
// `rerun`: what kFull re-runs.
LayerActivations layer_activations(const LayerDims& d, RecomputeConfig::Mode mode,
                                   const RecomputeModules& modules,
                                   const std::set<std::string>& named_saved,
                                   RecomputeConfig::Rerun rerun = RecomputeConfig::Rerun::kNeeded);
inline LayerActivations layer_activations(const LayerDims& d, RecomputeConfig::Mode mode,
                                          const std::set<std::string>& named_saved) {
  return layer_activations(d, mode, RecomputeModules{}, named_saved);
}
// The FLOPs the recompute of forward op `op` re-runs: fwd_op_flops, but MLA's up projections
// alone for kQkv under mla_up_proj.
double recompute_op_flops(const LayerDims& d, const LayerActivations& acts, FwdOp op);

// Useful FLOPs of one forward op of a layer on this rank. Attention counts the full s×s
// products unless `causal_attention` (the Megatron/PaLM MFU convention counts them in full).
double fwd_op_flops(const LayerDims& d, FwdOp op, bool causal_attention);
double layer_forward_flops(const LayerDims& d, bool causal_attention);
// LM head forward FLOPs on this rank: 2·b·s·h·v.
double lm_head_forward_flops(const LayerDims& d);

// Parameters of one layer (whole, not sharded) and of the embedding / head parts.
std::int64_t layer_parameter_count(const ModelArch& m);

// Parameters of one layer held by one tensor-parallel rank: column/row-split weights and the
// biases of column-parallel layers divided by tp; norms and row-parallel biases replicated.
// For an MoE layer (layer index given) the non-expert part: attention, norms, router and shared
// experts.
std::int64_t layer_parameter_count_per_rank(const ModelArch& m, int tp);
std::int64_t layer_parameter_count_per_rank(const ModelArch& m, int tp, int layer);
// The parameter tensors of a dense layer on one tensor-parallel rank, element counts in the order
// Megatron-LM's ParallelTransformerLayer registers them: input norm weight (and bias), the fused
// QKV weight (and bias), the attention output weight (and bias), the post-attention norm, the
// first MLP weight (a gated MLP's two projections fused) (and bias), the second (and bias). They
// sum to layer_parameter_count_per_rank(m, tp). Dense layers with standard attention only.
std::vector<std::int64_t> layer_parameter_tensors_per_rank(const ModelArch& m, int tp);
// Attention parameters of one layer on one tensor-parallel rank (MLA-aware).
std::int64_t attention_parameter_count_per_rank(const ModelArch& m, int tp);
// Parameters of the routed experts of one MoE layer on one rank: experts / ep experts, each
// split over etp (Megatron-Core expert layout).
std::int64_t expert_parameter_count_per_rank(const ModelArch& m, int ep, int etp);
// The weights of a layer's Transformer Engine linear modules on one tensor-parallel rank, what an
// FP8 step quantizes: the attention projections (MLA's included) and the dense MLP or, on an MoE
// layer, the shared experts. Not the norms, biases or router (plain bf16 parameters).
std::int64_t linear_weight_count_per_rank(const ModelArch& m, int tp, int layer);
// The routed experts' GEMM weights on one rank (expert_parameter_count_per_rank without biases).
std::int64_t expert_linear_weight_count_per_rank(const ModelArch& m, int ep, int etp);

// ZeRO / FSDP: which training state each data-parallel rank holds only its 1/dp shard of (over
// grad_dp ranks). ZeRO stage 1 (Megatron's distributed optimizer) shards the optimizer state
// (moments and master weights), stage 2 also the gradients, stage 3 also the parameters
// (Rajbhandari et al., SC'20, "ZeRO", section 5); FSDP's full shard shards all three.
// Activations are never sharded over data parallelism. The one statement of the rule: static
// memory, the step builder, the plan-size estimate and the scenario flags read it.
struct DpSharding {
  bool params = false;
  bool grads = false;
  bool optimizer = false;  // moments and master weights
  bool of(TensorClass cls) const;
};
DpSharding dp_sharding(const ParallelConfig& p);

// Bytes of parameters, gradients and optimizer state one rank holds for `params` parameters of
// its (tensor-sharded) pipeline stage, under ZeRO stage / FSDP over `dp` ranks:
//   params 2Ψ (ZeRO-3/FSDP: 2Ψ/dp), grads 2Ψ (ZeRO-2+: 2Ψ/dp),
//   optimizer 12Ψ with fp32 master weights, 8Ψ without (ZeRO-1+: /dp); shards rounded up.
struct StaticMemory {
  std::int64_t params_bytes = 0;
  std::int64_t grads_bytes = 0;
  std::int64_t optimizer_bytes = 0;  // moments + master weights
  std::int64_t master_bytes = 0;     // of which master weights
};
StaticMemory static_memory(std::int64_t params, const ParallelConfig& p, bool fp32_master,
                           sim::DType compute_dtype);

// The storage dtypes of the training state with the defaults filled in (TensorDtypes).
struct ResolvedDtypes {
  sim::DType params = sim::DType::kBf16;
  sim::DType grads = sim::DType::kBf16;
  std::optional<sim::DType> master;  // none: the optimizer updates `params` in place
  sim::DType first_moment = sim::DType::kFp32;
  sim::DType second_moment = sim::DType::kFp32;
  sim::DType all_gather = sim::DType::kBf16;
  sim::DType reduce_scatter = sim::DType::kBf16;
  // The fp32 master kept as the 16 bits the bf16 weights do not hold
  // (TrainingConfig::store_param_remainders).
  bool master_remainders = false;
  // Bytes per parameter of the master copy as stored: 0 without one, 2 as remainders.
  std::int64_t master_bytes() const;
  // Bytes per parameter of the copy the optimizer updates: the master as stored, or the
  // weights themselves when they are their own master.
  std::int64_t updated_bytes() const;
  // Bytes per parameter of the unsharded state: params + grads + master + moments.
  std::int64_t state_bytes_per_param() const;
};
ResolvedDtypes resolve_dtypes(const TrainingConfig& t);

// The same with explicit dtypes: params dtype(params)·Ψ (ZeRO-3/FSDP: /dp), grads
// dtype(grads)·Ψ (ZeRO-2+: /dp), optimizer (master + two moments)·Ψ (ZeRO-1+: /dp).
StaticMemory static_memory(std::int64_t params, const ParallelConfig& p, const ResolvedDtypes& d);

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace offsim::models
