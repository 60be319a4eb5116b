#include "models/plan_size.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "models/formulas.h"
#include "models/layer_policy.h"
#include "sim/plan/plan.h"
#include "sim/trace/timeline.h"

namespace offsim::models {

namespace {

// Heap blocks behind an op besides its struct: the name in the Timeline's OpInfo (most names,
// "mb12.l31.mlpwi.fwd", pass the 15-character small-string buffer, and malloc rounds the block
// to 32 bytes; the Plan's own copy, a sim::InlineString, holds up to 38 characters inside the
// op); the block of the OpInfo's deps vector (the Plan's op holds up to four deps, and its
// allocs and frees up to two each, inside its struct, as it holds the cost's resource uses, two
// to six, up to three: sim::SmallVector). Tensors alike: the TensorInfo's name on the heap, the
// Plan's inline. Checked against the real allocations in tests/models/plan_size_test.cc.
constexpr double kNameHeapBytes = 32.0;
constexpr double kVectorBlockBytes = 16.0;

// What one layer adds to the step, from its layer_policy() (layer_policy.h).
struct LayerShape {
  double host_chunks = 0;  // offloaded activation chunks (one D2H and one H2D each)
  bool hbm_saved = false;  // some activation stays on HBM
  bool recomputed = false;
  double recompute_ops = 0;
  double recompute_collectives = 0;  // of those, tensor-parallel collectives
  double recompute_p2p = 0;          // ring transfers of the recomputed overlapped GEMMs
  double recompute_gathered = 0;     // recomputed overlapped all-gather + GEMMs
  double recompute_scattered = 0;    // recomputed overlapped GEMM + reduce-scatters
  bool moe_recomputed = false;       // the MoE FFN is re-run whole
  bool recompute_core = false;       // the attention core is re-run
  bool params_on_host = false;
  bool grads_on_host = false;
  bool opt_on_host = false;
  bool master_on_host = false;
};

// The ops of an MoE FFN, counted from its recipes (moe_forward_recipe, moe_backward_recipe):
// kernels (GEMMs, grouped GEMMs, memory-bound), collectives (all-to-alls with ep > 1, the
// expert-TP gather and scatter with etp > 1, the shared experts' TP collectives), the host-sync
// marker, and the FP8 input casts of the GEMMs' forward and dgrad, plain and grouped (the wgrad
// reuses the dgrad's). The router-aware fetch's copy is counted apart (fwd_fetches: emitted only
// when the experts are on the host and fetched by route).
struct MoeOps {
  double fwd = 0;
  double bwd = 0;
  double fwd_collectives = 0;  // of fwd
  double bwd_collectives = 0;  // of bwd
  double alltoalls = 0;        // of the collectives, forward and backward: the all-to-alls
  double fwd_markers = 0;      // of fwd: the host-sync marker
  double fwd_fetches = 0;      // not in fwd: the router-aware fetch entries
  double fp8_casts_fwd = 0;    // FP8 input casts of the GEMMs (plain and grouped)
  double fp8_casts_bwd = 0;
};
struct MoePassOps {
  double ops = 0;
  double collectives = 0;
  double alltoalls = 0;
  double markers = 0;
  double fetches = 0;
  double fp8_casts = 0;
};
MoePassOps moe_pass_ops(const LayerDims& d, std::span<const MoeOpEntry> entries) {
  using K = MoeOpKind;
  MoePassOps o;
  for (const MoeOpEntry& e : entries) {
    o.fetches += e.kind == K::kRoutedFetch ? 1 : 0;
    if (e.kind == K::kRoutedFetch || !moe_entry_runs(e, d)) continue;
    o.ops += 1;
    o.markers += e.kind == K::kHostSync ? 1 : 0;
    o.alltoalls += e.kind == K::kAllToAll ? 1 : 0;
    // FP8 input casts of the GEMMs, plain and grouped (the wgrad reuses them).
    const bool gemm = e.kind == K::kGemm || e.kind == K::kGroupedGemm;
    o.fp8_casts += gemm && e.pass != GemmPass::kWgrad ? 1 : 0;
    const bool kernel =
        e.kind == K::kGemm || e.kind == K::kGroupedGemm || e.kind == K::kElementwise;
    o.collectives += !kernel && e.kind != K::kHostSync ? 1 : 0;
  }
  return o;
}
MoeOps moe_ops(const LayerDims& d) {
  const MoePassOps f = moe_pass_ops(d, moe_forward_recipe());
  const MoePassOps b = moe_pass_ops(d, moe_backward_recipe());
  return {.fwd = f.ops,
          .bwd = b.ops,
          .fwd_collectives = f.collectives,
          .bwd_collectives = b.collectives,
          .alltoalls = f.alltoalls + b.alltoalls,
          .fwd_markers = f.markers,
          .fwd_fetches = f.fetches,
          .fp8_casts_fwd = f.fp8_casts,
          .fp8_casts_bwd = b.fp8_casts};
}

// Where a layer's saved activations go: the chunks copied to the host (whole tensors when the
// policy does not chunk them) and whether any stays on HBM.
void place_activations(const LayerDims& d, const LayerPolicy& policy, LayerShape& out) {
  double host_bytes = 0;
  for (int a = 0; a < kNumActs; ++a) {
    if (!policy.acts.saved[a]) continue;
    const auto bytes = static_cast<double>(act_bytes(d, static_cast<Act>(a)));
    if (policy.on_host[a]) {
      host_bytes += bytes;
    } else if (bytes > 0) {
      out.hbm_saved = true;
    }
  }
  if (policy.acts.latent_bytes > 0) out.hbm_saved = true;
  if (host_bytes > 0) {
    out.host_chunks = policy.chunk_bytes > 0
                          ? std::ceil(host_bytes / static_cast<double>(policy.chunk_bytes))
                          : 1.0;
  }
}

struct RecomputeOps {
  double ops = 0;
  double collectives = 0;  // of ops: tensor-parallel and MoE collectives
  double p2p = 0;          // tp_comm_overlap ring transfers (not in ops)
  double gathered = 0;     // tp_comm_overlap: recomputed all-gather + GEMMs
  double scattered = 0;    // tp_comm_overlap: recomputed GEMM + reduce-scatters
  bool moe = false;        // the MoE FFN is re-run whole
};

// The tensor-parallel collectives of a recipe entry: a column-parallel GEMM's sequence-parallel
// all-gather, a row-parallel GEMM's reduce(-scatter) (StepBuilder::gathered_gemm,
// scattered_gemm).
double entry_collectives(const LayerDims& d, const LayerOpEntry& e) {
  if (e.shape == LayerOpShape::kColumnGemm) return d.t > 1 && d.sp > 1 ? 1 : 0;
  if (e.shape == LayerOpShape::kRowGemm) return d.t > 1 ? 1 : 0;
  return 0;
}
bool is_gemm(const LayerOpEntry& e) {
  return e.shape == LayerOpShape::kColumnGemm || e.shape == LayerOpShape::kRowGemm;
}

// The ops StepBuilder::recompute_forward re-runs for one entry of the layer's forward: its
// kernel, its collective when that is re-run too, the rotary embedding after it, and
// Transformer Engine's FP8 input cast of a GEMM (StepBuilder::gemm).
// Under mla_up_proj the QKV entry re-runs MLA's up projections without the collective.
bool mla_up_only(const LayerOpEntry& e, const LayerActivations& acts) {
  return e.first == FwdOp::kQkv && acts.mla_up_proj;
}
RecomputeOps entry_recompute(const Scenario& s, const LayerDims& d, const LayerOpEntry& e,
                             const LayerActivations& acts) {
  RecomputeOps out;
  out.collectives = recomputes_comm(e, acts) && !mla_up_only(e, acts) ? entry_collectives(d, e) : 0;
  out.ops = 1 + out.collectives;
  if (e.rotary_after && s.model.max_positions == 0) out.ops += 1;
  if (s.training.compute_dtype == sim::DType::kFp8 && is_gemm(e)) out.ops += 1;
  return out;
}

// The recompute ops of StepBuilder::layer_backward for a dense layer, with their tensor-parallel
// collectives: the entries of the layer's forward recipe the recompute re-runs.
RecomputeOps dense_recompute(const Scenario& s, const LayerDims& d, const LayerActivations& acts) {
  RecomputeOps out;
  for (const LayerOpEntry& e : layer_forward_recipe()) {
    if (!recomputes(e, acts)) continue;
    const RecomputeOps o = entry_recompute(s, d, e, acts);
    out.ops += o.ops;
    out.collectives += o.collectives;
  }
  // tp_comm_overlap: the recomputed GEMMs whose collective is re-run run as the forward's
  // overlapped GEMMs (tp_overlap_rows): a gathered GEMM's all-gather becomes tp - 1 ring
  // transfers and tp GEMMs, a scattered GEMM tp GEMMs (FP8: and casts) and tp reduce-scatters.
  // An MoE layer's FFN entries are replaced by its MoE FFN (moe_recompute).
  if (s.parallelism.tp_comm_overlap && d.t > 1 && d.sp > 1) {
    const double t = static_cast<double>(d.t);
    const double fp8 = s.training.compute_dtype == sim::DType::kFp8 ? 1 : 0;
    double gathered = 0;
    double scattered = 0;
    for (const LayerOpEntry& e : layer_forward_recipe()) {
      if (!recomputes_comm(e, acts) || (e.ffn && d.moe) || mla_up_only(e, acts) ||
          !recomputes(e, acts)) {
        continue;
      }
      gathered += e.shape == LayerOpShape::kColumnGemm ? 1 : 0;
      scattered += e.shape == LayerOpShape::kRowGemm ? 1 : 0;
    }
    const double more_collectives = scattered * (t - 1) - gathered;
    out.ops += (gathered + scattered * (1 + fp8)) * (t - 1) + more_collectives;
    out.collectives += more_collectives;
    out.p2p = gathered * (t - 1);
    out.gathered = gathered;
    out.scattered = scattered;
  }
  return out;
}

// An MoE layer whose MLP is recomputed re-runs StepBuilder::moe_forward whole instead of the
// dense MLP's recompute ops, or the entries of a partial recompute (moe_act's activations, the
// shared experts).
void moe_recompute(const Scenario& s, const LayerDims& d, const LayerActivations& acts,
                   RecomputeOps& out) {
  if (!d.moe) return;
  RecomputeOps mlp;
  bool any = false;
  for (const LayerOpEntry& e : layer_forward_recipe()) {
    if (!e.ffn || !recomputes(e, acts)) continue;
    any = true;
    const RecomputeOps o = entry_recompute(s, d, e, acts);
    mlp.ops += o.ops;
    mlp.collectives += o.collectives;
  }
  if (!any && !acts.shared_experts) return;
  out.ops -= mlp.ops;
  out.collectives -= mlp.collectives;
  if (!any || moe_activation_only(acts)) {
    std::vector<MoeOpEntry> partial;
    for (const MoeOpEntry& m : moe_forward_recipe()) {
      if (moe_partial_recompute_entry(m, acts)) partial.push_back(m);
    }
    const MoePassOps po = moe_pass_ops(d, partial);
    out.ops += po.ops;
    out.collectives += po.collectives;
    if (s.training.compute_dtype == sim::DType::kFp8) out.ops += po.fp8_casts;
    return;
  }
  const MoeOps mo = moe_ops(d);
  out.moe = true;
  if (s.training.compute_dtype == sim::DType::kFp8) out.ops += mo.fp8_casts_fwd;
  out.ops += mo.fwd;
  out.collectives += mo.fwd_collectives;
}

// The forward ops of the recipe's entries in (`ffn`) or outside the dense MLP: kernels, their
// tensor-parallel collectives, GEMMs (one FP8 input cast each) and rotary embeddings.
struct ForwardCounts {
  double kernels = 0;
  double collectives = 0;
  double gemms = 0;
  double rotary = 0;
};
ForwardCounts forward_counts(const LayerDims& d, bool ffn) {
  ForwardCounts c;
  for (const LayerOpEntry& e : layer_forward_recipe()) {
    if (e.ffn != ffn) continue;
    c.kernels += 1;
    c.collectives += entry_collectives(d, e);
    c.gemms += is_gemm(e) ? 1 : 0;
    c.rotary += e.rotary_after ? 1 : 0;
  }
  return c;
}

// The backward ops of the backward recipe's entries in (`ffn`) or outside the dense MLP:
// kernels, tensor-parallel collectives (a dgrad's all-gather under SP, a gradient reduction),
// dgrads (one FP8 cast of the output gradient each; the wgrad reuses it), dgrads after an
// all-gather, and rotary embeddings.
struct BackwardCounts {
  double kernels = 0;
  double collectives = 0;
  double dgrads = 0;
  double gathered = 0;
  double rotary = 0;
  double grad_reduces = 0;  // gradient-reduction entries, whether tp has them or not
};
BackwardCounts backward_counts(const LayerDims& d, bool ffn) {
  using K = LayerBackwardKind;
  BackwardCounts c;
  for (const LayerBackwardEntry& e : layer_backward_recipe()) {
    if (e.ffn != ffn) continue;
    const bool gather = e.kind == K::kDgrad && *e.gather != '\0';
    c.kernels += e.kind != K::kGradReduce && e.kind != K::kRotary ? 1 : 0;
    c.rotary += e.kind == K::kRotary ? 1 : 0;
    c.dgrads += e.kind == K::kDgrad ? 1 : 0;
    c.gathered += gather ? 1 : 0;
    if (gather) c.collectives += d.t > 1 && d.sp > 1 ? 1 : 0;
    if (e.kind == K::kGradReduce) c.collectives += d.t > 1 ? 1 : 0;
    c.grad_reduces += e.kind == K::kGradReduce ? 1 : 0;
  }
  return c;
}

LayerShape layer_shape(const Scenario& s, const LayerDims& d, const LayerPolicy& policy) {
  LayerShape out;
  out.params_on_host = policy.params_on_host;
  out.grads_on_host = policy.grads_on_host;
  out.opt_on_host = policy.opt_on_host;
  out.master_on_host = policy.master_on_host;
  place_activations(d, policy, out);
  out.recomputed = policy.acts.recomputed_bytes(d) > 0;
  RecomputeOps rc = dense_recompute(s, d, policy.acts);
  moe_recompute(s, d, policy.acts, rc);
  out.recompute_ops = rc.ops;
  out.recompute_collectives = rc.collectives;
  out.recompute_p2p = rc.p2p;
  out.recompute_gathered = rc.gathered;
  out.recompute_scattered = rc.scattered;
  out.moe_recomputed = rc.moe;
  out.recompute_core = policy.acts.recompute[static_cast<int>(FwdOp::kCore)];
  return out;
}

// What the recipe of a layer depends on besides its shape.
struct RecipeInputs {
  bool sharded_fetch = false;  // ZeRO-3 / FSDP parameters all-gathered over dp > 1 ranks
  bool routed_fetch = false;   // router-aware expert fetch (formulas.h expert_fetch_counts)
  // All-gathers per sharded fetch, forward and backward: one, or with param_gather
  // per_tensor_synchronized one per parameter tensor, twice in the backward of a fully
  // recomputed layer (StepBuilder::gather_per_tensor).
  double gathers_fwd = 1;
  double gathers_bwd = 1;
};

// The transformer layer without context or tensor-parallel overlap (StepBuilder::layer_forward /
// layer_backward): attention block, dense MLP or MoE FFN, tensor-parallel collectives, FP8
// casts, rotary embedding, accumulation, parameter fetches and activation copies.
void base_rows(const Scenario& s, const LayerDims& d, const LayerShape& ls, const RecipeInputs& in,
               std::vector<RecipeRow>& rows) {
  using K = RecipeOpKind;
  const bool fp8 = s.training.compute_dtype == sim::DType::kFp8;
  // The forward from the layer's forward recipe, the backward from its backward recipe. The
  // MoE FFN replaces the dense MLP's kernels, its TP collectives and its GEMMs' FP8 casts.
  const ForwardCounts attn = forward_counts(d, false);
  const ForwardCounts mlp = forward_counts(d, true);
  const BackwardCounts attn_bwd = backward_counts(d, false);
  const BackwardCounts mlp_bwd = backward_counts(d, true);
  rows.push_back(
      {"attention block, norms and residuals", K::kKernel, attn.kernels, attn_bwd.kernels});
  rows.push_back({"attention tensor-parallel collectives", K::kCollective, attn.collectives,
                  attn_bwd.collectives});
  if (d.moe) {
    const MoeOps mo = moe_ops(d);
    rows.push_back({"MoE FFN kernels", K::kKernel, mo.fwd - mo.fwd_collectives - mo.fwd_markers,
                    mo.bwd - mo.bwd_collectives});
    rows.push_back({"MoE collectives", K::kCollective, mo.fwd_collectives, mo.bwd_collectives});
    rows.push_back({"MoE host synchronisation", K::kMarker, mo.fwd_markers, 0});
    if (fp8) {
      rows.push_back({"FP8 input casts", K::kKernel, attn.gemms + mo.fp8_casts_fwd,
                      attn_bwd.dgrads + mo.fp8_casts_bwd});
    }
    if (ls.params_on_host && in.routed_fetch) {
      // StepBuilder::moe_routed_fetch: an H2D after the router's top-k.
      rows.push_back({"router-aware expert fetch", K::kCopy, mo.fwd_fetches, 0});
    }
  } else {
    rows.push_back({"MLP kernels", K::kKernel, mlp.kernels, mlp_bwd.kernels});
    rows.push_back(
        {"MLP tensor-parallel collectives", K::kCollective, mlp.collectives, mlp_bwd.collectives});
    if (fp8) {
      rows.push_back({"FP8 input casts", K::kKernel, attn.gemms + mlp.gemms,
                      attn_bwd.dgrads + mlp_bwd.dgrads});
    }
  }
  // Rotary positions: the rotary-embedding kernel after the QKV GEMM, and its backward.
  const bool rotary = s.model.max_positions == 0;
  rows.push_back({"rotary embedding", K::kKernel, rotary ? attn.rotary : 0,
                  rotary ? attn_bwd.rotary + mlp_bwd.rotary : 0});
  // Without gradient-accumulation fusion, one accumulation pass per layer in the backward.
  rows.push_back({"weight-gradient accumulation", K::kKernel, 0,
                  s.training.gradient_accumulation_fusion ? 0.0 : 1.0});
  const double host_fetch = ls.params_on_host ? 1 : 0;
  const double gather = in.sharded_fetch ? 1 : 0;
  rows.push_back({"host parameter fetch", K::kCopy, host_fetch, host_fetch});
  rows.push_back({"sharded parameter all-gather", K::kCollective, gather * in.gathers_fwd,
                  gather * in.gathers_bwd});
  // ZeRO-3 / FSDP: the routed experts' own all-gather over the expert-DP group.
  const double expert_gather =
      d.moe && dp_sharding(s.parallelism).params && expert_shard_dp(s.parallelism) > 1 ? 1 : 0;
  rows.push_back(
      {"sharded routed-expert all-gather", K::kCollective, expert_gather, expert_gather});
  rows.push_back(
      {"offloaded activation copies (D2H, H2D)", K::kCopy, ls.host_chunks, ls.host_chunks});
  const double rc_markers = ls.moe_recomputed ? 1 : 0;
  rows.push_back({"recomputed forward kernels", K::kKernel, 0, 0,
                  ls.recompute_ops - ls.recompute_collectives - rc_markers});
  rows.push_back({"recomputed collectives", K::kCollective, 0, 0, ls.recompute_collectives});
  rows.push_back({"recomputed ring transfers", K::kP2P, 0, 0, ls.recompute_p2p});
  rows.push_back({"recomputed MoE host synchronisation", K::kMarker, 0, 0, rc_markers});
}

// Context parallelism (StepBuilder::ring_attention / ulysses_attention): per attention pass,
// ring: cp kernels instead of one and cp − 1 K,V transfers (the backward also cp dK,dV
// transfers); all-to-all: two all-to-alls over cp ranks.
void context_parallel_rows(const Scenario& s, const LayerShape& ls, std::vector<RecipeRow>& rows) {
  const ParallelConfig& p = s.parallelism;
  if (p.cp == 1) return;
  const double cp = p.cp;
  const double recomputed = ls.recompute_core ? 1 : 0;
  if (p.cp_comm_type == ParallelConfig::CpCommType::kA2A) {
    rows.push_back(
        {"context-parallel all-to-alls", RecipeOpKind::kCollective, 2, 2, 2 * recomputed});
    return;
  }
  rows.push_back({"ring attention: more attention kernels", RecipeOpKind::kKernel, cp - 1, cp - 1,
                  recomputed * (cp - 1)});
  rows.push_back({"ring attention: K,V (and dK,dV) transfers", RecipeOpKind::kP2P, cp - 1,
                  2 * cp - 1, recomputed * (cp - 1)});
}

// Tensor-parallel overlap (StepBuilder::gathered_gemm / scattered_gemm). tp_comm_overlap with
// SP: an all-gather + GEMM becomes tp − 1 ring transfers and tp GEMMs, a GEMM + reduce-scatter
// tp GEMMs and tp reduce-scatters (FP8: a cast per GEMM of the reduce-scatter; a gathered GEMM's
// input is cast once, before the transfers): the column- and row-parallel GEMMs of the forward
// recipe and the gathered dgrads of the backward recipe, those of the dense MLP in a dense layer
// only (an MoE layer's attention block's).
// The GEMMs tensor-parallel overlap splits in a layer, from the recipes: the forward's column-
// parallel (gathered) and row-parallel (scattered) GEMMs, the backward's gathered dgrads, and
// the backward's gradient reductions; those of the dense MLP in a dense layer only.
struct TpGemms {
  double gathered = 0;
  double scattered = 0;
  double gathered_bwd = 0;
  double grad_reduces = 0;
};
TpGemms tp_gemms(const LayerDims& d) {
  TpGemms g;
  for (const LayerOpEntry& e : layer_forward_recipe()) {
    if (e.ffn && d.moe) continue;
    g.gathered += e.shape == LayerOpShape::kColumnGemm ? 1 : 0;
    g.scattered += e.shape == LayerOpShape::kRowGemm ? 1 : 0;
  }
  const BackwardCounts attn = backward_counts(d, false);
  const BackwardCounts mlp = backward_counts(d, true);
  g.gathered_bwd = attn.gathered + (d.moe ? 0 : mlp.gathered);
  g.grad_reduces = attn.grad_reduces + (d.moe ? 0 : mlp.grad_reduces);
  return g;
}

void tp_overlap_rows(const Scenario& s, const LayerDims& d, std::vector<RecipeRow>& rows) {
  const ParallelConfig& p = s.parallelism;
  if (d.t == 1 || !p.tp_comm_overlap || d.sp == 1) return;
  const double t = static_cast<double>(d.t);
  const double fp8 = s.training.compute_dtype == sim::DType::kFp8 ? 1 : 0;
  const TpGemms g = tp_gemms(d);
  const double gathered = g.gathered;    // forward
  const double scattered = g.scattered;  // forward
  const double gathered_bwd = g.gathered_bwd;
  rows.push_back({"tensor-parallel overlap: ring transfers", RecipeOpKind::kP2P, gathered * (t - 1),
                  gathered_bwd * (t - 1)});
  rows.push_back({"tensor-parallel overlap: split GEMMs (and casts)", RecipeOpKind::kKernel,
                  (gathered + scattered * (1 + fp8)) * (t - 1), gathered_bwd * (t - 1)});
  rows.push_back({"tensor-parallel overlap: collectives", RecipeOpKind::kCollective,
                  scattered * (t - 1) - gathered, -gathered_bwd});
}

LayerRecipe recipe_of(const Scenario& s, const LayerDims& d, const LayerShape& ls,
                      const RecipeInputs& in) {
  LayerRecipe r;
  base_rows(s, d, ls, in, r.rows);
  context_parallel_rows(s, ls, r.rows);
  tp_overlap_rows(s, d, r.rows);
  return r;
}

RecipeInputs recipe_inputs(const Scenario& s) {
  const ParallelConfig& p = s.parallelism;
  return {.sharded_fetch = dp_sharding(p).params && shard_dp(p) > 1,
          .routed_fetch = expert_fetch_counts(s).after_router > 0};
}

// The scenario's recipe inputs for layer l: its all-gathers per fetch.
RecipeInputs layer_inputs(const Scenario& s, RecipeInputs in, int l) {
  if (s.parallelism.param_gather != ParallelConfig::ParamGather::kPerTensorSynchronized) return in;
  const bool full = recompute_mode(s.recompute, l) == RecomputeConfig::Mode::kFull;
  const auto tensors =
      static_cast<double>(layer_parameter_tensors_per_rank(s.model, s.parallelism.tp).size());
  in.gathers_fwd = tensors;
  in.gathers_bwd = tensors * (full ? 2 : 1);
  return in;
}

// The dimensions of layer l (its MoE sizes when the model has experts).
LayerDims dims_of_layer(const Scenario& s, const LayerDims& d, int l) {
  return s.model.moe.experts > 0 ? layer_dims(s.model, s.training, s.parallelism, l) : d;
}

struct Counts {
  double ops = 0;
  double tensors = 0;
  double deps = 0;
  double samples = 0;      // memory samples: one per alloc and one per free
  double group_ranks = 0;  // collective groups: one int per member rank per collective
};

// Optimizer ops and static tensors of one parameter group (StepBuilder::optimizer and
// make_static_tensors). A group of linear weights (`linear`: a layer's or its routed experts')
// under FP8 GEMMs with bf16 parameters not sharded adds the FP8 copies Transformer Engine caches
// (StepBuilder::fp8_weight_cache_bytes); its weight cast is counted with the layer.
void add_group(const Scenario& s, bool params_on_host, bool grads_on_host, bool opt_on_host,
               Counts& c, bool linear = false) {
  const ParallelConfig& p = s.parallelism;
  const DpSharding shard = dp_sharding(p);
  double ops = 0;
  if (opt_on_host && s.offload.optimizer_on_cpu && s.offload.superoffload.enabled) {
    // SuperOffload (StepBuilder::superoffload_step): the worker's update, the narrowing and the
    // H2D per host group (a group kept on the GPU has one update instead).
    // With host gradients, the per-tensor gradient checks before their copy (deepspeed_grad_path).
    ops += 1 + 3;
    c.deps += grads_on_host ? 2 : 0;
  } else if (opt_on_host && s.offload.optimizer_on_cpu) {
    // DeepSpeed's flat CPU step and its H2D are one per stage, counted once (below); the
    // per-tensor gradient checks before each host gradient's copy (stages 1 and 2).
    const bool flat = s.offload.cpu_step == OffloadPolicy::CpuStep::kFlatPartition;
    const bool checks = flat && grads_on_host && p.zero_stage <= 2;
    ops += (grads_on_host ? 0 : 1) + (flat ? 0 : 1 + (params_on_host ? 0 : 1)) + (checks ? 1 : 0);
    c.deps += checks ? 2 : 0;
  } else if (opt_on_host) {
    ops += 3;  // states in, update, states out
    c.tensors += 1;
    c.samples += 2;
  } else {
    ops += 1;
  }
  if (grad_dp(p) > 1 && !shard.params && shard.optimizer) {
    ops += 1;
    c.group_ranks += grad_dp(p);
  }
  const ResolvedDtypes dt = resolve_dtypes(s.training);
  if (linear && s.training.compute_dtype == sim::DType::kFp8 && dt.params != sim::DType::kFp8 &&
      !shard.params) {
    c.tensors += 1;
  }
  c.ops += ops;
  c.deps += ops;  // each waits for the previous step of the chain
  c.tensors += dt.master ? 4 : 3;
}

// ZenFlow (StepBuilder::zenflow_step): the selected gradients' all-gather and the top-k update
// on the GPU, the optimizer worker's host op with overlap_step, per stage; the accumulation's
// H2D per parameter group when the interval is longer than one step.
void add_zenflow(const Scenario& s, double pp, Counts& c) {
  const OffloadPolicy::ZenFlow& zf = s.offload.zenflow;
  if (!zf.enabled) return;
  const double gathers = grad_dp(s.parallelism) > 1 ? 1 : 0;
  const double zf_ops = gathers + 1 + (zf.overlap_step ? 1 : 0);
  const auto groups = static_cast<double>(s.model.layers + 2);
  c.ops += pp * zf_ops;
  c.deps += pp * zf_ops + groups;
  c.group_ranks += pp * gathers * grad_dp(s.parallelism);
  // The selected columns' moments (static) and the per-step selected gradients and parameters.
  c.tensors += pp * 2;
  c.samples += pp * 2;
  if (zf.update_interval > 1) {
    c.ops += groups;
    c.deps += groups;
  }
}

// Gradient reduction and offload of one group over all micro-batches (StepBuilder::grads_done):
// `collectives` per reduction (one, or one per parameter tensor with param_gather
// per_tensor_synchronized; the first waits for the backward, the others follow it).
void add_grads(const Scenario& s, double micro_batches, bool grads_on_host, Counts& c,
               double collectives = 1) {
  const ParallelConfig& p = s.parallelism;
  const bool shard_grads = dp_sharding(p).grads;
  const double times = shard_grads ? micro_batches : 1;
  if (grad_dp(p) > 1) {
    c.ops += times * collectives;
    c.deps += times * (p.overlap_grad_reduce ? 1 : 2);  // not overlapped: also the last backward op
    c.group_ranks += times * collectives * shard_dp(p);
    // Hybrid sharding: each reduction's all-reduce across the replicas.
    if (const int replicas = grad_dp(p) / shard_dp(p); replicas > 1) {
      c.ops += times;
      c.deps += times;
      c.group_ranks += times * replicas;
    }
    if (shard_grads) {
      c.tensors += times;  // the gradient bucket
      c.samples += 2 * times;
    }
  }
  if (grads_on_host) {
    c.ops += times;
    c.deps += times;
  }
}

// Context parallelism beyond the recipe's ops: all-to-all: members of the two all-to-alls per
// attention pass; ring: the dependencies of the K,V transfers (the last dK,dV transfer awaited
// by the next kernel).
void add_context_parallel(const Scenario& s, double micro_batches, const LayerShape& ls,
                          Counts& c) {
  const ParallelConfig& p = s.parallelism;
  if (p.cp == 1) return;
  const double cp = p.cp;
  const double recomputed = ls.recompute_core ? 1 : 0;
  if (p.cp_comm_type == ParallelConfig::CpCommType::kA2A) {
    c.group_ranks += micro_batches * 2 * (2 + recomputed) * cp;
    return;
  }
  const double fwd_deps = 2 * (cp - 1);
  c.deps += micro_batches * (fwd_deps * (1 + recomputed) + 2 * (cp - 1) + cp + 1);
}

// Tensor-parallel overlap beyond the recipe's ops: the dependencies of the ring transfers and
// split GEMMs and the members of the split collectives; tp_async_grad_reduce moves the backward
// reductions to the TP lane: two more dependencies each.
void add_tp_overlap(const Scenario& s, double micro_batches, const LayerDims& d,
                    const LayerShape& ls, Counts& c) {
  const ParallelConfig& p = s.parallelism;
  if (d.t == 1) return;
  const double t = static_cast<double>(d.t);
  const TpGemms g = tp_gemms(d);
  if (p.tp_async_grad_reduce) c.deps += micro_batches * 2 * g.grad_reduces;
  if (!p.tp_comm_overlap || d.sp == 1) return;
  const double n_gathered = g.gathered + g.gathered_bwd;  // forward and backward
  const double n_scattered = g.scattered;
  // Deps of the forward's, the backward's and the recomputed forward's split GEMMs; the
  // recomputed collectives' members are counted with LayerShape::recompute_collectives.
  const double deps_gathered = n_gathered + ls.recompute_gathered;
  const double deps_scattered = n_scattered + ls.recompute_scattered;
  c.deps += micro_batches * (deps_gathered * 2 * (t - 1) + deps_scattered * (t + 1));
  c.group_ranks += micro_batches * (n_scattered * (t - 1) * t - n_gathered * t);
}

// What the estimate needs of the scenario as a whole.
struct StepContext {
  LayerDims d;                 // layer_dims(s): the dense layer
  double m = 1;                // micro-batches per step
  double tp_colls = 0;         // tensor-parallel collectives of a layer, each way
  RecipeInputs recipe;         // what layer recipes depend on besides the layer
  double dp_gather_ranks = 0;  // members of a ZeRO-3 / FSDP parameter all-gather, 0 when none
  const LayerPolicies* policies = nullptr;  // every layer's, as resolved (layer_policy.h)
};

// MoE layers beyond the recipe's ops: the host-sync marker waits for the permutation and holds
// the next kernel, in the forward and in a recomputed forward; the overlapped shared experts
// wait for the permutation and the unpermutation for them. The router-aware fetch's
// dependencies and buffer. The routed experts' own parameter group
// (StepBuilder::expert_grads_done and optimizer): reduced over the expert-DP group (once, or
// per micro-batch with sharded gradients), updated, and all-gathered under ZeRO-1; gathered
// for each pass with sharded parameters (fetch_params).
void add_moe_layer(const Scenario& s, const StepContext& x, const LayerDims& dl,
                   const LayerShape& ls, Counts& c) {
  const ParallelConfig& p = s.parallelism;
  const MoeOps mo = moe_ops(dl);
  const double passes = ls.moe_recomputed ? 2 : 1;  // the forward, and its recompute
  const double overlap = p.moe_shared_expert_overlap && dl.fs > 0 ? 2 : 0;
  c.deps += x.m * (2 * mo.fwd_markers + overlap) * passes;
  // The host issue thread (StepBuilder::host_issue_close): an MoE forward (and recomputed
  // forward) ends a host segment at its synchronisation, with a marker on the host lane that
  // waits for the segment's first op and that its last op waits for; segments of a host-bound
  // pass get one too (not counted: they depend on the kernels' times, so they are not in the
  // layer recipe either).
  const double host_markers = mo.fwd_markers * passes;
  c.ops += x.m * host_markers;
  c.deps += 2 * x.m * host_markers;
  if (p.moe_a2a_overlap) {
    // Combined 1F1B steps (StepBuilder::link_combined): an all-to-all on its own stream waits for
    // the compute op before it and the next compute op for it; a layer pair adds nine waits.
    c.deps += x.m * (2 * mo.alltoalls + 9);
  }
  if (ls.params_on_host && x.recipe.routed_fetch) {
    // Each fetch waits for the top-k and the expert GEMMs for it; it allocates the buffer.
    c.deps += 2 * x.m * mo.fwd_fetches;
    c.tensors += x.m * mo.fwd_fetches;
    c.samples += 2 * x.m * mo.fwd_fetches;
  }
  const int edp = expert_dp(p);
  const int xshard = expert_shard_dp(p);
  if (dp_sharding(p).params && xshard > 1) {
    // Sharded experts: their own all-gather in each forward and backward fetch (a recipe row),
    // which allocates the gathered buffer and waits for the prefetch point; the layer waits for
    // it.
    c.tensors += 2 * x.m;
    c.samples += 4 * x.m;
    c.deps += 4 * x.m;
    c.group_ranks += 2 * x.m * xshard;
  }
  Scenario se = s;
  se.parallelism.dp = edp;  // the expert-DP group takes in the context-parallel ranks
  se.parallelism.cp = 1;
  se.parallelism.fsdp_shard = p.fsdp_shard > 0 ? xshard : 0;
  add_grads(se, x.m, ls.grads_on_host, c);
  add_group(se, ls.params_on_host, ls.grads_on_host, ls.opt_on_host, c, true);
}

// Layer l: its recipe's ops in every micro-batch, their tensors, dependencies and collective
// members, and its parameter group's gradient and optimizer ops.
void add_layer(const Scenario& s, const StepContext& x, int l, Counts& c) {
  const LayerDims dl = dims_of_layer(s, x.d, l);
  const LayerShape ls = layer_shape(s, dl, x.policies->of(l));
  const RecipeInputs in = layer_inputs(s, x.recipe, l);
  const LayerRecipe recipe = recipe_of(s, dl, ls, in);
  const double m = x.m;
  c.ops += m * recipe.per_micro_batch();
  const double fetch_ops = (ls.params_on_host ? 1 : 0) + (x.recipe.sharded_fetch ? 1 : 0);
  double moe_colls = 0;
  if (dl.moe) {
    const MoeOps mo = moe_ops(dl);
    const double mlp_colls = dl.t > 1 ? (dl.sp > 1 ? 2 : 1) : 0;
    moe_colls = mo.fwd_collectives + mo.bwd_collectives - 2 * mlp_colls;
    add_moe_layer(s, x, dl, ls, c);
  }
  // FP8: the layer's weights, and its routed experts', are cast once per step, after their
  // optimizer update.
  if (s.training.compute_dtype == sim::DType::kFp8) {
    const double groups = dl.moe ? 2 : 1;
    c.ops += groups;
    c.deps += groups;
  }
  // Members of the tensor-parallel collectives (forward, backward, recomputed) and of the
  // data-parallel parameter gathers.
  c.group_ranks +=
      m * ((2 * x.tp_colls + ls.recompute_collectives + moe_colls) * static_cast<double>(x.d.t) +
           (in.gathers_fwd + in.gathers_bwd) * x.dp_gather_ranks);
  add_context_parallel(s, m, ls, c);
  add_tp_overlap(s, m, dl, ls, c);
  // Tensors: saved on HBM; per chunk a staging buffer, a host copy and a reload; the
  // recompute buffer; fetched parameters, forward and backward.
  const double tensors =
      (ls.hbm_saved ? 1 : 0) + 3 * ls.host_chunks + (ls.recomputed ? 1 : 0) + 2 * fetch_ops;
  c.tensors += m * tensors;
  c.samples += m * 2 * tensors;
  // Deps: each copy waits for its producer (D2H) or for its producer and prefetch point
  // (H2D); fetches wait for the prefetch point and the layer's first ops for them.
  c.deps += m * (ls.host_chunks * 3 + 2 * fetch_ops * 2);
  // Offload back-pressure: a layer's first forward op waits for the D2H copies of the layer
  // kOffloadWindowLayers before it on the same stage (approximated over the whole model).
  if (l >= 2) c.deps += m * layer_shape(s, x.d, x.policies->of(l - 2)).host_chunks;
  const double reduces =
      s.parallelism.param_gather == ParallelConfig::ParamGather::kPerTensorSynchronized
          ? static_cast<double>(layer_parameter_tensors_per_rank(s.model, s.parallelism.tp).size())
          : 1;
  add_grads(s, m, ls.grads_on_host, c, reduces);
  add_group(s, ls.params_on_host, ls.grads_on_host, ls.opt_on_host, c, true);
}

// Embedding (stage 0) and head (last stage), placed by the rules that select every layer. The
// head's ops are those of its recipes (head_forward_recipe, head_backward_recipe); chunked, each
// chunk's logits are a tensor of their own. The head's GEMMs stay in bf16 with FP8 (no casts).
void add_embedding_and_head(const Scenario& s, const StepContext& x, Counts& c) {
  const GroupPlacement& outside = x.policies->outside;
  const double m = x.m;
  c.ops += m * 2;  // embedding forward and backward
  add_grads(s, m, outside.grads_on_host, c);
  add_group(s, outside.params_on_host, outside.grads_on_host, outside.opt_on_host, c);
  const std::int64_t chunks = std::max<std::int64_t>(1, s.training.loss_chunks);
  const bool chunked = chunks > 1;
  for (const auto recipe : {head_forward_recipe(chunked), head_backward_recipe(chunked)}) {
    for (const HeadOpEntry& e : recipe) {
      const double n = head_ops(e, x.d, chunks);
      c.ops += m * n;
      if (head_collective(e)) c.group_ranks += m * n * static_cast<double>(x.d.t);
      if (e.kind == HeadOpKind::kLogits && chunked) {
        c.tensors += m * n;  // one tensor of logits per chunk
        c.samples += 2 * m * n;
      }
    }
  }
  c.tensors += m;  // logits and norm input
  c.samples += 2 * m;
  add_grads(s, m, outside.grads_on_host, c);
  add_group(s, outside.params_on_host, outside.grads_on_host, outside.opt_on_host, c);
}

// Pipeline sends, the optimizer's gradient passes, DeepSpeed's flat CPU step and the per-stage
// runtime tensors.
void add_stage_ops(const Scenario& s, const StepContext& x, Counts& c) {
  const ParallelConfig& p = s.parallelism;
  const double pp = std::max(1, p.pp);
  const double v = std::max(1, p.virtual_stages);
  // Pipeline: every forward and backward task sends to its neighbour except at the ends; each
  // send is two ops, the send (waiting on its producer) and its receive on the peer (waiting on
  // the send), and the receiver's first op (sometimes also a reload) waits on the receive.
  const double sends = 2 * x.m * (pp * v - 1);
  c.ops += 2 * sends;
  // Forward outputs kept until the backward (deallocate_pipeline_outputs false): one tensor
  // per forward send.
  if (!p.deallocate_pipeline_outputs) c.tensors += sends / 2;
  // The mixed-precision optimizer's gradient passes on every stage: the gradient norm, and with
  // fp16 the unscale and inf check; each waits for the stage's gradient reductions.
  const double grad_passes = s.training.compute_dtype == sim::DType::kFp16 ? 2 : 1;
  c.ops += pp * grad_passes;
  // With pp > 1 the norm's all-reduce over the model-parallel group, waiting for every stage's
  // norm (StepBuilder::grad_passes).
  if (p.pp > 1) {
    c.ops += pp;
    c.deps += pp * pp;
    c.group_ranks += pp * pp * static_cast<double>(p.tp);
  }
  // The word embedding's gradient all-reduce between the first and the last stage
  // (StepBuilder::embedding_grad_sync): one op on each, waiting for both stages' reductions.
  if (p.pp > 1 && (s.model.tied_embeddings || s.model.mtp_layers > 0)) {
    c.ops += 2;
    c.deps += 4;
    c.group_ranks += 4;
  }
  // One per parameter group: the embedding, the head, each layer's dense group and each MoE
  // layer's expert group.
  double groups = static_cast<double>(built_layers(s.model) + 2);
  for (int l = 0; l < built_layers(s.model); ++l) groups += is_moe_layer(s.model, l) ? 1 : 0;
  c.deps += grad_passes * groups;
  // DeepSpeed's flat CPU step (StepBuilder::deepspeed_flat_step): a host step waiting for every
  // group's gradient reduction, and one H2D, per stage.
  if (s.offload.optimizer_on_cpu && s.offload.cpu_step == OffloadPolicy::CpuStep::kFlatPartition &&
      !s.offload.superoffload.enabled) {
    c.ops += pp * 2;
    c.deps += pp + static_cast<double>(s.model.layers + 2);
    add_zenflow(s, pp, c);
  }
  c.deps += sends * 3.5;
  // Per stage: the workspace tensor; with hardware.runtime the CUDA context, NCCL buffers (when
  // a group has more than one rank) and the cuBLAS workspace instead (JAX: none, outside its
  // pool).
  using Runtime = HardwareConfig::Runtime;
  const bool comms = grad_dp(p) > 1 || p.tp > 1 || p.pp > 1;
  const double runtime_tensors = s.hardware.runtime == Runtime::kNone  ? 1
                                 : s.hardware.runtime == Runtime::kJax ? 0
                                                                       : (comms ? 3 : 2);
  c.tensors += pp * runtime_tensors;
}

// Bytes of the Plan and the Timeline for these counts.
double plan_bytes(const Counts& c, const PlanSizeOptions& options) {
  const double per_op =
      static_cast<double>(sizeof(sim::Op) + sizeof(sim::OpInfo) + sizeof(sim::Span)) +
      kNameHeapBytes + kVectorBlockBytes;
  const double per_tensor = static_cast<double>(sizeof(sim::Tensor));
  double bytes = c.ops * per_op + c.tensors * per_tensor +
                 c.deps * static_cast<double>(sizeof(sim::OpId)) +
                 c.group_ranks * static_cast<double>(sizeof(int));
  if (options.with_memory_samples) {
    // Per alloc and per free: a memory sample of its pool and a memory event; per tensor: its
    // TensorInfo (name, category, bytes, pool), so that the events name what was live.
    bytes += c.samples * static_cast<double>(sizeof(sim::MemorySample) + sizeof(sim::MemoryEvent)) +
             c.tensors * (static_cast<double>(sizeof(sim::TensorInfo)) + kNameHeapBytes);
  }
  return bytes;
}

}  // namespace

const char* to_string(RecipeOpKind kind) {
  switch (kind) {
    case RecipeOpKind::kKernel:
      return "kernel";
    case RecipeOpKind::kCollective:
      return "collective";
    case RecipeOpKind::kP2P:
      return "p2p";
    case RecipeOpKind::kCopy:
      return "copy";
    case RecipeOpKind::kMarker:
      return "marker";
  }
  return "?";
}

std::span<const LayerOpEntry> layer_forward_recipe() {
  using S = LayerOpShape;
  // Megatron-Core's TransformerLayer with Transformer Engine modules: input norm, fused QKV
  // (column-parallel) and rotary embedding, the attention core, the output projection
  // (row-parallel), bias-dropout-add fused with the second norm, the MLP's input projection
  // (column-parallel, gated: both halves), its activation, its output projection
  // (row-parallel), and the second bias-dropout-add. The recompute re-runs the out projection's
  // reduction (its output feeds the residual the next entry re-creates) but not the MLP output
  // projection's, and not the second residual add, which only makes the layer's output.
  static constexpr std::array<LayerOpEntry, 9> kForward = {{
      {.name = "ln1", .shape = S::kElementwise, .first = FwdOp::kLn1, .last = FwdOp::kLn1},
      {.name = "qkv",
       .shape = S::kColumnGemm,
       .first = FwdOp::kQkv,
       .last = FwdOp::kQkv,
       .comm = "qkv.tp_allgather",
       .comm_recomputed = true,
       .rotary_after = true},
      {.name = "attn", .shape = S::kAttention, .first = FwdOp::kCore, .last = FwdOp::kCore},
      {.name = "out_proj",
       .shape = S::kRowGemm,
       .first = FwdOp::kOutProj,
       .last = FwdOp::kOutProj,
       .comm = "out_proj.tp_reduce",
       .comm_recomputed = true},
      {.name = "res1_ln2", .shape = S::kElementwise, .first = FwdOp::kRes1, .last = FwdOp::kLn2},
      {.name = "mlpwi",
       .shape = S::kColumnGemm,
       .first = FwdOp::kMlpWi,
       .last = FwdOp::kMlpWi,
       .comm = "mlp.tp_allgather",
       .comm_recomputed = true,
       .ffn = true},
      {.name = "act",
       .shape = S::kElementwise,
       .first = FwdOp::kAct,
       .last = FwdOp::kAct,
       .ffn = true},
      {.name = "mlpwo",
       .shape = S::kRowGemm,
       .first = FwdOp::kMlpWo,
       .last = FwdOp::kMlpWo,
       .comm = "mlpwo.tp_reduce",
       .ffn = true},
      {.name = "res2",
       .shape = S::kElementwise,
       .first = FwdOp::kRes2,
       .last = FwdOp::kRes2,
       .rerun = false},
  }};
  return kForward;
}

std::span<const LayerBackwardEntry> layer_backward_recipe() {
  using K = LayerBackwardKind;
  // The forward recipe backwards (Megatron-Core with Transformer Engine modules): the second
  // residual add; the MLP's output projection (row-parallel: all-gather of its output gradient
  // under SP, then dgrad and wgrad), activation and input projection (column-parallel: its input
  // gradient reduced over tensor parallelism, overlapping the wgrad when asynchronous); the
  // first residual add fused with the second norm; the output projection, the attention core,
  // the rotary embedding, the fused QKV projection, and the first norm.
  static constexpr std::array<LayerBackwardEntry, 16> kBackward = {{
      {.name = "res2.bwd", .kind = K::kElementwise, .of = FwdOp::kRes2},
      {.name = "mlpwo.dgrad",
       .kind = K::kDgrad,
       .of = FwdOp::kMlpWo,
       .flops = 1,
       .gather = "mlpwo.bwd.tp_allgather",
       .ffn = true},
      {.name = "mlpwo.wgrad", .kind = K::kWgrad, .of = FwdOp::kMlpWo, .flops = 1, .ffn = true},
      {.name = "act.bwd", .kind = K::kElementwise, .of = FwdOp::kAct, .ffn = true},
      {.name = "mlpwi.dgrad", .kind = K::kDgrad, .of = FwdOp::kMlpWi, .flops = 1, .ffn = true},
      {.name = "mlpwi.bwd.tp_reduce", .kind = K::kGradReduce, .of = FwdOp::kMlpWi, .ffn = true},
      {.name = "mlpwi.wgrad", .kind = K::kWgrad, .of = FwdOp::kMlpWi, .flops = 1, .ffn = true},
      {.name = "res1_ln2.bwd", .kind = K::kElementwise, .of = FwdOp::kRes1},
      {.name = "out_proj.dgrad",
       .kind = K::kDgrad,
       .of = FwdOp::kOutProj,
       .flops = 1,
       .gather = "out_proj.bwd.tp_allgather"},
      {.name = "out_proj.wgrad", .kind = K::kWgrad, .of = FwdOp::kOutProj, .flops = 1},
      {.name = "attn.bwd", .kind = K::kAttention, .of = FwdOp::kCore, .flops = 2},
      {.name = "rope.bwd", .kind = K::kRotary, .of = FwdOp::kQkv},
      {.name = "qkv.dgrad", .kind = K::kDgrad, .of = FwdOp::kQkv, .flops = 1},
      {.name = "qkv.bwd.tp_reduce", .kind = K::kGradReduce, .of = FwdOp::kQkv},
      {.name = "qkv.wgrad", .kind = K::kWgrad, .of = FwdOp::kQkv, .flops = 1},
      {.name = "ln1.bwd", .kind = K::kElementwise, .of = FwdOp::kLn1},
  }};
  return kBackward;
}

std::span<const HeadOpEntry> head_forward_recipe(bool chunked) {
  using K = HeadOpKind;
  static constexpr std::array<HeadOpEntry, 4> kWhole = {{
      {.name = "final_norm.fwd", .kind = K::kFinalNorm},
      {.name = "tp_allgather", .kind = K::kTpGather},
      {.name = "lm_head.fwd", .kind = K::kLogits},
      {.name = "loss.fwd", .kind = K::kLoss},
  }};
  static constexpr std::array<HeadOpEntry, 7> kChunked = {{
      {.name = "final_norm.fwd", .kind = K::kFinalNorm},
      {.name = "tp_allgather", .kind = K::kTpGather},
      {.name = "lm_head.fwd", .kind = K::kLogits, .per_chunk = true},
      {.name = "loss.fwd", .kind = K::kLoss, .per_chunk = true},
      {.name = "loss.bwd", .kind = K::kLossGrad, .per_chunk = true},
      {.name = "lm_head.dgrad", .kind = K::kDgrad, .per_chunk = true},
      {.name = "lm_head.wgrad", .kind = K::kWgrad, .per_chunk = true},
  }};
  if (chunked) return kChunked;
  return kWhole;
}

std::span<const HeadOpEntry> head_backward_recipe(bool chunked) {
  using K = HeadOpKind;
  static constexpr std::array<HeadOpEntry, 5> kWhole = {{
      {.name = "loss.bwd", .kind = K::kLossGrad},
      {.name = "lm_head.dgrad", .kind = K::kDgrad},
      {.name = "lm_head.wgrad", .kind = K::kWgrad},
      {.name = "tp_reduce", .kind = K::kTpReduce},
      {.name = "final_norm.bwd", .kind = K::kFinalNormGrad},
  }};
  static constexpr std::array<HeadOpEntry, 3> kChunked = {{
      {.name = "loss.bwd", .kind = K::kLossScale},
      {.name = "tp_reduce", .kind = K::kTpReduce},
      {.name = "final_norm.bwd", .kind = K::kFinalNormGrad},
  }};
  if (chunked) return kChunked;
  return kWhole;
}

bool head_collective(const HeadOpEntry& e) {
  return e.kind == HeadOpKind::kTpGather || e.kind == HeadOpKind::kTpReduce;
}

double head_ops(const HeadOpEntry& e, const LayerDims& d, std::int64_t chunks) {
  if (e.kind == HeadOpKind::kTpGather) return d.t > 1 && d.sp > 1 ? 1 : 0;
  if (e.kind == HeadOpKind::kTpReduce) return d.t > 1 ? 1 : 0;
  return e.per_chunk ? static_cast<double>(chunks) : 1;
}

std::span<const MoeOpEntry> moe_forward_recipe() {
  using K = MoeOpKind;
  using G = MoeGemm;
  using T = MoeTraffic;
  // Megatron-Core's MoELayer forward with the all-to-all token dispatcher (dropless): the
  // shared experts on the compute stream first (MoELayer.forward calls shared_experts_compute
  // before route since Megatron-Core 0.15, merge request 4068 "Compute shared experts before
  // router", 2025-10-11; the expert-parallel overlap's pre-dispatch node runs them there too;
  // with moe_shared_expert_overlap they run on their own stream from the synchronisation on,
  // the unpermutation waiting for them); the router's GEMM and fused top-k; the router-aware
  // expert fetch once the top-k is known; the permutation; the host's wait for the per-expert
  // token counts (with HybridEP after its all-gather of the routing map: HybridEPBuffer's
  // dispatch without a handle, deepseek-ai/DeepEP deep_ep/hybrid_ep_buffer.py, which
  // Megatron-Core's _HybridEPManager calls in every forward); dispatch of the tokens and of
  // their probabilities
  // (MoEAlltoAllTokenDispatcher.dispatch_all_to_all) and the expert-TP all-gather; the experts'
  // grouped FC1, activation and grouped FC2; the expert-TP reduce-scatter and the combine; the
  // unpermutation.
  static constexpr std::array<MoeOpEntry, 22> kForward = {{
      {.name = "shared.tp_allgather", .kind = K::kSharedGather, .shared = true},
      {.name = "shared.mlpwi", .kind = K::kGemm, .gemm = G::kSharedWi, .shared = true},
      {.name = "shared.act", .kind = K::kElementwise, .traffic = T::kSharedAct, .shared = true},
      {.name = "shared.mlpwo", .kind = K::kGemm, .gemm = G::kSharedWo, .shared = true},
      {.name = "shared.tp_reduce", .kind = K::kSharedReduce, .shared = true},
      {.name = "router", .kind = K::kGemm, .gemm = G::kRouter},
      {.name = "router.topk", .kind = K::kElementwise, .traffic = T::kTopk, .host_ops = 14},
      {.name = "experts.routed_h2d", .kind = K::kRoutedFetch},
      {.name = "moe.permute", .kind = K::kElementwise, .traffic = T::kPermute, .host_ops = 20},
      {.name = "moe.dispatch.routing_allgather", .kind = K::kRoutingGather, .host_ops = 3},
      {.name = "moe.host_sync", .kind = K::kHostSync},
      {.name = "moe.dispatch.alltoall", .kind = K::kAllToAll, .host_ops = 2},
      {.name = "moe.dispatch.probs.alltoall", .kind = K::kAllToAll, .probs = true, .host_ops = 2},
      {.name = "moe.etp_allgather", .kind = K::kExpertGather},
      {.name = "moe.sort_chunks",
       .kind = K::kElementwise,
       .traffic = T::kSortChunks,
       .host_ops = 2},
      {.name = "experts.fc1.grouped_gemm", .kind = K::kGroupedGemm, .gemm = G::kFc1, .host_ops = 3},
      {.name = "experts.act", .kind = K::kElementwise, .traffic = T::kExpertAct, .host_ops = 3},
      {.name = "experts.fc2.grouped_gemm", .kind = K::kGroupedGemm, .gemm = G::kFc2, .host_ops = 3},
      {.name = "moe.unsort_chunks", .kind = K::kElementwise, .traffic = T::kUnsortChunks},
      {.name = "moe.etp_reducescatter", .kind = K::kExpertScatter},
      {.name = "moe.combine.alltoall", .kind = K::kAllToAll, .host_ops = 2},
      {.name = "moe.unpermute", .kind = K::kElementwise, .traffic = T::kUnpermute, .host_ops = 2},
  }};
  return kForward;
}

std::span<const MoeOpEntry> moe_backward_recipe() {
  using K = MoeOpKind;
  using G = MoeGemm;
  using T = MoeTraffic;
  using P = GemmPass;
  // The forward backwards: the unpermutation's backward, the combine's (an all-to-all back to
  // the experts) and the expert-TP all-gather, the grouped FC2's and FC1's dgrad and wgrad
  // around the activation's backward, the expert-TP reduce-scatter, the dispatch's all-to-alls
  // back to the tokens, the permutation's and the top-k's backward and the router's dgrad and
  // wgrad; then the shared experts (created first in the forward, so autograd, which runs the
  // later-created of two ready nodes first, reaches them last): their output gradient's
  // all-gather, the output projection's dgrad and wgrad, the activation's backward, the input
  // projection's dgrad and wgrad, the reduction of their input gradient.
  static constexpr std::array<MoeOpEntry, 24> kBackward = {{
      {.name = "moe.unpermute.bwd",
       .kind = K::kElementwise,
       .traffic = T::kUnpermute,
       .host_ops = 3},
      {.name = "moe.combine.alltoall.bwd", .kind = K::kAllToAll, .host_ops = 2},
      {.name = "moe.etp_allgather.bwd", .kind = K::kExpertGather},
      {.name = "moe.unsort_chunks.bwd", .kind = K::kElementwise, .traffic = T::kUnsortChunks},
      {.name = "experts.fc2.grouped_gemm.dgrad",
       .kind = K::kGroupedGemm,
       .gemm = G::kFc2,
       .pass = P::kDgrad,
       .host_ops = 2},
      {.name = "experts.fc2.grouped_gemm.wgrad",
       .kind = K::kGroupedGemm,
       .gemm = G::kFc2,
       .pass = P::kWgrad,
       .host_ops = 2},
      {.name = "experts.act.bwd", .kind = K::kElementwise, .traffic = T::kExpertAct, .host_ops = 3},
      {.name = "experts.fc1.grouped_gemm.dgrad",
       .kind = K::kGroupedGemm,
       .gemm = G::kFc1,
       .pass = P::kDgrad,
       .host_ops = 2},
      {.name = "experts.fc1.grouped_gemm.wgrad",
       .kind = K::kGroupedGemm,
       .gemm = G::kFc1,
       .pass = P::kWgrad,
       .host_ops = 2},
      {.name = "moe.sort_chunks.bwd",
       .kind = K::kElementwise,
       .traffic = T::kSortChunks,
       .host_ops = 2},
      {.name = "moe.etp_reducescatter.bwd", .kind = K::kExpertScatter},
      {.name = "moe.dispatch.alltoall.bwd", .kind = K::kAllToAll, .host_ops = 2},
      {.name = "moe.dispatch.probs.alltoall.bwd",
       .kind = K::kAllToAll,
       .probs = true,
       .host_ops = 2},
      {.name = "moe.permute.bwd", .kind = K::kElementwise, .traffic = T::kPermute, .host_ops = 3},
      {.name = "router.topk.bwd", .kind = K::kElementwise, .traffic = T::kTopk, .host_ops = 9},
      {.name = "router.dgrad", .kind = K::kGemm, .gemm = G::kRouter, .pass = P::kDgrad},
      {.name = "router.wgrad", .kind = K::kGemm, .gemm = G::kRouter, .pass = P::kWgrad},
      {.name = "shared.bwd.tp_allgather", .kind = K::kSharedGather, .shared = true},
      {.name = "shared.mlpwo.dgrad",
       .kind = K::kGemm,
       .gemm = G::kSharedWo,
       .pass = P::kDgrad,
       .shared = true},
      {.name = "shared.mlpwo.wgrad",
       .kind = K::kGemm,
       .gemm = G::kSharedWo,
       .pass = P::kWgrad,
       .shared = true},
      {.name = "shared.act.bwd", .kind = K::kElementwise, .traffic = T::kSharedAct, .shared = true},
      {.name = "shared.mlpwi.dgrad",
       .kind = K::kGemm,
       .gemm = G::kSharedWi,
       .pass = P::kDgrad,
       .shared = true},
      {.name = "shared.mlpwi.wgrad",
       .kind = K::kGemm,
       .gemm = G::kSharedWi,
       .pass = P::kWgrad,
       .shared = true},
      {.name = "shared.bwd.tp_reduce", .kind = K::kSharedReduce, .shared = true},
  }};
  return kBackward;
}

bool moe_entry_runs(const MoeOpEntry& e, const LayerDims& d) {
  if (e.shared && d.fs <= 0) return false;
  switch (e.kind) {
    case MoeOpKind::kAllToAll:
      return d.ep > 1;
    case MoeOpKind::kExpertGather:
    case MoeOpKind::kExpertScatter:
      return d.etp > 1;
    case MoeOpKind::kSharedGather:
      return d.t > 1 && d.sp > 1;
    case MoeOpKind::kSharedReduce:
      return d.t > 1;
    case MoeOpKind::kHostSync:
      return !d.padded;
    case MoeOpKind::kRoutingGather:
      return d.routing_gather && d.ep > 1;
    case MoeOpKind::kElementwise:
      return (e.traffic != MoeTraffic::kSortChunks && e.traffic != MoeTraffic::kUnsortChunks) ||
             d.sorts_chunks;
    default:
      return true;
  }
}

GemmMnk moe_gemm(const LayerDims& d, MoeGemm gemm, GemmPass pass, std::int64_t rows) {
  const std::int64_t g = d.gated ? 2 : 1;
  GemmMnk f;
  switch (gemm) {
    case MoeGemm::kRouter:
      f = {d.moe_tokens, d.experts, d.h};
      break;
    case MoeGemm::kFc1:
      f = {rows, d.fe * g, d.h};
      break;
    case MoeGemm::kFc2:
      f = {rows, d.h, d.fe};
      break;
    case MoeGemm::kSharedWi:
      f = {d.tokens(), d.fs * g, d.h};
      break;
    case MoeGemm::kSharedWo:
      f = {d.tokens(), d.h, d.fs};
      break;
    case MoeGemm::kNone:
      break;
  }
  if (pass == GemmPass::kDgrad) return {f.m, f.k, f.n};
  if (pass == GemmPass::kWgrad) return {f.k, f.n, f.m};
  return f;
}

double backward_entry_flops(const LayerBackwardEntry& e, const LayerDims& d) {
  return e.flops == 0 ? 0.0 : e.flops * fwd_op_flops(d, e.of, false);
}

double moe_entry_flops(const MoeOpEntry& e, const LayerDims& d) {
  if (e.kind != MoeOpKind::kGemm && e.kind != MoeOpKind::kGroupedGemm) return 0.0;
  const GemmMnk g = moe_gemm(d, e.gemm, e.pass, d.routed);
  return 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
}

namespace {

double moe_flops(std::span<const MoeOpEntry> entries, const LayerDims& d) {
  double total = 0.0;
  for (const MoeOpEntry& e : entries) {
    if (moe_entry_runs(e, d)) total += moe_entry_flops(e, d);
  }
  return total;
}

}  // namespace

double recipe_forward_flops(const LayerDims& d) {
  double total = 0.0;
  for (const LayerOpEntry& e : layer_forward_recipe()) {
    if (e.ffn && d.moe) continue;
    for (int op = static_cast<int>(e.first); op <= static_cast<int>(e.last); ++op) {
      total += fwd_op_flops(d, static_cast<FwdOp>(op), false);
    }
  }
  return d.moe ? total + moe_flops(moe_forward_recipe(), d) : total;
}

double recipe_backward_flops(const LayerDims& d) {
  double total = 0.0;
  for (const LayerBackwardEntry& e : layer_backward_recipe()) {
    if (!(e.ffn && d.moe)) total += backward_entry_flops(e, d);
  }
  return d.moe ? total + moe_flops(moe_backward_recipe(), d) : total;
}

bool recomputes_comm(const LayerOpEntry& entry, const LayerActivations& acts) {
  return entry.comm_recomputed || acts.whole_layer;
}

bool moe_activation_only(const LayerActivations& acts) {
  const auto re = [&](FwdOp op) { return acts.recompute[static_cast<int>(op)]; };
  return re(FwdOp::kAct) && !re(FwdOp::kMlpWi) && !re(FwdOp::kMlpWo);
}

bool recomputes(const LayerOpEntry& entry, const LayerActivations& acts) {
  if (!entry.rerun && !acts.whole_layer) return false;
  for (int op = static_cast<int>(entry.first); op <= static_cast<int>(entry.last); ++op) {
    if (acts.recompute[op]) return true;
  }
  return false;
}

double LayerRecipe::forward() const {
  double n = 0;
  for (const RecipeRow& r : rows) n += r.forward;
  return n;
}
double LayerRecipe::backward() const {
  double n = 0;
  for (const RecipeRow& r : rows) n += r.backward + r.recompute;
  return n;
}
double LayerRecipe::recompute() const {
  double n = 0;
  for (const RecipeRow& r : rows) n += r.recompute;
  return n;
}
double LayerRecipe::of(RecipeOpKind kind) const {
  double n = 0;
  for (const RecipeRow& r : rows) {
    if (r.kind == kind) n += r.forward + r.backward + r.recompute;
  }
  return n;
}

LayerRecipe layer_recipe(const Scenario& s, int layer) {
  const LayerDims dl = dims_of_layer(s, layer_dims(s), layer);
  return recipe_of(s, dl, layer_shape(s, dl, layer_policy(s, dl, layer)),
                   layer_inputs(s, recipe_inputs(s), layer));
}

LayerRecipe layer_recipe(const ResolvedScenario& r, int layer) {
  const Scenario& s = r.scenario();
  const LayerDims dl = dims_of_layer(s, layer_dims(s), layer);
  return recipe_of(s, dl, layer_shape(s, dl, r.layer_policies().of(layer)),
                   layer_inputs(s, recipe_inputs(s), layer));
}

namespace {

PlanSize estimate(const Scenario& s, const LayerPolicies& policies,
                  const PlanSizeOptions& options) {
  const ParallelConfig& p = s.parallelism;
  StepContext x;
  x.d = layer_dims(s);
  x.m = static_cast<double>(std::max<std::int64_t>(
      1, options.micro_batches > 0 ? options.micro_batches : grad_accum_steps(s.training, p)));
  x.tp_colls = x.d.t > 1 ? (x.d.sp > 1 ? 4 : 2) : 0;
  x.recipe = recipe_inputs(s);
  x.dp_gather_ranks = x.recipe.sharded_fetch ? static_cast<double>(shard_dp(p)) : 0;
  x.policies = &policies;
  Counts c;
  // Every layer is held by exactly one stage; one pass per micro-batch. Each multi-token-
  // prediction module adds a layer and, per micro-batch, its embedding, norms and eh_proj
  // (forward: 3 ops and the projection's gathers; backward: 5 and its reduction) and a saved
  // tensor (StepBuilder::mtp_input_forward, mtp_input_backward).
  for (int l = 0; l < built_layers(s.model); ++l) add_layer(s, x, l, c);
  const auto mtp = static_cast<double>(s.model.mtp_layers);
  c.ops += mtp * x.m * (8 + (x.d.t > 1 ? 2 : 0) + (x.d.sp > 1 ? 1 : 0));
  c.deps += mtp * x.m * 8;
  c.tensors += mtp * x.m;
  c.samples += 2 * mtp * x.m;
  add_embedding_and_head(s, x, c);
  add_stage_ops(s, x, c);
  PlanSize size;
  size.ops = c.ops;
  size.tensors = c.tensors;
  size.deps = c.deps;
  size.bytes = plan_bytes(c, options);
  return size;
}

}  // namespace

bool host_issue_marker(const sim::Op& op) {
  constexpr std::string_view kSuffix = ".host_issue";
  return op.kind == sim::OpKind::kMarker && op.name.ends_with(kSuffix);
}

PlanSize estimate_plan_size(const Scenario& s, const PlanSizeOptions& options) {
  return estimate(s, resolve_layer_policies(s), options);
}

PlanSize estimate_plan_size(const ResolvedScenario& r, const PlanSizeOptions& options) {
  return estimate(r.scenario(), r.layer_policies(), options);
}

std::string describe(const PlanSize& size) {
  const auto count = [](double n) {
    if (n >= 1e9) return fmt::format("{:.1f}G", n / 1e9);
    if (n >= 1e6) return fmt::format("{:.1f}M", n / 1e6);
    if (n >= 1e4) return fmt::format("{:.0f}k", n / 1e3);
    return fmt::format("{:.0f}", n);
  };
  const double gib = size.bytes / static_cast<double>(std::int64_t{1} << 30);
  return fmt::format("{} ops, {} tensors, {} deps, about {} of plan and timeline", count(size.ops),
                     count(size.tensors), count(size.deps),
                     gib >= 1024.0 ? fmt::format("{:.1f} TiB", gib / 1024.0)
                     : gib >= 1.0  ? fmt::format("{:.1f} GiB", gib)
                                   : fmt::format("{:.0f} MiB", size.bytes / (1 << 20)));
}

}  // namespace offsim::models
