// StepBuilder: parameter groups and their static tensors, ZeRO/FSDP parameter gathers,
// data-parallel gradient reductions, and the optimizer step on the GPU.
#include "models/step_builder_impl.h"

#include <algorithm>

namespace offsim::models::detail {

// FP8: Transformer Engine quantizes each layer's linear weights (row-wise for the forward,
// column-wise for the dgrad) once per step: Megatron passes is_first_microbatch, and later
// micro-batches reuse the cached FP8 weights. Charged right after the group's optimizer update,
// which produces the weights it casts.
// * bf16 parameters: the recipe's cast (fp8_quantize_bytes) of every linear weight on the rank.
// * FP8 parameters (training.dtypes.params fp8, Megatron's --fp8-param-gather): per-tensor and
//   blockwise scaling quantize the updated fp32 master shard straight into the FP8 weights
//   (TE's cast_master_weights_to_fp8; the update writes them, adam_bytes_per_param), current
//   scaling after an amax pass over that shard (read 4 bytes each), and where the GEMMs need a
//   column-wise copy (Ada and Hopper, blockwise everywhere) it is made from the gathered
//   weights (read 1, write 1 each). MXFP8 gathers the updated weights in bf16 and quantizes
//   them all as with bf16 parameters (Megatron's reuse_grad_buf_for_mxfp8_param_ag path).
OpId StepBuilder::fp8_weight_cast(Rank& r, const ParamGroup& g, OpId after) {
  const std::int64_t weights = g.linear_weights;
  std::int64_t bytes = fp8_quantize_bytes(fp8_recipe_, fp8_non_tn_, false, weights);
  if (dt_.params == sim::DType::kFp8 && fp8_recipe_ != TrainingConfig::Fp8Recipe::kMxfp8) {
    const bool current = fp8_recipe_ == TrainingConfig::Fp8Recipe::kCurrent;
    const bool columnwise = !fp8_non_tn_ || fp8_recipe_ == TrainingConfig::Fp8Recipe::kBlockwise;
    const std::int64_t shard = optimizer_shard(g) * weights / std::max<std::int64_t>(g.params, 1);
    bytes = (current ? 4 * shard : 0) + (columnwise ? 2 * weights : 0);
  }
  if (bytes <= 0) return after;
  const OpId cast = elementwise(r, g.name + ".fp8_weight_cast", OpCategory::kOptimizer, g.layer,
                                bytes, static_cast<double>(weights));
  b_.op_at(cast).deps.push_back(after);
  return cast;
}

// FP8 parameters: a group's linear weights are held only as their FP8 copies
// (fp8_weight_copy_bytes; sharded over the data-parallel ranks, a row-wise shard of one byte
// per value), its norms, biases and router in bf16 (not Transformer Engine modules). The
// embedding and the head stay bf16.
void StepBuilder::fp8_param_storage(ParamGroup& g, const ParallelConfig& p) const {
  if (dt_.params != sim::DType::kFp8) return;
  const std::int64_t rest = 2 * (g.params - g.linear_weights);
  g.mem.params_bytes =
      dp_sharding(p).params
          ? ceil_div(g.linear_weights + rest, shard_dp(p))
          : fp8_weight_copy_bytes(fp8_recipe_, fp8_non_tn_, g.linear_weights) + rest;
}

// bf16 parameters under FP8 GEMMs: the FP8 copies Transformer Engine caches of every linear
// weight across micro-batches and steps (the module's workspaces, kept while the module lives).
// With sharded parameters (ZeRO-3, FSDP) none are counted: the cache would hold every gathered
// layer's weights, and the step charges the cast once per step all the same.
std::int64_t StepBuilder::fp8_weight_cache_bytes(const ParamGroup& g) const {
  if (gdtype_ != sim::DType::kFp8 || dt_.params == sim::DType::kFp8 || shard_params()) return 0;
  return fp8_weight_copy_bytes(fp8_recipe_, fp8_non_tn_, g.linear_weights);
}

// The mixed-precision optimizer's passes over the gradients before the update (Megatron's
// DistributedOptimizer / MixedPrecisionOptimizer): with fp16, unscale the main gradients and
// check them for inf/NaN (read and write each); always, the gradient norm for clipping (read
// each). Over this rank's optimizer shard, at the main gradients' width (fp32 with fp32
// master weights). With pp > 1, their scalars (the norm, and with fp16 the inf flag) are
// all-reduced over the model-parallel group (Megatron's clip_grad_norm_fp32 and
// _unscale_main_grads_and_check_for_nan, over get_model_parallel_group: tp x pp ranks): a
// collective every stage joins, so no stage updates before every stage's norm is taken
// (build() links the stages). Returns what the update waits for.
OpId StepBuilder::grad_passes(Rank& r, const std::vector<OpId>& deps) {
  std::int64_t shard = 0;
  for (const ParamGroup& g : r.groups) shard += optimizer_shard(g);
  const std::int64_t gbytes = s_.training.fp32_master_weights ? 4 : 2;
  if (gdtype_ == sim::DType::kFp16) {
    const OpId u = elementwise(r, "unscale_inf_check", OpCategory::kOptimizer, -1,
                               2 * gbytes * shard, 2.0 * static_cast<double>(shard));
    b_.op_at(u).deps.insert(b_.op_at(u).deps.end(), deps.begin(), deps.end());
  }
  const OpId n = elementwise(r, "grad_norm", OpCategory::kOptimizer, -1, gbytes * shard,
                             2.0 * static_cast<double>(shard));
  b_.op_at(n).deps.insert(b_.op_at(n).deps.end(), deps.begin(), deps.end());
  const ParallelConfig& p = s_.parallelism;
  if (p.pp <= 1) return n;
  std::vector<int> group;
  for (int s = 0; s < p.pp; ++s) {
    for (int t = 0; t < p.tp; ++t) group.push_back(s * stage_ranks(p) + t);
  }
  const std::int64_t scalars = gdtype_ == sim::DType::kFp16 ? 2 : 1;
  const OpId sync = collective(r, r.comm, "grad_norm.allreduce", OpCategory::kComm, -1,
                               sim::CollectiveKind::kAllReduce, group, 4 * scalars, {n});
  norm_syncs_.push_back({n, sync});
  return sync;
}

// Every stage's gradient-norm all-reduce waits for every stage's norm (grad_passes).
void StepBuilder::link_norm_syncs() {
  for (const auto& [norm, sync] : norm_syncs_) {
    for (const auto& [other_norm, other_sync] : norm_syncs_) {
      if (other_sync != sync) b_.op_at(sync).deps.push_back(other_norm);
    }
  }
}

// Expert data-parallel size: tp · cp · dp / (ep · etp).
int StepBuilder::edp() const { return expert_dp(s_.parallelism); }

void StepBuilder::make_param_groups(Rank& r) {
  const ParallelConfig& p = s_.parallelism;
  const ModelArch& m = s_.model;
  const auto finish = [&](ParamGroup g) {
    g.mem = static_memory(g.params, p, dt_);
    fp8_param_storage(g, p);
    r.groups.push_back(std::move(g));
  };
  if (r.stage == 0) {
    ParamGroup g{.name = "embed",
                 .role = ParamGroup::Role::kEmbed,
                 .layer = -1,
                 .params = d_.v * m.hidden + m.max_positions * m.hidden};
    non_layer_policy(g);
    finish(g);
  }
  for (int c = 0; c < p.virtual_stages; ++c) {
    for (int l : chunk_layers(r.stage, c)) {
      const LayerPolicy& lp = policies_[l];
      ParamGroup g{.name = fmt::format("l{}", l),
                   .layer = l,
                   .params = layer_parameter_count_per_rank(m, p.tp, l),
                   .linear_weights = linear_weight_count_per_rank(m, p.tp, l),
                   .params_on_host = lp.params_on_host,
                   .grads_on_host = lp.grads_on_host,
                   .opt_on_host = lp.opt_on_host,
                   .master_on_host = lp.master_on_host,
                   .master_on_hbm = lp.master_on_hbm};
      r.group_of_layer[l] = r.groups.size();
      finish(g);
      if (ld(l).moe) {
        // Routed experts: experts / ep local experts, each split over etp; ZeRO-1 (the
        // distributed optimizer) shards their optimizer state over the expert-DP group.
        ParamGroup x{.name = fmt::format("l{}.experts", l),
                     .layer = l,
                     .params = expert_parameter_count_per_rank(m, p.ep, p.etp),
                     .linear_weights = expert_linear_weight_count_per_rank(m, p.ep, p.etp),
                     .params_on_host = lp.params_on_host,
                     .grads_on_host = lp.grads_on_host,
                     .opt_on_host = lp.opt_on_host,
                     .master_on_host = lp.master_on_host,
                     .master_on_hbm = lp.master_on_hbm,
                     .expert = true};
        ParallelConfig pe = p;
        pe.dp = expert_shard_dp(p);  // the expert-DP group takes in the context-parallel ranks
        pe.cp = 1;
        pe.fsdp_shard = 0;
        x.mem = static_memory(x.params, pe, dt_);
        fp8_param_storage(x, pe);
        r.expert_group_of_layer[l] = r.groups.size();
        r.groups.push_back(std::move(x));
      }
    }
  }
  if (r.stage == p.pp - 1) {
    const std::int64_t norm = m.norm == ModelArch::Norm::kLayerNorm ? 2 * m.hidden : m.hidden;
    // Untied: the output projection. Tied with pp > 1: Megatron keeps a copy of the word
    // embedding on the last stage. Tied with pp = 1: shared with "embed".
    const bool head_matrix = !m.tied_embeddings || p.pp > 1;
    // Multi-token prediction (the modules' layers are groups of their own): each module's
    // eh_proj (2h -> h, column-parallel) and its three norms (enorm, hnorm, final), and with
    // pp > 1 and untied embeddings a copy of the word embedding, which Megatron-Core's GPTModel
    // builds on the stage that runs MTP (`pre_process or mtp_process`).
    const std::int64_t mtp = m.mtp_layers <= 0
                                 ? 0
                                 : m.mtp_layers * (2 * m.hidden * m.hidden / p.tp + 3 * norm) +
                                       (p.pp > 1 && !m.tied_embeddings ? d_.v * m.hidden : 0);
    ParamGroup g{.name = "head",
                 .role = ParamGroup::Role::kHead,
                 .layer = -1,
                 .params = norm + (head_matrix ? d_.v * m.hidden : 0) + mtp};
    non_layer_policy(g);
    finish(g);
  }
}

void StepBuilder::make_static_tensors(Rank& r) {
  for (ParamGroup& g : r.groups) {
    const std::int64_t master = g.mem.master_bytes;
    const std::int64_t moments = g.mem.optimizer_bytes - master;
    g.params_t = tensor(g.params_on_host ? r.host : r.hbm, g.name + ".params", g.mem.params_bytes,
                        TensorCategory::kParams);
    g.grads_t = tensor(g.grads_on_host ? r.host : r.hbm, g.name + ".grads", g.mem.grads_bytes,
                       TensorCategory::kGrads);
    g.opt_t = tensor(g.opt_on_host ? r.host : r.hbm, g.name + ".moments", moments,
                     TensorCategory::kOptimizer);
    b_.initial(g.params_t);
    if (const std::int64_t cache = fp8_weight_cache_bytes(g); cache > 0) {
      b_.initial(tensor(r.hbm, g.name + ".fp8_weights", cache, TensorCategory::kParams));
    }
    b_.initial(g.grads_t);
    b_.initial(g.opt_t);
    if (master > 0) {
      const bool host = g.master_on_host || (g.opt_on_host && !g.master_on_hbm);
      g.master_t =
          tensor(host ? r.host : r.hbm, g.name + ".master", master, TensorCategory::kOptimizer);
      b_.initial(g.master_t);
    }
  }
  // ZenFlow's GPU-side moments of the selected columns (see zenflow_topk_update).
  if (const std::int64_t selected = zenflow_selected(r); selected > 0) {
    b_.initial(tensor(r.hbm, "zenflow.selected_moments",
                      2 * selected * sim::dtype_bytes(dt_.params), TensorCategory::kOptimizer));
  }
  // Library workspaces, CUDA context and allocator overhead on the static state, from the
  // profile: fixed + fraction × bytes the allocator holds for weights and optimizer.
  const auto& alloc = cm_.profile().allocator;
  std::int64_t hbm_static = 0;
  for (const ParamGroup& g : r.groups) {
    if (!g.params_on_host) hbm_static += g.mem.params_bytes;
    hbm_static += fp8_weight_cache_bytes(g);
    if (!g.grads_on_host) hbm_static += g.mem.grads_bytes;
    if (!g.opt_on_host) hbm_static += g.mem.optimizer_bytes;
    if (g.opt_on_host && g.master_on_hbm) hbm_static += g.mem.master_bytes;
  }
  const RuntimeModel& rt = out_.runtime;
  if (rt.runtime == HardwareConfig::Runtime::kNone) {
    const auto ws = static_cast<std::int64_t>(
        alloc.fixed_bytes.value + alloc.overhead_fraction.value * static_cast<double>(hbm_static));
    b_.initial(tensor(r.hbm, "workspace", ws, TensorCategory::kWorkspace));
    return;
  }
  // The runtime's own figures replace the profile's lump: the CUDA context and NCCL buffers
  // on the device outside the allocator (JAX: outside its preallocated pool, so not here), the
  // cuBLAS workspace through it.
  if (!rt.preallocated) {
    b_.initial(
        tensor(r.hbm, "runtime.cuda_context", rt.cuda_context_bytes, TensorCategory::kRuntime));
    if (rt.nccl_bytes > 0) {
      b_.initial(tensor(r.hbm, "runtime.nccl_buffers", rt.nccl_bytes, TensorCategory::kRuntime));
    }
  }
  if (rt.cublas_workspace_bytes > 0) {
    b_.initial(
        tensor(r.hbm, "cublas_workspace", rt.cublas_workspace_bytes, TensorCategory::kWorkspace));
  }
}

// Brings a layer's parameters in before use: H2D from host and/or FSDP all-gather, prefetched
// `prefetch` layers ahead (dependency on the first op of an earlier layer).
StepBuilder::Fetch StepBuilder::fetch_params(Rank& r, int layer, const std::string& tag,
                                             std::optional<OpId> after, bool forward) {
  Fetch f;
  const ParamGroup& g = group(r, layer);
  if (!g.params_on_host && !shard_params()) return f;
  const std::int64_t full = g.params * sim::dtype_bytes(dt_.all_gather);
  // An MoE layer's routed experts: those prefetched with it (moe_expert_fetch_bytes).
  const auto [expert_bytes, routed_bytes] = moe_expert_fetch_bytes(r, layer, forward);
  std::vector<OpId> deps;
  if (after) deps.push_back(*after);
  if (g.params_on_host) {
    f.routed_bytes = routed_bytes;
    const std::int64_t in_bytes = g.mem.params_bytes + expert_bytes;
    const TensorId buf = tensor(r.hbm, fmt::format("{}.{}.params_in", g.name, tag), in_bytes,
                                TensorCategory::kBuffers);
    const OpId c = copy(r, sim::CopyDirection::kH2D, fmt::format("{}.{}.params_h2d", g.name, tag),
                        OpCategory::kOffload, layer, in_bytes, deps);
    b_.op_at(c).allocs.push_back(buf);
    f.buffers.push_back(buf);
    deps = {c};
    f.wait = {c};
  }
  if (shard_params() && shard_dp(s_.parallelism) > 1) {
    const TensorId buf = tensor(r.hbm, fmt::format("{}.{}.params_gathered", g.name, tag), full,
                                TensorCategory::kBuffers);
    // The all-gather that allocates the gathered buffer and the one the layer waits for.
    std::pair<OpId, OpId> ag;
    if (s_.parallelism.param_gather == ParallelConfig::ParamGather::kPerTensorSynchronized) {
      // The backward of a layer whose forward is recomputed fetches twice: the checkpointed
      // forward's module hooks gather the parameters and release them, then the backward's.
      const int rounds =
          !forward && recompute_mode(s_.recompute, layer) == RecomputeConfig::Mode::kFull ? 2 : 1;
      ag = gather_per_tensor(r, g, layer, tag, rounds, deps);
    } else {
      ag.first = ag.second = collective(
          r, r.comm, fmt::format("{}.{}.params_allgather", g.name, tag), OpCategory::kComm, layer,
          sim::CollectiveKind::kAllGather, r.shard_group, full, deps);
    }
    b_.op_at(ag.first).allocs.push_back(buf);
    f.buffers.push_back(buf);
    f.wait = {ag.second};
  }
  // An MoE layer's routed experts are sharded over the expert-data-parallel ranks and gathered
  // on their own, after the layer's other parameters on the same stream (torchtitan shards
  // `moe.experts` with fully_shard over the dp-mod-ep mesh and prefetches it with its block).
  const auto x = r.expert_group_of_layer.find(layer);
  if (shard_params() && expert_shard_dp(s_.parallelism) > 1 && x != r.expert_group_of_layer.end()) {
    const ParamGroup& e = r.groups[x->second];
    const std::int64_t bytes = e.params * sim::dtype_bytes(dt_.all_gather);
    const TensorId buf = tensor(r.hbm, fmt::format("{}.{}.params_gathered", e.name, tag), bytes,
                                TensorCategory::kBuffers);
    const OpId ag =
        collective(r, r.comm, fmt::format("{}.{}.params_allgather", e.name, tag), OpCategory::kComm,
                   layer, sim::CollectiveKind::kAllGather, r.expert_shard_group, bytes, deps);
    b_.op_at(ag).allocs.push_back(buf);
    f.buffers.push_back(buf);
    f.wait.push_back(ag);
  }
  return f;
}

// The parameter tensors of a group as the framework registers them (a transformer layer's, by
// layer_parameter_tensors_per_rank), or the group as one tensor.
std::vector<std::int64_t> StepBuilder::param_tensor_sizes(const ParamGroup& g) const {
  if (g.role == ParamGroup::Role::kLayer && !g.expert) {
    std::vector<std::int64_t> per = layer_parameter_tensors_per_rank(s_.model, s_.parallelism.tp);
    std::int64_t sum = 0;
    for (std::int64_t n : per) sum += n;
    if (sum == g.params) return per;
  }
  return {g.params};
}

// DeepSpeed ZeRO-3 of early 2021 (ParallelConfig::ParamGather::kPerTensorSynchronized): each
// parameter tensor of the group is all-gathered on its own (`rounds` times), after
// torch.cuda.synchronize(). The first waits for every GPU op issued before the fetch (the compute
// lane's latest: the device synchronisation) besides `deps`; the others follow it on the
// communication lane. Each costs, besides NCCL's time, the host's round trip of its
// synchronisation and the output copies of torch.distributed.all_gather with a list of outputs:
// ProcessGroupNCCL gathers into a flat buffer and copies each rank's partition out with copy_
// (one cudaMemcpyAsync per rank of the group, at the profile's submit cost, host_link.
// submit_overhead_s), which DeepSpeed waits for before the next tensor's synchronisation.
// Returns the first and the last all-gather.
std::pair<OpId, OpId> StepBuilder::gather_per_tensor(Rank& r, const ParamGroup& g, int layer,
                                                     const std::string& tag, int rounds,
                                                     std::vector<OpId> deps) {
  const std::vector<std::int64_t> tensors = param_tensor_sizes(g);
  if (last_compute_.valid()) deps.push_back(last_compute_);
  const std::int64_t bytes_per = sim::dtype_bytes(dt_.all_gather);
  const sim::Duration per_gather =
      cm_.host_sync_latency() +
      sim::duration_from_seconds(static_cast<double>(r.dp_group.size()) *
                                 cm_.profile().host_link.submit_overhead_s.value);
  std::optional<OpId> first;
  OpId last;
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const std::string name =
          round == 0 ? fmt::format("{}.{}.params_allgather{}", g.name, tag, i)
                     : fmt::format("{}.{}.recompute.params_allgather{}", g.name, tag, i);
      last = collective(r, r.comm, name, OpCategory::kComm, layer, sim::CollectiveKind::kAllGather,
                        r.shard_group, tensors[i] * bytes_per, first ? std::vector<OpId>{} : deps);
      b_.op_at(last).cost.latency += per_gather;
      if (!first) first = last;
    }
  }
  return {*first, last};
}

