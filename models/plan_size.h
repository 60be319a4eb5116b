// plan_size: the size of the Plan build_step() would emit for a scenario, and of the Timeline
// the engine would record for it, estimated in closed form without building anything
// (target offsim_models). Used to refuse enormous scenarios up front.
//
// The count follows the step builder (models/step_*.cc): per represented rank (one per pipeline
// stage), for every micro-batch and every layer the rank holds, the forward and backward ops of one
// layer pass (GEMMs, attention, norms, tensor-parallel collectives, recompute, activation offload
// copies, parameter fetches, gradient reductions), plus the embedding/head ops, the pipeline sends
// and the optimizer ops of every parameter group. Layers are visited once (at most 100 000 in a
// scenario); micro-batches multiply in floating point, so no count overflows.
//
//   models::PlanSize size = models::estimate_plan_size(scenario);
//   if (size.ops > 20e6) fmt::print("{}\n", models::describe(size));
//   for (const models::RecipeRow& row : models::layer_recipe(scenario, 0).rows)
//     fmt::print("{}: {} forward, {} backward\n", row.what, row.forward, row.backward);
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "models/formulas.h"
#include "models/resolve.h"
#include "models/scenario.h"

namespace offsim::sim {
struct Op;
}

namespace offsim::models {

struct PlanSize {
  double ops = 0.0;      // plan.ops.size()
  double tensors = 0.0;  // plan.tensors.size()
  double deps = 0.0;     // sum of op.deps.size()
  // Approximate bytes of the Plan plus the Timeline the engine records for it (spans and op
  // infos always; memory samples, memory events and tensor infos when `with_memory_samples`):
  // struct sizes from sizeof plus typical heap blocks for names and small vectors (plan_size.cc).
  double bytes = 0.0;
};

struct PlanSizeOptions {
  // The Timeline keeps per-change memory samples and memory events (--trace, --timeline-out).
  bool with_memory_samples = false;
  // > 0: the size of the step with this many micro-batches (BuildOptions::micro_batches, the
  // reduced steps of the steady-state paths) in place of the scenario's.
  std::int64_t micro_batches = 0;
};

// Expects a scenario that passed check_scenario(); for others the figures are still finite.
// Works out the layers' policies with resolve_layer_policies (layer_policy.h).
PlanSize estimate_plan_size(const Scenario& scenario, const PlanSizeOptions& options = {});
// Reads the layers' policies from the resolved scenario.
PlanSize estimate_plan_size(const ResolvedScenario& scenario, const PlanSizeOptions& options = {});

// The host issue thread's segment markers (StepBuilder::host_issue_close, "….host_issue"): where
// they appear depends on the kernels' times (host-bound segments), so the estimate does not
// count them.
bool host_issue_marker(const sim::Op& op);

// One layer's recipe: the ops the step builder lowers it to in each micro-batch, by kind, counted
// in the forward pass, the backward pass and the forward ops the backward re-runs (recompute).
// A row that replaces ops of another (the MoE FFN replacing the dense MLP, tensor-parallel
// overlap splitting a GEMM) counts the difference, so a row may be negative. The estimate sums
// the recipe of every layer; tests/models/plan_size_test.cc checks it, kind by kind, against the
// ops every micro-batch of the built plans gives each layer.
enum class RecipeOpKind {
  kKernel,      // GPU kernels: GEMMs, attention, elementwise (norms, casts, rotary, accumulation)
  kCollective,  // tensor-, expert- and data-parallel collectives
  kP2P,         // point-to-point transfers (context-parallel ring, tensor-parallel overlap ring)
  kCopy,        // host-device copies (offloaded activations, host parameters)
  kMarker,      // zero-duration ordering points (MoE host synchronisation)
};
const char* to_string(RecipeOpKind kind);

struct RecipeRow {
  const char* what = "";  // "attention block kernels"
  RecipeOpKind kind = RecipeOpKind::kKernel;
  double forward = 0;
  double backward = 0;   // without the recompute
  double recompute = 0;  // forward ops re-run in the backward
};

struct LayerRecipe {
  std::vector<RecipeRow> rows;
  double forward() const;
  double backward() const;  // with the recompute
  double recompute() const;
  double per_micro_batch() const { return forward() + backward(); }
  // Forward, backward and recompute ops of one kind.
  double of(RecipeOpKind kind) const;
};

// The forward of one transformer layer, op by op in the order the step builder emits it: the
// single statement of what a layer's forward runs. StepBuilder::layer_forward and
// recompute_forward iterate it (a layer's ops and the ones its backward re-runs), the layer
// recipe above counts its rows from it, and the recompute FLOPs of build_step() sum
// fwd_op_flops() over the FwdOps its re-run entries cover.
enum class LayerOpShape {
  kElementwise,  // a memory-bound kernel (norms, residual adds, the MLP activation)
  kColumnGemm,   // a column-parallel GEMM: sequence-parallel all-gather of its input before it
  kAttention,    // the attention core (flash, or the context-parallel ring / all-to-all)
  kRowGemm,      // a row-parallel GEMM: tensor-parallel reduce(-scatter) of its output after it
};
struct LayerOpEntry {
  const char* name = "";  // ops "mb<m>.l<l>.<name>.fwd" and ".recompute"
  LayerOpShape shape = LayerOpShape::kElementwise;
  FwdOp first = FwdOp::kLn1;     // the FwdOps it computes, [first, last] (formulas.h): its FLOPs,
  FwdOp last = FwdOp::kLn1;      // the tensors it makes, and when a recompute re-runs it
  const char* comm = "";         // its tensor-parallel collective ("qkv.tp_allgather"), GEMMs only
  bool comm_recomputed = false;  // the collective is re-run with the GEMM
  bool rerun = true;             // a recompute that marks it re-runs it (else it is not re-run)
  bool ffn = false;              // part of the dense MLP: an MoE layer runs its MoE FFN instead
  bool rotary_after = false;     // followed by the rotary embedding (rotary positions)
};
std::span<const LayerOpEntry> layer_forward_recipe();
// Whether the recompute of `acts` re-runs the entry (any FwdOp it covers is marked).
bool recomputes(const LayerOpEntry& entry, const LayerActivations& acts);
// Whether a recompute that re-runs the entry re-runs its collective too (comm_recomputed, or the
// whole layer re-run).
bool recomputes_comm(const LayerOpEntry& entry, const LayerActivations& acts);
// Whether an MoE layer's recompute re-runs only its activations (recompute module moe_act),
// not the whole MoE FFN.
bool moe_activation_only(const LayerActivations& acts);

// The backward of one transformer layer after its recompute, op by op in the order the step
// builder emits it: StepBuilder::layer_backward, ffn_backward and attention_backward iterate it,
// and the layer recipe counts its backward rows from it. A GEMM entry's dims are those of the
// forward GEMM of `of` (StepBuilder::layer_gemm, m × n × k): its dgrad m × k × n, its wgrad
// k × n × m.
enum class LayerBackwardKind {
  kElementwise,  // the backward of a memory-bound kernel (norm, residual add, the activation)
  kDgrad,        // a GEMM's input gradient, after the all-gather of its output gradient (`gather`)
  kWgrad,        // a GEMM's weight gradient
  kGradReduce,   // the tensor-parallel reduction of the dgrad before it: started right after it
                 // (tp_async_grad_reduce), waited for after the next wgrad, or run after that
  kAttention,    // the attention core's backward
  kRotary,       // the rotary embedding's backward (rotary positions only)
};
struct LayerBackwardEntry {
  const char* name = "";  // op "mb<m>.l<l>.<name>"
  LayerBackwardKind kind = LayerBackwardKind::kElementwise;
  FwdOp of = FwdOp::kLn1;  // the forward op it differentiates (its GEMM or its traffic)
  // Its model FLOPs in units of the forward FLOPs of `of` (fwd_op_flops): a dgrad and a wgrad
  // each 1 (the forward GEMM transposed), the attention core's backward 2 (dQ, and dK with dV:
  // the 3 × forward convention of model FLOPs), the rest 0.
  double flops = 0;
  const char* gather = "";  // a dgrad's sequence-parallel all-gather ("mlpwo.bwd.tp_allgather")
  bool ffn = false;         // part of the dense MLP: an MoE layer runs its MoE backward instead
};
std::span<const LayerBackwardEntry> layer_backward_recipe();
// The FLOP column of the backward recipe on dims `d`: flops × fwd_op_flops(d, of) (attention in
// full, as the model FLOPs count it).
double backward_entry_flops(const LayerBackwardEntry& entry, const LayerDims& d);

// The LM head and its loss on the last pipeline stage (Megatron's output layer and
// vocabulary-parallel cross entropy), op by op in the order the step builder emits them:
// StepBuilder::head_forward and head_backward (models/step_lowering.cc) iterate these recipes and
// the plan-size estimate counts the head's ops and collectives from them (head_ops). Unchunked:
// final norm, [sequence-parallel all-gather], logits GEMM, loss; loss gradient, data- and
// weight-gradient GEMMs, [tensor-parallel reduce], final norm backward. Chunked
// (training.loss_chunks = C > 1, fused linear cross entropy): the loss gradient and both gradient
// GEMMs move into the forward, once per chunk of tokens, and the backward scales the saved input
// gradient.
enum class HeadOpKind {
  kFinalNorm,      // the final norm (forward)
  kTpGather,       // sequence-parallel all-gather of the norm's output (tp > 1 with SP)
  kLogits,         // the logits GEMM, tokens × vocab / tp × hidden (bf16 with FP8)
  kLoss,           // the cross entropy over the fp32 logits
  kLossGrad,       // its gradient with respect to the logits
  kDgrad,          // the logits GEMM's input gradient
  kWgrad,          // its weight gradient
  kLossScale,      // chunked: the saved input gradient scaled by the loss gradient
  kTpReduce,       // tensor-parallel reduce(-scatter) of the input gradient (tp > 1)
  kFinalNormGrad,  // the final norm's backward
};
struct HeadOpEntry {
  const char* name = "";  // op "mb<m>.head.<name>", per chunk "mb<m>.head.chunk<c>.<name>"
  HeadOpKind kind = HeadOpKind::kFinalNorm;
  bool per_chunk = false;  // once per loss chunk (chunked recipe only)
};
std::span<const HeadOpEntry> head_forward_recipe(bool chunked);
std::span<const HeadOpEntry> head_backward_recipe(bool chunked);
// How many ops an entry emits per micro-batch: its collective only when the parallelism has it
// (d.t, d.sp), a per-chunk entry `chunks` times, the others once.
double head_ops(const HeadOpEntry& entry, const LayerDims& d, std::int64_t chunks);
bool head_collective(const HeadOpEntry& entry);

// The MoE FFN of an MoE layer (Megatron-Core's MoE layer with the all-to-all token dispatcher),
// which replaces the `ffn` entries of both recipes above: its forward (also its recompute, which
// re-runs it whole) and its backward, op by op in the order the step builder emits them.
// StepBuilder::moe_forward, moe_shared_forward and moe_backward (models/step_moe.cc) iterate
// them, the layer recipe counts its MoE rows from them, and moe_entry_flops() gives their FLOPs.
//
// The GEMMs of the MoE FFN by their forward m × n × k: the router (moe_tokens × experts × h),
// the local experts' grouped FC1 (rows × fe·g × h, g = 2 when gated) and FC2 (rows × h × fe),
// the shared experts' input (tokens × fs·g × h) and output (tokens × h × fs) projections.
enum class MoeGemm { kNone, kRouter, kFc1, kFc2, kSharedWi, kSharedWo };
// The pass of a GEMM: the forward m × n × k, its dgrad m × k × n, its wgrad k × n × m.
enum class GemmPass { kForward, kDgrad, kWgrad };
enum class MoeOpKind {
  kGemm,           // a GEMM over the tokens (router, shared experts); FP8: forward and dgrad cast
  kGroupedGemm,    // the local experts' grouped GEMM (StepBuilder::grouped_gemm)
  kElementwise,    // a memory-bound kernel (`traffic`)
  kAllToAll,       // over the expert-parallel group (ep > 1): the tokens, or their probabilities
  kExpertGather,   // expert-tensor-parallel all-gather of the routed rows (etp > 1)
  kExpertScatter,  // their reduce-scatter (etp > 1)
  kSharedGather,   // the shared experts' sequence-parallel all-gather of the tokens (tp > 1, SP)
  kSharedReduce,   // the shared experts' tensor-parallel reduce(-scatter) (tp > 1)
  kHostSync,       // dropless routing: the host waits for the token counts (a host-lane marker)
  kRoutingGather,  // HybridEP: the all-gather of the routing map (one byte per token and expert)
  kRoutedFetch,    // router-aware expert fetch: the H2D of the picked experts (a copy, when the
                   // experts are on the host and offload.experts.fetch is routed)
};
// The memory-bound kernels: the router's softmax and top-k, the permutation of the tokens to
// their experts, the experts' activation, the unpermutation (weighted sum of the top-k outputs),
// the shared experts' activation.
enum class MoeTraffic {
  kNone,
  kTopk,
  kPermute,
  kSortChunks,    // the received tokens (and their probabilities) sorted by local expert
  kUnsortChunks,  // the experts' outputs back in the received order
  kExpertAct,
  kUnpermute,
  kSharedAct
};
struct MoeOpEntry {
  const char* name = "";  // forward: ops "mb<m>.l<l>.<name>.fwd" / ".recompute"; backward: as is
  MoeOpKind kind = MoeOpKind::kElementwise;
  MoeGemm gemm = MoeGemm::kNone;  // GEMM entries
  GemmPass pass = GemmPass::kForward;
  MoeTraffic traffic = MoeTraffic::kNone;  // elementwise entries
  bool probs = false;   // an all-to-all of the routing probabilities (fp32), not the tokens
  bool shared = false;  // a shared expert's op: only with shared experts (fs > 0)
  // Framework ops the host issues for it (StepBuilder::next_host_ops, counted in Megatron-Core's
  // source, models/README.md "Host issue thread"); 0: the default of one op.
  double host_ops = 0;
};
std::span<const MoeOpEntry> moe_forward_recipe();
std::span<const MoeOpEntry> moe_backward_recipe();
// Whether the entry is emitted for an MoE layer of dims `d` (its parallelism and shared
// experts); a kRoutedFetch entry also needs the fetch (not known from the dims).
bool moe_entry_runs(const MoeOpEntry& entry, const LayerDims& d);
// Whether the entry is an experts' activation (routed or shared): what an activation-only MoE
// recompute (moe_activation_only) re-runs.
inline bool moe_activation_entry(const MoeOpEntry& entry) {
  return entry.traffic == MoeTraffic::kExpertAct || entry.traffic == MoeTraffic::kSharedAct;
}
// Whether a recompute of an MoE layer that does not re-run the whole MoE FFN re-runs the entry:
// the experts' activations under moe_act (moe_activation_only), every shared-expert entry under
// shared_experts (LayerActivations::shared_experts), the shared activation once.
inline bool moe_partial_recompute_entry(const MoeOpEntry& entry, const LayerActivations& acts) {
  if (acts.shared_experts && entry.shared) return true;
  return moe_activation_only(acts) && moe_activation_entry(entry) &&
         !(acts.shared_experts && entry.shared);
}
struct GemmMnk {
  std::int64_t m = 0, n = 0, k = 0;
};
// The GEMM of an entry's pass; `rows`: the token rows of a grouped GEMM's expert (else unused).
GemmMnk moe_gemm(const LayerDims& d, MoeGemm gemm, GemmPass pass, std::int64_t rows);
// The FLOP column of the MoE recipes on dims `d`: a GEMM's 2·m·n·k, a grouped GEMM's over all
// its `routed` rows (its useful FLOPs, whatever the imbalance), 0 for the rest; with
// fwd_op_flops' convention (the router and the experts' and shared experts' input projections
// count in kMlpWi, their output projections in kMlpWo).
double moe_entry_flops(const MoeOpEntry& entry, const LayerDims& d);

// Model FLOPs of one layer's forward and of its backward from the recipes: the forward
// entries' fwd_op_flops, the backward entries' FLOP column, an MoE layer's FFN from the MoE
// recipes' entries that run. build_step()'s model FLOPs are the forward's 3 × (forward,
// dgrad, wgrad); tests/models/plan_size_test.cc checks that its backward FLOPs are these.
double recipe_forward_flops(const LayerDims& d);
double recipe_backward_flops(const LayerDims& d);

// Expects a scenario that passed check_scenario() and 0 <= layer < model.layers.
LayerRecipe layer_recipe(const Scenario& scenario, int layer);
// The same, with the layer's policy read from the resolved scenario.
LayerRecipe layer_recipe(const ResolvedScenario& scenario, int layer);

// "3.2M ops, 1.1M tensors, 4.0M deps, about 2.1 GiB of plan and timeline"
std::string describe(const PlanSize& size);

}  // namespace offsim::models
