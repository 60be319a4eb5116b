// StepBuilder: the lowering behind build_step() (step_builder.h), private to offsim_models.
//
// One representative rank per pipeline stage (multiplicity dp·tp·cp). Each rank runs its
// pipeline schedule (1F1B or interleaved 1F1B) as a list of forward/backward tasks over
// (micro-batch, model chunk); each task lowers its layers to ops. Pipeline p2p sends are
// recorded and their receives added on the peers once every rank is emitted. The member
// functions live in one file per concern:
//   step_builder.cc   build_step(), the rank's lanes and pools, the op primitives (add, gemm,
//                     elementwise, collective, copy, tensor)
//   step_issue.cc     the framework's host issue thread (segments and their markers)
//   step_schedule.cc  pipeline schedules, tasks, pipeline sends and receives
//   step_lowering.cc  one layer's forward, backward and recompute; attention, context and
//                     tensor parallelism; the LM head
//   step_moe.cc       the MoE FFN: router, dispatch and combine, grouped GEMMs, shared experts
//   step_params.cc    parameter groups, static tensors, ZeRO/FSDP gathers, gradient
//                     reductions, the GPU optimizer step
//   step_offload.cc   host transfers of activations and gradients, host optimizer steps
//                     (ZeRO-Offload, ZenFlow, SuperOffload, HybridDeviceOptimizer)
//
//   detail::StepBuilder builder(scenario, cost_model, plan_builder, out, options);
//   OFFSIM_RETURN_IF_ERROR(builder.build());
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "models/cost_model.h"
#include "models/formulas.h"
#include "models/plan_size.h"
#include "models/step_builder.h"

namespace offsim::models::detail {

using sim::LaneId;
using sim::OpCategory;
using sim::OpId;
using sim::OpKind;
using sim::PoolId;
using sim::TensorCategory;
using sim::TensorId;

// AdamW per parameter: read the gradient, read and write the master (or the weights themselves
// when they are their own master) and both moments, and write the weights when they are a
// separate copy. bf16 weights with fp32 master and moments: 2 + 2·4 + 2·4 + 2·4 + 2 = 28 bytes.
// A master kept as remainders is read with the weights it completes (TE's FusedAdam reads and
// writes both halves): 2 + 2·2 + 2·4 + 2·4 + 2 + 2 = 26 bytes.
inline std::int64_t adam_bytes_per_param(const ResolvedDtypes& d) {
  const std::int64_t params = sim::dtype_bytes(d.params);
  return sim::dtype_bytes(d.grads) + 2 * d.updated_bytes() + 2 * sim::dtype_bytes(d.first_moment) +
         2 * sim::dtype_bytes(d.second_moment) + (d.master ? params : 0) +
         (d.master_remainders ? params : 0);
}
constexpr double kAdamFlopsPerParam = 12.0;

struct Task {
  bool forward = true;
  int mb = 0;
  int chunk = 0;
  bool steady = false;  // a forward or backward of the schedule's 1F1B steady state
};

// How many layers' offloaded activations may still be on their way to the host while a layer's
// forward starts (see forward_task).
constexpr std::size_t kOffloadWindowLayers = 2;

// Where a piece of parameters lives and how its optimizer runs.
struct ParamGroup {
  enum class Role { kLayer, kEmbed, kHead };
  std::string name;  // "l3", "embed", "head", for display
  Role role = Role::kLayer;
  int layer = -1;                   // transformer layer or -1
  std::int64_t params = 0;          // on this rank (tensor-sharded, before ZeRO)
  std::int64_t linear_weights = 0;  // of them, Transformer Engine linear weights (FP8 GEMMs')
  StaticMemory mem;
  bool params_on_host = false;
  bool grads_on_host = false;
  bool opt_on_host = false;
  bool master_on_host = false;
  bool master_on_hbm = false;  // kept on HBM by a rule while the moments are on the host
  // The routed experts of an MoE layer: sharded and reduced over the expert data-parallel group
  // (tp · cp · dp / (ep · etp) ranks) instead of the data-parallel one.
  bool expert = false;
  TensorId params_t, grads_t, opt_t, master_t;
  // The key of its gradient reduction (grads_done): the layer, -1 embedding, -2 head.
  int reduce_key() const { return role == Role::kEmbed ? -1 : role == Role::kHead ? -2 : layer; }
};

using SendKey = std::tuple<bool, int, int, int>;  // forward?, mb, destination stage, dest chunk

class StepBuilder {
 public:
  // `policies`: the resolved scenario's (ResolvedScenario::layer_policies), read, not worked
  // out again.
  StepBuilder(const Scenario& s, const LayerPolicies& policies, const CostModel& cm,
              sim::PlanBuilder& b, BuiltStep& out, const BuildOptions& options);
  sim::Status build();

