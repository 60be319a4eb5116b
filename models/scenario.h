// Scenario: the plain description of one training setup — model architecture, hardware, training
// configuration, parallel layout, recompute choice and offload policy — plus its checks, the
// model catalogue, Hugging Face config import and the named offload presets.
//
//   OFFSIM_ASSIGN_OR_RETURN(models::ModelArch arch, models::find_model("llama3-70b"));
//   models::Scenario s{.name = "70b", .model = arch};
//   s.hardware.system = "dgx-h100";
//   s.training = {.global_batch = 64, .micro_batch = 1, .seq_len = 4096};
//   s.parallelism = {.dp = 1, .tp = 8};
//   OFFSIM_ASSIGN_OR_RETURN(s.offload, models::offload_preset("megatron_activation_offload", {}));
//   OFFSIM_RETURN_IF_ERROR(models::check_scenario(s));
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sim/core/result.h"
#include "sim/plan/plan.h"

namespace offsim::models {

// Mixture-of-experts feed-forward layers (routed experts chosen per token by a top-k router,
// plus optional shared experts every token passes through). experts == 0: a dense model.
struct MoeConfig {
  std::int64_t experts = 0;            // routed experts per MoE layer
  std::int64_t top_k = 1;              // experts each token is routed to
  std::int64_t expert_ffn_hidden = 0;  // FFN hidden size of one expert
  std::int64_t shared_experts = 0;     // shared experts per MoE layer
  std::int64_t shared_ffn_hidden = 0;  // FFN hidden of one shared expert; 0 = expert_ffn_hidden
  std::int64_t first_k_dense = 0;  // the first k layers are dense (DeepSeek first_k_dense_replace)
  std::int64_t layer_freq = 1;     // then every layer_freq-th layer is MoE (moe_layer_freq)
  // Expert capacity = capacity_factor × mean tokens per expert; tokens above it are dropped.
  // 0 = dropless (Megatron's default).
  double capacity_factor = 0.0;
  // Every expert's input padded to its capacity (Megatron-Core's
  // --moe-pad-expert-input-to-capacity, "drop and pad"; needs capacity_factor): each expert
  // runs capacity rows and the all-to-alls carry them all, and the token dispatcher knows its
  // split sizes without copying the per-expert counts to the host, so the forward's host
  // synchronisation goes away (static shapes: the whole MoE layer can be captured in a CUDA graph).
  bool pad_to_capacity = false;
  // Tokens of the most-loaded expert over the mean (>= 1); it and the rank holding it set the
  // step. Ignored when expert_loads is given.
  double load_imbalance = 1.0;
  // Measured per-expert loads: token-expert assignments of one micro-batch on one rank
  // (must sum to micro_batch × seq_len × top_k), one entry per routed expert.
  std::vector<double> expert_loads;
  bool router_bias = false;  // a bias on the router (gpt-oss)
  // Group-limited routing (DeepSeek-V3's node-limited routing: Hugging Face n_group and
  // topk_group, Megatron-Core --moe-router-num-groups and --moe-router-group-topk): the experts
  // in `router_groups` equal groups of consecutive experts, each token's top_k picked inside
  // the `router_group_topk` groups it scores highest. 0: not group-limited. It changes which
  // ranks and nodes a token reaches, hence the bytes of a deduplicating dispatcher
  // (parallelism.moe_dispatcher deepep).
  std::int64_t router_groups = 0;
  std::int64_t router_group_topk = 0;
};

// DeepSeek-V2/V3 multi-head latent attention: low-rank query and key/value projections.
// kv_lora_rank == 0: standard (grouped-query) attention.
struct MlaConfig {
  std::int64_t q_lora_rank = 0;  // 0 = full-rank query projection
  std::int64_t kv_lora_rank = 0;
  std::int64_t qk_nope_head_dim = 0;
  std::int64_t qk_rope_head_dim = 0;
  std::int64_t v_head_dim = 0;
};

// A decoder-only transformer, dense or mixture-of-experts.
struct ModelArch {
  enum class Activation { kGelu, kSwiGlu };
  enum class Norm { kLayerNorm, kRmsNorm };
  // kFlash: the fused attention of the framework's default backend, at the profile's flash
  // figures (cuDNN's fused attention on Hopper and Blackwell). kFlash2: FlashAttention-2's
  // kernels (Ampere code, run as they are on later GPUs) at the profile's flash2 curves where it
  // has them, else its flash figures. kClassic: unfused batched GEMMs and score passes.
  enum class AttentionImpl { kFlash, kClassic, kFlash2 };