// The routed experts' gradients of micro-batch `mb`: reduced over the expert-DP group after
// the last micro-batch (reduce-scatter under the distributed optimizer), or after each one when
// gradients are sharded (ZeRO-2/3, FSDP: the experts' full gradient lives until its
// reduce-scatter, as a layer's does in grads_done), and D2H when they live on the host.
void StepBuilder::expert_grads_done(Rank& r, int layer, int mb, OpId last) {
  const bool last_mb = mb == micro_batches_ - 1;
  if (!last_mb && !shard_grads()) return;
  ParamGroup& g = r.groups[r.expert_group_of_layer.at(layer)];
  OpId after = last;
  if (edp() > 1) {
    std::optional<TensorId> buf;
    if (shard_grads()) {
      buf = tensor(r.hbm, fmt::format("mb{}.{}.grad_bucket", lbl(mb), g.name),
                   g.params * sim::dtype_bytes(dt_.grads), TensorCategory::kBuffers);
      const auto first = r.layer_first_bwd.find({mb, layer});
      b_.op_at(first != r.layer_first_bwd.end() ? first->second : last).allocs.push_back(*buf);
    }
    after = reduce_grads(r, g, mb, last);
    if (buf) b_.op_at(after).frees.push_back(*buf);
  }
  if (g.grads_on_host) {
    after = copy(r, sim::CopyDirection::kD2H, fmt::format("mb{}.{}.grads_d2h", lbl(mb), g.name),
                 OpCategory::kOffload, layer, last_mb ? grads_d2h_bytes(g) : g.mem.grads_bytes,
                 {after});
  }
  if (last_mb) r.expert_reduce_op[layer] = after;
}