 private:
  struct Rank {
    int rank = 0;
    int stage = 0;
    LaneId compute, comm, p2p, h2d, d2h, cpu;
    LaneId moe_shared;  // the shared experts' stream (moe_shared_expert_overlap)
    PoolId hbm, host;
    std::vector<int> tp_group, dp_group;
    // Hybrid sharding (parallelism.fsdp_shard): the rank's shard group (all of dp_group without
    // it) and its replicas, one rank of each shard group.
    std::vector<int> shard_group, replica_group;
    std::vector<int> cp_group;  // context-parallel ring (stride tp), cp > 1
    LaneId cp_lane;             // its K,V transfers (Transformer Engine's CP stream), cp > 1
    LaneId replica_lane;        // hybrid sharding's all-reduces (FSDP2's all_reduce_stream)
    LaneId tp_lane;             // overlapped tensor-parallel communication (tp > 1)
    LaneId issue;               // the framework's host thread issuing the GPU ops (".host")
    // parallelism.moe_a2a_overlap: a combined 1F1B step's backward runs on lanes of its own (its
    // compute stream, host thread, TP and CP streams; swap_backward_lanes), and each pass's MoE
    // all-to-alls on a communication stream of their own.
    LaneId compute_b, issue_b, tp_lane_b, cp_lane_b, a2a, a2a_b;
    OpId last_compute_b;  // the latest op on compute_b
    std::vector<ParamGroup> groups;
    std::map<int, std::size_t> group_of_layer;
    std::map<std::pair<int, int>, OpId> last_grad_op;  // (layer key, mb) -> op after its grads
    std::map<int, OpId> reduce_op;                     // layer key -> DP reduction of last mb
    std::vector<int> ep_group, etp_group, edp_group;   // expert-parallel groups (MoE)
    // Hybrid sharding: the expert-DP ranks of the rank's replica group, and its expert replicas.
    std::vector<int> expert_shard_group, expert_replica_group;
    std::map<int, std::size_t> expert_group_of_layer;  // MoE layer -> its experts' ParamGroup
    std::map<int, OpId> expert_reduce_op;              // MoE layer -> expert-DP reduction
    // Per (mb, layer): the tensors kept between forward and backward.
    struct Saved {
      TensorId hbm;                      // saved on HBM
      std::vector<TensorId> host;        // offloaded chunks on host
      std::vector<std::int64_t> chunks;  // their sizes
      std::vector<OpId> d2h;             // their copies
    };
    std::map<std::pair<int, int>, Saved> saved;
    std::map<std::pair<int, int>, OpId> layer_first_bwd;  // (mb, layer) -> first backward op
    std::map<std::pair<int, int>, OpId> layer_first_fwd;  // (mb, layer) -> first forward op
    std::map<int, TensorId> head_saved;                   // mb -> logits + head input
    std::map<std::pair<int, int>, TensorId> mtp_saved;    // (mb, MTP layer) -> its inputs
    // (mb, chunk) -> the chunk's forward output, kept until its backward when pipeline
    // outputs are not deallocated after their send (deallocate_pipeline_outputs false).
    std::map<std::pair<int, int>, TensorId> stage_output;
  };

  // A GEMM's m × n × k (gathered_gemm, scattered_gemm).
  struct GemmDims {
    std::int64_t m = 0, n = 0, k = 0;
  };
  // A memory-bound kernel's bytes and FLOPs.
  struct Traffic {
    std::int64_t bytes = 0;
    double flops = 0.0;
  };

  // A layer's fetched parameters (fetch_params): the ops the layer's first compute op must wait
  // for, and the buffers to free after the layer. `routed_bytes`: host-resident expert weights
  // the forward fetches once its router has run (moe_routed_fetch).
  struct Fetch {
    std::vector<OpId> wait;
    std::vector<TensorId> buffers;
    std::int64_t routed_bytes = 0;
  };

  // The open segment of the current rank's host issue thread (host_issue_open/close).
  struct HostSegment {
    bool open = false;
    LaneId lane;       // the rank's host lane
    std::string name;  // its marker's
    int layer = 0;
    double host_s = 0.0;       // host time of its ops
    double gpu_s = 0.0;        // GPU time (alone) of its compute-stream ops
    double first_gpu_s = 0.0;  // of its first op (0 off the compute stream)
    double last_gpu_s = 0.0;   // of its last op
    std::optional<OpId> first;
    std::optional<OpId> last;  // its last compute-stream op, which waits for the marker
  };