  std::string name;
  std::int64_t vocab_size = 0;
  std::int64_t hidden = 0;
  std::int64_t layers = 0;
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;  // == heads for multi-head attention, fewer for GQA
  std::int64_t head_dim = 0;  // usually hidden / heads
  std::int64_t ffn_hidden = 0;
  Activation activation = Activation::kGelu;
  Norm norm = Norm::kLayerNorm;
  bool tied_embeddings = false;
  AttentionImpl attention = AttentionImpl::kFlash;
  // GPT-2/3 style details (Megatron GPT): biases on every linear layer, learned absolute
  // position embeddings of `max_positions` rows, dropout after attention and MLP (its masks are
  // saved activations, one byte per element, as in Korthikanti et al. 2022).
  bool linear_bias = false;
  std::int64_t max_positions = 0;  // 0: rotary / no learned position table
  bool dropout = false;
  MoeConfig moe;
  MlaConfig mla;
  // Multi-token-prediction modules (DeepSeek-V3 num_nextn_predict_layers, Megatron-Core
  // mtp_num_layers): counted in mtp_parameter_count(), not in parameter_count(). The step builds
  // them on the loss's chunk as Megatron-Core's MultiTokenPredictionLayer runs them (models/
  // README.md, "Multi-token prediction"); 0 leaves them out.
  std::int64_t mtp_layers = 0;
};

// Storage dtypes of the training state, by tensor class (training.dtypes in a scenario). An unset
// entry takes the default of the compute dtype (see resolve_dtypes in formulas.h): params and
// grads in the compute dtype (bf16 under fp8), fp32 master weights (fp32_master_weights), fp32
// moments, collectives in the dtype of what they move.
struct TensorDtypes {
  std::optional<sim::DType> params;  // model weights as stored (sharded under ZeRO-3/FSDP)
  std::optional<sim::DType> grads;   // accumulated gradients (Megatron main_grad: fp32)
  // The optimizer's own copy of the weights. Equal to params: no separate copy (fp32 weights
  // are their own master, as in MaxText's default weight_dtype=float32 or FSDP2's sharded fp32
  // parameters).
  std::optional<sim::DType> master;
  std::optional<sim::DType> first_moment;    // Adam m (optax mu_dtype)
  std::optional<sim::DType> second_moment;   // Adam v
  std::optional<sim::DType> all_gather;      // parameters on the wire and gathered (ZeRO-3/FSDP)
  std::optional<sim::DType> reduce_scatter;  // gradients on the wire (all-reduce/reduce-scatter)
  bool operator==(const TensorDtypes&) const = default;
};

// What a per-layer CUDA graph captures (Megatron-Core's CudaGraphModule, --cuda-graph-modules):
//   attn            TransformerLayer._forward_attention: input norm, attention, residual add
//   mlp             TransformerLayer._forward_mlp of a dense layer
//   moe_router      an MoE layer's _forward_mlp up to the router: the shared experts (when not
//                   overlapped with the expert-parallel communication) and the router
//   moe_preprocess  MoELayer.preprocess: the token dispatcher's per-expert counts (with
//                   moe_router); the host synchronisation after it stays outside the graph
//   moe             an MoE layer's whole _forward_mlp: router, dispatch, experts, combine
//                   (experts padded to capacity only: model.moe.pad_to_capacity)
//   layer           the whole TransformerLayer as one graph (Megatron-Core's empty module
//                   list, or the deprecated scope "full"); alone, and on MoE layers padded only
enum class CudaGraphModule { kAttn, kMlp, kMoeRouter, kMoePreprocess, kMoe, kLayer };
inline constexpr int kNumCudaGraphModules = 6;

// A set of CudaGraphModule values.
struct CudaGraphModules {
  unsigned bits = 0;
  bool has(CudaGraphModule m) const { return (bits & of(m)) != 0; }
  void add(CudaGraphModule m) { bits |= of(m); }
  static unsigned of(CudaGraphModule m) { return 1U << static_cast<unsigned>(m); }
  bool empty() const { return bits == 0; }
  bool operator==(const CudaGraphModules&) const = default;
};

struct TrainingConfig {
  enum class Optimizer { kAdamW };

  std::int64_t global_batch = 0;  // sequences per optimizer step, over all data-parallel ranks
  std::int64_t micro_batch = 1;   // sequences per forward/backward pass on one rank
  std::int64_t seq_len = 0;
  sim::DType compute_dtype = sim::DType::kBf16;  // GEMM precision; kFp8 = fp8 GEMMs, bf16 rest
  // How Transformer Engine scales FP8 tensors (training.fp8_recipe; only with fp8): kDelayed,
  // per-tensor scales from the amax history (DelayedScaling); kCurrent, per-tensor scales from
  // the tensor's own amax (Float8CurrentScaling, Megatron-Bridge "FP8-CS"); kMxfp8, E8M0 scales
  // per 1x32 block (MXFP8BlockScaling, Blackwell only, "FP8-MX"); kBlockwise, fp32 scales per
  // 1x128 (activations, gradients) and 128x128 (weights) block (Float8BlockScaling, DeepSeek-V3).
  // Unset: TE's get_default_fp8_recipe(), mxfp8 on Blackwell, delayed otherwise (set by resolve).
  enum class Fp8Recipe { kDelayed, kCurrent, kMxfp8, kBlockwise };
  std::optional<Fp8Recipe> fp8_recipe;
  bool fp32_master_weights = true;
  // Transformer Engine's FusedAdam with store_param_remainders (Megatron-Core's default with
  // --use-precision-aware-optimizer on TE >= 2.1, when TE holds the master: bf16 weights, no FP8
  // or delayed-scaling FP8): the fp32 master is kept as the 16 low-order bits the bf16 weights
  // do not hold, 2 bytes per parameter; the update reads and writes both halves. Needs bf16
  // weights, an fp32 master and the optimizer on the GPU.
  bool store_param_remainders = false;
  Optimizer optimizer = Optimizer::kAdamW;
  // The LM head and cross entropy over the micro-batch's tokens in this many chunks. 1: the
  // fp32 logits of the whole micro-batch are materialised and kept for the backward (Megatron,
  // plain PyTorch). N > 1: chunked/fused linear cross entropy (Liger-Kernel, torchtune, MaxText
  // vocabulary tiling): each chunk's logits are made, turned into the loss and its gradients in
  // the forward, and freed, so only one chunk's logits is ever live; the backward only scales the
  // saved gradient of the head's input.
  std::int64_t loss_chunks = 1;
  // Weight gradients accumulate over micro-batches inside the wgrad GEMM (Megatron
  // --gradient-accumulation-fusion, Transformer Engine). false: a separate add per layer and
  // micro-batch reads and writes the accumulated gradient (Megatron-LM 2021's main_grad hook).
  bool gradient_accumulation_fusion = true;
  // How an MoE layer's grouped GEMMs run (training.moe_grouped_gemm). kMultiStream: Transformer
  // Engine's GroupedLinear (Megatron-Core's TEGroupedMLP), one cuBLAS GEMM per local expert
  // issued round-robin on four compute streams, so up to four experts' GEMMs share the SMs at a
  // time (multi_stream_cublas_gemm, the default unless NVTE_USE_CUTLASS_GROUPED_GEMM=1 on
  // Hopper). kSingleKernel: one grouped kernel over every expert's tiles (CUTLASS grouped GEMM,
  // torch._grouped_mm as torchtitan runs it, MaxText's megablox / ragged_dot). kSequential: one
  // GEMM per expert, one after another on the compute stream (Megatron-Core's SequentialMLP
  // without --moe-grouped-gemm).
  enum class MoeGroupedGemm { kMultiStream, kSingleKernel, kSequential };
  MoeGroupedGemm moe_grouped_gemm = MoeGroupedGemm::kMultiStream;
  // Per-layer CUDA graphs (Megatron-Core's --cuda-graph-impl transformer_engine or local with
  // --cuda-graph-modules): each pass of a captured module in every layer is one graph replay on
  // the host instead of its ops' launches (models/README.md "CUDA graphs"). Empty: no graphs.
  CudaGraphModules cuda_graph_modules;
  // Per-class storage dtypes; `dtype_preset` names the framework convention they came from
  // (dtype_preset()), empty when set by hand or left at the defaults.
  TensorDtypes dtypes;
  std::string dtype_preset;
};

struct ParallelConfig {
  enum class PipelineSchedule { k1F1B, kInterleaved1F1B };

