// StepBuilder: host transfers (offloaded activations' reload, gradients to the host) and the
// optimizer steps that run on the host: DeepSpeed ZeRO-Offload, ZenFlow and SuperOffload,
// Megatron-Core's HybridDeviceOptimizer and FSDP CPU offload.
#include "models/step_builder_impl.h"

#include <algorithm>
#include <cmath>

namespace offsim::models::detail {

namespace {

// The host step of ZeRO-Offload (DeepSpeed stage 1/2 with offload_optimizer: cpu) per parameter
// of the rank's shard, as DeepSpeed's stage_1_and_2.py runs it. During the backward each
// gradient is widened to fp32 on the GPU (async_inplace_copy_grad_to_fp32_buffer_from_gpu:
// src_tensor.to(master dtype) before the copy) and its norm is taken on the GPU
// (set_norm_for_param_grad_in_gpu), so neither pass touches host DRAM. step() then runs, on the
// flat fp32 partition of each parameter group: unscale and clip, a multiply (read 4, write 4);
// DeepSpeedCPUAdam on fp32 gradient, master and moments (read 4, read and write the master and
// both moments); the fp32 partition narrowed into the pinned 16-bit buffer
// (param_buffer_of_bit16_for_cpu_offload_groups: read master, write p). bf16 parameters with
// fp32 master and moments: 8 + 28 + 6 = 42 bytes. Other frameworks' CPU steps (FSDP CPU offload)
// receive the gradient in its compute dtype and widen and norm it on the host: + 6 + 4 bytes.
std::int64_t cpu_step_bytes_per_param(const ResolvedDtypes& d, bool widen_on_host) {
  const std::int64_t master = d.updated_bytes();
  const std::int64_t g = sim::dtype_bytes(d.grads);
  const std::int64_t widen = (!widen_on_host || g == 4) ? 0 : g + 4;
  const std::int64_t norm = widen_on_host ? 4 : 0;
  const std::int64_t adam =
      4 + 2 * master + 2 * sim::dtype_bytes(d.first_moment) + 2 * sim::dtype_bytes(d.second_moment);
  const std::int64_t narrow = d.master ? master + sim::dtype_bytes(d.params) : 0;
  return widen + norm + 8 + adam + narrow;
}
// The host step of Megatron-Core's HybridDeviceOptimizer (megatron/core/optimizer/
// cpu_offloading/hybrid_optimizer.py with the distributed optimizer): the gradient is copied
// into a pinned fp32 host buffer (the dtype conversion happens in the copy), torch.optim.AdamW
// (fused=True, the CPU optimizer Megatron-Core's optimizer/__init__.py builds) reads the fp32
// gradient and reads and writes the fp32 master clone and both moments, and the master itself is
// copied back to the GPU's main parameter (no narrowing on the host). Clipping by the global
// norm runs on the GPU before the step, as MegatronOptimizer.step() does. fp32: 4 + 8 + 16 = 28.
std::int64_t hdo_step_bytes_per_param(const ResolvedDtypes& d) {
  const std::int64_t master = d.updated_bytes();
  return 4 + 2 * master + 2 * sim::dtype_bytes(d.first_moment) +
         2 * sim::dtype_bytes(d.second_moment);
}
// FLOPs per parameter of that step: Adam's 12, the clip multiply 1, the narrowing 1, and on the
// host-widening path the widening 1 and the norm's multiply-add 2.
double cpu_step_flops_per_param(bool widen_on_host) {
  return 12.0 + 1.0 + 1.0 + (widen_on_host ? 3.0 : 0.0);
}

// DeepSpeed's per-tensor gradient checks on the GPU at the gradient-accumulation boundary, on
// the compute stream. ZeRO-Offload (stage_1_and_2.py, copy_grads_in_partition with cpu_offload,
// per parameter tensor of the rank's partition): set_norm_for_param_grad_in_gpu
// (grad.double().norm(2): read g, write 8, read 8 bytes; 2 kernels),
// update_offload_overflow_tracker (_has_inf_or_nan: float() read g write 4, isnan read 4 write
// 1, isinf read 4 write 1, logical_or read 2 write 1, float() read 1 write 4, max read 4; 6
// kernels, then `if tensor:` reads the result on the host, a device-to-host synchronisation),
// async_inplace_copy_grad_to_fp32_buffer_from_gpu (.to(fp32) read g write 4, then the copy_ to
// the pinned buffer; 2 ops). g = 2 (bf16): 52 bytes, 10 eager ops and one synchronisation per
// tensor. SuperOffload (superoffload_stage3.py partition_grads, ZeRO-3's _constant_buffered_norm2):
// grad_buffer.copy_(grad_partition) read g write g, .double().norm(2) ** 2 read g write 8 read
// 8, .to(fp32) read g write 4, then the copy_ (6 ops): 28 bytes, and one stream synchronize per
// completed sub-group. Before partition_grads, ZeRO-3's reduction path (stage3.py, with
// overlap_comm off also on the compute stream) moves each gradient three more times:
// __add_grad_to_ipg_bucket copies it into the contiguous bucket (read g write g, one copy_ per
// tensor), and __avg_scatter_grads' reduce_scatter_coalesced (runtime/comm/
// coalesced_collectives.py) flattens the bucket's tensors with torch.cat (read g write g) and
// pre-divides the flat buffer in place by the world size (div_, read g write g), one op each
// per bucket: 6g bytes more, 40 in all for bf16, and one eager op more per tensor (the
// per-bucket ops' host issue, two per 4e8-element bucket, is not counted). The reduce-scatter
// itself is NCCL's on one rank (no copy charged); a tensor larger than reduce_bucket_size (a large
// embedding or head) skips the bucket copy and the concatenation, which is not distinguished here.
// FLOPs per element: the norm's multiply-add and the two comparisons (or the sum of squares).
constexpr double kGradCheckFlopsPerParam = 4.0;
struct GradChecks {
  std::int64_t bytes_per_param = 0;
  double eager_ops_per_tensor = 0.0;
  double syncs_per_tensor = 0.0;
};
GradChecks zero_offload_grad_checks(std::int64_t g) {
  return {.bytes_per_param = (g + 16) + (g + 4 + 5 + 5 + 3 + 5 + 4) + (g + 4),
          .eager_ops_per_tensor = 10.0,
          .syncs_per_tensor = 1.0};
}
GradChecks superoffload_grad_checks(std::int64_t g) {
  const std::int64_t zero3_reduce_path = 2 * g + 2 * g + 2 * g;  // bucket copy_, cat, div_
  return {.bytes_per_param = zero3_reduce_path + 2 * g + (g + 16) + (g + 4),
          .eager_ops_per_tensor = 7.0,
          .syncs_per_tensor = 0.0};
}

}  // namespace

// The tensors layer l's forward saves (allocated by its first op `first`): those kept on HBM as
// one tensor, the offloaded ones as HBM staging buffers, in chunks of the policy's chunk_bytes.
// Returns the staging buffers.
std::vector<TensorId> StepBuilder::save_activations(Rank& r, int l, const std::string& p,
                                                    OpId first, Rank::Saved& saved) {
  const LayerPolicy& lp = policies_[l];
  std::int64_t hbm_bytes = 0;
  std::int64_t host_bytes = 0;
  for (int a = 0; a < kNumActs; ++a) {
    if (!lp.acts.saved[a]) continue;
    (lp.on_host[a] ? host_bytes : hbm_bytes) += act_bytes(ld(l), static_cast<Act>(a));
  }
  hbm_bytes += lp.acts.latent_bytes;  // MLA latents kept for the up projections' recompute
  if (hbm_bytes > 0) {
    saved.hbm = tensor(r.hbm, p + ".act", hbm_bytes, TensorCategory::kActivations);
    b_.op_at(first).allocs.push_back(saved.hbm);
  }
  std::vector<TensorId> staging;
  if (host_bytes > 0) {
    const std::int64_t chunk = lp.chunk_bytes > 0 ? lp.chunk_bytes : host_bytes;
    for (std::int64_t off = 0; off < host_bytes; off += chunk) {
      const std::int64_t n = std::min(chunk, host_bytes - off);
      saved.chunks.push_back(n);
      const TensorId st = tensor(r.hbm, fmt::format("{}.act_offload{}", p, staging.size()), n,
                                 TensorCategory::kActivations);
      b_.op_at(first).allocs.push_back(st);
      staging.push_back(st);
    }
  }
  return staging;
}

// Eager D2H of the offloaded tensors once the layer's forward (its last op `last`) is done.
void StepBuilder::offload_activations(Rank& r, int l, const std::string& p, OpId last,
                                      const std::vector<TensorId>& staging, Rank::Saved& saved) {
  for (std::size_t c = 0; c < staging.size(); ++c) {
    const TensorId host = tensor(r.host, fmt::format("{}.act_host{}", p, c), saved.chunks[c],
                                 TensorCategory::kActivations);
    const OpId cp = copy(r, sim::CopyDirection::kD2H, fmt::format("{}.act.d2h{}", p, c),
                         OpCategory::kOffload, l, saved.chunks[c], {last});
    b_.op_at(cp).allocs.push_back(host);
    b_.op_at(cp).frees.push_back(staging[c]);
    saved.host.push_back(host);
    saved.d2h.push_back(cp);
  }
}

// Reloads layer l's offloaded activations of micro-batch mb (H2D after their D2H and
// `act_after`); appends the copies to `wait` and returns the reloaded HBM tensors.
std::vector<TensorId> StepBuilder::reload_activations(Rank& r, int mb, int l, const std::string& p,
                                                      std::optional<OpId> act_after,
                                                      std::optional<SendKey> recv,
                                                      std::vector<OpId>& wait) {
  const Rank::Saved& saved = r.saved.at({mb, l});
  std::vector<TensorId> reloaded;
  for (std::size_t c = 0; c < saved.host.size(); ++c) {
    std::vector<OpId> deps = {saved.d2h[c]};
    if (act_after) deps.push_back(*act_after);
    const TensorId back = tensor(r.hbm, fmt::format("{}.act_reload{}", p, c), saved.chunks[c],
                                 TensorCategory::kActivations);
    const OpId cp = copy(r, sim::CopyDirection::kH2D, fmt::format("{}.act.h2d{}", p, c),
                         OpCategory::kOffload, l, saved.chunks[c], deps);
    b_.op_at(cp).allocs.push_back(back);
    b_.op_at(cp).frees.push_back(saved.host[c]);
    if (recv) pending_recv_.push_back({cp, *recv});
    reloaded.push_back(back);
    wait.push_back(cp);
  }
  return reloaded;
}

// Bytes of a host-resident gradient's D2H copy at the last micro-batch. DeepSpeed's
// ZeRO-Offload widens the gradient to the master dtype on the GPU before the copy
// (stage_1_and_2.py, async_inplace_copy_grad_to_fp32_buffer_from_gpu), so fp32 crosses the
// link. (Earlier micro-batches' accumulation copies, async_accumulate_grad_in_cpu_via_gpu, are
// modelled as the gradient in its own dtype.)
std::int64_t StepBuilder::grads_d2h_bytes(const ParamGroup& g) const {
  if (!deepspeed_cpu_step(g) && !superoffload(g)) return g.mem.grads_bytes;
  const std::int64_t widened =
      g.mem.grads_bytes / sim::dtype_bytes(dt_.grads) * dt_.updated_bytes();
  if (!zenflow(g)) return widened;
  // ZenFlow runs DeepSpeed's gradient accumulation over update_interval steps (engine.py sets
  // gradient_accumulation_steps to it): every step copies the gradient to the host in its own
  // dtype (async_accumulate_grad_in_cpu_via_gpu) and the last one also the fp32 widening
  // (async_inplace_copy_grad_to_fp32_buffer_from_gpu): the mean over the interval.
  return g.mem.grads_bytes + widened / zenflow_interval();
}

// ZenFlow's accumulation brings the host's running sum back to the GPU before adding the new
// gradient to it, on every step of the interval but its first: the mean over the interval.
std::int64_t StepBuilder::zenflow_grads_h2d_bytes(const ParamGroup& g) const {
  if (!zenflow(g)) return 0;
  const int n = zenflow_interval();
  return g.mem.grads_bytes * (n - 1) / n;
}

// DeepSpeed ZeRO-Offload (offload.cpu.step flat_partition, set by the zero_offload preset)
// updates on the host, with the fp32 master there.
bool StepBuilder::deepspeed_cpu_step(const ParamGroup& g) const {
  return g.opt_on_host && s_.offload.optimizer_on_cpu && !s_.offload.superoffload.enabled &&
         s_.offload.cpu_step == OffloadPolicy::CpuStep::kFlatPartition &&
         !(g.master_on_hbm && g.mem.master_bytes > 0);
}

CostModel::CpuThreads StepBuilder::cpu_threads() const {
  return {.bind_cores = s_.offload.cpu_bind_cores,
          .threads = s_.offload.cpu_threads,
          .local_ranks = static_cast<int>(std::min<std::int64_t>(
              static_cast<std::int64_t>(stage_ranks(s_.parallelism)) * s_.parallelism.pp,
              cm_.system().gpus_per_node))};
}

// DeepSpeed's step() on the host (stage_1_and_2.py, cpu_offload): it starts once every
// gradient has arrived (the global norm's .item() synchronizes the device) and runs on the
// flat fp32 partition of the optimizer's parameter group, not layer by layer: unscale/clip,
// DeepSpeedCPUAdam and the narrowing copy over the whole partition, then one non-blocking H2D
// of the 16-bit partition, then the all-gather. So no update reaches the GPU before the last
// one is computed. Returns the op after which the groups' all-gathers may start.
std::optional<OpId> StepBuilder::deepspeed_flat_step(Rank& r) {
  std::int64_t shard = 0;
  std::int64_t h2d = 0;
  double partition_tensors = 0.0;
  std::vector<OpId> deps;
  for (const auto& [key, op] : r.reduce_op) deps.push_back(op);
  for (const auto& [key, op] : r.expert_reduce_op) deps.push_back(op);
  const std::int64_t master = dt_.updated_bytes();
  for (const ParamGroup& g : r.groups) {
    if (!deepspeed_cpu_step(g)) continue;
    const std::int64_t n = optimizer_shard(g);
    shard += n;
    partition_tensors += param_tensors(g) * static_cast<double>(n) /
                         static_cast<double>(std::max<std::int64_t>(1, g.params));
    if (!g.params_on_host) h2d += n * sim::dtype_bytes(dt_.params);
    if (!g.grads_on_host) {
      deps.push_back(copy(r, sim::CopyDirection::kD2H, g.name + ".grads_d2h", OpCategory::kOffload,
                          g.layer, n * master, {}));
    }
  }
  if (shard == 0) return std::nullopt;
  if (s_.offload.zenflow.enabled) return zenflow_step(r, shard, h2d, std::move(deps));
  sim::OpSizes sz;
  sz.bytes = cpu_step_bytes_per_param(dt_, false) * shard;
  sz.flops = cpu_step_flops_per_param(false) * static_cast<double>(shard);
  sim::OpCost cost = cm_.host_compute(r.rank, sz.bytes, sz.flops, cpu_threads());
  // Before it, the global norm (complete_grad_norm_calculation_for_cpu_offload) reads each
  // tensor's GPU norm with .item(): one device-to-host round trip per tensor of the partition.
  cost.latency +=
      sim::duration_from_seconds(partition_tensors * sim::to_seconds(cm_.host_sync_latency()));
  OpId done = add(r, r.cpu, "partition.adam.cpu", OpKind::kHostCompute, OpCategory::kCpuOptimizer,
                  -1, std::move(cost), sz, deps);
  if (h2d > 0) {
    done = copy(r, sim::CopyDirection::kH2D, "partition.params_h2d", OpCategory::kOffload, -1, h2d,
                {done});
  }
  return done;
}

// ZenFlow's GPU side, every step (zenflow_stage_1_and_2.py, _process_selected_fp32_groups_grad):
// after the reduction each rank broadcasts the selected top-k columns of its partition's
// gradients, so every rank holds the selected gradients of the whole model (an all-gather of
// topk_ratio of the gradients), and the selective optimizer (ZenFlowSelectiveAdamW) updates
// those columns of its own full parameters on the GPU, with their moments kept on the GPU.
// The column selection itself (per-column norms, torch.topk) runs once per select_interval,
// by default once per epoch, and is not charged. 1-D parameters (norms, biases) are selected
// whole by DeepSpeed; here every group is counted at topk_ratio.
//
// Memory (ZenFlowSelectiveAdamW, deepspeed/ops/adam/zenflow_torch_adam.py, without its
// optimizer offload): the selected columns' exp_avg and exp_avg_sq are zeros_like the selected
// parameter slice, so two parameter-dtype values per selected element stay on the GPU
// (zenflow_selected_moments, a static tensor); each step also holds the selected gradients
// (selected_grad) and a copy of the selected parameters (temp_selected_param) from the
// all-gather until the update ends.
std::optional<OpId> StepBuilder::zenflow_topk_update(Rank& r, std::vector<OpId> deps) {
  const std::int64_t selected = zenflow_selected(r);
  if (selected == 0) return std::nullopt;
  const TensorId buffers =
      tensor(r.hbm, "zenflow.selected_grads_and_params",
             selected * (sim::dtype_bytes(dt_.grads) + sim::dtype_bytes(dt_.params)),
             TensorCategory::kOptimizer);
  std::optional<OpId> gather;
  if (dp() > 1) {
    gather = collective(r, r.compute, "zenflow.selected_grads_allgather", OpCategory::kComm, -1,
                        sim::CollectiveKind::kAllGather, r.dp_group,
                        selected * sim::dtype_bytes(dt_.grads), std::move(deps));
    deps = {*gather};
  }
  sim::OpSizes sz;
  sz.bytes = adam_bytes_per_param(dt_) * selected;
  sz.flops = kAdamFlopsPerParam * static_cast<double>(selected);
  const OpId update =
      add(r, r.compute, "zenflow.topk_adam", OpKind::kElementwise, OpCategory::kOptimizer, -1,
          cm_.memory_bound(r.rank, sz.bytes, sz.flops), sz, std::move(deps));
  b_.op_at(gather.value_or(update)).allocs.push_back(buffers);
  b_.op_at(update).frees.push_back(buffers);
  return update;
}

// The elements ZenFlow updates on the GPU each step: topk_ratio of the rank's parameters in
// groups on the ZenFlow step (0 without ZenFlow).
std::int64_t StepBuilder::zenflow_selected(const Rank& r) const {
  std::int64_t params = 0;
  for (const ParamGroup& g : r.groups) {
    if (zenflow(g)) params += g.params;
  }
  return static_cast<std::int64_t>(
      std::ceil(s_.offload.zenflow.topk_ratio * static_cast<double>(params)));
}

// ZenFlow's host side (ZenFlowZeroOptimizerParallel with overlap_step, ...Sequential without),
// as the mean step of one update interval of n steps. Once per interval: the training process
// waits for the optimizer worker's previous update, copies the updated fp32 partition into the
// GPU's 16-bit partition (copy_ narrows on the host, the 16-bit partition crosses PCIe),
// all-gathers it, unscales and clips the new fp32 gradient (read 4, write 4 bytes) and submits
// it to the worker. The worker process runs DeepSpeed CPU Adam (read the fp32 gradient, read
// and write the fp32 master and both moments: 28 bytes) on its own cores, the
// 1 - pt_reserved_cores_perc of the rank's share, while the GPU runs the next n steps. Each is
// charged 1/n of its bytes per step: the worker's share starts with the step (it overlaps the
// forward and backward), and the clip waits for it on the host lane, as the training process
// waits for the worker. So the mean step is the boundary work / n plus the longer of the GPU's
// step and the worker's update / n. Without overlap_step the whole 42-byte step runs in the
// training process on every core of the rank's share, after the gradients, 1/n per step.
std::optional<OpId> StepBuilder::zenflow_step(Rank& r, std::int64_t shard, std::int64_t h2d,
                                              std::vector<OpId> deps) {
  const OffloadPolicy::ZenFlow& zf = s_.offload.zenflow;
  const std::int64_t n = zenflow_interval();
  if (const std::optional<OpId> topk = zenflow_topk_update(r, deps)) deps.push_back(*topk);
  CostModel::CpuThreads main = cpu_threads();
  OpId done{};
  if (zf.overlap_step) {
    // ZenFlow binds both processes itself (zenflow_utils.py, _compute_zf_pt_affinity: when the
    // launcher did not bind, each rank takes its own range of physical cores, then splits it),
    // and sets OMP_NUM_THREADS to each side's cores, with or without --bind_cores_to_rank.
    main.bind_cores = true;
    main.threads = 0;
    CostModel::CpuThreads worker = main;
    worker.core_fraction = 1.0 - zf.reserved_cores;
    main.core_fraction = zf.reserved_cores;
    sim::OpSizes w;
    w.bytes = 28 * shard / n;
    w.flops = kAdamFlopsPerParam * static_cast<double>(shard) / static_cast<double>(n);
    add(r, r.cpu, "partition.zenflow_adam.worker", OpKind::kHostCompute, OpCategory::kCpuOptimizer,
        -1, cm_.host_compute(r.rank, w.bytes, w.flops, worker), w, {});
    const std::int64_t master = dt_.updated_bytes();
    sim::OpSizes m;
    m.bytes = (2 * master + master + sim::dtype_bytes(dt_.params)) * shard / n;
    m.flops = 2.0 * static_cast<double>(shard) / static_cast<double>(n);
    done = add(r, r.cpu, "partition.zenflow_clip_narrow.cpu", OpKind::kHostCompute,
               OpCategory::kCpuOptimizer, -1, cm_.host_compute(r.rank, m.bytes, m.flops, main), m,
               std::move(deps));
  } else {
    sim::OpSizes sz;
    sz.bytes = cpu_step_bytes_per_param(dt_, false) * shard / n;
    sz.flops =
        cpu_step_flops_per_param(false) * static_cast<double>(shard) / static_cast<double>(n);
    done =
        add(r, r.cpu, "partition.zenflow_adam.cpu", OpKind::kHostCompute, OpCategory::kCpuOptimizer,
            -1, cm_.host_compute(r.rank, sz.bytes, sz.flops, main), sz, std::move(deps));
  }
  if (h2d > 0) {
    done = copy(r, sim::CopyDirection::kH2D, "partition.zenflow.params_h2d", OpCategory::kOffload,
                -1, h2d / n, {done});
  }
  return done;
}

// The CPU update of one group (Megatron's HybridDeviceOptimizer, FSDP CPU offload), layer by
// layer, and its copy back to the GPU: its gradient's copy down, the update, the copy up, each
// after the one before (HybridDeviceOptimizer with overlap_cpu_optimizer_d2h_h2d, FSDP).
OpId StepBuilder::cpu_group_step(Rank& r, ParamGroup& g, std::vector<OpId> deps, bool& started) {
  // The host step clips by the global gradient norm, so no group updates before every
  // gradient has arrived. The CPU lane runs its ops in order: the first update waiting for
  // them all is enough.
  if (!started) {
    const std::vector<OpId> own = deps;
    for (const auto& [other, op] : r.reduce_op) {
      if (own.empty() || !(op == own.front())) deps.push_back(op);
    }
    started = true;
  }
  if (const std::optional<OpId> down = cpu_grads_down(r, g, deps)) deps = {*down};
  const OpId done = cpu_update(r, g, std::move(deps));
  return cpu_params_up(r, g, {done}).value_or(done);
}

// The gradient's copy into the host buffer the CPU update reads; none when the gradient already
// lives on the host.
std::optional<OpId> StepBuilder::cpu_grads_down(Rank& r, const ParamGroup& g,
                                                std::vector<OpId> deps) {
  if (g.grads_on_host) return std::nullopt;
  return copy(r, sim::CopyDirection::kD2H, g.name + ".grads_d2h", OpCategory::kOffload, g.layer,
              optimizer_shard(g) * sim::dtype_bytes(dt_.grads), std::move(deps));
}

// The update of one group on the CPU lane.
OpId StepBuilder::cpu_update(Rank& r, const ParamGroup& g, std::vector<OpId> deps) {
  const std::int64_t shard = optimizer_shard(g);
  // Megatron's HybridDeviceOptimizer keeps the fp32 master on the GPU and updates a pinned
  // host clone of it (see hdo_step_bytes_per_param); FSDP's master lives on the host.
  const bool hdo = hybrid_device_step(g);
  sim::OpSizes sz;
  sz.bytes = (hdo ? hdo_step_bytes_per_param(dt_) : cpu_step_bytes_per_param(dt_, true)) * shard;
  sz.flops =
      (hdo ? kAdamFlopsPerParam : cpu_step_flops_per_param(true)) * static_cast<double>(shard);
  CostModel::CpuThreads threads = cpu_threads();
  threads.time_factor = CostModel::cpu_adam_time_factor(s_.offload.cpu_adam);
  return add(r, r.cpu, g.name + ".adam.cpu", OpKind::kHostCompute, OpCategory::kCpuOptimizer,
             g.layer, cm_.host_compute(r.rank, sz.bytes, sz.flops, threads), sz, std::move(deps));
}

// The updated group's copy back to the GPU; none when its parameters live on the host.
std::optional<OpId> StepBuilder::cpu_params_up(Rank& r, const ParamGroup& g,
                                               std::vector<OpId> deps) {
  if (g.params_on_host) return std::nullopt;
  // HybridDeviceOptimizer copies the updated fp32 master back into the GPU's main parameter
  // (the distributed optimizer then casts it to the model parameter on the GPU, a pass of a
  // few milliseconds not modelled); the others copy the narrowed one.
  const bool hdo = hybrid_device_step(g);
  const std::int64_t bytes =
      optimizer_shard(g) * (hdo ? dt_.updated_bytes() : sim::dtype_bytes(dt_.params));
  return copy(r, sim::CopyDirection::kH2D, g.name + (hdo ? ".master_h2d" : ".params_h2d"),
              OpCategory::kOffload, g.layer, bytes, std::move(deps));
}

// Whether group g updates on the CPU in Megatron-Core's HybridDeviceOptimizer: a per-group host
// step whose fp32 master stays on the GPU.
bool StepBuilder::hybrid_device_cpu_group(const ParamGroup& g) const {
  return g.opt_on_host && s_.offload.optimizer_on_cpu && !s_.offload.superoffload.enabled &&
         s_.offload.cpu_step == OffloadPolicy::CpuStep::kPerGroup && hybrid_device_step(g);
}

bool StepBuilder::hybrid_device_step(const ParamGroup& g) const {
  return g.master_on_hbm && g.mem.master_bytes > 0;
}

// SuperOffload's sub-groups (superoffload_stage3.py, _create_fp16_sub_groups, and ZeRO-3's
// _create_fp32_partitions): the rank's partition is cut, in parameter order, into sub-groups
// that close once they reach sub_group_size elements, and sub-group i stays on the GPU when
// i < int((1 - ratio) · N). Here a parameter group stays on the GPU when its first element
// falls within those first sub-groups: its fp32 master, moments and gradients are allocated
// on the HBM and it updates with the GPU optimizer. These are the groups the backward reaches
// last, so the CPU has no update left to start once the backward ends (the "tail buckets" n').
void StepBuilder::superoffload_placement(Rank& r) {
  const OffloadPolicy::SuperOffload& so = s_.offload.superoffload;
  if (!so.enabled || !s_.offload.optimizer_on_cpu) return;
  std::int64_t partition = 0;
  for (const ParamGroup& g : r.groups) {
    if (g.opt_on_host) partition += optimizer_shard(g);
  }
  const std::int64_t sub_groups = std::max<std::int64_t>(1, ceil_div(partition, so.sub_group_size));
  const auto on_gpu = static_cast<std::int64_t>((1.0 - so.ratio) * static_cast<double>(sub_groups));
  const std::int64_t gpu_elements = on_gpu * so.sub_group_size;
  std::int64_t before = 0;
  for (ParamGroup& g : r.groups) {
    if (!g.opt_on_host) continue;
    if (before < gpu_elements) {
      g.opt_on_host = false;
      g.grads_on_host = false;
      g.master_on_host = false;
      g.master_on_hbm = false;
    }
    before += optimizer_shard(g);
  }
}

// SuperOffload's host side (superoffload_stage3.py partition_grads and step(),
// superoffload_utils.py), in the order the backward completes the sub-groups: once a group's
// gradient is reduced, its fp32 gradient (cast on the GPU, grads_d2h_bytes) is on the host and
// the worker process runs DeepSpeed CPU Adam on it (copy into its pinned gradient buffer, read
// 4 write 4; Adam on fp32 gradient, master and moments, 28 bytes) on cpuadam_cores_perc of the
// rank's cores. It does not wait for the global gradient norm: the update is speculative and
// rolled back only when clipping or an overflow strikes, which a steady step does not
// (gradient_clipping is unset in DeepSpeed's SuperOffload examples). step() then waits for
// every pending update and, per host sub-group, copies the fp32 partition into the GPU's
// 16-bit partition: a blocking copy_, so PyTorch narrows on the host (read 4, write 2) and the
// 16-bit partition crosses the link, one group after the other. The narrowing runs on the
// training process's OpenMP threads, which keep the launcher's cores: SuperOffload restricts
// the process with psutil's cpu_affinity, i.e. sched_setaffinity of its main thread only, after
// the thread pool exists, and the worker is idle by then. Ops are recorded per group in
// superoffload_done_.
void StepBuilder::superoffload_step(Rank& r) {
  superoffload_done_.clear();
  superoffload_waited_.reset();
  CostModel::CpuThreads worker = cpu_threads();
  worker.core_fraction = s_.offload.superoffload.cpuadam_cores_perc;
  const CostModel::CpuThreads main = cpu_threads();
  const std::int64_t master = dt_.updated_bytes();
  std::optional<OpId> last_update;
  for (std::size_t i = r.groups.size(); i-- > 0;) {
    const ParamGroup& g = r.groups[i];
    if (!superoffload(g)) continue;
    const std::map<int, OpId>& reduced = g.expert ? r.expert_reduce_op : r.reduce_op;
    std::vector<OpId> deps;
    if (auto it = reduced.find(g.reduce_key()); it != reduced.end()) deps.push_back(it->second);
    const std::int64_t shard = optimizer_shard(g);
    if (!g.grads_on_host) {
      deps = {copy(r, sim::CopyDirection::kD2H, g.name + ".grads_d2h", OpCategory::kOffload,
                   g.layer, shard * master, std::move(deps))};
    }
    sim::OpSizes sz;
    sz.bytes = (2 * master + hdo_step_bytes_per_param(dt_)) * shard;
    sz.flops = kAdamFlopsPerParam * static_cast<double>(shard);
    last_update = add(r, r.cpu, g.name + ".superoffload_adam.worker", OpKind::kHostCompute,
                      OpCategory::kCpuOptimizer, g.layer,
                      cm_.host_compute(r.rank, sz.bytes, sz.flops, worker), sz, std::move(deps));
  }
  if (!last_update) return;
  OpId prev = *last_update;
  for (const ParamGroup& g : r.groups) {
    if (!superoffload(g)) continue;
    const std::int64_t shard = optimizer_shard(g);
    sim::OpSizes sz;
    sz.bytes = (master + sim::dtype_bytes(dt_.params)) * shard;
    sz.flops = static_cast<double>(shard);
    const OpId narrow = add(r, r.cpu, g.name + ".superoffload_narrow.cpu", OpKind::kHostCompute,
                            OpCategory::kCpuOptimizer, g.layer,
                            cm_.host_compute(r.rank, sz.bytes, sz.flops, main), sz, {prev});
    prev = copy(r, sim::CopyDirection::kH2D, g.name + ".params_h2d", OpCategory::kOffload, g.layer,
                shard * sim::dtype_bytes(dt_.params), {narrow});
    superoffload_done_[g.name] = prev;
  }
  superoffload_waited_ = *last_update;
}

// The op after which a group's updated parameters are on the GPU under SuperOffload: its
// narrowing copy for a host group; the GPU optimizer, once step() has waited for the
// worker's updates, for a group kept on the GPU.
OpId StepBuilder::superoffload_done(Rank& r, ParamGroup& g, std::vector<OpId> deps) {
  if (auto it = superoffload_done_.find(g.name); it != superoffload_done_.end()) {
    return it->second;
  }
  if (superoffload_waited_) deps.push_back(*superoffload_waited_);
  return gpu_group_step(r, g, std::move(deps));
}

// Parameter tensors of a group (the unit of DeepSpeed's per-parameter hooks): per transformer
// layer the four attention projections, two (GELU) or three (SwiGLU) MLP matrices and two norms
// (a LayerNorm has a bias too), with linear_bias a bias per linear layer, and an MoE layer's
// router; its routed experts, two or three matrices per local expert; the embedding (and the
// learned position table); the head (unless tied) and the final norm. MLA's extra projections
// are not counted.
double StepBuilder::param_tensors(const ParamGroup& g) const {
  const ModelArch& m = s_.model;
  const double mlp = m.activation == ModelArch::Activation::kSwiGlu ? 3.0 : 2.0;
  const double norm = m.norm == ModelArch::Norm::kLayerNorm ? 2.0 : 1.0;
  if (g.role == ParamGroup::Role::kEmbed) return m.max_positions > 0 ? 2.0 : 1.0;
  if (g.role == ParamGroup::Role::kHead) return norm + (m.tied_embeddings ? 0.0 : 1.0);
  if (g.expert) {
    const std::int64_t ep = std::max(1, s_.parallelism.ep);
    return mlp * static_cast<double>(std::max<std::int64_t>(1, m.moe.experts / ep));
  }
  const bool moe = ld(g.layer).moe;
  double n = 4.0 + 2.0 * norm + (moe ? 1.0 + mlp * static_cast<double>(m.moe.shared_experts) : mlp);
  if (m.linear_bias) n += 4.0 + mlp;
  return n;
}

// Whether DeepSpeed runs its per-tensor gradient checks on the group's gradients (ZeRO-Offload's
// flat step of stages 1 and 2, ZenFlow's included, and SuperOffload's host groups). ZeRO-3's own
// offload path (stage3.py) accumulates its overflow flag on the GPU without a synchronisation
// and is not charged here.
bool StepBuilder::deepspeed_grad_checks(const ParamGroup& g) const {
  return (deepspeed_cpu_step(g) && s_.parallelism.zero_stage <= 2) || superoffload(g);
}

// The GPU checks of one group's gradients before their D2H copy (see zero_offload_grad_checks):
// memory-bound kernels on the compute stream, and the GPU idles while the host issues each
// tensor's ops after a synchronisation: per tensor the eager ops' host time (9.02 us each) and
// the round trip of its synchronisation (26.11 us), the figures of CostModel::host_issue_s and
// host_sync_latency. Without overlap_comm DeepSpeed runs the gradient's reduction, these checks
// and the copy on the compute stream.
OpId StepBuilder::deepspeed_grad_check_op(Rank& r, const ParamGroup& g, std::vector<OpId> deps) {
  const std::int64_t gb = sim::dtype_bytes(dt_.grads);
  const bool zero3_path = superoffload(g) || superoffload_on_gpu(g);
  const GradChecks c = zero3_path ? superoffload_grad_checks(gb) : zero_offload_grad_checks(gb);
  const std::int64_t shard = optimizer_shard(g);
  double tensors = param_tensors(g) * static_cast<double>(shard) /
                   static_cast<double>(std::max<std::int64_t>(1, g.params));
  double syncs = c.syncs_per_tensor * tensors;
  if (zero3_path) {
    syncs = static_cast<double>(shard) /
            static_cast<double>(std::max<std::int64_t>(1, s_.offload.superoffload.sub_group_size));
  }
  // ZenFlow accumulates over update_interval steps and runs the checks at the boundary only
  // (copy_grads_in_partition is stage_1_and_2.py's): a 1/update_interval share per mean step.
  const std::int64_t n = zenflow(g) ? zenflow_interval() : 1;
  tensors /= static_cast<double>(n);
  syncs /= static_cast<double>(n);
  const OpId id = elementwise(r, g.name + ".grad_checks", OpCategory::kOptimizer, g.layer,
                              c.bytes_per_param * shard / n,
                              kGradCheckFlopsPerParam * static_cast<double>(shard / n));
  sim::OpCost& cost = b_.op_at(id).cost;
  cost.latency +=
      sim::duration_from_seconds(tensors * cm_.host_issue_s({.eager = c.eager_ops_per_tensor}) +
                                 syncs * sim::to_seconds(cm_.host_sync_latency()));
  auto& d = b_.op_at(id).deps;
  d.insert(d.end(), deps.begin(), deps.end());
  return id;
}

// After a group's last gradient reduction (`reduced`) and its D2H copy were emitted: the
// checks run before the copy (on the compute lane also with overlap_comm, where DeepSpeed runs
// them on its reduction stream: an approximation), and without overlap_comm the copy is on the
// compute stream (DeepSpeed issues both on the current stream: stage_1_and_2.py reduce_ipg_grads
// with cpu_offload, ZeRO-3's reduce_and_partition_stream = the default stream), so the next
// compute op waits for it. When the reduction itself waits for the whole backward (no overlap), the
// checks are emitted after the backward (deferred_grad_checks).
void StepBuilder::deepspeed_grad_path(Rank& r, const ParamGroup& g, OpId reduced, OpId grads_d2h) {
  if (!deepspeed_grad_checks(g)) return;
  if (dp() > 1 && !s_.parallelism.overlap_grad_reduce) {
    const auto index = static_cast<std::size_t>(&g - r.groups.data());
    pending_grad_checks_.push_back({.group = index, .reduced = reduced, .grads_d2h = grads_d2h});
    return;
  }
  const OpId checks = deepspeed_grad_check_op(r, g, {reduced});
  b_.op_at(grads_d2h).deps.push_back(checks);
  // With overlap_comm (overlap_grad_reduce) the copies run on DeepSpeed's reduction stream
  // instead, beside the backward.
  if (!s_.parallelism.overlap_grad_reduce) next_compute_deps_.push_back(grads_d2h);
}

// SuperOffload's sub-groups kept on the GPU take the same path on the compute stream after their
// reduction (`reduced`): ZeRO-3's reduction path and partition_grads, whose fp32 copy_ stays in
// HBM (superoffload_grad_checks' bytes and ops), and the stream synchronize when a sub-group
// completes. Returns the op the group's GPU step waits for.
OpId StepBuilder::superoffload_gpu_grad_path(Rank& r, const ParamGroup& g, OpId reduced) {
  return deepspeed_grad_check_op(r, g, {reduced});
}

// The deferred checks, once the backward is emitted, one group after the other on the compute
// stream, each after the previous group's copy.
void StepBuilder::deferred_grad_checks(Rank& r) {
  std::optional<OpId> prev;
  for (const PendingGradCheck& p : pending_grad_checks_) {
    std::vector<OpId> deps = {p.reduced};
    if (prev) deps.push_back(*prev);
    const OpId checks = deepspeed_grad_check_op(r, r.groups[p.group], std::move(deps));
    b_.op_at(p.grads_d2h).deps.push_back(checks);
    prev = p.grads_d2h;
  }
  pending_grad_checks_.clear();
}

}  // namespace offsim::models::detail