  struct NextHostOps {
    double ops = 1.0;
    bool backward = false;
  };
  // What sees each op a lowering function emits (the MoE and recompute lowering share it).
  using OpSink = std::function<void(OpId)>;

  // --- step_builder.cc: the op primitives and the rank
  void non_layer_policy(ParamGroup& g) const;
  OpId add(Rank& r, LaneId lane, const std::string& name, OpKind kind, OpCategory category,
           int layer, sim::OpCost cost, sim::OpSizes sizes = {}, std::vector<OpId> deps = {});
  OpId wgrad_gemm(Rank& r, const std::string& name, OpCategory cat, int layer, std::int64_t m,
                  std::int64_t n, std::int64_t k);
  OpId gemm(Rank& r, const std::string& name, OpCategory cat, int layer, std::int64_t m,
            std::int64_t n, std::int64_t k, bool weight_grad = false);
  OpId head_gemm(Rank& r, const std::string& name, std::int64_t m, std::int64_t n, std::int64_t k,
                 bool weight_grad = false);
  OpId gemm_as(sim::DType dtype, Rank& r, const std::string& name, OpCategory cat, int layer,
               std::int64_t m, std::int64_t n, std::int64_t k, bool weight_grad);
  OpId fp8_cast(Rank& r, const std::string& name, OpCategory cat, int layer, std::int64_t elements,
                bool from_norm);
  OpId elementwise(Rank& r, const std::string& name, OpCategory cat, int layer, std::int64_t bytes,
                   double flops);
  OpId collective(Rank& r, LaneId lane, const std::string& name, OpCategory cat, int layer,
                  sim::CollectiveKind kind, const std::vector<int>& group, std::int64_t bytes,
                  std::vector<OpId> deps = {});
  OpId copy(Rank& r, sim::CopyDirection dir, const std::string& name, OpCategory cat, int layer,
            std::int64_t bytes, std::vector<OpId> deps);
  TensorId tensor(PoolId pool, const std::string& name, std::int64_t bytes, TensorCategory cat);
  sim::Status build_rank(int stage);

  // --- step_issue.cc: the host issue thread
  void host_issue_open(Rank& r, const std::string& first, int layer, bool on_compute);
  void host_issue_note(OpId id, double host_s, double gpu_s, bool on_compute);
  void host_issue_close(bool force = false);
  void host_issue_end_task();
  CostModel::HostOps take_host_ops(OpCategory category, const sim::OpSizes& sizes);

  // What a combined 1F1B step (parallelism.moe_a2a_overlap) needs of each layer of each pass:
  // its first and last compute-stream ops, its all-to-alls in order with the compute op before
  // and the first compute op after each, and the forward's host synchronisation.
  struct PassMarks {
    int layer = -1;
    std::optional<OpId> first, last;
    std::vector<OpId> a2a, before;
    std::vector<std::optional<OpId>> after;
    std::optional<OpId> sync;
  };
  PassMarks& pass_marks(int layer);

  // --- step_schedule.cc: schedules, tasks, pipeline sends and receives
  void run_schedule(Rank& r);
  void swap_backward_lanes(Rank& r);
  void link_combined(const std::vector<PassMarks>& f, const std::vector<PassMarks>& b);
  OpId receive(OpId send);
  std::int64_t p2p_bytes() const;
  void run_task(Rank& r, const Task& t);
  std::vector<int> chunk_layers(int stage, int chunk) const;
  std::optional<OpId> activation_fetch_after(int l, std::size_t i, const std::vector<OpId>& firsts,
                                             std::optional<OpId> task_first) const;
  void end_backward_task(Rank& r, const Task& t, OpId last, bool embedding_only);
  void forward_task(Rank& r, const Task& t);
  std::pair<int, int> next_stage(int stage, int chunk) const;
  std::pair<int, int> prev_stage(int stage, int chunk) const;
  void backward_task(Rank& r, const Task& t);
  void keep_stage_output(Rank& r, const Task& t, OpId made);
  void release_stage_output(Rank& r, const Task& t, OpId done);