  int dp = 1;
  int tp = 1;
  int pp = 1;
  bool sequence_parallel = false;
  int zero_stage = 0;  // 0..3 (DeepSpeed ZeRO / Megatron distributed optimizer = 1)
  // pjit/FSDP-style sharding over the data-parallel axis: parameters, gradients and optimizer
  // state sharded like ZeRO-3, parameters all-gathered per layer before forward and backward.
  bool fsdp = false;
  // Hybrid sharding (PyTorch FSDP's HSDP, torchtitan's data_parallel_replicate_degree beside
  // data_parallel_shard_degree, MaxText's data axis beside fsdp): the sharded state is split
  // over groups of `fsdp_shard` data-parallel ranks and replicated over the grad_dp / fsdp_shard
  // groups; parameters are gathered within a group, gradients reduce-scattered within it and
  // all-reduced across the replicas. 0: one group of every data-parallel rank.
  int fsdp_shard = 0;
  // Megatron-Core's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-
  // split: the embedding and the loss each take a transformer layer's place when the layers
  // are split over the pipeline chunks (PipelineLayout), so that (layers + 2) / (pp · v) slots
  // per chunk balance the stages (Llama 3 405B: 126 layers + 2 over 16 stages × 8 chunks).
  bool account_for_embedding_in_pipeline_split = false;
  bool account_for_loss_in_pipeline_split = false;
  // Megatron-Core's pipeline_model_parallel_layout (--pipeline-model-parallel-layout,
  // megatron/core/transformer/pipeline_parallel_layer_layout.py): what each virtual pipeline
  // stage builds, in model order (entry i is chunk i / pp of stage i % pp). The embedding is the
  // first entry's, the loss the last entry's; decoder layers in order; the multi-token-prediction
  // modules with the loss. Empty: the even split (with the account_for_* slots above).
  struct StageLayout {
    int decoders = 0;
    bool embedding = false;
    int mtp = 0;
    bool loss = false;
  };
  std::vector<StageLayout> layout;
  // When the backward's parameter all-gathers (ZeRO-3, FSDP) are issued, as PyTorch FSDP's
  // BackwardPrefetch names the choice (torch.distributed.fsdp, _runtime_utils.py). kPre (FSDP's
  // default BACKWARD_PRE; FSDP2 and DeepSpeed ZeRO-3 prefetch the same way): the next layer's
  // all-gather is issued in the current layer's pre-backward hook, queued ahead of the current
  // layer's reduce-scatter. kPost (BACKWARD_POST): issued once the current layer's gradients are
  // computed, still ahead of its reduce-scatter. kNone (backward_prefetch=None, DeepSpeed's
  // stage3_prefetch_bucket_size 0): each layer's all-gather is issued in its own pre-backward
  // hook, behind the previous layer's reduce-scatter. Parameter offload's H2D copies follow the
  // same order.
  enum class BackwardPrefetch { kPre, kPost, kNone };
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kPre;
  // How ZeRO-3 / FSDP all-gathers a layer's parameters. kPerLayer: one all-gather of the layer's
  // flat shard (PyTorch FSDP's flat parameters, FSDP2, DeepSpeed's coalesced fetch since 2021,
  // Megatron-FSDP). kPerTensorSynchronized: DeepSpeed ZeRO-3 as released in early 2021 (v0.3.x,
  // runtime/zero/partition_parameters.py _allgather_param): one all-gather per parameter tensor,
  // each issued after torch.cuda.synchronize(), so it waits for all the GPU work issued before
  // it and for the host's round trip, and overlaps no compute (the backward's fetches are issued
  // as with BackwardPrefetch::kNone, whatever backward_prefetch says: the device synchronisation
  // before each module waits for a prefetch too); with a list of outputs, whose per-rank copies
  // cost one cudaMemcpyAsync each; and a layer whose forward is recomputed gathers twice in the
  // backward (the recomputed forward's hooks, then the backward's). Its gradients are reduced
  // the same way (_reduce_scatter_gradients): one reduce-scatter per parameter tensor with a
  // list of inputs, copied into a flat buffer one cudaMemcpyAsync per rank.
  enum class ParamGather { kPerLayer, kPerTensorSynchronized };
  ParamGather param_gather = ParamGather::kPerLayer;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int virtual_stages = 1;  // model chunks per pipeline stage (interleaved 1F1B)
  // Data-parallel gradient reduction overlapped with the backward, bucket by bucket (DDP,
  // Megatron --overlap-grad-reduce). false: reduced after the whole backward (Megatron-LM 2021).
  bool overlap_grad_reduce = true;
  // Pipeline point-to-point transfers overlapped with compute (their own stream). false: every
  // transfer blocks the compute stream (Megatron-LM 2021 synchronized the device after each
  // batch_isend_irecv), with its scatter-gather of tensor-parallel slices.
  bool overlap_p2p_comm = true;
  // A stage's forward output is freed once it is sent, only its autograd node kept for the
  // backward (Megatron-Core's deallocate_output_tensor and custom_backward,
  // megatron/core/pipeline_parallel/schedules.py; Megatron-LM's training sets
  // config.deallocate_pipeline_outputs = True, megatron/training/arguments.py). The layer
  // inputs a backward reads (the received input among them) stay saved either way. false: the
  // output stays on HBM from its send to the end of the chunk's backward, as Megatron-Core's
  // ModelParallelConfig default (False) and torch.distributed.pipelining (the stage output in
  // fwd_cache until backward_one_chunk) keep it.
  bool deallocate_pipeline_outputs = true;
  // Expert parallelism (MoE): routed experts split over `ep` ranks and each expert's FFN over
  // `etp` ranks. Megatron-Core's parallel folding: ep · etp divides tp · cp · dp (the stage's
  // ranks; parallel_state.py: expert_data_parallel_size = world / (etp · ep · pp)), the remaining
  // tp · cp · dp / (ep · etp) ranks are the expert data-parallel group.
  int ep = 1;
  int etp = 1;
  // Megatron-Core --moe-shared-expert-overlap (default off): the shared experts' forward runs
  // on a stream of its own, beside the token dispatch, the routed experts and the combine.
  bool moe_shared_expert_overlap = false;
  // Megatron-Core --overlap-moe-expert-parallel-comm (default off): in the 1F1B steady state the
  // forward of one micro-batch and the backward of another run as one combined step, layer by
  // layer (forward layer i beside backward layer n-1-i of the chunks), each MoE all-to-all on a
  // communication stream of its own overlapping the other pass's computation
  // (megatron/core/models/common/model_chunk_schedule_plan.py TransformerLayerSchedulePlan.run;
  // one extra warm-up forward, pipeline_parallel/schedules.py). Needs ep > 1 and, with pp > 1,
  // the interleaved schedule, as Megatron-Core's TransformerConfig asks.
  bool moe_a2a_overlap = false;
  // The token dispatcher of an expert-parallel MoE layer. kAllToAll: Megatron-Core's
  // MoEAlltoAllTokenDispatcher, one NCCL all-to-all per direction carrying each token once per
  // routed expert (and one of its fp32 probabilities). kDeepEp: Megatron-Core's flex
  // dispatcher with DeepEP (--moe-token-dispatcher-type flex --moe-enable-deepep): a token
  // crosses NVLink once per destination rank and InfiniBand once per destination node (it is
  // forwarded inside that node over NVLink), with its top-k indices and probabilities in the
  // same kernel (deepseek-ai/DeepEP, "normal" kernels); the combine returns one partial sum per
  // rank and node the same way. kHybridEp: the flex dispatcher with NVIDIA's HybridEP backend
  // (--moe-flex-dispatcher-backend hybridep; deepseek-ai/DeepEP docs/Hybrid-EP_Implementation.md):
  // the same hierarchical path (a token once per destination NVLink domain over RDMA, forwarded
  // inside it over NVLink, once per destination rank), priced as DeepEP's; unlike DeepEP it
  // supports experts padded to capacity, whose permuted size is known on the host, so the
  // dispatch then needs no host synchronisation (Megatron-Core _HybridEPManager).
  enum class MoeDispatcher { kAllToAll, kDeepEp, kHybridEp };
  MoeDispatcher moe_dispatcher = MoeDispatcher::kAllToAll;
  // Megatron-Core's --delay-wgrad-compute (Megatron-Bridge sets it with moe_a2a_overlap): in a
  // combined step the backward's expert MLP runs its data gradients first and its weight
  // gradients (TransformerLayerNode.backward_dw) after them, and the dispatch's all-to-all back
  // to the tokens waits for the data gradients only, so it overlaps the weight gradients. Needs
  // moe_a2a_overlap, as Megatron-Core's TransformerConfig asks.
  bool delay_wgrad_compute = false;
  // Context parallelism (Megatron-Core --context-parallel-size, Transformer Engine's attention
  // with a CP group): each sequence split over `cp` ranks (tp fastest, then cp, then dp), every
  // rank holding seq_len / cp tokens of every layer; the ranks of a CP group join the
  // data-parallel gradient reduction and optimizer sharding (dp · cp ranks).
  int cp = 1;
  // How attention sees the whole sequence (TE cp_comm_type). kP2P: ring attention, K and V
  // blocks passed around the CP ring in cp − 1 steps overlapped with the per-block attention,
  // the sequence in 2·cp chunks for causal load balance (Megatron's default). kA2A: all-to-alls
  // of Q, K, V and of the output trade the sequence split for a head split (DeepSpeed-Ulysses).
  enum class CpCommType { kP2P, kA2A };
  CpCommType cp_comm_type = CpCommType::kP2P;
  // The backward of a column-parallel linear launches its input-gradient all-reduce (with
  // sequence parallelism: reduce-scatter) asynchronously and runs the weight-gradient GEMM
  // meanwhile (Megatron-Core's LinearWithGradAccumulationAndAsyncCommunication, always on
  // today). false: after the wgrad GEMM on the compute stream (Megatron-LM 2021). The default
  // stays false, as every validation table and example was scored with it; the rows whose
  // recipes run Megatron-Core set it to true (the steady-state fast path proves the period of
  // plans with it: SteadyState.TakenForGpt3WithAsynchronousTensorParallelGradientReduce).
  bool tp_async_grad_reduce = false;
  // Transformer Engine's tp_comm_overlap with userbuffers (Megatron-Core --tp-comm-overlap,
  // default off; Megatron-Bridge's performance recipes turn it on): with sequence parallelism,
  // the all-gather before a column-parallel GEMM (and before the row-parallel dgrad) runs as a
  // ring exchange of tp chunks on the copy engines, each chunk's GEMM as soon as its rows
  // arrive, and the reduce-scatter after a row-parallel GEMM is pipelined chunk by chunk.
  bool tp_comm_overlap = false;
};

// Ranks that reduce a parameter's gradient and shard its optimizer state: data parallel times
// context parallel (Megatron-Core's data-parallel group with context parallelism).
inline int grad_dp(const ParallelConfig& p) { return p.dp * p.cp; }
// Ranks over which sharded state is split (ZeRO / FSDP): the data-parallel ranks, or with hybrid
// sharding one group of `fsdp_shard` of them.
inline int shard_dp(const ParallelConfig& p) {
  return p.fsdp_shard > 0 ? p.fsdp_shard : grad_dp(p);
}
// Ranks that reduce a routed expert's gradient and shard its optimizer state (and, with ZeRO-3 or
// FSDP, its weights): what the expert-parallel grid leaves of the stage's tp · cp · dp ranks (the
// expert-DP group).
inline int expert_dp(const ParallelConfig& p) { return p.tp * p.cp * p.dp / (p.ep * p.etp); }
// Of those, the ranks that shard a routed expert's state: all of them, or with hybrid sharding
// (fsdp_shard) one replica group's share, tp · fsdp_shard / (ep · etp) (torchtitan shards the
// experts over the dp_shard_mod_ep mesh and replicates them over dp_replicate).
inline int expert_shard_dp(const ParallelConfig& p) {
  return expert_dp(p) / (grad_dp(p) / shard_dp(p));
}
// Ranks of one pipeline stage: tp · cp · dp.
inline int stage_ranks(const ParallelConfig& p) { return p.tp * p.cp * p.dp; }

// What selective recompute re-runs, as Megatron-Core's recompute_modules names it
// (megatron/core/transformer/transformer_config.py; default ["core_attn"]):
//   core_attn    the attention core (its score/softmax state is not kept)
//   layernorm    input_layernorm and pre_mlp_layernorm (their outputs are not kept)
//   moe_act      the routed experts' activation function (its output is not kept)
//   mla_up_proj  multi-head latent attention's up projections and RoPE: q, k and v are not kept,
//                the normalised latents are, and the up projections are re-run from them
//   mlp          the dense MLP of a dense layer (checkpointed from its input)
//   moe          the MoE FFN of an MoE layer: router, dispatch, experts, combine
//   shared_experts  an MoE layer's shared experts (checkpointed from their input: FC1 and the
//                activation output are not kept; the backward re-runs FC1, the activation and FC2
//                with their tensor-parallel collectives)
enum class RecomputeModule {
  kCoreAttn,
  kLayernorm,
  kMoeAct,
  kMlaUpProj,
  kMlp,
  kMoe,
  kSharedExperts
};
inline constexpr int kNumRecomputeModules = 7;

// A set of RecomputeModule values.
struct RecomputeModules {
  unsigned bits = 1U;  // {core_attn}: Megatron-Core's default
  bool has(RecomputeModule m) const { return (bits >> static_cast<unsigned>(m) & 1U) != 0; }
  void add(RecomputeModule m) { bits |= 1U << static_cast<unsigned>(m); }
  bool operator==(const RecomputeModules&) const = default;
};

struct RecomputeConfig {
  enum class Mode { kNone, kSelective, kFull };
  // What full recompute re-runs. kNeeded: the forward ops whose outputs the backward needs (JAX
  // remat, which drops the rest as dead code; PyTorch's non-reentrant checkpoint, which stops
  // early). kLayer: the checkpointed layer's whole forward, its last GEMM, that GEMM's
  // tensor-parallel reduction and the residual add included, as a reentrant checkpoint re-runs
  // the function (Megatron-Core's full recompute through tensor_parallel.checkpoint or Transformer
  // Engine's checkpoint, DeepSpeed's activation checkpointing).
  enum class Rerun { kNeeded, kLayer };