// The data-parallel reduction of a group's gradients of micro-batch `mb` after `last` (the
// backward op that completes them), on the comm lane: one reduce-scatter (all-reduce without a
// sharded optimizer) of the group over its data-parallel ranks (the expert-DP group for routed
// experts); returns the op that completes it.
OpId StepBuilder::reduce_grads(Rank& r, const ParamGroup& g, int mb, OpId last) {
  const bool reduce_scatter = dp_sharding(s_.parallelism).optimizer;
  const std::string name = fmt::format("mb{}.{}.grad_{}", lbl(mb), g.name,
                                       reduce_scatter ? "reducescatter" : "allreduce");
  const sim::CollectiveKind kind =
      reduce_scatter ? sim::CollectiveKind::kReduceScatter : sim::CollectiveKind::kAllReduce;
  const std::int64_t wire_bytes = sim::dtype_bytes(dt_.reduce_scatter);
  OpId first;
  OpId after;
  if (s_.parallelism.param_gather == ParallelConfig::ParamGather::kPerTensorSynchronized) {
    // DeepSpeed ZeRO-3 of early 2021 (v0.3.13 partition_parameters.py,
    // _reduce_scatter_gradients): one torch.distributed.reduce_scatter per parameter tensor with
    // a list of world-size input views, which ProcessGroupNCCL copies into a flat buffer one
    // rank's partition at a time (a cudaMemcpyAsync each, at the profile's submit cost, as the
    // list outputs of gather_per_tensor); issued asynchronously, no synchronisation. The first
    // waits for the backward, the others follow it on the comm lane.
    const std::vector<std::int64_t> tensors = param_tensor_sizes(g);
    const sim::Duration list_copies = sim::duration_from_seconds(
        static_cast<double>(r.dp_group.size()) * cm_.profile().host_link.submit_overhead_s.value);
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      after = collective(r, r.comm, fmt::format("{}{}", name, i), OpCategory::kComm, g.layer, kind,
                         r.dp_group, tensors[i] * wire_bytes,
                         i == 0 ? std::vector<OpId>{last} : std::vector<OpId>{});
      b_.op_at(after).cost.latency += list_copies;
      if (i == 0) first = after;
    }
  } else {
    first = after =
        collective(r, r.comm, name, OpCategory::kComm, g.layer, kind,
                   g.expert ? r.expert_shard_group : r.shard_group, g.params * wire_bytes, {last});
    // Hybrid sharding: the shard's gradient all-reduced across the replicas, on a stream of its
    // own beside the gathers and reduce-scatters (FSDP2's all_reduce_stream: "the collectives
    // use different network resources and can overlap in the typical intra-node sharding /
    // inter-node replication case").
    const std::vector<int>& replicas = g.expert ? r.expert_replica_group : r.replica_group;
    if (replicas.size() > 1) {
      const int shard = g.expert ? expert_shard_dp(s_.parallelism) : shard_dp(s_.parallelism);
      after = collective(r, r.replica_lane,
                         fmt::format("mb{}.{}.grad_replica_allreduce", lbl(mb), g.name),
                         OpCategory::kComm, g.layer, sim::CollectiveKind::kAllReduce, replicas,
                         ceil_div(g.params, shard) * wire_bytes, {first});
    }
  }
  // Not overlapped: reduced once the whole backward is done, so the collective also waits for
  // the rank's last backward op, known only at the end (patched in optimizer()).
  if (!s_.parallelism.overlap_grad_reduce) deferred_reduce_.push_back(first);
  return after;
}