  // --- step_lowering.cc: the layers and the head
  OpId attention(Rank& r, const std::string& name, OpCategory cat, int layer, bool backward);
  sim::AttentionShape attention_shape(bool backward, std::int64_t seq, std::int64_t heads,
                                      std::int64_t kv_heads) const;
  OpId attention_kernel(Rank& r, const std::string& name, OpCategory cat, int layer,
                        const sim::AttentionShape& shape, std::vector<OpId> deps = {});
  OpId ring_attention(Rank& r, const std::string& name, OpCategory cat, int layer, bool backward);
  OpId cp_transfer(Rank& r, const std::string& name, int layer, std::int64_t bytes,
                   std::vector<OpId> deps);
  OpId ulysses_attention(Rank& r, const std::string& name, OpCategory cat, int layer,
                         bool backward);
  OpId rotary(Rank& r, const std::string& name, int layer);
  // `rows`: multiples of the micro-batch's tokens (the head's with MTP: head_rows()).
  void tp_reduce(Rank& r, const std::string& name, OpCategory cat, int layer,
                 std::int64_t rows = 1);
  void tp_gather(Rank& r, const std::string& name, OpCategory cat, int layer,
                 std::int64_t rows = 1);
  OpId gathered_gemm(Rank& r, const std::string& gather, const std::string& name, OpCategory cat,
                     int layer, GemmDims g, bool from_norm = false);
  OpId gathered_gemm_of(Rank& r, const std::string& gather, const std::string& name, OpCategory cat,
                        int layer, GemmDims g, std::int64_t elem_bytes);
  OpId scattered_gemm(Rank& r, const std::string& name, const std::string& reduce, OpCategory cat,
                      int layer, GemmDims g);
  std::optional<OpId> async_tp_reduce(Rank& r, const std::string& name, int layer);
  void finish_tp_reduce(Rank& r, std::optional<OpId> reduce, const std::string& name, int layer);
  void grad_accumulation(Rank& r, const std::string& name, int layer, std::int64_t params);
  OpId layer_forward(Rank& r, int mb, int l, Fetch& fetch);
  OpId forward_op(Rank& r, const std::string& p, int l, const LayerOpEntry& e);
  void recompute_op(Rank& r, const std::string& p, int l, const LayerOpEntry& e,
                    const OpSink& emit);
  GemmDims layer_gemm(FwdOp op) const;
  Traffic layer_elementwise(FwdOp op) const;
  OpId head_op(Rank& r, const std::string& prefix, const HeadOpEntry& e, std::int64_t n);
  // The head's forward and backward ops of a micro-batch: its first and its last op.
  struct HeadOps {
    OpId first;
    OpId last;
  };
  HeadOps head_forward(Rank& r, int mb);
  OpId head_chunk(Rank& r, const std::string& p, std::span<const HeadOpEntry> entries,
                  std::int64_t c, std::int64_t chunks);
  HeadOps head_backward(Rank& r, int mb);
  std::optional<OpId> embedding_grad_sync(Rank& r, const std::vector<OpId>& ready);
  void link_norm_syncs();
  // A multi-token-prediction module's ops around its transformer layer `l` (index layers + k).
  void mtp_input_forward(Rank& r, int mb, int l);
  OpId mtp_input_backward(Rank& r, int mb, int l);
  // The head runs over the main model's tokens and each MTP module's (Megatron's
  // process_mtp_loss: one output-layer call per module on its share of the concatenated
  // hidden states).
  std::int64_t head_rows() const { return 1 + s_.model.mtp_layers; }
  void recompute_forward(Rank& r, const std::string& p, int l, const OpSink& emit);
  OpId backward_entries(Rank& r, const std::string& p, int l,
                        std::span<const LayerBackwardEntry> entries, const OpSink& emit);
  OpId backward_op(Rank& r, const std::string& p, int l, const LayerBackwardEntry& e);
  Traffic layer_elementwise_backward(FwdOp op) const;
  void res2_backward(Rank& r, const std::string& p, int l, const OpSink& emit);
  void ffn_backward(Rank& r, const std::string& p, int l);
  OpId attention_backward(Rank& r, const std::string& p, int l);
  // `before_reduce` runs once the layer's backward ops exist and before its gradient reduction
  // is queued, with the op after which its gradients are ready (the caller issues the next
  // layers' parameter fetches there).
  OpId layer_backward(Rank& r, int mb, int l, Fetch& fetch, std::optional<OpId> act_after,
                      std::optional<SendKey> recv, const std::function<void(OpId)>& before_reduce);