  Mode mode = Mode::kNone;
  std::map<int, Mode> per_layer;  // layer index -> mode, overrides `mode` for that layer
  RecomputeModules modules;       // what kSelective re-runs (every layer that is selective)
  Rerun rerun = Rerun::kNeeded;   // what kFull re-runs (every layer that is full)
};

// Which layers a rule applies to.
// Which layers each pipeline chunk builds, as Megatron-Core splits them
// (megatron/core/transformer/transformer_block.py get_num_layers_to_build and
// get_transformer_layer_offset): the layers, plus one slot for the embedding and one for the
// loss when ParallelConfig::account_for_embedding_in_pipeline_split /
// account_for_loss_in_pipeline_split ask, cut into pp · virtual_stages equal runs in model-chunk
// order (chunk c of stage s is run c · pp + s). The embedding slot is the first, the loss slot
// the last: their chunks build one layer fewer (none when a run is one slot long). With
// ParallelConfig::layout, run i builds the layout's entry i (`counts`) instead.
struct PipelineLayout {
  std::int64_t layers = 0;
  int pp = 1;
  int virtual_stages = 1;
  int embedding_slots = 0;  // 0 or 1
  int loss_slots = 0;       // 0 or 1
  // parallelism.layout: the decoder layers of each run (empty: the even split of the slots).
  std::vector<int> counts;