// After a group's gradients of micro-batch `mb` are computed: data-parallel reduction
// (bucketed per layer, overlapped on the comm lane) and, for host-resident gradients, D2H.
// key: layer, -1 embedding, -2 head.
void StepBuilder::grads_done(Rank& r, int key, int mb, OpId last) {
  ParamGroup* gp = nullptr;
  for (ParamGroup& g : r.groups) {
    if (g.expert) continue;
    if (g.reduce_key() == key) gp = &g;
  }
  if (key >= 0 && r.expert_group_of_layer.count(key) != 0) expert_grads_done(r, key, mb, last);
  if (gp == nullptr) return;
  const bool last_mb = mb == micro_batches_ - 1;
  // The layer's gradient as accumulated.
  const std::int64_t full = gp->params * sim::dtype_bytes(dt_.grads);
  OpId after = last;
  if (dp() > 1 && (shard_grads() || last_mb)) {
    std::optional<TensorId> buf;
    if (shard_grads()) {
      // The layer's full gradient exists until its reduce-scatter is done.
      buf = tensor(r.hbm, fmt::format("mb{}.{}.grad_bucket", lbl(mb), gp->name), full,
                   TensorCategory::kBuffers);
      b_.op_at(r.layer_first_bwd.count({mb, gp->layer}) ? r.layer_first_bwd.at({mb, gp->layer})
                                                        : last)
          .allocs.push_back(*buf);
    }
    after = reduce_grads(r, *gp, mb, last);
    if (buf) b_.op_at(after).frees.push_back(*buf);
  }
  if (gp->grads_on_host && last_mb && zenflow_grads_h2d_bytes(*gp) > 0) {
    after = copy(r, sim::CopyDirection::kH2D, fmt::format("{}.zenflow.grad_accum_h2d", gp->name),
                 OpCategory::kOffload, gp->layer, zenflow_grads_h2d_bytes(*gp), {after});
  }
  if (gp->grads_on_host && (shard_grads() || last_mb)) {
    const OpId reduced = after;
    after = copy(r, sim::CopyDirection::kD2H, fmt::format("mb{}.{}.grads_d2h", lbl(mb), gp->name),
                 OpCategory::kOffload, gp->layer,
                 last_mb ? grads_d2h_bytes(*gp) : gp->mem.grads_bytes, {after});
    if (last_mb) deepspeed_grad_path(r, *gp, reduced, after);
  }
  if (last_mb && superoffload_on_gpu(*gp)) after = superoffload_gpu_grad_path(r, *gp, after);
  if (last_mb) r.reduce_op[key] = after;
}