  // --- step_moe.cc: mixture of experts
  template <class Shape>
  OpId grouped_gemm(Rank& r, const std::string& name, OpCategory cat, int layer,
                    const LayerDims& md, bool weight_grad, Shape shape);
  std::pair<std::int64_t, std::int64_t> moe_expert_fetch_bytes(const Rank& r, int layer,
                                                               bool forward) const;
  OpId moe_routed_fetch(Rank& r, const std::string& p, int l, OpId topk, Fetch& fetch);
  std::int64_t alltoall_bytes(const LayerDims& md) const;
  // One token exchange of the MoE layer (dispatch or combine, or their backward) over the
  // expert-parallel group, as parallelism.moe_dispatcher runs it; `probs`: the all-to-all
  // dispatcher's separate exchange of the routing probabilities (none with DeepEP, whose
  // dispatch carries them).
  OpId moe_exchange(Rank& r, LaneId lane, const std::string& name, int layer, const LayerDims& md,
                    bool probs, std::vector<OpId> deps = {});
  void moe_forward(Rank& r, const std::string& p, OpCategory cat, int l, const OpSink& emit,
                   const std::string& sfx = ".fwd", Fetch* fetch = nullptr);
  OpId moe_host_sync(Rank& r, const std::string& name, int l, OpId after);
  OpId moe_op(Rank& r, const std::string& name, OpCategory cat, int l, const MoeOpEntry& e,
              bool backward);
  Traffic moe_elementwise(const LayerDims& md, MoeTraffic which, bool backward) const;
  OpId moe_shared_forward_side(Rank& r, const std::string& p, OpCategory cat, int l,
                               const std::string& sfx, OpId after);
  void moe_backward(Rank& r, const std::string& p, OpCategory cat, int l);

  // --- step_params.cc: parameter groups, gradient reductions, the optimizer
  OpId fp8_weight_cast(Rank& r, const ParamGroup& g, OpId after);
  void fp8_param_storage(ParamGroup& g, const ParallelConfig& p) const;
  std::int64_t fp8_weight_cache_bytes(const ParamGroup& g) const;
  OpId grad_passes(Rank& r, const std::vector<OpId>& deps);
  int edp() const;
  void make_param_groups(Rank& r);
  void make_static_tensors(Rank& r);
  std::vector<std::int64_t> param_tensor_sizes(const ParamGroup& g) const;
  OpId reduce_grads(Rank& r, const ParamGroup& g, int mb, OpId last);
  std::pair<OpId, OpId> gather_per_tensor(Rank& r, const ParamGroup& g, int layer,
                                          const std::string& tag, int rounds,
                                          std::vector<OpId> deps);
  Fetch fetch_params(Rank& r, int layer, const std::string& tag, std::optional<OpId> after,
                     bool forward = false);
  void expert_grads_done(Rank& r, int layer, int mb, OpId last);
  void grads_done(Rank& r, int key, int mb, OpId last);
  std::int64_t optimizer_shard(const ParamGroup& g) const;
  std::int64_t zero2_step_extra_bytes() const;
  OpId gpu_group_step(Rank& r, ParamGroup& g, std::vector<OpId> deps);
  void optimizer(Rank& r);
  void group_updated(Rank& r, const ParamGroup& g, OpId done);
  void hybrid_device_down_and_update(Rank& r, OpId clipped, std::optional<OpId>& down,
                                     std::optional<OpId>& updated);

  // --- step_offload.cc: host transfers and host optimizer steps
  std::vector<TensorId> save_activations(Rank& r, int l, const std::string& p, OpId first,
                                         Rank::Saved& saved);
  void offload_activations(Rank& r, int l, const std::string& p, OpId last,
                           const std::vector<TensorId>& staging, Rank::Saved& saved);
  std::vector<TensorId> reload_activations(Rank& r, int mb, int l, const std::string& p,
                                           std::optional<OpId> act_after,
                                           std::optional<SendKey> recv, std::vector<OpId>& wait);
  std::int64_t grads_d2h_bytes(const ParamGroup& g) const;
  std::int64_t zenflow_grads_h2d_bytes(const ParamGroup& g) const;
  bool deepspeed_cpu_step(const ParamGroup& g) const;
  CostModel::CpuThreads cpu_threads() const;
  std::optional<OpId> deepspeed_flat_step(Rank& r);
  std::optional<OpId> zenflow_topk_update(Rank& r, std::vector<OpId> deps);
  std::int64_t zenflow_selected(const Rank& r) const;
  std::optional<OpId> zenflow_step(Rank& r, std::int64_t shard, std::int64_t h2d,
                                   std::vector<OpId> deps);
  OpId cpu_group_step(Rank& r, ParamGroup& g, std::vector<OpId> deps, bool& started);
  std::optional<OpId> cpu_grads_down(Rank& r, const ParamGroup& g, std::vector<OpId> deps);
  OpId cpu_update(Rank& r, const ParamGroup& g, std::vector<OpId> deps);
  std::optional<OpId> cpu_params_up(Rank& r, const ParamGroup& g, std::vector<OpId> deps);
  bool hybrid_device_cpu_group(const ParamGroup& g) const;
  bool hybrid_device_step(const ParamGroup& g) const;
  void superoffload_placement(Rank& r);
  void superoffload_step(Rank& r);
  OpId superoffload_done(Rank& r, ParamGroup& g, std::vector<OpId> deps);
  double param_tensors(const ParamGroup& g) const;
  bool deepspeed_grad_checks(const ParamGroup& g) const;
  void deepspeed_grad_path(Rank& r, const ParamGroup& g, OpId reduced, OpId grads_d2h);
  OpId deepspeed_grad_check_op(Rank& r, const ParamGroup& g, std::vector<OpId> deps);
  OpId superoffload_gpu_grad_path(Rank& r, const ParamGroup& g, OpId reduced);
  void deferred_grad_checks(Rank& r);

