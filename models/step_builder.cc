// build_step(): lowers a Scenario to the Plan of one training step. This file holds the
// entry point (flags, FLOP totals, runtime, metadata, pool capacities), the per-layer offload
// policy, and StepBuilder's constructor, the set-up of a rank (lanes, pools, groups) and the
// op primitives every lowering uses. The class and the map of its files: step_builder_impl.h.
#include "models/step_builder.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "models/cost_model.h"
#include "models/formulas.h"
#include "models/plan_size.h"
#include "models/step_builder_impl.h"
#include "sim/plan/shape_math.h"
#include "sim/platform/host.h"
#include "sim/platform/profile.h"
#include "sim/platform/system.h"

namespace offsim::models::detail {

StepBuilder::StepBuilder(const Scenario& s, const LayerPolicies& policies, const CostModel& cm,
                         sim::PlanBuilder& b, BuiltStep& out, const BuildOptions& options)
    : s_(s),
      cm_(cm),
      b_(b),
      out_(out),
      d_(layer_dims(s)),
      policies_(policies.layers),
      outside_(policies.outside) {
  const ParallelConfig& p = s.parallelism;
  layout_ = pipeline_layout(s.model.layers, p);
  micro_batches_ = options.micro_batches > 0 ? options.micro_batches
                                             : static_cast<int>(grad_accum_steps(s.training, p));
  last_label_ =
      options.last_micro_batch_label >= 0 ? options.last_micro_batch_label : micro_batches_ - 1;
  static_only_ = options.static_only;
  if (options.layers_per_chunk > 0) kept_layers_ = options.layers_per_chunk;
  gdtype_ = s.training.compute_dtype;
  adtype_ = gdtype_ == sim::DType::kFp8 ? sim::DType::kBf16 : gdtype_;
  const int cc = cm.profile().gpu.compute_capability_x10();
  fp8_non_tn_ = fp8_non_tn_gemm(cc);
  fp8_recipe_ = s.training.fp8_recipe.value_or(default_fp8_recipe(cc));
  fp8_gemm_scale_ = fp8_recipe_gemm_time_scale(fp8_recipe_, cc);
  dt_ = resolve_dtypes(s.training);
  for (int l = 0; l < built_layers(s.model); ++l) {
    ldims_.push_back(layer_dims(s.model, s.training, p, l));
  }
  xfetch_ = expert_fetch_counts(s);
}

// A non-layer parameter group (embedding, head) follows rules that select all layers.
void StepBuilder::non_layer_policy(ParamGroup& g) const {
  const GroupPlacement& p = outside_;
  g.params_on_host = p.params_on_host;
  g.grads_on_host = p.grads_on_host;
  g.opt_on_host = p.opt_on_host;
  g.master_on_host = p.master_on_host;
  g.master_on_hbm = p.master_on_hbm;
}

OpId StepBuilder::add(Rank& r, LaneId lane, const std::string& name, OpKind kind,
                      OpCategory category, int layer, sim::OpCost cost, sim::OpSizes sizes,
                      std::vector<OpId> deps) {
  const bool on_compute = lane == r.compute;
  const bool issued =
      lane != r.cpu && lane != r.issue && kind != OpKind::kMarker && kind != OpKind::kHostCompute;
  double host_s = 0.0;
  const double gpu_s = on_compute ? sim::to_seconds(cm_.alone(cost)) : 0.0;
  if (issued) {
    host_s = cm_.host_issue_s(take_host_ops(category, sizes));
    // May end the open segment with a marker op: it takes its id before this op.
    host_issue_open(r, name, layer, on_compute);
    if (host_wait_) {
      // The first op after a synchronisation: the host issues it once the wait returns.
      b_.op_at(*host_wait_).cost.latency += sim::duration_from_seconds(host_s);
      host_s = 0.0;
      host_wait_.reset();
    }
  }
  // Built in place in the plan: an op is a few hundred bytes, and the plan holds 10^5 of them.
  const OpId id = b_.new_op();
  sim::Op& op = b_.op_at(id);
  op.name = name;
  op.lane = lane;
  op.kind = kind;
  op.category = category;
  op.layer = layer;
  op.sizes = std::move(sizes);
  op.cost = std::move(cost);
  op.deps = std::move(deps);
  if (on_compute && !next_compute_deps_.empty()) {
    op.deps.insert(op.deps.end(), next_compute_deps_.begin(), next_compute_deps_.end());
    next_compute_deps_.clear();
  }
  if (on_compute) last_compute_ = id;
  if (issued) host_issue_note(id, host_s, gpu_s, on_compute);
  if (marks_ != nullptr && on_compute && layer >= 0) {
    PassMarks& m = pass_marks(layer);
    if (!m.first) m.first = id;
    m.last = id;
    for (std::optional<OpId>& a : m.after) {
      if (!a) a = id;
    }
  }
  return id;
}

// The marks of `layer` in the pass being built (a layer's ops may interleave with a
// neighbour's, e.g. a prefetch's cast).
StepBuilder::PassMarks& StepBuilder::pass_marks(int layer) {
  for (auto it = marks_->rbegin(); it != marks_->rend(); ++it) {
    if (it->layer == layer) return *it;
  }
  marks_->push_back(PassMarks{.layer = layer});
  return marks_->back();
}

// A weight-gradient GEMM: with fp8 it reuses the transposes its forward and dgrad cast.
OpId StepBuilder::wgrad_gemm(Rank& r, const std::string& name, OpCategory cat, int layer,
                             std::int64_t m, std::int64_t n, std::int64_t k) {
  return gemm(r, name, cat, layer, m, n, k, /*weight_grad=*/true);
}

OpId StepBuilder::gemm(Rank& r, const std::string& name, OpCategory cat, int layer, std::int64_t m,
                       std::int64_t n, std::int64_t k, bool weight_grad) {
  return gemm_as(gdtype_, r, name, cat, layer, m, n, k, weight_grad);
}

// The LM head's GEMMs: Megatron's output layer is a plain (not Transformer Engine) linear
// layer, so FP8 runs keep it in bf16 (the activation dtype), without FP8 casts.
OpId StepBuilder::head_gemm(Rank& r, const std::string& name, std::int64_t m, std::int64_t n,
                            std::int64_t k, bool weight_grad) {
  return gemm_as(adtype_, r, name, OpCategory::kCompute, -1, m, n, k, weight_grad);
}

OpId StepBuilder::gemm_as(sim::DType dtype, Rank& r, const std::string& name, OpCategory cat,
                          int layer, std::int64_t m, std::int64_t n, std::int64_t k,
                          bool weight_grad) {
  sim::GemmShape shape{.m = m, .n = n, .k = k, .batch = 1, .dtype = dtype};
  if (dtype == sim::DType::kFp8 && !weight_grad && !fp8_input_cast_) {
    // Transformer Engine quantizes the GEMM's bf16 activation input (forward) or output
    // gradient (dgrad), m × k elements, row-wise for this GEMM and column-wise for the wgrad
    // GEMM, which reuses it.
    fp8_cast(r, name, cat, layer, m * k, /*from_norm=*/false);
  }
  sim::OpSizes sz;
  sz.gemm = shape;
  sz.flops = sim::gemm_flops(shape);
  sim::OpCost cost = cm_.gemm(r.rank, shape);
  if (dtype == sim::DType::kFp8) cost = cm_.scale_kernel_time(r.rank, cost, fp8_gemm_scale_);
  return add(r, r.compute, name, OpKind::kGemm, cat, layer, std::move(cost), sz);
}

// The FP8 quantization of `elements` bf16 values as the scenario's recipe runs it
// (fp8_quantize_bytes); one op for the recipe's kernels (amax pass, cast).
OpId StepBuilder::fp8_cast(Rank& r, const std::string& name, OpCategory cat, int layer,
                           std::int64_t elements, bool from_norm) {
  const std::int64_t bytes = fp8_quantize_bytes(fp8_recipe_, fp8_non_tn_, from_norm, elements);
  return elementwise(r, name + ".fp8_cast", cat, layer, bytes,
                     bytes > 0 ? static_cast<double>(elements) : 0.0);
}

OpId StepBuilder::elementwise(Rank& r, const std::string& name, OpCategory cat, int layer,
                              std::int64_t bytes, double flops) {
  sim::OpSizes sz;
  sz.bytes = bytes;
  sz.flops = flops;
  return add(r, r.compute, name, OpKind::kElementwise, cat, layer,
             cm_.memory_bound(r.rank, bytes, flops), sz);
}

OpId StepBuilder::collective(Rank& r, LaneId lane, const std::string& name, OpCategory cat,
                             int layer, sim::CollectiveKind kind, const std::vector<int>& group,
                             std::int64_t bytes, std::vector<OpId> deps) {
  sim::OpSizes sz;
  sz.bytes = bytes;
  sz.collective = {.kind = kind, .group = group};
  return add(r, lane, name, OpKind::kCollective, cat, layer,
             cm_.collective(r.rank, kind, group, bytes), std::move(sz), std::move(deps));
}

OpId StepBuilder::copy(Rank& r, sim::CopyDirection dir, const std::string& name, OpCategory cat,
                       int layer, std::int64_t bytes, std::vector<OpId> deps) {
  sim::OpSizes sz;
  sz.bytes = bytes;
  sz.copy_direction = dir;
  const LaneId lane = dir == sim::CopyDirection::kH2D ? r.h2d : r.d2h;
  return add(r, lane, name, OpKind::kCopy, cat, layer, cm_.copy(r.rank, dir, bytes, true), sz,
             std::move(deps));
}

TensorId StepBuilder::tensor(PoolId pool, const std::string& name, std::int64_t bytes,
                             TensorCategory cat) {
  // The framework's allocator rounds every block it hands out (runtime.h); what lives outside
  // it (CUDA context, NCCL buffers) is not rounded.
  if (cat != TensorCategory::kRuntime &&
      std::find(hbm_pools_.begin(), hbm_pools_.end(), pool) != hbm_pools_.end()) {
    bytes = rounded_allocation(out_.runtime, bytes);
  }
  return b_.tensor(name, pool, bytes, cat);
}

sim::Status StepBuilder::build_rank(int stage) {
  const ParallelConfig& p = s_.parallelism;
  Rank r;
  r.stage = stage;
  r.rank = stage * stage_ranks(p);
  const std::string rn = fmt::format("rank{}", r.rank);
  const auto lane = [&](const char* suffix, sim::LaneRole role) {
    return b_.lane(rn + suffix, {.rank = r.rank, .stage = stage, .role = role});
  };
  r.compute = lane(".compute", sim::LaneRole::kCompute);
  r.comm = lane(".comm", sim::LaneRole::kComm);
  r.p2p = lane(".p2p", sim::LaneRole::kP2P);
  r.h2d = lane(".h2d", sim::LaneRole::kH2D);
  r.d2h = lane(".d2h", sim::LaneRole::kD2H);
  r.cpu = lane(".cpu", sim::LaneRole::kCpu);
  r.issue = lane(".host", sim::LaneRole::kCpu);
  host_seg_ = HostSegment{};
  host_wait_.reset();
  host_prev_first_.reset();
  host_prev_gpu_s_ = 0.0;
  host_behind_ = false;
  if (s_.parallelism.moe_shared_expert_overlap && s_.model.moe.experts > 0) {
    r.moe_shared = lane(".moe_shared", sim::LaneRole::kOther);
  }
  if (s_.parallelism.moe_a2a_overlap) {
    r.compute_b = lane(".compute_bwd", sim::LaneRole::kCompute);
    r.issue_b = lane(".host_bwd", sim::LaneRole::kCpu);
    r.a2a = lane(".a2a", sim::LaneRole::kComm);
    r.a2a_b = lane(".a2a_bwd", sim::LaneRole::kComm);
  }
  r.hbm = cm_.hbm_pool(r.rank);
  r.host = cm_.host_pool(r.rank);
  hbm_pools_.push_back(r.hbm);
  for (int i = 0; i < p.tp; ++i) r.tp_group.push_back(r.rank + i);
  // Rank order tp, cp, dp (Megatron-Core's default order): the gradient group is the dp · cp
  // ranks of stride tp, the CP ring its first cp.
  for (int i = 0; i < grad_dp(p); ++i) r.dp_group.push_back(r.rank + i * p.tp);
  // Hybrid sharding: shard groups of consecutive data-parallel ranks (within a node first, as
  // FSDP's HSDP mesh places them), replicated across the groups.
  const int shard = shard_dp(p);
  r.shard_group.assign(r.dp_group.begin(), r.dp_group.begin() + shard);
  for (int j = 0; j < grad_dp(p) / shard; ++j) r.replica_group.push_back(r.rank + j * p.tp * shard);
  if (r.replica_group.size() > 1) r.replica_lane = lane(".replica", sim::LaneRole::kComm);
  for (int i = 0; i < p.cp; ++i) r.cp_group.push_back(r.rank + i * p.tp);
  if (p.cp > 1) r.cp_lane = lane(".cp", sim::LaneRole::kComm);
  if (p.tp > 1 && (p.tp_async_grad_reduce || p.tp_comm_overlap)) {
    r.tp_lane = lane(".tp", sim::LaneRole::kComm);
  }
  if (p.moe_a2a_overlap && p.cp > 1) r.cp_lane_b = lane(".cp_bwd", sim::LaneRole::kComm);
  if (p.moe_a2a_overlap && r.tp_lane.valid()) r.tp_lane_b = lane(".tp_bwd", sim::LaneRole::kComm);
  // Megatron-Core's expert grid over the stage's tp · cp · dp ranks, etp fastest, then ep, then
  // the expert data-parallel group.
  for (int i = 0; i < p.ep; ++i) r.ep_group.push_back(r.rank + i * p.etp);
  for (int i = 0; i < p.etp; ++i) r.etp_group.push_back(r.rank + i);
  for (int i = 0; i < edp(); ++i) r.edp_group.push_back(r.rank + i * p.ep * p.etp);
  const int xshard = expert_shard_dp(p);
  r.expert_shard_group.assign(r.edp_group.begin(), r.edp_group.begin() + xshard);
  if (xshard < edp()) {
    for (int j = 0; j < edp() / xshard; ++j) {
      r.expert_replica_group.push_back(r.rank + j * p.ep * p.etp * xshard);
    }
  }

  b_.representative({.rank = r.rank, .multiplicity = stage_ranks(p), .stride = 1});
  SimRankInfo info;
  info.rank = r.rank;
  info.stage = stage;
  // The representative is the stage's first rank: data- and tensor-parallel index 0.
  info.dp_rank = 0;
  info.tp_rank = 0;
  info.multiplicity = stage_ranks(p);
  info.hbm_pool = r.hbm;
  info.host_pool = r.host;
  info.compute_lane = r.compute;
  out_.ranks.push_back(info);

  make_param_groups(r);
  superoffload_placement(r);
  make_static_tensors(r);
  if (static_only_) return sim::ok();

  run_schedule(r);
  // The optimizer's ops (multi-tensor kernels over every group) are one host segment.
  host_one_segment_ = true;
  optimizer(r);
  host_issue_end_task();
  host_one_segment_ = false;
  return sim::ok();
}

}  // namespace offsim::models::detail