// Megatron-Core's finalize_model_grads (_allreduce_word_embedding_grads): with pp > 1 the word
// embedding's gradient is all-reduced between the first stage and the last, which holds a copy
// of the embedding for tied embeddings (the output layer) or multi-token prediction (the MTP
// modules' input), once the stage's data-parallel gradient sync is done (finish_grad_sync comes
// first) and before the optimizer step: the embedding's rows on this rank (vocabulary / tp) in
// the gradient's dtype. A collective: each side also waits for the other's sync. `ready`: the
// stage's gradient reductions. Returns the all-reduce, or nothing on a stage without it.
std::optional<OpId> StepBuilder::embedding_grad_sync(Rank& r, const std::vector<OpId>& ready) {
  const ParallelConfig& p = s_.parallelism;
  const int last_stage = p.pp - 1;
  const bool copy = s_.model.tied_embeddings || s_.model.mtp_layers > 0;
  if (p.pp <= 1 || !copy || (r.stage != 0 && r.stage != last_stage)) return std::nullopt;
  const std::vector<int> group = {0, last_stage * stage_ranks(p)};
  const std::int64_t bytes = d_.v * s_.model.hidden * sim::dtype_bytes(dt_.grads);
  const OpId op = collective(r, r.comm, "embedding.grad_allreduce", OpCategory::kComm, -1,
                             sim::CollectiveKind::kAllReduce, group, bytes, ready);
  const int side = r.stage == 0 ? 0 : 1;
  embedding_sync_[side] = {ready, op};
  if (const auto& other = embedding_sync_[1 - side]) {
    for (const OpId d : other->first) b_.op_at(op).deps.push_back(d);
    for (const OpId d : ready) b_.op_at(other->second).deps.push_back(d);
  }
  return op;
}