  // --- small rules used across the files
  // The dimensions of layer l (its MoE sizes when it has experts).
  const LayerDims& ld(int l) const { return ldims_[static_cast<std::size_t>(l)]; }
  // The host ops of an overlapped tensor-parallel GEMM's chunk after the first (step_lowering.cc).
  void chunk_host_ops(OpCategory cat);
  // What the next issued op stands for on the host thread, set by the lowering just before it
  // adds an op that stands for several framework ops: the MoE layer's router, permutation,
  // all-to-alls, grouped GEMMs and activation, counted in Megatron-Core's source
  // (megatron/core/transformer/moe/, see models/README.md "Host issue thread" for the count per
  // function). `backward`: backward nodes of the autograd engine rather than eager ops.
  void next_host_ops(double framework_ops, bool backward) {
    next_host_ops_ = NextHostOps{.ops = framework_ops, .backward = backward};
  }
  // --- per-layer CUDA graphs (training.cuda_graph_modules, step_issue.cc)
  // The module whose ops a recipe entry emits, as Megatron-Core's per-layer graphs cut a layer.
  enum class GraphRegion { kNone, kAttn, kMlp, kMoeRouter, kMoe, kLayer };
  // While alive, the ops issued belong to `region` of layer `layer`: in a captured module the
  // first op issued costs the host one graph replay and the others none (take_host_ops).
  // Consecutive entries of one module in one layer share a replay; an entry of another module
  // (captured or not) or of another layer ends it.
  class GraphScope {
   public:
    GraphScope(StepBuilder& b, GraphRegion region, int layer) : b_(b) {
      if (region != b_.graph_last_ || layer != b_.graph_last_layer_) b_.graph_charged_ = false;
      b_.graph_last_ = region;
      b_.graph_last_layer_ = layer;
      b_.graph_region_ = region;
    }
    ~GraphScope() { b_.graph_region_ = GraphRegion::kNone; }
    GraphScope(const GraphScope&) = delete;
    GraphScope& operator=(const GraphScope&) = delete;
    GraphScope(GraphScope&&) = delete;
    GraphScope& operator=(GraphScope&&) = delete;