namespace offsim::models {

namespace {

std::vector<std::string> scenario_flags(const Scenario& s) {
  std::vector<std::string> flags;
  const std::string& preset = s.offload.preset;
  bool act_offload = false;
  for (const OffloadRule& r : s.offload.rules) {
    if (r.where == Placement::kHost &&
        (r.cls == TensorClass::kActivations || r.cls == TensorClass::kNamedActivation)) {
      act_offload = true;
    }
  }
  if (act_offload && s.parallelism.pp > 1 &&
      (preset == "megatron_activation_offload" || preset.empty())) {
    flags.push_back(
        "megatron cannot offload activations with pp>1 (Transformer Engine CPU "
        "offloading refuses pipeline parallelism); simulated anyway");
  }
  if (s.offload.remat_unsaved && s.recompute.mode != RecomputeConfig::Mode::kFull) {
    flags.push_back(fmt::format(
        "preset {} rematerializes everything it does not save: expected recompute.mode full, got "
        "{}",
        preset, to_string(s.recompute.mode)));
  }
  if (s.parallelism.fsdp && s.parallelism.pp > 1) {
    flags.push_back("FSDP with pipeline parallelism: most frameworks do not combine them");
  }
  // Host-resident training state that the data-parallel ranks do not shard is held whole by
  // every rank's host. DeepSpeed's ZeRO-Offload partitions what it offloads over the
  // data-parallel ranks (offload_optimizer needs ZeRO stage 1, 2 or 3; the ZeRO-Offload paper,
  // Ren et al. ATC'21, runs it with stage 2), FSDP CPUOffload shards it too.
  const ParallelConfig& p = s.parallelism;
  if (p.dp > 1 && !p.fsdp) {
    std::vector<std::string> replicated;
    bool params_replicated = false;
    for (const OffloadRule& r : s.offload.rules) {
      if (r.where != Placement::kHost) continue;
      const bool state =
          r.cls != TensorClass::kActivations && r.cls != TensorClass::kNamedActivation;
      const bool sharded = !state || dp_sharding(p).of(r.cls);
      const std::string name = to_string(r.cls);
      if (!sharded && std::find(replicated.begin(), replicated.end(), name) == replicated.end()) {
        replicated.push_back(name);
        params_replicated = params_replicated || r.cls == TensorClass::kParams;
      }
    }
    if (!replicated.empty()) {
      flags.push_back(fmt::format(
          "host state replicated over dp={} ranks: every rank keeps the whole {} on the host "
          "(zero_stage {}); ZeRO-Offload partitions it over the data-parallel ranks: set "
          "parallelism.zero_stage: {} (or parallelism.fsdp: true)",
          p.dp, fmt::join(replicated, ", "), p.zero_stage, params_replicated ? 3 : 2));
    }
  }
  return flags;
}

}  // namespace

namespace {

// Model FLOPs (whole job): 3 × forward (forward, activation grad, weight grad) of every layer
// and the LM head, attention counted in full (Megatron/PaLM convention); the hardware FLOPs add
// the recomputed forward ops. Multi-token prediction as Megatron-LM counts it
// (num_floating_point_operations): each module's layer, its eh_proj and one more LM head.
void set_step_flops(const Scenario& s, BuiltStep& out) {
  const LayerDims d = layer_dims(s.model, s.training, ParallelConfig{});
  const double sequences =
      static_cast<double>(s.training.global_batch) / static_cast<double>(s.training.micro_batch);
  const auto mtp = static_cast<double>(s.model.mtp_layers);
  double fwd = (1.0 + mtp) * lm_head_forward_flops(d) +
               mtp * 4.0 * static_cast<double>(d.tokens() * d.h) * static_cast<double>(d.h);
  for (int l = 0; l < built_layers(s.model); ++l) {
    fwd +=
        s.model.moe.experts > 0
            ? layer_forward_flops(layer_dims(s.model, s.training, ParallelConfig{}, l, true), false)
            : layer_forward_flops(d, false);
  }
  out.model_flops_per_step = 3.0 * fwd * sequences;
  double recompute = 0.0;
  const PipelineLayout layout = pipeline_layout(s.model.layers, s.parallelism);
  for (int l = 0; l < built_layers(s.model); ++l) {
    std::set<std::string> named;
    for (const OffloadRule& r : s.offload.rules) {
      const bool selected = l < s.model.layers ? r.layers.contains(l, layout)
                                               : r.layers.kind == LayerSelection::Kind::kAll;
      if (r.cls == TensorClass::kNamedActivation && selected) {
        named.insert(r.name);
      }
    }
    const LayerDims dl =
        s.model.moe.experts > 0 ? layer_dims(s.model, s.training, ParallelConfig{}, l, true) : d;
    const LayerActivations a = layer_activations(dl, recompute_mode(s.recompute, l),
                                                 s.recompute.modules, named, s.recompute.rerun);
    // The entries of the layer's forward recipe its recompute re-runs.
    for (const LayerOpEntry& e : layer_forward_recipe()) {
      if (!recomputes(e, a)) continue;
      for (int op = static_cast<int>(e.first); op <= static_cast<int>(e.last); ++op) {
        if (a.recompute[op]) recompute += recompute_op_flops(dl, a, static_cast<FwdOp>(op));
      }
    }
  }
  out.hardware_flops_per_step = out.model_flops_per_step + recompute * sequences;
}

// The communicators every rank joins (a group of one rank needs none): data-parallel,
// tensor-parallel, and the pipeline's point-to-point pairs; in one NVLink domain when the
// group fits on a node of an NVLink system. Sets out.runtime and appends its notes to the flags.
void set_runtime(const Scenario& s, const sim::platform::System& system,
                 const sim::platform::CalibrationProfile& profile, BuiltStep& out) {
  const ParallelConfig& p = s.parallelism;
  const bool nvlink = profile.nvlink.bytes_per_s_per_gpu.value > 0.0;
  const int per_node = system.gpus_per_node;
  std::vector<NcclCommunicator> comms = {
      {.ranks = grad_dp(p), .nvlink = nvlink && stage_ranks(p) <= per_node},
      {.ranks = p.tp, .nvlink = nvlink && p.tp <= per_node},
      {.ranks = p.pp > 1 ? 2 : 1, .nvlink = nvlink && stage_ranks(p) * p.pp <= per_node}};
  if (p.cp > 1) comms.push_back({.ranks = p.cp, .nvlink = nvlink && p.tp * p.cp <= per_node});
  out.runtime = runtime_model(s.hardware.runtime, profile.gpu.compute_capability_major(),
                              static_cast<std::int64_t>(profile.gpu.hbm_usable_bytes.value), comms);
  for (const std::string& note : out.runtime.notes) out.flags.push_back(note);
}

// Per-expert load of one micro-batch (token rows over the expert-parallel group) and the
// simulated EP rank's share, for the report's metadata.
void add_moe_metadata(const Scenario& s, sim::PlanBuilder& b) {
  const ParallelConfig& p = s.parallelism;
  const std::vector<double> rows = expert_rows(s.model, s.training, p);
  std::string loads;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    loads += fmt::format("{}{:.0f}", i == 0 ? "" : ",", rows[i]);
  }
  b.metadata("moe_expert_rows_per_micro_batch", loads);
  if (s.offload.expert_fetch == OffloadPolicy::ExpertFetch::kRouted) {
    const ExpertFetchCounts x = expert_fetch_counts(s);
    b.metadata("moe_expert_fetch",
               fmt::format("routed: {:.2f} of {} local experts hit per micro-batch; {} fetched, "
                           "{} prefetched with the layer, {} after the router",
                           x.expected_hit, s.model.moe.experts / p.ep, x.fetched, x.with_layer,
                           x.after_router));
  }
  for (int l = 0; l < s.model.layers; ++l) {
    if (!is_moe_layer(s.model, l)) continue;
    const LayerDims md = layer_dims(s.model, s.training, p, l);
    b.metadata("moe_simulated_rank_rows",
               fmt::format("{} rows over {} local experts, {} in the most-loaded one", md.routed,
                           md.local_experts, md.max_rows));
    break;
  }
}

// The HBM and host pool capacities of the built plan (the JAX runtime's preallocated pool
// caps the HBM ones), as seen by the first simulated rank.
void set_pool_capacities(BuiltStep& out) {
  if (out.runtime.preallocated) {
    // JAX: tensors live in the preallocated pool, a fraction of the HBM.
    for (const SimRankInfo& info : out.ranks) {
      out.plan.pools[info.hbm_pool.index()].capacity_bytes = out.runtime.allocator_limit_bytes;
    }
  }
  if (!out.ranks.empty()) {
    const auto& pools = out.plan.pools;
    for (const auto& pool : pools) {
      if (&pool == &pools[out.ranks.front().hbm_pool.index()]) {
        out.hbm_capacity_bytes = pool.capacity_bytes;
      }
      if (&pool == &pools[out.ranks.front().host_pool.index()]) {
        out.host_capacity_bytes = pool.capacity_bytes;
      }
    }
  }
}

}  // namespace