std::int64_t StepBuilder::optimizer_shard(const ParamGroup& g) const {
  const int gdp = g.expert ? expert_shard_dp(s_.parallelism) : shard_dp(s_.parallelism);
  return dp_sharding(s_.parallelism).optimizer ? ceil_div(g.params, gdp) : g.params;
}

// DeepSpeed's ZeRO stage 2 step on the GPU (stage_1_and_2.py step() without cpu_offload), per
// parameter of the rank's partition, beyond the generic gradient norm (grad_passes, read g) and
// AdamW (adam_bytes_per_param): the global norm in fp64 per tensor (get_grad_norm_direct:
// vector_norm(grad.double()): read g, write 8, read 8, in place of the generic read), the flat
// partition (flatten of averaged_gradients: read g, write g), its widening to fp32 (read g,
// write 4), unscale and clip (mul_: read 4, write 4), the optimizer reading the fp32 gradient
// (4 instead of g) and the narrowing copy into the 16-bit partition reading the fp32 master
// (4; its write is counted). bf16: 40 bytes. Stage 2 is DeepSpeed's alone here (Megatron's
// distributed optimizer is stage 1, which keeps its fp32 main gradients and norms them in fp32);
// with fp32 weights and no separate master, nothing is added.
std::int64_t StepBuilder::zero2_step_extra_bytes() const {
  if (s_.parallelism.zero_stage != 2 || !dt_.master) return 0;
  const std::int64_t g = sim::dtype_bytes(dt_.grads);
  const std::int64_t master = sim::dtype_bytes(*dt_.master);
  return 16 + 2 * g + (g + master) + 2 * master + (master - g) + master;
}