   private:
    StepBuilder& b_;
  };
  // The host work of one replay of a captured module, in framework ops: Transformer Engine's
  // graphed callable (transformer_engine/pytorch/graph.py, make_graphed_callables: the autograd
  // Function's forward or backward copies the new input, or incoming gradient, into the graph's
  // static buffer and calls replay()): the Function's dispatch, the copy, the replay.
  static constexpr double kGraphReplayOps = 3.0;
  // Of the permutation entry's 20 forward host ops, MoELayer.preprocess's (the per-expert counts,
  // the split sizes and their all-gather over the TP x EP group; models/README.md "Host issue
  // thread"): what a moe_preprocess graph replaces.
  static constexpr double kMoePreprocessHostOps = 10.0;
  bool captured(GraphRegion region) const;
  GraphRegion layer_region(bool ffn, FwdOp op, int l) const;
  GraphRegion moe_region(const MoeOpEntry& e, int l) const;
  double moe_forward_host_ops(const MoeOpEntry& e) const;
  // Rotary position embedding (models without a learned position table): one kernel applies
  // it to the query and key heads of the layer, reading and writing q and k (2 · tokens ·
  // (q + kv) elements); its backward does the same to their gradients. 3 FLOPs per element
  // (two products and a sum).
  bool rotary_positions() const { return s_.model.max_positions == 0; }
  bool tp_overlap() const { return s_.parallelism.tp_comm_overlap && d_.t > 1 && d_.sp > 1; }
  std::int64_t residual_bytes() const { return d_.tokens() * d_.h * d_.e / d_.sp; }
  // Pipeline sends. Overlapped: on their own lane. Blocking (Megatron-LM 2021, which
  // synchronized the device after every batch_isend_irecv): on the compute lane, and each
  // tensor-parallel rank sends only its 1/tp slice of the replicated activation (its
  // scatter-gather optimization; the NVLink all-gather that rebuilds it is not charged).
  LaneId p2p_lane(const Rank& r) const {
    return s_.parallelism.overlap_p2p_comm ? r.p2p : r.compute;
  }
  // With dropout (GPT / Megatron): bias + dropout + residual add is one fused kernel that also
  // writes (forward) or reads (backward) a one-byte mask, and the next norm reads the sum again.
  std::int64_t dropout_mask_bytes() const { return d_.dropout ? d_.tokens() * d_.h / d_.sp : 0; }
  std::int64_t res1_ln2_fwd_bytes() const {
    return (d_.dropout ? 5 : 4) * residual_bytes() + dropout_mask_bytes();
  }
  std::int64_t res2_fwd_bytes() const { return 3 * residual_bytes() + dropout_mask_bytes(); }
  std::int64_t norm_flops() const { return 5 * d_.tokens() * d_.h / d_.sp; }
  bool shard_params() const { return dp_sharding(s_.parallelism).params; }
  bool shard_grads() const { return dp_sharding(s_.parallelism).grads; }
  int dp() const { return grad_dp(s_.parallelism); }  // the gradient-reduction group
  // The micro-batch number in names (a reduced step names its last one as the full step does).
  int lbl(int mb) const { return mb == micro_batches_ - 1 ? last_label_ : mb; }
  std::string pfx(int mb, int layer) const { return fmt::format("mb{}.l{}", lbl(mb), layer); }
  bool has_embedding(int stage, int chunk) const { return stage == 0 && chunk == 0; }
  bool has_head(int stage, int chunk) const {
    return stage == s_.parallelism.pp - 1 && chunk == s_.parallelism.virtual_stages - 1;
  }
  ParamGroup& group(Rank& r, int layer) { return r.groups[r.group_of_layer.at(layer)]; }
  std::int64_t probs_alltoall_bytes(const LayerDims& md) const {
    return md.moe_tokens * md.top_k * 4;  // fp32 probabilities of the routed copies
  }
  // DeepSpeed ZenFlow (offload.cpu.zenflow) on that step. Its ops are charged as the mean step
  // over one update interval: what runs once per interval is charged 1/update_interval of its
  // bytes on every step (see zenflow_step).
  bool zenflow(const ParamGroup& g) const {
    return s_.offload.zenflow.enabled && deepspeed_cpu_step(g);
  }
  int zenflow_interval() const { return std::max(1, s_.offload.zenflow.update_interval); }
  // DeepSpeed SuperOffload (offload.cpu.superoffload) on a group whose optimizer stays on the
  // host (superoffload_placement moved the others' state to the GPU).
  bool superoffload(const ParamGroup& g) const {
    return s_.offload.superoffload.enabled && s_.offload.optimizer_on_cpu && g.opt_on_host;
  }
  // A SuperOffload sub-group kept on the GPU (its Adam on the GPU).
  bool superoffload_on_gpu(const ParamGroup& g) const {
    return s_.offload.superoffload.enabled && s_.offload.optimizer_on_cpu && !g.opt_on_host;
  }