  struct Span {
    int first = 0;  // the chunk's first layer
    int count = 0;  // its layers (0: only the embedding or only the loss)
  };
  std::int64_t slots() const { return layers + embedding_slots + loss_slots; }
  std::int64_t chunks() const { return static_cast<std::int64_t>(pp) * virtual_stages; }
  // Every chunk holds the same number of slots, or the layout lists every run's layers.
  bool even() const;
  // Chunks build unequal work (the embedding and loss slots, or a listed layout).
  bool unequal() const { return embedding_slots + loss_slots > 0 || !counts.empty(); }
  // The layers chunk `chunk` of stage `stage` builds (even() layouts).
  Span span(int stage, int chunk) const;
  // The (stage, chunk) that builds `layer`.
  std::pair<int, int> place(int layer) const;
  // The layers stage `stage` builds over its chunks.
  std::int64_t stage_layers(int stage) const;
};
struct ParallelConfig;
PipelineLayout pipeline_layout(std::int64_t layers, const ParallelConfig& p);
// ParallelConfig::layout in Megatron's string form ("Et*4|t*4|tmL"); empty without one.
std::string layout_string(const ParallelConfig& p);
// Megatron-Core's layout string (PipelineParallelLayerLayout.parse_str_to_list): commas and
// spaces are cosmetic, "(...)*n" and then "x*n" repeat, '|' separates the stages; E embedding,
// t decoder layer, m MTP module, L loss. The error says what was expected.
sim::Result<std::vector<ParallelConfig::StageLayout>> parse_pipeline_layout(std::string text);
// The letter of one of Megatron's LayerType names (embedding, decoder, mtp, loss) or of a letter.
std::optional<char> pipeline_layer_letter(std::string_view name);
// The layout with `layers` decoder layers in place of its own, spread over its stages in
// proportion to theirs (largest remainder, earlier stages first on ties); the embedding, MTP
// modules and loss stay where they are. For a step scaled down to fewer layers (offsim replay
// --layers).
std::vector<ParallelConfig::StageLayout> scale_layout(
    const std::vector<ParallelConfig::StageLayout>& layout, std::int64_t layers);

struct LayerSelection {
  enum class Kind { kAll, kList, kFraction, kFirst, kStageFraction };