// The update of one group on the GPU, with its states streamed in and out when they live on
// the host.
OpId StepBuilder::gpu_group_step(Rank& r, ParamGroup& g, std::vector<OpId> deps) {
  const std::int64_t shard = optimizer_shard(g);
  std::optional<TensorId> stage_buf;
  if (g.opt_on_host) {
    // States streamed in, updated on the GPU, streamed out.
    const std::int64_t states = g.mem.optimizer_bytes;
    stage_buf = tensor(r.hbm, g.name + ".optimizer_in", states, TensorCategory::kOptimizer);
    const OpId in = copy(r, sim::CopyDirection::kH2D, g.name + ".optimizer_h2d",
                         OpCategory::kOffload, g.layer, states, deps);
    b_.op_at(in).allocs.push_back(*stage_buf);
    deps = {in};
  }
  sim::OpSizes sz;
  sz.bytes = (adam_bytes_per_param(dt_) + (g.opt_on_host ? 0 : zero2_step_extra_bytes())) * shard;
  sz.flops = kAdamFlopsPerParam * static_cast<double>(shard);
  OpId done = add(r, r.compute, g.name + ".adam", OpKind::kElementwise, OpCategory::kOptimizer,
                  g.layer, cm_.memory_bound(r.rank, sz.bytes, sz.flops), sz, deps);
  if (stage_buf) {
    done = copy(r, sim::CopyDirection::kD2H, g.name + ".optimizer_d2h", OpCategory::kOffload,
                g.layer, g.mem.optimizer_bytes, {done});
    b_.op_at(done).frees.push_back(*stage_buf);
  }
  return done;
}