sim::Result<BuiltStep> build_step(const Scenario& s, const BuildOptions& options) {
  OFFSIM_ASSIGN_OR_RETURN(ResolvedScenario resolved, resolve(s));
  return build_step(resolved, options);
}

sim::Result<BuiltStep> build_step(const ResolvedScenario& resolved, const BuildOptions& options) {
  // Checked, with the host and hardware.overrides applied, once by resolve().
  const Scenario& s = resolved.scenario();
  const sim::platform::System& system = resolved.system();
  const sim::platform::CalibrationProfile* profile = &resolved.profile();

  const ParallelConfig& p = s.parallelism;
  std::vector<SimRank> ranks;
  for (int stage = 0; stage < p.pp; ++stage) {
    ranks.push_back({.rank = stage * stage_ranks(p), .multiplicity = stage_ranks(p), .stride = 1});
  }
  sim::PlanBuilder b;
  OFFSIM_ASSIGN_OR_RETURN(CostModel cm, CostModel::create(system, *profile, ranks, b));

  BuiltStep out;
  out.gpus = stage_ranks(p) * p.pp;
  out.tokens_per_step = s.training.global_batch * s.training.seq_len;
  set_step_flops(s, out);
  out.peak_flops_per_gpu = cm.peak_flops(s.training.compute_dtype);
  out.flags = scenario_flags(s);
  set_runtime(s, system, *profile, out);

  if (options.layers_per_chunk == 0 && !options.static_only) {
    // The closed-form size is within a few percent of the plan's (plan_size_test): 5% more room
    // keeps the ops and tensors from being moved as the plan grows. Reduced steps (fewer
    // micro-batches) are sized for their own count.
    const PlanSize size = estimate_plan_size(resolved, {.micro_batches = options.micro_batches});
    b.reserve(static_cast<std::size_t>(size.ops * 1.05) + 64,
              static_cast<std::size_t>(size.tensors * 1.05) + 64);
  }
  detail::StepBuilder builder(s, resolved.layer_policies(), cm, b, out, options);
  OFFSIM_RETURN_IF_ERROR(builder.build());

  b.metadata("scenario", s.name);
  b.metadata("model", s.model.name);
  b.metadata("system", system.name);
  b.metadata("representative_ranks",
             fmt::format("one simulated rank per pipeline stage ({}), each standing for {} = {} "
                         "identical ranks",
                         p.pp, p.cp > 1 ? "dp·tp·cp" : "dp·tp", stage_ranks(p)));
  if (s.model.moe.experts > 0) add_moe_metadata(s, b);
  out.plan = std::move(b).build();
  set_pool_capacities(out);
  return out;
}

}  // namespace offsim::models