  Kind kind = Kind::kAll;
  std::vector<int> list;   // kList: layer indices
  double fraction = 1.0;   // kFraction: the first round(fraction * layers) layers;
                           // kStageFraction: the first round(fraction * layers / pp) layers of
                           // every pipeline stage, in the order the stage holds them (Megatron's
                           // optimizer_offload_fraction is a fraction of each rank's state)
  std::int64_t count = 0;  // kFirst: the first `count` layers (Megatron/TE num_layers)

  // The layout places the layer on its stage (kStageFraction only).
  bool contains(int layer, const PipelineLayout& layout) const;
  // The same, with pp · virtual_stages equal chunks and no embedding or loss slot.
  bool contains(int layer, std::int64_t num_layers, int pp = 1, int virtual_stages = 1) const;
};

enum class TensorClass {
  kParams,
  kGrads,
  kOptimizerStates,  // AdamW moments (and master weights, unless a kMasterWeights rule says else)
  kMasterWeights,
  kActivations,      // every activation saved for backward
  kNamedActivation,  // one named activation (MaxText checkpoint names), see OffloadRule::name
};

enum class Placement { kHbm, kHost };

struct OffloadRule {
  TensorClass cls = TensorClass::kActivations;
  // For kNamedActivation: decoder_layer_input, query_proj, key_proj, value_proj, context,
  // out_proj, mlpwi, mlpwo. A named activation with a rule is saved for backward (on HBM or on
  // host) even under full recompute, as JAX's save_and_offload_only_these_names does.
  std::string name;
  LayerSelection layers;
  Placement where = Placement::kHost;
  int prefetch_layers = 1;       // H2D this many layers ahead of use
  std::int64_t chunk_bytes = 0;  // split copies into chunks of at most this size; 0 = whole
};

struct OffloadPolicy {
  std::vector<OffloadRule> rules;
  // The optimizer update of host-resident optimizer state runs on the CPU (ZeRO-Offload):
  // gradients go down, updated parameters come up.
  bool optimizer_on_cpu = false;
  std::string preset;  // the preset this policy came from, if any
  // A JAX/MaxText remat policy: the named activations are saved or offloaded and everything else
  // is rematerialized, so it expects recompute.mode full (set by those presets).
  bool remat_unsaved = false;
  // How the CPU optimizer's threads run (offload.cpu): DeepSpeed's --bind_cores_to_rank pins
  // each rank's process to its own physical cores (its share of the node), so its threads and
  // memory stay on one socket; unbound, the threads migrate over every socket. cpu_threads is
  // OMP_NUM_THREADS; 0 = the runtime's default (every logical CPU, or the bound cores).
  bool cpu_bind_cores = false;
  int cpu_threads = 0;
  // How the host step is organised (offload.cpu.step). kPerGroup: each parameter group updates
  // on the CPU once its gradient has arrived and goes back to the GPU on its own (FSDP's CPU
  // step, Megatron's HybridDeviceOptimizer). kFlatPartition: DeepSpeed ZeRO-Offload's step() on
  // the rank's flat fp32 partition, after every gradient, then one H2D of the whole bf16
  // partition (stage_1_and_2.py); set by the zero_offload preset.
  enum class CpuStep { kPerGroup, kFlatPartition };
  CpuStep cpu_step = CpuStep::kPerGroup;
  // Whether a per-group host step that keeps the master on the GPU (Megatron-Core's
  // HybridDeviceOptimizer) overlaps its copies with the CPU update (offload.cpu.overlap_d2h_h2d,
  // Megatron's overlap_cpu_optimizer_d2h_h2d). true: each group's gradient goes down, is updated
  // and goes back on its own, pipelined over the groups (copies on their own streams). false
  // (Megatron's default, which the megatron_optimizer_offload preset sets): one CPU optimizer over
  // every offloaded parameter and the compute stream for both copies, so every gradient goes down,
  // then the CPU updates them all, then every master goes back.
  bool cpu_overlap_d2h_h2d = true;
  // Which CPU Adam a per-group host step runs (offload.cpu.adam). kDeepSpeed: DeepSpeed's
  // vectorized DeepSpeedCPUAdam, the rate the host model's per-core figure was measured with.
  // kTorchFused: torch.optim.AdamW(fused=True), one vectorized pass like DeepSpeed's (Megatron's
  // HybridDeviceOptimizer builds it). kTorch: what torch.optim picks by default for CPU tensors,
  // the single-tensor for-loop of elementwise ops (FSDP's CPU offload with a plain
  // torch.optim.AdamW); see CostModel::CpuThreads::time_factor.
  enum class CpuAdam { kDeepSpeed, kTorchFused, kTorch };
  CpuAdam cpu_adam = CpuAdam::kDeepSpeed;
  // How host-resident routed-expert weights come back for an MoE layer's forward
  // (offload.experts.fetch). kWhole: the rank's whole local expert set with the layer, prefetched
  // like any offloaded parameter. kRouted: only the experts the router picks, the expected number
  // of distinct local experts the micro-batch's tokens hit (expected_local_experts_hit), fetched
  // after the router (MoE-Infinity's and fMoE's on-demand fetch), so the copy is on the critical
  // path; the backward and recompute passes know the routing and prefetch the same experts.
  enum class ExpertFetch { kWhole, kRouted };
  ExpertFetch expert_fetch = ExpertFetch::kWhole;
  // kRouted with a predictor of the next layer's experts (Pre-gated MoE, ProMoE): that many
  // experts are prefetched with the layer, this fraction of them correctly, and the misses are
  // fetched after the router (offload.experts.prediction_hit, in [0, 1]); none = no predictor.
  std::optional<double> expert_prediction_hit;
  // DeepSpeed ZenFlow (offload.cpu.zenflow; zero_optimization.zenflow, deepspeed/runtime/zenflow/
  // zenflow_config.py, arXiv 2505.12242) on the flat-partition step: the top-k gradient columns
  // are updated on the GPU every step, the rest accumulate and the CPU updates them once every
  // update_interval steps, overlapped with the next steps' GPU work when overlap_step is set.
  struct ZenFlow {
    bool enabled = false;
    double topk_ratio = 0.1;      // zenflow_config.py default
    int update_interval = 4;      // DeepSpeed's default is "auto"; 4 as its tutorial sets
    bool overlap_step = false;    // zenflow_config.py default
    double reserved_cores = 0.5;  // pt_reserved_cores_perc: cores kept by the training process
  };
  ZenFlow zenflow;
  // DeepSpeed SuperOffload (offload.cpu.superoffload; zero_optimization.offload_optimizer
  // super_offload: true, deepspeed/runtime/superoffload/, arXiv 2509.21271) on ZeRO-3: the first
  // 1 - ratio of the rank's optimizer sub-groups (in parameter order, the last the backward
  // reaches) keep master, moments and fp32 gradients on the GPU and update there; the others'
  // fp32 gradients go down as each sub-group completes and a worker process runs CPU Adam on
  // cpuadam_cores_perc of the rank's cores, overlapping the rest of the backward (no wait for
  // the global norm: speculation, rolled back only when clipping or overflow strikes).
  struct SuperOffload {
    bool enabled = false;
    double ratio = 1.0;                           // offload_config.py default
    double cpuadam_cores_perc = 0.8;              // offload_config.py default
    std::int64_t sub_group_size = 1'000'000'000;  // zero/config.py default
  };
  SuperOffload superoffload;
};

struct HardwareConfig {
  std::string system;  // a name of sim::platform's catalogue, e.g. "dgx-h100"
  int nodes = 1;
  int gpus = 0;              // 0 = every GPU of `nodes` nodes
  std::string profile_path;  // a calibration profile JSON; empty = the system's default
  // What the training framework's runtime adds on each GPU (runtime.h): kNone keeps only the
  // calibration profile's workspace/allocator term.
  enum class Runtime { kNone, kPytorch, kPytorchExpandable, kJax };
  Runtime runtime = Runtime::kNone;
  // A host of sim::platform's catalogue (sim/platform/host.h); empty = the system's own host.
  std::string host;
  // Figure overrides applied after the host, in order: ("profile.host.cores_per_socket", 32),
  // ("system.host_memory_bytes_per_node", 1e12), ... (sim::platform::override_paths).
  std::vector<std::pair<std::string, double>> overrides;
};

struct Scenario {
  std::string name;
  ModelArch model;
  HardwareConfig hardware;
  TrainingConfig training;
  ParallelConfig parallelism;
  RecomputeConfig recompute;
  OffloadPolicy offload;
};

const char* to_string(ModelArch::Activation v);
const char* to_string(ModelArch::Norm v);
const char* to_string(ModelArch::AttentionImpl v);
const char* to_string(ParallelConfig::PipelineSchedule v);
const char* to_string(RecomputeConfig::Mode v);
const char* to_string(RecomputeModule v);
const char* to_string(RecomputeConfig::Rerun v);
const char* to_string(TensorClass v);
const char* to_string(Placement v);
std::optional<ModelArch::Activation> activation_from_string(std::string_view s);
std::optional<ModelArch::Norm> norm_from_string(std::string_view s);
std::optional<ModelArch::AttentionImpl> attention_impl_from_string(std::string_view s);
std::optional<ParallelConfig::PipelineSchedule> pipeline_schedule_from_string(std::string_view s);
const char* to_string(ParallelConfig::CpCommType v);
const char* to_string(ParallelConfig::MoeDispatcher v);
const char* to_string(ParallelConfig::BackwardPrefetch v);
std::optional<ParallelConfig::BackwardPrefetch> backward_prefetch_from_string(std::string_view s);
const char* to_string(ParallelConfig::ParamGather v);
std::optional<ParallelConfig::ParamGather> param_gather_from_string(std::string_view s);
std::optional<ParallelConfig::CpCommType> cp_comm_type_from_string(std::string_view s);
std::optional<ParallelConfig::MoeDispatcher> moe_dispatcher_from_string(std::string_view s);
const char* to_string(TrainingConfig::Fp8Recipe v);
std::optional<TrainingConfig::Fp8Recipe> fp8_recipe_from_string(std::string_view s);
const char* to_string(TrainingConfig::MoeGroupedGemm v);
std::optional<TrainingConfig::MoeGroupedGemm> moe_grouped_gemm_from_string(std::string_view s);
const char* to_string(CudaGraphModule v);
std::optional<CudaGraphModule> cuda_graph_module_from_string(std::string_view s);
std::optional<RecomputeConfig::Mode> recompute_mode_from_string(std::string_view s);
std::optional<RecomputeModule> recompute_module_from_string(std::string_view s);
std::optional<RecomputeConfig::Rerun> recompute_rerun_from_string(std::string_view s);
std::optional<TensorClass> tensor_class_from_string(std::string_view s);
std::optional<Placement> placement_from_string(std::string_view s);
const char* to_string(OffloadPolicy::CpuStep v);
std::optional<OffloadPolicy::CpuStep> cpu_step_from_string(std::string_view s);
const char* to_string(OffloadPolicy::CpuAdam v);
std::optional<OffloadPolicy::CpuAdam> cpu_adam_from_string(std::string_view s);
const char* to_string(OffloadPolicy::ExpertFetch v);
std::optional<OffloadPolicy::ExpertFetch> expert_fetch_from_string(std::string_view s);
const char* to_string(HardwareConfig::Runtime v);
std::optional<HardwareConfig::Runtime> runtime_from_string(std::string_view s);

// The MaxText checkpoint names a kNamedActivation rule may use.
const std::vector<std::string>& activation_names();

// The recompute mode of one layer.
RecomputeConfig::Mode recompute_mode(const RecomputeConfig& r, int layer);

// global_batch / (micro_batch * dp): micro-batches each rank runs per step.
std::int64_t grad_accum_steps(const TrainingConfig& t, const ParallelConfig& p);

// Checks the scenario for impossible configurations without knowing the hardware; messages name
// the key path ("parallelism.tp: 3 does not divide model.heads 64").
sim::Status check_scenario(const Scenario& s);
// Also checks the GPU count against a system of `gpus_per_node` GPUs.
sim::Status check_scenario(const Scenario& s, int gpus_per_node);
// Only the GPU count against a system of `gpus_per_node` GPUs (for a scenario that passed
// check_scenario(s); resolve.h runs both).
sim::Status check_gpu_count(const Scenario& s, int gpus_per_node);
// How many times check_scenario(s) has run in this process (tests count the checks of a run).
std::int64_t scenario_checks_run();

// --- Catalogue ----------------------------------------------------------------------------------

struct CatalogueEntry {
  std::string name;
  std::string source;  // where the configuration comes from
};
std::vector<CatalogueEntry> list_models();
sim::Result<ModelArch> find_model(std::string_view name);

// Imports a Hugging Face config.json (Llama, Mistral, Qwen2 style; MoE: Mixtral, Qwen3-MoE,
// DeepSeek-V3, gpt-oss). `source` names the input in
// error messages.
sim::Result<ModelArch> model_from_hf_config(const std::string& json_text,
                                            const std::string& source);

// Parameter count of the whole model (embeddings, layers, final norm, LM head unless tied).
std::int64_t parameter_count(const ModelArch& m);
// Parameters one token uses: routed experts counted top_k times out of `experts`.
std::int64_t active_parameter_count(const ModelArch& m);
// Parameters of the multi-token-prediction modules (each: one MoE layer, a 2h × h projection
// and two norms; embedding and head shared with the main model).
std::int64_t mtp_parameter_count(const ModelArch& m);
// The layers a step builds: the decoder layers, then one per multi-token-prediction module
// (index layers + k, on the loss's chunk).
inline int built_layers(const ModelArch& m) { return static_cast<int>(m.layers + m.mtp_layers); }
// Whether layer `layer` (0-based) has a mixture-of-experts FFN.
bool is_moe_layer(const ModelArch& m, int layer);

// --- Offload presets ----------------------------------------------------------------------------

struct PresetInfo {
  std::string name;
  std::string description;  // what the preset maps to in its framework and here
};
std::vector<PresetInfo> list_presets();

struct PresetOptions {
  std::int64_t num_layers = -1;  // Megatron/TE: layers whose activations are offloaded; -1 = all
  double fraction = 1.0;         // optimizer offload: fraction of the optimizer state on host
  int prefetch_layers = 1;
  std::vector<std::string> names;  // save_and_offload_only_these_names: names to offload
};
sim::Result<OffloadPolicy> offload_preset(std::string_view name, const PresetOptions& options);

// --- Dtype presets ------------------------------------------------------------------------------

// Framework conventions for training.dtypes (training.dtype_preset): megatron_fp16,
// megatron_bf16, megatron_fp32, deepspeed_fp16, deepspeed_bf16, fsdp2_mixed, maxtext_default,
// maxtext_bf16_mu; each description cites the framework's source.
std::vector<PresetInfo> list_dtype_presets();
sim::Result<TensorDtypes> dtype_preset(std::string_view name);
// MaxText `remat_policy` names ("full", "minimal", "save_qkv_proj", "qkv_proj_offloaded", ...)
// and the offload preset each stands for; every one runs with recompute.mode full.
std::vector<std::string> maxtext_remat_policies();
sim::Result<std::string> maxtext_remat_preset(std::string_view policy);

}  // namespace offsim::models