void StepBuilder::optimizer(Rank& r) {
  for (OpId reduce : deferred_reduce_) b_.op_at(reduce).deps.push_back(last_compute_);
  deferred_reduce_.clear();
  deferred_grad_checks(r);
  OpId clipped{};
  {
    // The global gradient norm covers every gradient, the experts' too (Megatron's chained
    // optimizer takes one norm over its dense and expert optimizers).
    std::vector<OpId> reduces;
    for (const auto& [key, op] : r.reduce_op) reduces.push_back(op);
    for (const auto& [key, op] : r.expert_reduce_op) reduces.push_back(op);
    if (const auto sync = embedding_grad_sync(r, reduces)) reduces.push_back(*sync);
    clipped = grad_passes(r, reduces);
  }
  const std::optional<OpId> flat = deepspeed_flat_step(r);
  if (s_.offload.superoffload.enabled) superoffload_step(r);
  // Megatron's HybridDeviceOptimizer copies its gradients down in step(), after the clipping.
  // Without overlap_cpu_optimizer_d2h_h2d every copy comes first, then every CPU update, and
  // the copies back wait for the GPU optimizer (StepBuilder::hybrid_device_cpu_group).
  const bool serial = !s_.offload.cpu_overlap_d2h_h2d;
  std::optional<OpId> all_down;
  std::optional<OpId> all_updated;
  if (serial) hybrid_device_down_and_update(r, clipped, all_down, all_updated);
  std::optional<OpId> last_gpu_update;
  std::vector<std::size_t> copied_back_later;
  bool cpu_step_started = false;
  for (std::size_t i = 0; i < r.groups.size(); ++i) {
    ParamGroup& g = r.groups[i];
    const int key = g.reduce_key();
    const std::map<int, OpId>& reduced = g.expert ? r.expert_reduce_op : r.reduce_op;
    auto it = reduced.find(key);
    std::vector<OpId> deps;
    if (it != reduced.end()) deps.push_back(it->second);
    OpId done{};
    if (flat && deepspeed_cpu_step(g)) {
      done = *flat;
    } else if (s_.offload.superoffload.enabled) {
      done = superoffload_done(r, g, std::move(deps));
    } else if (serial && hybrid_device_cpu_group(g)) {
      copied_back_later.push_back(i);
      continue;
    } else if (g.opt_on_host && s_.offload.optimizer_on_cpu) {
      if (hybrid_device_cpu_group(g)) deps = {clipped};
      done = cpu_group_step(r, g, std::move(deps), cpu_step_started);
    } else {
      if (serial && all_down) deps.push_back(*all_down);
      done = gpu_group_step(r, g, std::move(deps));
      last_gpu_update = done;
    }
    group_updated(r, g, done);
  }
  for (std::size_t i : copied_back_later) {
    ParamGroup& g = r.groups[i];
    std::vector<OpId> deps = {*all_updated};
    if (last_gpu_update) deps.push_back(*last_gpu_update);
    group_updated(r, g, cpu_params_up(r, g, std::move(deps)).value_or(*all_updated));
  }
}

// HybridDeviceOptimizer.step() without overlap_cpu_optimizer_d2h_h2d (hybrid_optimizer.py): one
// CPU optimizer over every offloaded parameter, and the current stream for the copies. After the
// clipping every gradient is queued down, the host waits for them (the D2H event's synchronize)
// and torch AdamW updates them all; `down` and `updated` receive the last copy and update.
void StepBuilder::hybrid_device_down_and_update(Rank& r, OpId clipped, std::optional<OpId>& down,
                                                std::optional<OpId>& updated) {
  for (const ParamGroup& g : r.groups) {
    if (!hybrid_device_cpu_group(g)) continue;
    if (auto d = cpu_grads_down(r, g, {down.value_or(clipped)})) down = d;
  }
  for (const ParamGroup& g : r.groups) {
    if (!hybrid_device_cpu_group(g)) continue;
    updated = cpu_update(r, g, {updated.value_or(down.value_or(clipped))});
  }
}

// After group g's update (`done`): its FP8 weight cast, and with ZeRO-1/2 the all-gather of the
// updated parameter shards for the next step.
void StepBuilder::group_updated(Rank& r, const ParamGroup& g, OpId done) {
  const int gdp = g.expert ? edp() : dp();
  if (gdtype_ == sim::DType::kFp8 && g.layer >= 0) done = fp8_weight_cast(r, g, done);
  if (gdp > 1 && !shard_params() && dp_sharding(s_.parallelism).optimizer) {
    collective(r, r.comm, g.name + ".params_allgather", OpCategory::kComm, g.layer,
               sim::CollectiveKind::kAllGather, g.expert ? r.edp_group : r.dp_group,
               g.params * sim::dtype_bytes(dt_.all_gather) / (zenflow(g) ? zenflow_interval() : 1),
               {done});
  }
}

}  // namespace offsim::models::detail