  const Scenario& s_;
  const CostModel& cm_;
  sim::PlanBuilder& b_;
  BuiltStep& out_;
  LayerDims d_;
  PipelineLayout layout_;  // which layers each chunk builds
  int kept_layers_ = 0;    // BuildOptions::layers_per_chunk (0: every layer of a chunk)
  // The word embedding's gradient all-reduce on the first stage [0] and the last [1]: the ops it
  // waited for on its stage, and the all-reduce (embedding_grad_sync).
  std::array<std::optional<std::pair<std::vector<OpId>, OpId>>, 2> embedding_sync_;
  // Each stage's gradient norm and the all-reduce of its scalar (grad_passes).
  std::vector<std::pair<OpId, OpId>> norm_syncs_;
  int micro_batches_ = 1;
  int last_label_ = 0;
  sim::DType gdtype_ = sim::DType::kBf16;
  sim::DType adtype_ = sim::DType::kBf16;
  // FP8 (training.fp8_recipe as resolved; Blackwell needs no transposed FP8 copies).
  TrainingConfig::Fp8Recipe fp8_recipe_ = TrainingConfig::Fp8Recipe::kDelayed;
  bool fp8_non_tn_ = false;      // fp8_non_tn_gemm() of the GPU
  double fp8_gemm_scale_ = 1.0;  // fp8_recipe_gemm_time_scale() of the recipe on the GPU
  // Set while a gathered GEMM's input was quantized before its all-gather: its GEMMs cast nothing.
  bool fp8_input_cast_ = false;
  ResolvedDtypes dt_;
  std::vector<PoolId> hbm_pools_;
  const std::vector<LayerPolicy>& policies_;  // ResolvedScenario::layer_policies().layers
  const GroupPlacement& outside_;             // and .outside
  std::vector<LayerDims> ldims_;              // per layer (MoE layers carry their expert sizes)
  ExpertFetchCounts xfetch_;                  // how host-resident routed experts come back (MoE)
  std::map<SendKey, OpId> sends_;
  std::map<OpId, std::string> recv_names_;  // the display name of each send's receive
  std::vector<std::pair<OpId, SendKey>> pending_recv_;
  std::vector<OpId> deferred_reduce_;  // gradient reductions that wait for the whole backward
  // SuperOffload (superoffload_step): per host group the op that puts its update on the GPU,
  // and the worker's last update, which step() waits for.
  std::map<std::string, OpId> superoffload_done_;
  std::optional<OpId> superoffload_waited_;
  // DeepSpeed's per-tensor gradient checks whose gradient reduction waits for the whole backward
  // (deepspeed_grad_path): the group's index, its reduction and its D2H copy.
  struct PendingGradCheck {
    std::size_t group = 0;
    OpId reduced, grads_d2h;
  };
  std::vector<PendingGradCheck> pending_grad_checks_;
  OpId last_compute_;         // the latest op emitted on the current rank's compute lane
  bool static_only_ = false;  // BuildOptions::static_only
  // Cross-lane dependencies of the next compute op (a ring attention's last dK,dV transfer).
  std::vector<OpId> next_compute_deps_;
  HostSegment host_seg_;
  // While a combined step's pass is built: its marks, and the lane of its all-to-alls.
  std::vector<PassMarks>* marks_ = nullptr;
  LaneId a2a_lane_;
  // moe_backward with delayed weight gradients: what the dispatch's all-to-alls wait for.
  std::optional<OpId> a2a_ready_;
  // parallelism.delay_wgrad_compute in a combined step's backward: the shared experts' and the
  // attention block's weight gradients of the layer last built, in that order (Megatron-Core's
  // pre_dispatch_computation.backward_dw, _BackwardDWWrapper), emitted once the next layer's
  // combine all-to-all is issued or at the task's end (flush_delayed_wgrads), and what waits for
  // them (`after`: the layer's frees, gradient accumulation and reduction, given the last of
  // them). `prefix` names the layer and micro-batch they belong to.
  struct DelayedWgrads {
    std::string prefix;
    std::vector<std::function<OpId()>> emits;
    std::function<void(OpId)> after;
  };
  // Opens the delayed weight gradients of the layer `prefix` names (flushing another layer's
  // first) and returns them.
  DelayedWgrads& delayed_wgrads_of(const std::string& prefix);
  bool defers_wgrads(int l) const;
  std::optional<DelayedWgrads> delayed_wgrads_;
  bool defer_wgrads_ = false;  // backward_entries: collect the wgrad entries into delayed_wgrads_
  void flush_delayed_wgrads();
  std::optional<OpId> host_wait_;             // a synchronisation whose next op is not issued yet
  std::optional<NextHostOps> next_host_ops_;  // next_host_ops(): for the next issued op only
  GraphRegion graph_region_ = GraphRegion::kNone;  // GraphScope: the module being emitted
  GraphRegion graph_last_ = GraphRegion::kNone;    // the last entry's module
  int graph_last_layer_ = -1;                      // and its layer
  bool graph_charged_ = false;                     // its graph replay is charged
  bool in_backward_task_ = false;                  // building a backward task
  std::optional<OpId> host_prev_first_;  // the first GPU op of the task's previous segment
  double host_prev_gpu_s_ = 0.0;         // that segment's GPU time after its first op
  bool host_behind_ = false;             // a marker of this task may hold the GPU back
  bool host_one_segment_ = false;        // the optimizer: no cut at layer changes
};

}  // namespace offsim::models::detail
