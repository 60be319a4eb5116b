// Lowering of a Scenario to the Plan of one training step.
//
// Structure: one representative rank per pipeline stage (multiplicity dp·tp). Each rank runs its
// pipeline schedule (1F1B or interleaved 1F1B) as a list of forward/backward tasks over
// (micro-batch, model chunk); each task lowers its layers to ops. Pipeline p2p sends are
// recorded and the receiving ops' dependencies patched in once every rank is emitted.
#include "models/step_builder.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "models/cost_model.h"
#include "models/formulas.h"
#include "models/plan_size.h"
#include "sim/platform/host.h"
#include "sim/platform/profile.h"
#include "sim/platform/system.h"

namespace offsim::models {

namespace {

using sim::LaneId;
using sim::OpCategory;
using sim::OpId;
using sim::OpKind;
using sim::PoolId;
using sim::TensorCategory;
using sim::TensorId;
using Mode = RecomputeConfig::Mode;

// AdamW per parameter: read the gradient, read and write the master (or the weights themselves
// when they are their own master) and both moments, and write the weights when they are a
// separate copy. bf16 weights with fp32 master and moments: 2 + 2·4 + 2·4 + 2·4 + 2 = 28 bytes.
std::int64_t adam_bytes_per_param(const ResolvedDtypes& d) {
  const std::int64_t master = sim::dtype_bytes(d.master.value_or(d.params));
  return sim::dtype_bytes(d.grads) + 2 * master + 2 * sim::dtype_bytes(d.first_moment) +
         2 * sim::dtype_bytes(d.second_moment) + (d.master ? sim::dtype_bytes(d.params) : 0);
}
constexpr double kAdamFlopsPerParam = 12.0;

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
  const std::int64_t master = sim::dtype_bytes(d.master.value_or(d.params));
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
  const std::int64_t master = sim::dtype_bytes(d.master.value_or(d.params));
  return 4 + 2 * master + 2 * sim::dtype_bytes(d.first_moment) +
         2 * sim::dtype_bytes(d.second_moment);
}
// FLOPs per parameter of that step: Adam's 12, the clip multiply 1, the narrowing 1, and on the
// host-widening path the widening 1 and the norm's multiply-add 2.
double cpu_step_flops_per_param(bool widen_on_host) {
  return 12.0 + 1.0 + 1.0 + (widen_on_host ? 3.0 : 0.0);
}

struct Task {
  bool forward = true;
  int mb = 0;
  int chunk = 0;
};

// Megatron-LM's schedules (megatron/core/pipeline_parallel/schedules.py).
std::vector<Task> pipeline_schedule(int stage, int pp, int v, int m, bool interleaved) {
  std::vector<Task> tasks;
  if (!interleaved || v == 1) {
    const int warmup = std::min(pp - stage - 1, m);
    int f = 0;
    int b = 0;
    for (; f < warmup; ++f) tasks.push_back({true, f, 0});
    while (f < m) {
      tasks.push_back({true, f++, 0});
      tasks.push_back({false, b++, 0});
    }
    while (b < m) tasks.push_back({false, b++, 0});
    return tasks;
  }
  const int total = m * v;
  int warmup = (m == pp) ? total : std::min((pp - stage - 1) * 2 + (v - 1) * pp, total);
  const auto fwd_task = [&](int k) {
    const int group = pp * v;
    return Task{true, (k / group) * pp + k % pp, (k % group) / pp};
  };
  const auto bwd_task = [&](int k) {
    const int group = pp * v;
    return Task{false, (k / group) * pp + k % pp, v - 1 - (k % group) / pp};
  };
  const int remaining = total - warmup;
  for (int k = 0; k < warmup; ++k) tasks.push_back(fwd_task(k));
  for (int i = 0; i < remaining; ++i) {
    tasks.push_back(fwd_task(warmup + i));
    tasks.push_back(bwd_task(i));
  }
  for (int i = remaining; i < total; ++i) tasks.push_back(bwd_task(i));
  return tasks;
}

// How many layers' offloaded activations may still be on their way to the host while a layer's
// forward starts (see forward_task).
constexpr std::size_t kOffloadWindowLayers = 2;

// Where a piece of parameters lives and how its optimizer runs.
struct ParamGroup {
  enum class Role { kLayer, kEmbed, kHead };
  std::string name;  // "l3", "embed", "head", for display
  Role role = Role::kLayer;
  int layer = -1;           // transformer layer or -1
  std::int64_t params = 0;  // on this rank (tensor-sharded, before ZeRO)
  StaticMemory mem;
  bool params_on_host = false;
  bool grads_on_host = false;
  bool opt_on_host = false;
  bool master_on_host = false;
  bool master_on_hbm = false;  // kept on HBM by a rule while the moments are on the host
  // The routed experts of an MoE layer: sharded and reduced over the expert data-parallel group
  // (tp · dp / (ep · etp) ranks) instead of the data-parallel one.
  bool expert = false;
  TensorId params_t, grads_t, opt_t, master_t;
  // The key of its gradient reduction (grads_done): the layer, -1 embedding, -2 head.
  int reduce_key() const { return role == Role::kEmbed ? -1 : role == Role::kHead ? -2 : layer; }
};

using SendKey = std::tuple<bool, int, int, int>;  // forward?, mb, destination stage, dest chunk

class StepBuilder {
 public:
  StepBuilder(const Scenario& s, const CostModel& cm, sim::PlanBuilder& b, BuiltStep& out,
              const BuildOptions& options)
      : s_(s), cm_(cm), b_(b), out_(out), d_(layer_dims(s)) {
    const ParallelConfig& p = s.parallelism;
    layers_per_chunk_ = static_cast<int>(s.model.layers / (p.pp * p.virtual_stages));
    micro_batches_ = options.micro_batches > 0 ? options.micro_batches
                                               : static_cast<int>(grad_accum_steps(s.training, p));
    last_label_ =
        options.last_micro_batch_label >= 0 ? options.last_micro_batch_label : micro_batches_ - 1;
    static_only_ = options.static_only;
    gdtype_ = s.training.compute_dtype;
    adtype_ = gdtype_ == sim::DType::kFp8 ? sim::DType::kBf16 : gdtype_;
    fp8_blackwell_ = fp8_blackwell(cm.system().gpu);
    fp8_recipe_ = s.training.fp8_recipe.value_or(default_fp8_recipe(cm.system().gpu));
    dt_ = resolve_dtypes(s.training);
    for (int l = 0; l < s.model.layers; ++l) {
      ldims_.push_back(layer_dims(s.model, s.training, p, l));
      policies_.push_back(layer_policy(l));
    }
    xfetch_ = expert_fetch_counts(s);
  }

  sim::Status build() {
    const ParallelConfig& p = s_.parallelism;
    for (int stage = 0; stage < p.pp; ++stage) {
      OFFSIM_RETURN_IF_ERROR(build_rank(stage));
    }
    // Every send gets its receive on the peer, in send order: one receive lane per (receiver,
    // sender) pair, so a receive never waits behind another sender's and the lane adds no delay
    // (sends to one peer leave one lane in order). Appended after every other op and lane.
    std::map<OpId, OpId> recv_of_send;
    std::vector<OpId> sends;
    for (const auto& [key, send] : sends_) sends.push_back(send);
    std::sort(sends.begin(), sends.end());
    // Each receive is a one-op task of its own, numbered as the task of its send.
    const std::size_t stage_tasks = out_.pipeline_tasks.size();
    for (const OpId send : sends) {
      recv_of_send[send] = receive(send);
      const auto task = std::upper_bound(
          out_.pipeline_tasks.begin(),
          out_.pipeline_tasks.begin() + static_cast<std::ptrdiff_t>(stage_tasks), send.index(),
          [](std::size_t op, const PipelineTask& x) { return op < x.op_begin; });
      if (task == out_.pipeline_tasks.begin()) continue;
      PipelineTask rt = *std::prev(task);
      rt.receive = true;
      rt.op_begin = recv_of_send[send].index();
      rt.op_end = rt.op_begin + 1;
      rt.tensor_begin = rt.tensor_end = b_.peek().tensors.size();
      out_.pipeline_tasks.push_back(rt);
    }
    for (const auto& [op, key] : pending_recv_) {
      auto it = sends_.find(key);
      if (it == sends_.end()) {
        return sim::fail(sim::ErrorCode::kInternal, "pipeline: no send for a receive (mb {})",
                         std::get<1>(key));
      }
      b_.op_at(op).deps.push_back(recv_of_send.at(it->second));
    }
    return sim::ok();
  }

 private:
  struct Rank {
    int rank = 0;
    int stage = 0;
    LaneId compute, comm, p2p, h2d, d2h, cpu;
    LaneId moe_shared;  // the shared experts' stream (moe_shared_expert_overlap)
    PoolId hbm, host;
    std::vector<int> tp_group, dp_group;
    std::vector<int> cp_group;  // context-parallel ring (stride tp), cp > 1
    LaneId cp_lane;             // its K,V transfers (Transformer Engine's CP stream), cp > 1
    LaneId tp_lane;             // overlapped tensor-parallel communication (tp > 1)
    LaneId issue;               // the framework's host thread issuing the GPU ops (".host")
    std::vector<ParamGroup> groups;
    std::map<int, std::size_t> group_of_layer;
    std::map<std::pair<int, int>, OpId> last_grad_op;  // (layer key, mb) -> op after its grads
    std::map<int, OpId> reduce_op;                     // layer key -> DP reduction of last mb
    std::vector<int> ep_group, etp_group, edp_group;   // expert-parallel groups (MoE)
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
  };

  // --- policy -------------------------------------------------------------------------------

  LayerPolicy layer_policy(int layer) const {
    return models::layer_policy(s_, ldims_[static_cast<std::size_t>(layer)], layer);
  }
  // The dimensions of layer l (its MoE sizes when it has experts).
  const LayerDims& ld(int l) const { return ldims_[static_cast<std::size_t>(l)]; }

  // A non-layer parameter group (embedding, head) follows rules that select all layers.
  void non_layer_policy(ParamGroup& g) const {
    const GroupPlacement p = non_layer_placement(s_);
    g.params_on_host = p.params_on_host;
    g.grads_on_host = p.grads_on_host;
    g.opt_on_host = p.opt_on_host;
    g.master_on_host = p.master_on_host;
    g.master_on_hbm = p.master_on_hbm;
  }

  // --- helpers ------------------------------------------------------------------------------

  // The receive of `send` on a lane of its peer: no work of its own, it ends when the send does.
  OpId receive(OpId send) {
    const sim::Op s = b_.op_at(send);
    // A copy: creating the receive lane below may reallocate the lane table.
    const int from_rank = b_.peek().lanes[s.lane.index()].rank;
    const int dst = s.sizes.peer;
    const auto stage = static_cast<int>(dst / stage_ranks(s_.parallelism));
    const LaneId lane = b_.lane(fmt::format("rank{}.recv_from_rank{}", dst, from_rank),
                                {.rank = dst, .stage = stage, .role = sim::LaneRole::kRecv});
    const auto pair = static_cast<std::int64_t>(send.index());
    b_.op_at(send).sizes.p2p_pair = pair;
    sim::Op op;
    op.name = recv_names_.at(send);
    op.lane = lane;
    op.kind = OpKind::kP2P;
    op.category = s.category;
    op.layer = s.layer;
    op.sizes.bytes = s.sizes.bytes;
    op.sizes.peer = from_rank;
    op.sizes.p2p_role = sim::P2PRole::kRecv;
    op.sizes.p2p_pair = pair;
    op.deps = {send};
    return b_.op(std::move(op));
  }

  OpId add(Rank& r, LaneId lane, std::string name, OpKind kind, OpCategory category, int layer,
           sim::OpCost cost, sim::OpSizes sizes = {}, std::vector<OpId> deps = {}) {
    sim::Op op;
    op.name = std::move(name);
    op.lane = lane;
    op.kind = kind;
    op.category = category;
    op.layer = layer;
    op.sizes = std::move(sizes);
    op.cost = std::move(cost);
    op.deps = std::move(deps);
    const bool on_compute = lane == r.compute;
    if (on_compute && !next_compute_deps_.empty()) {
      op.deps.insert(op.deps.end(), next_compute_deps_.begin(), next_compute_deps_.end());
      next_compute_deps_.clear();
    }
    const bool issued =
        lane != r.cpu && lane != r.issue && kind != OpKind::kMarker && kind != OpKind::kHostCompute;
    double host_s = 0.0;
    const double gpu_s = on_compute ? sim::to_seconds(cm_.alone(op.cost)) : 0.0;
    if (issued) {
      host_s = cm_.host_issue_s(take_host_ops(category, op.sizes));
      host_issue_open(r, op.name, layer, on_compute);
      if (host_wait_) {
        // The first op after a synchronisation: the host issues it once the wait returns.
        b_.op_at(*host_wait_).cost.latency += sim::duration_from_seconds(host_s);
        host_s = 0.0;
        host_wait_.reset();
      }
    }
    const OpId id = b_.op(std::move(op));
    if (on_compute) last_compute_ = id;
    if (issued) host_issue_note(id, host_s, gpu_s, on_compute);
    return id;
  }

  // --- the host issue thread -----------------------------------------------------------------
  // The framework's Python thread issues the rank's GPU ops in program order (every op on a GPU
  // lane, in the order the builder emits them) and a kernel cannot start before its launch.
  // The ops are cut into segments (one layer's part of a pass, split at host synchronisations);
  // each segment has a marker on the rank's host lane ("rank<r>.host") whose latency is the
  // host time of its ops (CostModel::host_issue_s), and the segment's last op waits for it. The
  // lane runs its markers in order, and a synchronisation is a marker there that waits for the
  // GPU op it reads, so the markers' end times are the host's clock: the last op of a segment
  // starts no earlier than the CPU issued it. The host does not run ahead into a pass the GPU
  // has not begun: a pass's first marker also waits for a GPU op of the pass (a bound in place
  // of CUDA's 1024-entry launch queue; it keeps the engine state periodic for the
  // steady-state probe). With fast kernels (a host-bound step) the GPU
  // waits for the host; with long ones the host stays ahead and nothing changes.
  // A compute-stream op of another layer starts a segment; side-stream ops (copies, gradient
  // reductions, prefetches of another layer) join the open one.
  void host_issue_open(Rank& r, const std::string& first, int layer, bool on_compute) {
    if (host_seg_.open && (host_seg_.layer == layer || !on_compute || host_one_segment_)) return;
    host_issue_close();
    host_seg_.open = true;
    host_seg_.lane = r.issue;
    host_seg_.layer = layer;
    // Named by the first op's micro-batch and layer ("mb0.l3.host_issue").
    const std::size_t dot = first.find('.');
    const std::size_t dot2 = dot == std::string::npos ? dot : first.find('.', dot + 1);
    host_seg_.name = first.substr(0, dot2) + ".host_issue";
  }

  // The segment's marker holds its last compute-stream op; copies and side-stream collectives
  // are not held (prefetches are issued ahead by hooks and schedules).
  void host_issue_note(OpId id, double host_s, double gpu_s, bool on_compute) {
    HostSegment& g = host_seg_;
    g.host_s += host_s;
    g.gpu_s += gpu_s;
    if (!g.first) {
      g.first = id;
      g.first_gpu_s = gpu_s;
    }
    if (on_compute) {
      g.last = id;
      g.last_gpu_s = gpu_s;
    }
  }

  // Ends the open segment. The pass's first marker waits for the first op of the pass's
  // previous segment (the pass's first segment gets none: the host issued it while the GPU ran
  // the previous pass), so the host does not run ahead into a pass the GPU has not begun;
  // later markers, and those after a synchronisation, follow in the lane's order.
  // A segment gets no marker when the host cannot hold its last op back: its
  // host time is at most the GPU time (alone) from that anchor's end to the last op's start,
  // and no earlier segment of the pass had the GPU wait. `force`: a synchronisation follows.
  void host_issue_close(bool force = false) {
    HostSegment g = std::move(host_seg_);
    host_seg_ = HostSegment{};
    if (!g.open || !g.first || !g.last) return;
    // Once a marker of the pass holds the GPU, the lane's order bounds the next ones.
    const std::optional<OpId> anchor = host_behind_ ? std::nullopt : host_prev_first_;
    const double slack = host_prev_gpu_s_ + g.gpu_s - g.last_gpu_s;
    const bool pass_first = !host_prev_first_;
    host_prev_first_ = g.first;
    host_prev_gpu_s_ = g.gpu_s - g.first_gpu_s;
    // The pass's first segment: the host issued it while the GPU ran the previous pass.
    if (pass_first && !host_behind_) return;
    if (!force && !host_behind_ && g.host_s <= slack) return;
    host_behind_ = true;
    sim::Op m;
    m.name = g.name;
    m.lane = g.lane;
    m.kind = OpKind::kMarker;
    m.category = OpCategory::kNone;
    m.layer = g.layer;
    m.cost.latency = sim::duration_from_seconds(g.host_s);
    if (anchor) m.deps.push_back(*anchor);
    const OpId marker = b_.op(std::move(m));
    b_.op_at(*g.last).deps.push_back(marker);
  }

  // Between tasks (passes): the host is taken to have issued the next pass's first segment
  // while the GPU ran this one.
  void host_issue_end_task() {
    host_issue_close();
    host_prev_first_.reset();
    host_prev_gpu_s_ = 0.0;
    host_behind_ = false;
  }

  // What the next issued op stands for on the host thread, set by the lowering just before it
  // adds an op that stands for several framework ops: the MoE layer's router, permutation,
  // all-to-alls, grouped GEMMs and activation, counted in Megatron-Core's source
  // (megatron/core/transformer/moe/, see models/README.md "Host issue thread" for the count per
  // function). `backward`: backward nodes of the autograd engine rather than eager ops.
  void next_host_ops(double framework_ops, bool backward) {
    next_host_ops_ = NextHostOps{.ops = framework_ops, .backward = backward};
  }

  // The host work of the op being issued: what next_host_ops() set, else one PyTorch op (an
  // eager op in the forward, recompute and optimizer, a backward node in a backward task). A
  // grouped GEMM adds one cuBLAS launch per local expert (Transformer Engine's
  // general_grouped_gemm loops over the GEMMs in C++).
  CostModel::HostOps take_host_ops(OpCategory category, const sim::OpSizes& sizes) {
    NextHostOps next{.ops = 1.0,
                     .backward = in_backward_task_ && category != OpCategory::kRecompute};
    if (next_host_ops_) next = *next_host_ops_;
    next_host_ops_.reset();
    CostModel::HostOps ops;
    (next.backward ? ops.autograd : ops.eager) = next.ops;
    if (sizes.gemm.grouped) ops.launches = static_cast<double>(sizes.gemm.batch);
    return ops;
  }

  // A weight-gradient GEMM: with fp8 it reuses the transposes its forward and dgrad cast.
  OpId wgrad_gemm(Rank& r, const std::string& name, OpCategory cat, int layer, std::int64_t m,
                  std::int64_t n, std::int64_t k) {
    return gemm(r, name, cat, layer, m, n, k, /*weight_grad=*/true);
  }

  OpId gemm(Rank& r, const std::string& name, OpCategory cat, int layer, std::int64_t m,
            std::int64_t n, std::int64_t k, bool weight_grad = false) {
    return gemm_as(gdtype_, r, name, cat, layer, m, n, k, weight_grad);
  }

  // The LM head's GEMMs: Megatron's output layer is a plain (not Transformer Engine) linear
  // layer, so FP8 runs keep it in bf16 (the activation dtype), without FP8 casts.
  OpId head_gemm(Rank& r, const std::string& name, std::int64_t m, std::int64_t n, std::int64_t k,
                 bool weight_grad = false) {
    return gemm_as(adtype_, r, name, OpCategory::kCompute, -1, m, n, k, weight_grad);
  }

  OpId gemm_as(sim::DType dtype, Rank& r, const std::string& name, OpCategory cat, int layer,
               std::int64_t m, std::int64_t n, std::int64_t k, bool weight_grad) {
    sim::GemmShape shape{.m = m, .n = n, .k = k, .batch = 1, .dtype = dtype};
    if (dtype == sim::DType::kFp8 && !weight_grad && !fp8_input_cast_) {
      // Transformer Engine quantizes the GEMM's bf16 activation input (forward) or output
      // gradient (dgrad), m × k elements, row-wise for this GEMM and column-wise for the wgrad
      // GEMM, which reuses it.
      fp8_cast(r, name, cat, layer, m * k, /*from_norm=*/false);
    }
    sim::OpSizes sz;
    sz.gemm = shape;
    sz.flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    return add(r, r.compute, name, OpKind::kGemm, cat, layer, cm_.gemm(r.rank, shape), sz);
  }

  // The FP8 quantization of `elements` bf16 values as the scenario's recipe runs it
  // (fp8_quantize_bytes); one op for the recipe's kernels (amax pass, cast).
  OpId fp8_cast(Rank& r, const std::string& name, OpCategory cat, int layer, std::int64_t elements,
                bool from_norm) {
    const std::int64_t bytes = fp8_quantize_bytes(fp8_recipe_, fp8_blackwell_, from_norm, elements);
    return elementwise(r, name + ".fp8_cast", cat, layer, bytes,
                       bytes > 0 ? static_cast<double>(elements) : 0.0);
  }

  OpId elementwise(Rank& r, const std::string& name, OpCategory cat, int layer, std::int64_t bytes,
                   double flops) {
    sim::OpSizes sz;
    sz.bytes = bytes;
    sz.flops = flops;
    return add(r, r.compute, name, OpKind::kElementwise, cat, layer,
               cm_.memory_bound(r.rank, bytes, flops), sz);
  }

  // The attention core of one layer on this rank: one kernel, or with context parallelism the
  // ring (cp_comm_type p2p) or all-to-all (a2a) form Transformer Engine runs.
  OpId attention(Rank& r, const std::string& name, OpCategory cat, int layer, bool backward) {
    const ParallelConfig& p = s_.parallelism;
    if (p.cp > 1 && p.cp_comm_type == ParallelConfig::CpCommType::kA2A) {
      return ulysses_attention(r, name, cat, layer, backward);
    }
    if (p.cp > 1) return ring_attention(r, name, cat, layer, backward);
    return attention_kernel(r, name, cat, layer, attention_shape(backward, d_.s, d_.a, d_.kvh));
  }
  sim::AttentionShape attention_shape(bool backward, std::int64_t seq, std::int64_t heads,
                                      std::int64_t kv_heads) const {
    return {.batch = d_.b,
            .heads = heads,
            .kv_heads = kv_heads,
            .seq_q = seq,
            .seq_kv = seq,
            .head_dim = d_.d,
            .causal = true,
            .backward = backward,
            .dtype = adtype_};
  }
  OpId attention_kernel(Rank& r, const std::string& name, OpCategory cat, int layer,
                        const sim::AttentionShape& shape, std::vector<OpId> deps = {}) {
    sim::OpSizes sz;
    sz.attention = shape;
    sz.flops = CostModel::attention_flops(shape);
    return add(r, r.compute, name, OpKind::kAttention, cat, layer,
               cm_.attention(r.rank, shape, d_.flash, d_.dropout), sz, std::move(deps));
  }

  // Ring attention (Transformer Engine AttnFuncWithCPAndKVP2P, cp_comm_type p2p): cp steps, step
  // i the rank's queries against the K,V block that started i ranks before it on the ring. The
  // sequence is in 2·cp chunks, rank j holding chunks j and 2cp−1−j (Megatron's causal load
  // balancing), so every step is half of a full s×s product, as much as one causal s×s
  // attention: the kernels have that shape. K,V for step i come from the ring predecessor on the
  // CP stream while step i−1 computes; with two receive buffers the transfer for step i starts
  // once step i−2 has released its buffer. Backward: the same K,V transfers, and after each step
  // its partial dK,dV goes on to the next rank (overlapped with the following step); the last
  // transfer brings a rank its own dK,dV, which the next kernel waits for.
  OpId ring_attention(Rank& r, const std::string& name, OpCategory cat, int layer, bool backward) {
    const int cp = s_.parallelism.cp;
    const std::int64_t kv_block = 2 * d_.b * d_.s * d_.kv() * d_.e;  // K and V, this rank's tokens
    const sim::AttentionShape shape = attention_shape(backward, d_.s, d_.a, d_.kvh);
    const OpId ready = last_compute_;  // K,V (and in the backward dO) are ready
    std::vector<OpId> blocks;
    OpId recv{};
    OpId dkv{};
    for (int i = 0; i < cp; ++i) {
      if (i + 1 < cp) {
        const OpId freed = i == 0 ? ready : blocks[static_cast<std::size_t>(i - 1)];
        const OpId next =
            cp_transfer(r, fmt::format("{}.cp_kv{}", name, i + 1), layer, kv_block, {freed});
        blocks.push_back(attention_kernel(r, fmt::format("{}.cp{}", name, i), cat, layer, shape,
                                          i > 0 ? std::vector<OpId>{recv} : std::vector<OpId>{}));
        recv = next;
      } else {
        blocks.push_back(
            attention_kernel(r, fmt::format("{}.cp{}", name, i), cat, layer, shape, {recv}));
      }
      if (backward) {
        dkv = cp_transfer(r, fmt::format("{}.cp_dkv{}", name, i), layer, kv_block, {blocks.back()});
      }
    }
    if (backward) next_compute_deps_.push_back(dkv);
    return blocks.back();
  }
  // One ring step of the CP group: this rank sends `bytes` to its successor while receiving as
  // much from its predecessor. The ring moves at its slowest link: priced over the NIC when any
  // neighbour pair of the ring lies in different NVLink domains, else over NVLink.
  OpId cp_transfer(Rank& r, const std::string& name, int layer, std::int64_t bytes,
                   std::vector<OpId> deps) {
    const std::vector<int>& g = r.cp_group;
    const int successor = g[1 % g.size()];
    int priced = successor;
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (!cm_.system().same_nvlink_domain(g[i], g[(i + 1) % g.size()])) {
        for (int peer : g) {
          if (!cm_.system().same_nvlink_domain(r.rank, peer)) priced = peer;
        }
        break;
      }
    }
    sim::OpSizes sz;
    sz.bytes = bytes;
    sz.peer = successor;
    sz.p2p_role = sim::P2PRole::kSend;
    return add(r, r.cp_lane, name, OpKind::kP2P, OpCategory::kComm, layer,
               cm_.p2p(r.rank, priced, bytes), sz, std::move(deps));
  }
  // DeepSpeed-Ulysses style (cp_comm_type a2a): all-to-alls over the CP group turn the sequence
  // split into a head split, attention runs over the whole sequence for heads / cp heads, and
  // an all-to-all turns its output back; the backward does the same with the gradients. On the
  // compute stream: the attention needs their result.
  OpId ulysses_attention(Rank& r, const std::string& name, OpCategory cat, int layer,
                         bool backward) {
    const int cp = s_.parallelism.cp;
    const std::int64_t qkv_bytes = d_.tokens() * (d_.q() + 2 * d_.kv()) * d_.e;
    const std::int64_t out_bytes = d_.tokens() * d_.o() * d_.e;
    collective(r, r.compute, name + ".cp_a2a_in", OpCategory::kComm, layer,
               sim::CollectiveKind::kAllToAll, r.cp_group, backward ? out_bytes : qkv_bytes);
    attention_kernel(r, name, cat, layer,
                     attention_shape(backward, d_.s * cp, d_.a / cp, d_.kvh / cp));
    return collective(r, r.compute, name + ".cp_a2a_out", OpCategory::kComm, layer,
                      sim::CollectiveKind::kAllToAll, r.cp_group, backward ? qkv_bytes : out_bytes);
  }

  OpId collective(Rank& r, LaneId lane, const std::string& name, OpCategory cat, int layer,
                  sim::CollectiveKind kind, const std::vector<int>& group, std::int64_t bytes,
                  std::vector<OpId> deps = {}) {
    sim::OpSizes sz;
    sz.bytes = bytes;
    sz.collective = {.kind = kind, .group = group};
    return add(r, lane, name, OpKind::kCollective, cat, layer,
               cm_.collective(r.rank, kind, group, bytes), sz, std::move(deps));
  }

  OpId copy(Rank& r, sim::CopyDirection dir, const std::string& name, OpCategory cat, int layer,
            std::int64_t bytes, std::vector<OpId> deps) {
    sim::OpSizes sz;
    sz.bytes = bytes;
    sz.copy_direction = dir;
    const LaneId lane = dir == sim::CopyDirection::kH2D ? r.h2d : r.d2h;
    return add(r, lane, name, OpKind::kCopy, cat, layer, cm_.copy(r.rank, dir, bytes, true), sz,
               std::move(deps));
  }

  TensorId tensor(PoolId pool, const std::string& name, std::int64_t bytes, TensorCategory cat) {
    // The framework's allocator rounds every block it hands out (runtime.h); what lives outside
    // it (CUDA context, NCCL buffers) is not rounded.
    if (cat != TensorCategory::kRuntime &&
        std::find(hbm_pools_.begin(), hbm_pools_.end(), pool) != hbm_pools_.end()) {
      bytes = rounded_allocation(out_.runtime, bytes);
    }
    return b_.tensor(name, pool, bytes, cat);
  }

  // --- What frameworks add around the model's own kernels (Megatron-Core / Transformer
  // Engine). Each is an op with exact bytes; the memory-bound ones run at the profile's
  // memory-bound efficiency.

  // Rotary position embedding (models without a learned position table): one kernel applies
  // it to the query and key heads of the layer, reading and writing q and k (2 · tokens ·
  // (q + kv) elements); its backward does the same to their gradients. 3 FLOPs per element
  // (two products and a sum).
  bool rotary_positions() const { return s_.model.max_positions == 0; }
  OpId rotary(Rank& r, const std::string& name, int layer) {
    if (!rotary_positions()) return last_compute_;
    const std::int64_t elems = d_.tokens() * (d_.q() + d_.kv());
    return elementwise(r, name, OpCategory::kCompute, layer, 2 * elems * d_.e,
                       3.0 * static_cast<double>(elems));
  }

  // FP8: Transformer Engine quantizes each layer's bf16 weights (row-wise for the forward,
  // column-wise for the dgrad) once per step: Megatron passes is_first_microbatch, and later
  // micro-batches reuse the cached FP8 weights. Bytes per the recipe (fp8_quantize_bytes) over
  // the layer's linear weights on this rank. Charged right after the layer's optimizer update,
  // which produces the weights it casts.
  OpId fp8_weight_cast(Rank& r, const ParamGroup& g, OpId after) {
    const std::int64_t gated = d_.gated ? 2 : 1;
    const std::int64_t weights =
        d_.h * (d_.q() + 2 * d_.kv()) + d_.q() * d_.h + d_.h * d_.f * gated + d_.f * d_.h;
    const OpId cast = elementwise(r, g.name + ".fp8_weight_cast", OpCategory::kOptimizer, g.layer,
                                  fp8_quantize_bytes(fp8_recipe_, fp8_blackwell_, false, weights),
                                  static_cast<double>(weights));
    b_.op_at(cast).deps.push_back(after);
    return cast;
  }

  // The mixed-precision optimizer's passes over the gradients before the update (Megatron's
  // DistributedOptimizer / MixedPrecisionOptimizer): with fp16, unscale the main gradients and
  // check them for inf/NaN (read and write each); always, the gradient norm for clipping (read
  // each). Over this rank's optimizer shard, at the main gradients' width (fp32 with fp32
  // master weights). Their scalar all-reduces (a few bytes) are not charged.
  void grad_passes(Rank& r, const std::vector<OpId>& deps) {
    std::int64_t shard = 0;
    for (const ParamGroup& g : r.groups) {
      shard += dp_sharding(s_.parallelism).optimizer ? ceil_div(g.params, dp()) : g.params;
    }
    const std::int64_t gbytes = s_.training.fp32_master_weights ? 4 : 2;
    if (gdtype_ == sim::DType::kFp16) {
      const OpId u = elementwise(r, "unscale_inf_check", OpCategory::kOptimizer, -1,
                                 2 * gbytes * shard, 2.0 * static_cast<double>(shard));
      b_.op_at(u).deps.insert(b_.op_at(u).deps.end(), deps.begin(), deps.end());
    }
    const OpId n = elementwise(r, "grad_norm", OpCategory::kOptimizer, -1, gbytes * shard,
                               2.0 * static_cast<double>(shard));
    b_.op_at(n).deps.insert(b_.op_at(n).deps.end(), deps.begin(), deps.end());
  }

  // TP collective after a row-parallel GEMM (all-reduce, or reduce-scatter with SP) and before
  // a column-parallel GEMM with SP (all-gather). On the compute lane: Megatron runs them on the
  // compute stream and the next GEMM needs their result.
  void tp_reduce(Rank& r, const std::string& name, OpCategory cat, int layer) {
    if (d_.t == 1) return;
    const std::int64_t bytes = d_.tokens() * d_.h * d_.e;
    collective(r, r.compute, name, cat, layer,
               d_.sp > 1 ? sim::CollectiveKind::kReduceScatter : sim::CollectiveKind::kAllReduce,
               r.tp_group, bytes);
  }
  void tp_gather(Rank& r, const std::string& name, OpCategory cat, int layer) {
    if (d_.t == 1 || d_.sp == 1) return;
    collective(r, r.compute, name, cat, layer, sim::CollectiveKind::kAllGather, r.tp_group,
               d_.tokens() * d_.h * d_.e);
  }

  // --- tensor-parallel communication overlap (parallelism.tp_async_grad_reduce,
  // tp_comm_overlap) ---------------------------------------------------------------------------
  struct GemmDims {
    std::int64_t m = 0, n = 0, k = 0;
  };
  bool tp_overlap() const { return s_.parallelism.tp_comm_overlap && d_.t > 1 && d_.sp > 1; }
  // A column-parallel GEMM after the sequence-parallel all-gather of its input (forward), or a
  // row-parallel dgrad after the all-gather of the output gradient (backward). tp_comm_overlap:
  // Transformer Engine's ring exchange (userbuffers, copy engines): the GEMM on the rank's own
  // m/tp rows runs at once while the next chunk comes from the ring neighbour, each of the
  // tp − 1 transfers on the TP lane, each chunk's GEMM once its rows are there.
  // FP8: Transformer Engine quantizes the rank's own rows (m / sp) before the all-gather, which
  // then moves FP8 (1 byte per value); `from_norm`: the input is a norm's output.
  OpId gathered_gemm(Rank& r, const std::string& gather, const std::string& name, OpCategory cat,
                     int layer, GemmDims g, bool from_norm = false) {
    const bool fp8 = gdtype_ == sim::DType::kFp8;
    if (fp8) fp8_cast(r, name, cat, layer, ceil_div(g.m, d_.sp) * g.k, from_norm);
    fp8_input_cast_ = fp8;
    const OpId out = gathered_gemm_of(r, gather, name, cat, layer, g, fp8 ? 1 : d_.e);
    fp8_input_cast_ = false;
    return out;
  }
  OpId gathered_gemm_of(Rank& r, const std::string& gather, const std::string& name, OpCategory cat,
                        int layer, GemmDims g, std::int64_t elem_bytes) {
    if (!tp_overlap()) {
      if (d_.t > 1 && d_.sp > 1) {
        collective(r, r.compute, gather, OpCategory::kComm, layer, sim::CollectiveKind::kAllGather,
                   r.tp_group, d_.tokens() * d_.h * elem_bytes);
      }
      return gemm(r, name, cat, layer, g.m, g.n, g.k);
    }
    const std::int64_t chunk_bytes = d_.tokens() * d_.h * elem_bytes / d_.t;
    const OpId ready = last_compute_;
    OpId out{};
    OpId recv{};
    for (int i = 0; i < d_.t; ++i) {
      OpId next{};
      if (i + 1 < d_.t) {
        sim::OpSizes sz;
        sz.bytes = chunk_bytes;
        sz.peer = r.tp_group[1];
        sz.p2p_role = sim::P2PRole::kSend;
        next =
            add(r, r.tp_lane, fmt::format("{}{}", gather, i + 1), OpKind::kP2P, OpCategory::kComm,
                layer, cm_.p2p(r.rank, r.tp_group[1], chunk_bytes), sz, {ready});
      }
      if (i > 0) next_compute_deps_.push_back(recv);
      out = gemm(r, fmt::format("{}.c{}", name, i), cat, layer, ceil_div(g.m, d_.t), g.n, g.k);
      recv = next;
    }
    return out;
  }
  // A row-parallel GEMM and the sequence-parallel reduce-scatter (or all-reduce) of its output.
  // tp_comm_overlap: pipelined, the GEMM in tp chunks of m/tp rows, each chunk's reduce-scatter
  // on the TP lane while the next chunk computes; the next kernel waits for the last one.
  OpId scattered_gemm(Rank& r, const std::string& name, const std::string& reduce, OpCategory cat,
                      int layer, GemmDims g) {
    if (!tp_overlap()) {
      const OpId out = gemm(r, name, cat, layer, g.m, g.n, g.k);
      tp_reduce(r, reduce, OpCategory::kComm, layer);
      return out;
    }
    const std::int64_t chunk_bytes = d_.tokens() * d_.h * d_.e / d_.t;
    OpId out{};
    OpId rs{};
    for (int i = 0; i < d_.t; ++i) {
      out = gemm(r, fmt::format("{}.c{}", name, i), cat, layer, ceil_div(g.m, d_.t), g.n, g.k);
      rs = collective(r, r.tp_lane, fmt::format("{}{}", reduce, i), OpCategory::kComm, layer,
                      sim::CollectiveKind::kReduceScatter, r.tp_group, chunk_bytes, {out});
    }
    next_compute_deps_.push_back(rs);
    return out;
  }
  // The input-gradient reduction of a column-parallel linear's backward, started right after its
  // dgrad GEMM on the TP lane (tp_async_grad_reduce) so that the wgrad GEMM overlaps it;
  // finish_tp_reduce makes the next kernel wait for it, or (not async) runs it on the compute
  // stream after the wgrad GEMM.
  std::optional<OpId> async_tp_reduce(Rank& r, const std::string& name, int layer) {
    if (d_.t == 1 || !s_.parallelism.tp_async_grad_reduce) return std::nullopt;
    return collective(
        r, r.tp_lane, name, OpCategory::kComm, layer,
        d_.sp > 1 ? sim::CollectiveKind::kReduceScatter : sim::CollectiveKind::kAllReduce,
        r.tp_group, d_.tokens() * d_.h * d_.e, {last_compute_});
  }
  void finish_tp_reduce(Rank& r, std::optional<OpId> reduce, const std::string& name, int layer) {
    if (reduce) {
      next_compute_deps_.push_back(*reduce);
    } else {
      tp_reduce(r, name, OpCategory::kComm, layer);
    }
  }

  std::int64_t residual_bytes() const { return d_.tokens() * d_.h * d_.e / d_.sp; }
  // Pipeline sends. Overlapped: on their own lane. Blocking (Megatron-LM 2021, which
  // synchronized the device after every batch_isend_irecv): on the compute lane, and each
  // tensor-parallel rank sends only its 1/tp slice of the replicated activation (its
  // scatter-gather optimization; the NVLink all-gather that rebuilds it is not charged).
  LaneId p2p_lane(const Rank& r) const {
    return s_.parallelism.overlap_p2p_comm ? r.p2p : r.compute;
  }
  std::int64_t p2p_bytes() const {
    const bool scatter = !s_.parallelism.overlap_p2p_comm && d_.t > 1 && d_.sp == 1;
    return scatter ? ceil_div(residual_bytes(), d_.t) : residual_bytes();
  }
  // With dropout (GPT / Megatron): bias + dropout + residual add is one fused kernel that also
  // writes (forward) or reads (backward) a one-byte mask, and the next norm reads the sum again.
  std::int64_t dropout_mask_bytes() const { return d_.dropout ? d_.tokens() * d_.h / d_.sp : 0; }
  std::int64_t res1_ln2_fwd_bytes() const {
    return (d_.dropout ? 5 : 4) * residual_bytes() + dropout_mask_bytes();
  }
  std::int64_t res2_fwd_bytes() const { return 3 * residual_bytes() + dropout_mask_bytes(); }
  // Megatron-LM 2021 accumulated each micro-batch's weight gradients into param.main_grad with a
  // separate add (read main_grad and grad, write main_grad); gradient-accumulation fusion (the
  // wgrad GEMM accumulating in place) removed that pass.
  void grad_accumulation(Rank& r, const std::string& name, int layer, std::int64_t params) {
    const std::int64_t bytes = 3 * params * sim::dtype_bytes(dt_.grads);
    elementwise(r, name, OpCategory::kCompute, layer, bytes, static_cast<double>(params));
  }
  std::int64_t norm_flops() const { return 5 * d_.tokens() * d_.h / d_.sp; }

  bool shard_params() const { return dp_sharding(s_.parallelism).params; }
  bool shard_grads() const { return dp_sharding(s_.parallelism).grads; }
  int dp() const { return grad_dp(s_.parallelism); }  // the gradient-reduction group
  // Expert data-parallel size: tp · dp / (ep · etp).
  int edp() const {
    const ParallelConfig& p = s_.parallelism;
    return p.tp * p.dp / (p.ep * p.etp);
  }

  // The micro-batch number in names (a reduced step names its last one as the full step does).
  int lbl(int mb) const { return mb == micro_batches_ - 1 ? last_label_ : mb; }
  std::string pfx(int mb, int layer) const { return fmt::format("mb{}.l{}", lbl(mb), layer); }

  // --- the rank -----------------------------------------------------------------------------

  sim::Status build_rank(int stage) {
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
    r.hbm = cm_.hbm_pool(r.rank);
    r.host = cm_.host_pool(r.rank);
    hbm_pools_.push_back(r.hbm);
    for (int i = 0; i < p.tp; ++i) r.tp_group.push_back(r.rank + i);
    // Rank order tp, cp, dp (Megatron-Core's default order): the gradient group is the dp · cp
    // ranks of stride tp, the CP ring its first cp.
    for (int i = 0; i < grad_dp(p); ++i) r.dp_group.push_back(r.rank + i * p.tp);
    for (int i = 0; i < p.cp; ++i) r.cp_group.push_back(r.rank + i * p.tp);
    if (p.cp > 1) r.cp_lane = lane(".cp", sim::LaneRole::kComm);
    if (p.tp > 1 && (p.tp_async_grad_reduce || p.tp_comm_overlap)) {
      r.tp_lane = lane(".tp", sim::LaneRole::kComm);
    }
    // Megatron-Core's expert grid over the stage's tp · dp ranks, etp fastest, then ep, then the
    // expert data-parallel group.
    for (int i = 0; i < p.ep; ++i) r.ep_group.push_back(r.rank + i * p.etp);
    for (int i = 0; i < p.etp; ++i) r.etp_group.push_back(r.rank + i);
    for (int i = 0; i < edp(); ++i) r.edp_group.push_back(r.rank + i * p.ep * p.etp);

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

    const bool interleaved = p.schedule == ParallelConfig::PipelineSchedule::kInterleaved1F1B;
    const std::vector<Task> tasks =
        pipeline_schedule(stage, p.pp, p.virtual_stages, micro_batches_, interleaved);
    // Warm-up forwards: those before the first backward (the steady state's index origin).
    const auto first_bwd =
        std::find_if(tasks.begin(), tasks.end(), [](const Task& t) { return !t.forward; });
    const std::int64_t warmup = first_bwd - tasks.begin();
    std::int64_t forwards = 0;
    std::int64_t backwards = 0;
    for (const Task& t : tasks) {
      if (t.forward && p.pp == 1) {
        out_.micro_batch_starts.push_back(
            {.op = b_.peek().ops.size(), .tensor = b_.peek().tensors.size()});
      }
      PipelineTask pt{.stage = stage,
                      .chunk = t.chunk,
                      .mb = t.mb,
                      .forward = t.forward,
                      .index = t.forward ? forwards++ - warmup : backwards++,
                      .op_begin = b_.peek().ops.size(),
                      .tensor_begin = b_.peek().tensors.size()};
      run_task(r, t);
      if (p.pp > 1) {
        pt.op_end = b_.peek().ops.size();
        pt.tensor_end = b_.peek().tensors.size();
        out_.pipeline_tasks.push_back(pt);
      }
    }
    // The optimizer's ops (multi-tensor kernels over every group) are one host segment.
    host_one_segment_ = true;
    optimizer(r);
    host_issue_end_task();
    host_one_segment_ = false;
    return sim::ok();
  }

  // One forward or backward task of the schedule, a pass of its own on the host issue thread.
  void run_task(Rank& r, const Task& t) {
    host_issue_end_task();
    in_backward_task_ = !t.forward;
    if (t.forward) {
      forward_task(r, t);
    } else {
      backward_task(r, t);
    }
    in_backward_task_ = false;
    host_issue_end_task();
  }

  std::vector<int> chunk_layers(int stage, int chunk) const {
    const int pp = s_.parallelism.pp;
    const int first = (chunk * pp + stage) * layers_per_chunk_;
    std::vector<int> ls;
    for (int i = 0; i < layers_per_chunk_; ++i) ls.push_back(first + i);
    return ls;
  }
  bool has_embedding(int stage, int chunk) const { return stage == 0 && chunk == 0; }
  bool has_head(int stage, int chunk) const {
    return stage == s_.parallelism.pp - 1 && chunk == s_.parallelism.virtual_stages - 1;
  }

  void make_param_groups(Rank& r) {
    const ParallelConfig& p = s_.parallelism;
    const ModelArch& m = s_.model;
    const auto finish = [&](ParamGroup g) {
      g.mem = static_memory(g.params, p, dt_);
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
                       .params_on_host = lp.params_on_host,
                       .grads_on_host = lp.grads_on_host,
                       .opt_on_host = lp.opt_on_host,
                       .master_on_host = lp.master_on_host,
                       .master_on_hbm = lp.master_on_hbm,
                       .expert = true};
          ParallelConfig pe = p;
          pe.dp = edp();
          x.mem = static_memory(x.params, pe, s_.training.fp32_master_weights, gdtype_);
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
      ParamGroup g{.name = "head",
                   .role = ParamGroup::Role::kHead,
                   .layer = -1,
                   .params = norm + (head_matrix ? d_.v * m.hidden : 0)};
      non_layer_policy(g);
      finish(g);
    }
  }

  void make_static_tensors(Rank& r) {
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
      if (!g.grads_on_host) hbm_static += g.mem.grads_bytes;
      if (!g.opt_on_host) hbm_static += g.mem.optimizer_bytes;
      if (g.opt_on_host && g.master_on_hbm) hbm_static += g.mem.master_bytes;
    }
    const RuntimeModel& rt = out_.runtime;
    if (rt.runtime == HardwareConfig::Runtime::kNone) {
      const auto ws =
          static_cast<std::int64_t>(alloc.fixed_bytes.value + alloc.overhead_fraction.value *
                                                                  static_cast<double>(hbm_static));
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

  ParamGroup& group(Rank& r, int layer) { return r.groups[r.group_of_layer.at(layer)]; }

  // Brings a layer's parameters in before use: H2D from host and/or FSDP all-gather, prefetched
  // `prefetch` layers ahead (dependency on the first op of an earlier layer). Returns the ops
  // the layer's first compute op must wait for, and the buffer to free after the layer.
  // `routed_bytes`: host-resident expert weights the forward fetches once its router has run
  // (moe_routed_fetch).
  struct Fetch {
    std::vector<OpId> wait;
    std::vector<TensorId> buffers;
    std::int64_t routed_bytes = 0;
  };
  Fetch fetch_params(Rank& r, int layer, const std::string& tag, std::optional<OpId> after,
                     bool forward = false) {
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
    if (shard_params() && dp() > 1) {
      const TensorId buf = tensor(r.hbm, fmt::format("{}.{}.params_gathered", g.name, tag), full,
                                  TensorCategory::kBuffers);
      const OpId ag = collective(r, r.comm, fmt::format("{}.{}.params_allgather", g.name, tag),
                                 OpCategory::kComm, layer, sim::CollectiveKind::kAllGather,
                                 r.dp_group, full, deps);
      b_.op_at(ag).allocs.push_back(buf);
      f.buffers.push_back(buf);
      f.wait = {ag};
    }
    return f;
  }

  // --- forward ------------------------------------------------------------------------------

  void forward_task(Rank& r, const Task& t) {
    const std::vector<int> layers = chunk_layers(r.stage, t.chunk);
    OpId last{};
    bool first = true;
    const auto note_first = [&](OpId op) {
      if (first && !has_embedding(r.stage, t.chunk))
        pending_recv_.push_back({op, SendKey{true, t.mb, r.stage, t.chunk}});
      first = false;
    };
    if (has_embedding(r.stage, t.chunk)) {
      last = elementwise(r, fmt::format("mb{}.embed.fwd", lbl(t.mb)), OpCategory::kCompute, -1,
                         2 * residual_bytes(), 0.0);
      note_first(last);
    }
    std::vector<OpId> firsts;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const int l = layers[i];
      const int k = std::max(1, policies_[l].param_prefetch);
      std::optional<OpId> after;
      if (i >= static_cast<std::size_t>(k))
        after = firsts[i - k];
      else if (i > 0)
        after = firsts[0];
      Fetch f = fetch_params(r, l, fmt::format("mb{}.fwd", lbl(t.mb)), after, true);
      const OpId op = layer_forward(r, t.mb, l, f);
      firsts.push_back(r.layer_first_fwd.at({t.mb, l}));
      // Offload back-pressure: the forward of a layer waits until the D2H copies of the layer
      // kOffloadWindowLayers earlier have finished, so offloaded activations never pile up on
      // HBM behind a slow link (Transformer Engine's CPU offload makes the compute stream wait
      // for the D2H stream at each offload-window boundary; XLA's scheduler bounds live memory
      // the same way). The cost shows up as exposed offload time instead of HBM.
      if (i >= kOffloadWindowLayers) {
        const auto earlier = r.saved.find({t.mb, layers[i - kOffloadWindowLayers]});
        if (earlier != r.saved.end()) {
          for (const OpId d2h : earlier->second.d2h) b_.op_at(firsts.back()).deps.push_back(d2h);
        }
      }
      note_first(firsts.back());
      last = op;
    }
    if (has_head(r.stage, t.chunk)) {
      last = head_forward(r, t.mb);
    } else {
      const auto [dst_stage, dst_chunk] = next_stage(r.stage, t.chunk);
      const int dst = dst_stage * stage_ranks(s_.parallelism);
      sim::OpSizes sz;
      sz.bytes = p2p_bytes();
      sz.peer = dst;
      const OpId send =
          add(r, p2p_lane(r), fmt::format("mb{}.c{}.fwd.send", lbl(t.mb), t.chunk), OpKind::kP2P,
              OpCategory::kComm, -1, cm_.p2p(r.rank, dst, p2p_bytes()), sz, {last});
      sends_[SendKey{true, t.mb, dst_stage, dst_chunk}] = send;
      recv_names_[send] = fmt::format("mb{}.c{}.fwd.recv", lbl(t.mb), t.chunk);
    }
  }

  std::pair<int, int> next_stage(int stage, int chunk) const {
    if (stage + 1 < s_.parallelism.pp) return {stage + 1, chunk};
    return {0, chunk + 1};
  }
  std::pair<int, int> prev_stage(int stage, int chunk) const {
    if (stage > 0) return {stage - 1, chunk};
    return {s_.parallelism.pp - 1, chunk - 1};
  }

  // The forward ops of one layer; returns the last.
  OpId layer_forward(Rank& r, int mb, int l, Fetch& fetch) {
    const LayerPolicy& lp = policies_[l];
    const std::string p = pfx(mb, l);
    const OpCategory cat = OpCategory::kCompute;
    std::vector<OpId> ops;
    const auto push = [&](OpId op) {
      ops.push_back(op);
      return op;
    };

    // Saved tensors: the HBM-resident ones and the offloaded ones (separately, per chunk).
    Rank::Saved saved;
    std::int64_t hbm_bytes = 0;
    std::int64_t host_bytes = 0;
    for (int a = 0; a < kNumActs; ++a) {
      if (!lp.acts.saved[a]) continue;
      (lp.on_host[a] ? host_bytes : hbm_bytes) += act_bytes(ld(l), static_cast<Act>(a));
    }

    push(elementwise(r, p + ".ln1.fwd", cat, l, 2 * residual_bytes(), norm_flops()));
    for (OpId w : fetch.wait) b_.op_at(ops.front()).deps.push_back(w);
    r.layer_first_fwd[{mb, l}] = ops.front();
    if (hbm_bytes > 0) {
      saved.hbm = tensor(r.hbm, p + ".act", hbm_bytes, TensorCategory::kActivations);
      b_.op_at(ops.front()).allocs.push_back(saved.hbm);
    }
    std::vector<TensorId> staging;
    if (host_bytes > 0) {
      const std::int64_t chunk = lp.chunk_bytes > 0 ? lp.chunk_bytes : host_bytes;
      for (std::int64_t off = 0; off < host_bytes; off += chunk) {
        const std::int64_t n = std::min(chunk, host_bytes - off);
        saved.chunks.push_back(n);
        const TensorId st = tensor(r.hbm, fmt::format("{}.act_offload{}", p, staging.size()), n,
                                   TensorCategory::kActivations);
        b_.op_at(ops.front()).allocs.push_back(st);
        staging.push_back(st);
      }
    }
    push(gathered_gemm(r, p + ".qkv.tp_allgather", p + ".qkv.fwd", cat, l,
                       {d_.tokens(), d_.qkv_n(), d_.h}, /*from_norm=*/true));
    rotary(r, p + ".rope.fwd", l);
    push(attention(r, p + ".attn.fwd", cat, l, false));
    push(scattered_gemm(r, p + ".out_proj.fwd", p + ".out_proj.tp_reduce", cat, l,
                        {d_.tokens(), d_.h, d_.o()}));
    push(elementwise(r, p + ".res1_ln2.fwd", cat, l, res1_ln2_fwd_bytes(), 2 * norm_flops()));
    if (ld(l).moe) {
      moe_forward(r, p, cat, l, push, ".fwd", &fetch);
    } else {
      const std::int64_t g = d_.gated ? 2 : 1;
      push(gathered_gemm(r, p + ".mlp.tp_allgather", p + ".mlpwi.fwd", cat, l,
                         {d_.tokens(), d_.f * g, d_.h}, /*from_norm=*/true));
      push(elementwise(r, p + ".act.fwd", cat, l, d_.tokens() * d_.f * d_.e * (g + 1),
                       static_cast<double>(8 * d_.tokens() * d_.f)));
      push(scattered_gemm(r, p + ".mlpwo.fwd", p + ".mlpwo.tp_reduce", cat, l,
                          {d_.tokens(), d_.h, d_.f}));
    }
    const OpId last = push(elementwise(r, p + ".res2.fwd", cat, l, res2_fwd_bytes(),
                                       static_cast<double>(d_.tokens() * d_.h / d_.sp)));
    for (TensorId buf : fetch.buffers) b_.op_at(last).frees.push_back(buf);

    // Eager D2H of the offloaded tensors once the layer's forward is done.
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
    r.saved[{mb, l}] = std::move(saved);
    return last;
  }

  OpId head_forward(Rank& r, int mb) {
    const std::string p = fmt::format("mb{}.head", lbl(mb));
    const std::int64_t chunks = s_.training.loss_chunks;
    if (chunks > 1) return head_forward_chunked(r, mb, chunks);
    // Saved until the head's backward: the final-norm input and output and the fp32 logits'
    // softmax the vocabulary-parallel cross entropy keeps.
    const std::int64_t bytes = 2 * residual_bytes() + d_.tokens() * d_.v * 4;
    const TensorId t = tensor(r.hbm, p + ".act", bytes, TensorCategory::kActivations);
    const OpId norm = elementwise(r, p + ".final_norm.fwd", OpCategory::kCompute, -1,
                                  2 * residual_bytes(), norm_flops());
    b_.op_at(norm).allocs.push_back(t);
    tp_gather(r, p + ".tp_allgather", OpCategory::kComm, -1);
    head_gemm(r, p + ".lm_head.fwd", d_.tokens(), d_.v, d_.h);
    r.head_saved[mb] = t;
    return elementwise(r, p + ".loss.fwd", OpCategory::kCompute, -1,
                       d_.tokens() * d_.v * (d_.e + 4),
                       static_cast<double>(5 * d_.tokens() * d_.v));
  }

  // Chunked (fused linear) cross entropy: per chunk of tokens, the logits GEMM, the loss and its
  // gradient, the data-gradient GEMM into the saved gradient of the head's input and the
  // weight-gradient GEMM, then the chunk's fp32 logits are freed. The same GEMM and elementwise
  // work as the unchunked head, moved from the backward into the forward; the live logits shrink
  // from tokens × vocab to one chunk's. Saved for the backward: the final-norm input and output
  // and the gradient of the head's input (tokens × hidden each, like the residual).
  OpId head_forward_chunked(Rank& r, int mb, std::int64_t chunks) {
    const std::string p = fmt::format("mb{}.head", lbl(mb));
    const TensorId t =
        tensor(r.hbm, p + ".act", 3 * residual_bytes(), TensorCategory::kActivations);
    const OpId norm = elementwise(r, p + ".final_norm.fwd", OpCategory::kCompute, -1,
                                  2 * residual_bytes(), norm_flops());
    b_.op_at(norm).allocs.push_back(t);
    tp_gather(r, p + ".tp_allgather", OpCategory::kComm, -1);
    const std::int64_t tokens = d_.tokens();
    OpId last = norm;
    for (std::int64_t c = 0; c < chunks; ++c) {
      // Tokens [c·tokens/chunks, (c+1)·tokens/chunks): the chunks differ by at most one token.
      const std::int64_t n = (c + 1) * tokens / chunks - c * tokens / chunks;
      const std::string q = fmt::format("{}.chunk{}", p, c);
      const TensorId logits =
          tensor(r.hbm, q + ".logits", n * d_.v * 4, TensorCategory::kActivations);
      const OpId fwd = head_gemm(r, q + ".lm_head.fwd", n, d_.v, d_.h);
      b_.op_at(fwd).allocs.push_back(logits);
      elementwise(r, q + ".loss.fwd", OpCategory::kCompute, -1, n * d_.v * (d_.e + 4),
                  static_cast<double>(5 * n * d_.v));
      elementwise(r, q + ".loss.bwd", OpCategory::kCompute, -1, n * d_.v * (d_.e + 4),
                  static_cast<double>(3 * n * d_.v));
      head_gemm(r, q + ".lm_head.dgrad", n, d_.h, d_.v);
      last = head_gemm(r, q + ".lm_head.wgrad", d_.h, d_.v, n, /*weight_grad=*/true);
      b_.op_at(last).frees.push_back(logits);
    }
    r.head_saved[mb] = t;
    return last;
  }

  // --- backward -----------------------------------------------------------------------------

  void backward_task(Rank& r, const Task& t) {
    std::vector<int> layers = chunk_layers(r.stage, t.chunk);
    std::reverse(layers.begin(), layers.end());
    OpId last{};
    bool first = true;
    const auto note_first = [&](OpId op) {
      if (first && !has_head(r.stage, t.chunk)) {
        pending_recv_.push_back({op, SendKey{false, t.mb, r.stage, t.chunk}});
      }
      first = false;
    };
    std::optional<OpId> task_first;
    if (has_head(r.stage, t.chunk)) {
      last = head_backward(r, t.mb);
      note_first(last);
      task_first = last;
    }
    std::vector<OpId> firsts;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const int l = layers[i];
      const int k = std::max(1, policies_[l].param_prefetch);
      std::optional<OpId> after = task_first;
      if (i >= static_cast<std::size_t>(k))
        after = firsts[i - k];
      else if (i > 0)
        after = firsts[0];
      Fetch f = fetch_params(r, l, fmt::format("mb{}.bwd", lbl(t.mb)), after);
      // Activation prefetch: H2D of this layer's offloaded tensors once the backward of the
      // layer `prefetch` steps earlier has started.
      const int ka = std::max(1, policies_[l].prefetch);
      std::optional<OpId> act_after = task_first;
      if (i >= static_cast<std::size_t>(ka))
        act_after = firsts[i - ka];
      else if (i > 0)
        act_after = firsts[0];
      if (policies_[l].prefetch == 0 && i > 0) act_after = firsts[i - 1];
      std::optional<SendKey> recv;
      if (!act_after && !has_head(r.stage, t.chunk)) recv = SendKey{false, t.mb, r.stage, t.chunk};
      last = layer_backward(r, t.mb, l, f, act_after, recv);
      firsts.push_back(r.layer_first_bwd.at({t.mb, l}));
      note_first(firsts.back());
      if (!task_first) task_first = firsts.front();
    }
    if (has_embedding(r.stage, t.chunk)) {
      last = elementwise(r, fmt::format("mb{}.embed.bwd", lbl(t.mb)), OpCategory::kCompute, -1,
                         2 * residual_bytes(), 0.0);
      grads_done(r, -1, t.mb, last);
    } else {
      const auto [dst_stage, dst_chunk] = prev_stage(r.stage, t.chunk);
      const int dst = dst_stage * stage_ranks(s_.parallelism);
      sim::OpSizes sz;
      sz.bytes = p2p_bytes();
      sz.peer = dst;
      const OpId send =
          add(r, p2p_lane(r), fmt::format("mb{}.c{}.bwd.send", lbl(t.mb), t.chunk), OpKind::kP2P,
              OpCategory::kComm, -1, cm_.p2p(r.rank, dst, p2p_bytes()), sz, {last});
      sends_[SendKey{false, t.mb, dst_stage, dst_chunk}] = send;
      recv_names_[send] = fmt::format("mb{}.c{}.bwd.recv", lbl(t.mb), t.chunk);
    }
  }

  OpId head_backward(Rank& r, int mb) {
    const std::string p = fmt::format("mb{}.head", lbl(mb));
    OpId first{};
    if (s_.training.loss_chunks > 1) {
      // The head's gradients were made in the forward: scale the saved input gradient by the
      // loss gradient (one pass over tokens × hidden).
      first = elementwise(r, p + ".loss.bwd", OpCategory::kCompute, -1, 2 * residual_bytes(),
                          static_cast<double>(residual_bytes() / d_.e));
    } else {
      first =
          elementwise(r, p + ".loss.bwd", OpCategory::kCompute, -1, d_.tokens() * d_.v * (d_.e + 4),
                      static_cast<double>(3 * d_.tokens() * d_.v));
      head_gemm(r, p + ".lm_head.dgrad", d_.tokens(), d_.h, d_.v);
      head_gemm(r, p + ".lm_head.wgrad", d_.h, d_.v, d_.tokens(), /*weight_grad=*/true);
    }
    tp_reduce(r, p + ".tp_reduce", OpCategory::kComm, -1);
    const OpId last = elementwise(r, p + ".final_norm.bwd", OpCategory::kCompute, -1,
                                  3 * residual_bytes(), 2 * norm_flops());
    b_.op_at(last).frees.push_back(r.head_saved.at(mb));
    grads_done(r, -2, mb, last);
    return first;
  }

  // Reloads layer l's offloaded activations of micro-batch mb (H2D after their D2H and
  // `act_after`); appends the copies to `wait` and returns the reloaded HBM tensors.
  std::vector<TensorId> reload_activations(Rank& r, int mb, int l, const std::string& p,
                                           std::optional<OpId> act_after,
                                           std::optional<SendKey> recv, std::vector<OpId>& wait) {
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

  // Recomputes the forward ops of layer l that the backward needs and nobody saved; `emit`
  // sees every op.
  template <class Emit>
  void recompute_forward(Rank& r, const std::string& p, int l, Emit&& emit) {
    const auto& rc = policies_[l].acts.recompute;
    const OpCategory rcat = OpCategory::kRecompute;
    const std::int64_t g = d_.gated ? 2 : 1;
    const auto idx = [](FwdOp o) { return static_cast<int>(o); };
    if (rc[idx(FwdOp::kLn1)]) {
      emit(elementwise(r, p + ".ln1.recompute", rcat, l, 2 * residual_bytes(), norm_flops()));
    }
    // The checkpointed forward re-runs the same Transformer Engine modules: their all-gathers
    // (FP8 rows under fp8) and reduce-scatters, overlapped as in the forward (tp_comm_overlap).
    if (rc[idx(FwdOp::kQkv)]) {
      emit(gathered_gemm(r, p + ".qkv.tp_allgather.recompute", p + ".qkv.recompute", rcat, l,
                         {d_.tokens(), d_.qkv_n(), d_.h}, /*from_norm=*/true));
      if (rotary_positions()) emit(rotary(r, p + ".rope.recompute", l));
    }
    if (rc[idx(FwdOp::kCore)]) emit(attention(r, p + ".attn.recompute", rcat, l, false));
    if (rc[idx(FwdOp::kOutProj)]) {
      emit(scattered_gemm(r, p + ".out_proj.recompute", p + ".out_proj.tp_reduce.recompute", rcat,
                          l, {d_.tokens(), d_.h, d_.o()}));
    }
    if (rc[idx(FwdOp::kRes1)] || rc[idx(FwdOp::kLn2)]) {
      emit(elementwise(r, p + ".res1_ln2.recompute", rcat, l, res1_ln2_fwd_bytes(),
                       2 * norm_flops()));
    }
    if (ld(l).moe && (rc[idx(FwdOp::kMlpWi)] || rc[idx(FwdOp::kAct)] || rc[idx(FwdOp::kMlpWo)])) {
      // The MoE FFN is re-run whole (router, dispatch, experts, combine).
      moe_forward(r, p, rcat, l, emit, ".recompute");
    } else if (rc[idx(FwdOp::kMlpWi)]) {
      emit(gathered_gemm(r, p + ".mlp.tp_allgather.recompute", p + ".mlpwi.recompute", rcat, l,
                         {d_.tokens(), d_.f * g, d_.h}, /*from_norm=*/true));
    }
    if (rc[idx(FwdOp::kAct)] && !ld(l).moe) {
      emit(elementwise(r, p + ".act.recompute", rcat, l, d_.tokens() * d_.f * d_.e * (g + 1),
                       static_cast<double>(8 * d_.tokens() * d_.f)));
    }
    if (rc[idx(FwdOp::kMlpWo)] && !ld(l).moe) {
      emit(gemm(r, p + ".mlpwo.recompute", rcat, l, d_.tokens(), d_.h, d_.f));
    }
  }

  // The FFN's backward of layer l (MoE or dense), after the second residual's.
  void ffn_backward(Rank& r, const std::string& p, int l) {
    const OpCategory cat = OpCategory::kCompute;
    if (ld(l).moe) {
      moe_backward(r, p, cat, l);
      return;
    }
    const std::int64_t g = d_.gated ? 2 : 1;
    gathered_gemm(r, p + ".mlpwo.bwd.tp_allgather", p + ".mlpwo.dgrad", cat, l,
                  {d_.tokens(), d_.f, d_.h});
    wgrad_gemm(r, p + ".mlpwo.wgrad", cat, l, d_.f, d_.h, d_.tokens());
    elementwise(r, p + ".act.bwd", cat, l, d_.tokens() * d_.f * d_.e * (2 * g + 1),
                static_cast<double>(10 * d_.tokens() * d_.f));
    gemm(r, p + ".mlpwi.dgrad", cat, l, d_.tokens(), d_.h, d_.f * g);
    const std::optional<OpId> reduce = async_tp_reduce(r, p + ".mlpwi.bwd.tp_reduce", l);
    wgrad_gemm(r, p + ".mlpwi.wgrad", cat, l, d_.h, d_.f * g, d_.tokens());
    finish_tp_reduce(r, reduce, p + ".mlpwi.bwd.tp_reduce", l);
  }

  // The attention block's backward of layer l, from the first residual and second norm to
  // the first norm; returns the first norm's backward (the layer's last op).
  OpId attention_backward(Rank& r, const std::string& p, int l) {
    const OpCategory cat = OpCategory::kCompute;
    elementwise(r, p + ".res1_ln2.bwd", cat, l, 6 * residual_bytes() + dropout_mask_bytes(),
                4 * norm_flops());
    gathered_gemm(r, p + ".out_proj.bwd.tp_allgather", p + ".out_proj.dgrad", cat, l,
                  {d_.tokens(), d_.o(), d_.h});
    wgrad_gemm(r, p + ".out_proj.wgrad", cat, l, d_.o(), d_.h, d_.tokens());
    attention(r, p + ".attn.bwd", cat, l, true);
    rotary(r, p + ".rope.bwd", l);
    gemm(r, p + ".qkv.dgrad", cat, l, d_.tokens(), d_.h, d_.qkv_n());
    const std::optional<OpId> reduce = async_tp_reduce(r, p + ".qkv.bwd.tp_reduce", l);
    wgrad_gemm(r, p + ".qkv.wgrad", cat, l, d_.h, d_.qkv_n(), d_.tokens());
    finish_tp_reduce(r, reduce, p + ".qkv.bwd.tp_reduce", l);
    return elementwise(r, p + ".ln1.bwd", cat, l, 3 * residual_bytes(), 2 * norm_flops());
  }

  // `recv`: without an earlier op to prefetch after, the reload waits for the gradient
  // arriving from the next pipeline stage.
  OpId layer_backward(Rank& r, int mb, int l, Fetch& fetch, std::optional<OpId> act_after,
                      std::optional<SendKey> recv) {
    const LayerPolicy& lp = policies_[l];
    const std::string p = pfx(mb, l);

    std::vector<OpId> wait = fetch.wait;
    const std::vector<TensorId> reloaded = reload_activations(r, mb, l, p, act_after, recv, wait);

    std::vector<OpId> ops;
    const auto first_op = [&](OpId op) {
      if (ops.empty()) {
        for (OpId w : wait) b_.op_at(op).deps.push_back(w);
        r.layer_first_bwd[{mb, l}] = op;
      }
      ops.push_back(op);
      return op;
    };

    const std::int64_t recomputed = lp.acts.recomputed_bytes(ld(l));
    std::optional<TensorId> recomp_t;
    const auto rc_op = [&](OpId op) {
      first_op(op);
      if (!recomp_t && recomputed > 0) {
        // Re-created for this layer's backward only: a transient, not a saved activation.
        recomp_t = tensor(r.hbm, p + ".recomputed", recomputed, TensorCategory::kTransients);
        b_.op_at(op).allocs.push_back(*recomp_t);
      }
    };
    recompute_forward(r, p, l, rc_op);

    first_op(elementwise(r, p + ".res2.bwd", OpCategory::kCompute, l,
                         2 * residual_bytes() + dropout_mask_bytes(),
                         static_cast<double>(d_.tokens() * d_.h / d_.sp)));
    ffn_backward(r, p, l);
    const OpId last = attention_backward(r, p, l);
    const TensorId saved_hbm = r.saved.at({mb, l}).hbm;
    sim::Op& lo = b_.op_at(last);
    if (saved_hbm.valid()) lo.frees.push_back(saved_hbm);
    for (TensorId t : reloaded) lo.frees.push_back(t);
    if (recomp_t) lo.frees.push_back(*recomp_t);
    for (TensorId buf : fetch.buffers) lo.frees.push_back(buf);
    if (!s_.training.gradient_accumulation_fusion) {
      const std::int64_t experts = r.expert_group_of_layer.count(l) != 0
                                       ? r.groups[r.expert_group_of_layer.at(l)].params
                                       : 0;
      grad_accumulation(r, p + ".grad_accum", l, group(r, l).params + experts);
      grads_done(r, l, mb, last_compute_);
      return last_compute_;
    }
    grads_done(r, l, mb, last);
    return last;
  }

  // --- mixture of experts -------------------------------------------------------------------

  // A grouped GEMM over the rank's local experts: the most-loaded expert with max_rows rows and
  // the others sharing the rest evenly; `shape(rows)` gives one expert's GEMM for `rows` token
  // rows. Its plan shape is the mean expert's, batched over the local experts.
  template <class Shape>
  OpId grouped_gemm(Rank& r, const std::string& name, OpCategory cat, int layer,
                    const LayerDims& md, Shape shape) {
    const std::int64_t n = md.local_experts;
    std::vector<sim::GemmShape> groups;
    sim::GemmShape top = shape(md.max_rows);
    top.batch = 1;
    top.dtype = gdtype_;
    groups.push_back(top);
    if (n > 1) {
      sim::GemmShape rest =
          shape(ceil_div(std::max<std::int64_t>(md.routed - md.max_rows, 0), n - 1));
      rest.batch = n - 1;
      rest.dtype = gdtype_;
      groups.push_back(rest);
    }
    sim::OpSizes sz;
    sz.gemm = shape(ceil_div(md.routed, n));
    sz.gemm.batch = n;
    sz.gemm.dtype = gdtype_;
    sz.gemm.grouped = true;
    for (const sim::GemmShape& g : groups) {
      sz.flops += 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) *
                  static_cast<double>(g.k) * static_cast<double>(g.batch);
    }
    return add(r, r.compute, name, OpKind::kGemm, cat, layer, cm_.grouped_gemm(r.rank, groups), sz);
  }

  // Host-resident expert weights of layer l for one pass: {bytes prefetched with the layer,
  // bytes the forward fetches after its router} (OffloadPolicy::expert_fetch, formulas.h
  // expert_fetch_counts). The backward (`forward` false) knows the routing from the forward
  // and prefetches the experts it fetched.
  std::pair<std::int64_t, std::int64_t> moe_expert_fetch_bytes(const Rank& r, int layer,
                                                               bool forward) const {
    const auto it = r.expert_group_of_layer.find(layer);
    if (it == r.expert_group_of_layer.end()) return {0, 0};
    const std::int64_t all = r.groups[it->second].mem.params_bytes;
    const std::int64_t local = std::max<std::int64_t>(1, ld(layer).local_experts);
    const std::int64_t one = all / local;
    if (xfetch_.fetched >= local && xfetch_.after_router == 0) return {all, 0};
    if (!forward) return {xfetch_.fetched * one, 0};
    return {xfetch_.with_layer * one, xfetch_.after_router * one};
  }

  // Router-aware expert fetch (offload.experts.fetch routed): the H2D of the picked experts
  // that were not prefetched, issued once the router's top-k is known (MoE-Infinity's and
  // fMoE's on-demand fetch; with a predictor, Pre-gated MoE's and ProMoE's misses) into a
  // buffer sized for them, freed with the layer's other fetched weights.
  OpId moe_routed_fetch(Rank& r, const std::string& p, int l, OpId topk, Fetch& fetch) {
    const TensorId buf =
        tensor(r.hbm, p + ".experts.routed_in", fetch.routed_bytes, TensorCategory::kBuffers);
    const OpId c = copy(r, sim::CopyDirection::kH2D, p + ".experts.routed_h2d",
                        OpCategory::kOffload, l, fetch.routed_bytes, {topk});
    b_.op_at(c).allocs.push_back(buf);
    fetch.buffers.push_back(buf);
    return c;
  }

  // Token dispatch / combine over the expert-parallel group: each rank sends its tokens' top_k
  // copies (the all-to-all's (ep-1)/ep leave the rank) and the most-loaded rank receives its
  // experts' rows; the slower of the two sets the collective. On the compute stream, as
  // Megatron-Core's all-to-all token dispatcher runs it.
  std::int64_t alltoall_bytes(const LayerDims& md) const {
    const std::int64_t send = md.moe_tokens * md.top_k * md.h * md.e;
    const std::int64_t recv = md.routed / md.etp * md.h * md.e;
    return std::max(send, recv);
  }

  // The MoE FFN forward of layer l (after the second norm): router, dispatch, the experts'
  // grouped GEMMs, combine, and the shared experts. `emit` sees every compute-lane op.
  // Dropless routing (Megatron-Core's token dispatchers) synchronises the host with the compute
  // stream once, after the first permutation: the marker ".moe.host_sync" on the host lane
  // waits for it plus the device-to-host round trip, and the host issues the next kernel only
  // then (host_issue_open/close), so the GPU waits for the launch queue's refill.
  // With moe_shared_expert_overlap the shared experts run on their own stream from the
  // permutation on, and the unpermutation waits for them.
  // `fetch` (the forward's): its routed_bytes of expert weights come in after the router.
  template <class Emit>
  void moe_forward(Rank& r, const std::string& p, OpCategory cat, int l, Emit&& emit,
                   const std::string& sfx = ".fwd", Fetch* fetch = nullptr) {
    const LayerDims& md = ld(l);
    const std::int64_t t = md.moe_tokens;
    const std::int64_t assigned = t * md.top_k;
    emit(gemm(r, p + ".router" + sfx, cat, l, t, md.experts, md.h));
    next_host_ops(14, false);
    const OpId topk =
        emit_id(emit, elementwise(r, p + ".router.topk" + sfx, cat, l, t * md.experts * 8,
                                  static_cast<double>(5 * t * md.experts)));
    std::optional<OpId> weights_in;
    if (fetch != nullptr && fetch->routed_bytes > 0)
      weights_in = moe_routed_fetch(r, p, l, topk, *fetch);
    next_host_ops(20, false);
    const OpId permute = emit_id(
        emit, elementwise(r, p + ".moe.permute" + sfx, cat, l, 2 * assigned * md.h * md.e, 0.0));
    const bool overlap = s_.parallelism.moe_shared_expert_overlap && md.fs > 0;
    std::optional<OpId> shared_done;
    if (overlap) shared_done = moe_shared_forward_side(r, p, cat, l, sfx, permute);
    // The host issues nothing more until the counts are on the CPU: the segment up to the
    // permutation ends, then the synchronisation waits for the permutation and the copy.
    host_issue_close(/*force=*/true);
    sim::OpCost round_trip;
    round_trip.latency = cm_.host_sync_latency();
    const OpId sync = add(r, r.issue, p + ".moe.host_sync" + sfx, OpKind::kMarker,
                          OpCategory::kNone, l, round_trip, {}, {permute});
    host_wait_ = sync;
    host_behind_ = true;
    std::vector<OpId> after;
    const auto emit_after = [&](OpId id) {
      if (after.empty()) b_.op_at(id).deps.push_back(sync);
      after.push_back(id);
      emit(id);
    };
    moe_routed_forward(r, p, cat, l, sfx, emit_after, weights_in);
    // Unpermute: read the top_k expert outputs and their weights, write the token sum.
    next_host_ops(3, false);
    const OpId unpermute =
        elementwise(r, p + ".moe.unpermute" + sfx, cat, l, (assigned + t) * md.h * md.e,
                    static_cast<double>(2 * assigned * md.h));
    if (shared_done) b_.op_at(unpermute).deps.push_back(*shared_done);
    emit_after(unpermute);
    if (md.fs > 0 && !overlap) moe_shared_forward(r, p, cat, l, sfx, emit_after);
  }

  template <class Emit>
  static OpId emit_id(Emit& emit, OpId id) {
    emit(id);
    return id;
  }

  // Dispatch (tokens, then the routing probabilities, as two all-to-alls: Megatron-Core's
  // MoEAlltoAllTokenDispatcher.dispatch_all_to_all), the experts' grouped GEMMs, combine.
  // `weights_in`: the router-aware expert fetch the first grouped GEMM waits for.
  template <class Emit>
  void moe_routed_forward(Rank& r, const std::string& p, OpCategory cat, int l,
                          const std::string& sfx, Emit&& emit,
                          std::optional<OpId> weights_in = std::nullopt) {
    const LayerDims& md = ld(l);
    const std::int64_t g = md.gated ? 2 : 1;
    if (md.ep > 1) {
      next_host_ops(2, false);
      emit(collective(r, r.compute, p + ".moe.dispatch.alltoall" + sfx, OpCategory::kComm, l,
                      sim::CollectiveKind::kAllToAll, r.ep_group, alltoall_bytes(md)));
      next_host_ops(2, false);
      emit(collective(r, r.compute, p + ".moe.dispatch.probs.alltoall" + sfx, OpCategory::kComm, l,
                      sim::CollectiveKind::kAllToAll, r.ep_group, probs_alltoall_bytes(md)));
    }
    if (md.etp > 1) {
      emit(collective(r, r.compute, p + ".moe.etp_allgather" + sfx, OpCategory::kComm, l,
                      sim::CollectiveKind::kAllGather, r.etp_group, md.routed * md.h * md.e));
    }
    next_host_ops(5, false);
    const OpId fc1 = grouped_gemm(
        r, p + ".experts.fc1.grouped_gemm" + sfx, cat, l, md,
        [&](std::int64_t rows) { return sim::GemmShape{.m = rows, .n = md.fe * g, .k = md.h}; });
    if (weights_in) b_.op_at(fc1).deps.push_back(*weights_in);
    emit(fc1);
    next_host_ops(3, false);
    emit(elementwise(r, p + ".experts.act" + sfx, cat, l, md.routed * md.fe * md.e * (g + 1),
                     static_cast<double>(8 * md.routed * md.fe)));
    next_host_ops(3, false);
    emit(grouped_gemm(r, p + ".experts.fc2.grouped_gemm" + sfx, cat, l, md, [&](std::int64_t rows) {
      return sim::GemmShape{.m = rows, .n = md.h, .k = md.fe};
    }));
    if (md.etp > 1) {
      emit(collective(r, r.compute, p + ".moe.etp_reducescatter" + sfx, OpCategory::kComm, l,
                      sim::CollectiveKind::kReduceScatter, r.etp_group, md.routed * md.h * md.e));
    }
    if (md.ep > 1) {
      next_host_ops(2, false);
      emit(collective(r, r.compute, p + ".moe.combine.alltoall" + sfx, OpCategory::kComm, l,
                      sim::CollectiveKind::kAllToAll, r.ep_group, alltoall_bytes(md)));
    }
  }

  // The shared experts' forward on the compute stream, after the routed experts.
  template <class Emit>
  void moe_shared_forward(Rank& r, const std::string& p, OpCategory cat, int l,
                          const std::string& sfx, Emit&& emit) {
    const LayerDims& md = ld(l);
    const std::int64_t g = md.gated ? 2 : 1;
    if (d_.t > 1 && d_.sp > 1) {
      emit(collective(r, r.compute, p + ".shared.tp_allgather" + sfx, OpCategory::kComm, l,
                      sim::CollectiveKind::kAllGather, r.tp_group, d_.tokens() * d_.h * d_.e));
    }
    emit(gemm(r, p + ".shared.mlpwi" + sfx, cat, l, d_.tokens(), md.fs * g, d_.h));
    emit(elementwise(r, p + ".shared.act" + sfx, cat, l, d_.tokens() * md.fs * d_.e * (g + 1),
                     static_cast<double>(8 * d_.tokens() * md.fs)));
    emit(gemm(r, p + ".shared.mlpwo" + sfx, cat, l, d_.tokens(), d_.h, md.fs));
    if (d_.t > 1) {
      emit(collective(
          r, r.compute, p + ".shared.tp_reduce" + sfx, OpCategory::kComm, l,
          d_.sp > 1 ? sim::CollectiveKind::kReduceScatter : sim::CollectiveKind::kAllReduce,
          r.tp_group, d_.tokens() * d_.h * d_.e));
    }
  }

  // --moe-shared-expert-overlap: the same shared-expert ops on the rank's shared-expert stream,
  // started once the tokens are permuted; they share the SMs with the routed path through the
  // resources. Returns the last, which the unpermutation waits for.
  OpId moe_shared_forward_side(Rank& r, const std::string& p, OpCategory cat, int l,
                               const std::string& sfx, OpId after) {
    std::vector<OpId> side;
    const LaneId saved = r.compute;
    const OpId saved_last = last_compute_;
    r.compute = r.moe_shared;
    moe_shared_forward(r, p, cat, l, sfx, [&](OpId id) { side.push_back(id); });
    r.compute = saved;
    last_compute_ = saved_last;
    b_.op_at(side.front()).deps.push_back(after);
    return side.back();
  }

  std::int64_t probs_alltoall_bytes(const LayerDims& md) const {
    return md.moe_tokens * md.top_k * 4;  // fp32 probabilities of the routed copies
  }

  // The MoE FFN backward: shared experts, then combine's gradient back to the experts, their
  // data- and weight-gradient grouped GEMMs, and the dispatch's gradient back to the tokens.
  void moe_backward(Rank& r, const std::string& p, OpCategory cat, int l) {
    const LayerDims& md = ld(l);
    const std::int64_t g = md.gated ? 2 : 1;
    const std::int64_t t = md.moe_tokens;
    const std::int64_t assigned = t * md.top_k;
    if (md.fs > 0) {
      tp_gather(r, p + ".shared.bwd.tp_allgather", OpCategory::kComm, l);
      gemm(r, p + ".shared.mlpwo.dgrad", cat, l, d_.tokens(), md.fs, d_.h);
      wgrad_gemm(r, p + ".shared.mlpwo.wgrad", cat, l, md.fs, d_.h, d_.tokens());
      elementwise(r, p + ".shared.act.bwd", cat, l, d_.tokens() * md.fs * d_.e * (2 * g + 1),
                  static_cast<double>(10 * d_.tokens() * md.fs));
      gemm(r, p + ".shared.mlpwi.dgrad", cat, l, d_.tokens(), d_.h, md.fs * g);
      wgrad_gemm(r, p + ".shared.mlpwi.wgrad", cat, l, d_.h, md.fs * g, d_.tokens());
      tp_reduce(r, p + ".shared.bwd.tp_reduce", OpCategory::kComm, l);
    }
    next_host_ops(3, true);
    elementwise(r, p + ".moe.unpermute.bwd", cat, l, (2 * assigned + t) * md.h * md.e,
                static_cast<double>(2 * assigned * md.h));
    if (md.ep > 1) {
      next_host_ops(2, true);
      collective(r, r.compute, p + ".moe.combine.alltoall.bwd", OpCategory::kComm, l,
                 sim::CollectiveKind::kAllToAll, r.ep_group, alltoall_bytes(md));
    }
    if (md.etp > 1) {
      collective(r, r.compute, p + ".moe.etp_allgather.bwd", OpCategory::kComm, l,
                 sim::CollectiveKind::kAllGather, r.etp_group, md.routed * md.h * md.e);
    }
    next_host_ops(2, true);
    grouped_gemm(r, p + ".experts.fc2.grouped_gemm.dgrad", cat, l, md, [&](std::int64_t rows) {
      return sim::GemmShape{.m = rows, .n = md.fe, .k = md.h};
    });
    next_host_ops(2, true);
    grouped_gemm(r, p + ".experts.fc2.grouped_gemm.wgrad", cat, l, md, [&](std::int64_t rows) {
      return sim::GemmShape{.m = md.fe, .n = md.h, .k = rows};
    });
    next_host_ops(3, true);
    elementwise(r, p + ".experts.act.bwd", cat, l, md.routed * md.fe * md.e * (2 * g + 1),
                static_cast<double>(10 * md.routed * md.fe));
    next_host_ops(4, true);
    grouped_gemm(r, p + ".experts.fc1.grouped_gemm.dgrad", cat, l, md, [&](std::int64_t rows) {
      return sim::GemmShape{.m = rows, .n = md.h, .k = md.fe * g};
    });
    next_host_ops(2, true);
    grouped_gemm(r, p + ".experts.fc1.grouped_gemm.wgrad", cat, l, md, [&](std::int64_t rows) {
      return sim::GemmShape{.m = md.h, .n = md.fe * g, .k = rows};
    });
    if (md.etp > 1) {
      collective(r, r.compute, p + ".moe.etp_reducescatter.bwd", OpCategory::kComm, l,
                 sim::CollectiveKind::kReduceScatter, r.etp_group, md.routed * md.h * md.e);
    }
    if (md.ep > 1) {
      next_host_ops(2, true);
      collective(r, r.compute, p + ".moe.dispatch.alltoall.bwd", OpCategory::kComm, l,
                 sim::CollectiveKind::kAllToAll, r.ep_group, alltoall_bytes(md));
      next_host_ops(2, true);
      collective(r, r.compute, p + ".moe.dispatch.probs.alltoall.bwd", OpCategory::kComm, l,
                 sim::CollectiveKind::kAllToAll, r.ep_group, probs_alltoall_bytes(md));
    }
    next_host_ops(3, true);
    elementwise(r, p + ".moe.permute.bwd", cat, l, 2 * assigned * md.h * md.e, 0.0);
    next_host_ops(9, true);
    elementwise(r, p + ".router.topk.bwd", cat, l, t * md.experts * 8,
                static_cast<double>(5 * t * md.experts));
    gemm(r, p + ".router.dgrad", cat, l, t, md.h, md.experts);
    wgrad_gemm(r, p + ".router.wgrad", cat, l, md.h, md.experts, t);
  }

  // Bytes of a host-resident gradient's D2H copy at the last micro-batch. DeepSpeed's
  // ZeRO-Offload widens the gradient to the master dtype on the GPU before the copy
  // (stage_1_and_2.py, async_inplace_copy_grad_to_fp32_buffer_from_gpu), so fp32 crosses the
  // link. (Earlier micro-batches' accumulation copies, async_accumulate_grad_in_cpu_via_gpu, are
  // modelled as the gradient in its own dtype.)
  std::int64_t grads_d2h_bytes(const ParamGroup& g) const {
    if (!deepspeed_cpu_step(g) && !superoffload(g)) return g.mem.grads_bytes;
    const std::int64_t widened = g.mem.grads_bytes / sim::dtype_bytes(dt_.grads) *
                                 sim::dtype_bytes(dt_.master.value_or(dt_.params));
    if (!zenflow(g)) return widened;
    // ZenFlow runs DeepSpeed's gradient accumulation over update_interval steps (engine.py sets
    // gradient_accumulation_steps to it): every step copies the gradient to the host in its own
    // dtype (async_accumulate_grad_in_cpu_via_gpu) and the last one also the fp32 widening
    // (async_inplace_copy_grad_to_fp32_buffer_from_gpu): the mean over the interval.
    return g.mem.grads_bytes + widened / zenflow_interval();
  }
  // ZenFlow's accumulation brings the host's running sum back to the GPU before adding the new
  // gradient to it, on every step of the interval but its first: the mean over the interval.
  std::int64_t zenflow_grads_h2d_bytes(const ParamGroup& g) const {
    if (!zenflow(g)) return 0;
    const int n = zenflow_interval();
    return g.mem.grads_bytes * (n - 1) / n;
  }

  // The routed experts' gradients after the last micro-batch: reduced over the expert-DP group
  // (reduce-scatter under the distributed optimizer), and D2H when they live on the host.
  void expert_grads_done(Rank& r, int layer, int mb, OpId last) {
    if (mb != micro_batches_ - 1) return;
    ParamGroup& g = r.groups[r.expert_group_of_layer.at(layer)];
    OpId after = last;
    if (edp() > 1) {
      const bool reduce_scatter = dp_sharding(s_.parallelism).optimizer;
      after = collective(
          r, r.comm,
          fmt::format("mb{}.{}.grad_{}", lbl(mb), g.name,
                      reduce_scatter ? "reducescatter" : "allreduce"),
          OpCategory::kComm, layer,
          reduce_scatter ? sim::CollectiveKind::kReduceScatter : sim::CollectiveKind::kAllReduce,
          r.edp_group, g.params * sim::dtype_bytes(dt_.reduce_scatter), {last});
      if (!s_.parallelism.overlap_grad_reduce) deferred_reduce_.push_back(after);
    }
    if (g.grads_on_host) {
      after = copy(r, sim::CopyDirection::kD2H, fmt::format("mb{}.{}.grads_d2h", lbl(mb), g.name),
                   OpCategory::kOffload, layer, grads_d2h_bytes(g), {after});
    }
    r.expert_reduce_op[layer] = after;
  }

  // After a group's gradients of micro-batch `mb` are computed: data-parallel reduction
  // (bucketed per layer, overlapped on the comm lane) and, for host-resident gradients, D2H.
  // key: layer, -1 embedding, -2 head.
  void grads_done(Rank& r, int key, int mb, OpId last) {
    ParamGroup* gp = nullptr;
    for (ParamGroup& g : r.groups) {
      if (g.expert) continue;
      if (g.reduce_key() == key) gp = &g;
    }
    if (key >= 0 && r.expert_group_of_layer.count(key) != 0) expert_grads_done(r, key, mb, last);
    if (gp == nullptr) return;
    const bool last_mb = mb == micro_batches_ - 1;
    // The layer's gradient as accumulated, and as it goes on the wire.
    const std::int64_t full = gp->params * sim::dtype_bytes(dt_.grads);
    const std::int64_t wire = gp->params * sim::dtype_bytes(dt_.reduce_scatter);
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
      const bool reduce_scatter = dp_sharding(s_.parallelism).optimizer;
      after = collective(
          r, r.comm,
          fmt::format("mb{}.{}.grad_{}", lbl(mb), gp->name,
                      reduce_scatter ? "reducescatter" : "allreduce"),
          OpCategory::kComm, gp->layer,
          reduce_scatter ? sim::CollectiveKind::kReduceScatter : sim::CollectiveKind::kAllReduce,
          r.dp_group, wire, {last});
      if (buf) b_.op_at(after).frees.push_back(*buf);
      // Not overlapped: reduced once the whole backward is done, so the collective also waits
      // for the rank's last backward op, known only at the end (patched in optimizer()).
      if (!s_.parallelism.overlap_grad_reduce) deferred_reduce_.push_back(after);
    }
    if (gp->grads_on_host && last_mb && zenflow_grads_h2d_bytes(*gp) > 0) {
      after = copy(r, sim::CopyDirection::kH2D, fmt::format("{}.zenflow.grad_accum_h2d", gp->name),
                   OpCategory::kOffload, gp->layer, zenflow_grads_h2d_bytes(*gp), {after});
    }
    if (gp->grads_on_host && (shard_grads() || last_mb)) {
      after = copy(r, sim::CopyDirection::kD2H, fmt::format("mb{}.{}.grads_d2h", lbl(mb), gp->name),
                   OpCategory::kOffload, gp->layer,
                   last_mb ? grads_d2h_bytes(*gp) : gp->mem.grads_bytes, {after});
    }
    if (last_mb) r.reduce_op[key] = after;
  }

  // --- optimizer ----------------------------------------------------------------------------

  // DeepSpeed ZeRO-Offload (offload.cpu.step flat_partition, set by the zero_offload preset)
  // updates on the host, with the fp32 master there.
  bool deepspeed_cpu_step(const ParamGroup& g) const {
    return g.opt_on_host && s_.offload.optimizer_on_cpu && !s_.offload.superoffload.enabled &&
           s_.offload.cpu_step == OffloadPolicy::CpuStep::kFlatPartition &&
           !(g.master_on_hbm && g.mem.master_bytes > 0);
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
  std::int64_t optimizer_shard(const ParamGroup& g) const {
    const int gdp = g.expert ? edp() : dp();
    return dp_sharding(s_.parallelism).optimizer ? ceil_div(g.params, gdp) : g.params;
  }
  CostModel::CpuThreads cpu_threads() const {
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
  std::optional<OpId> deepspeed_flat_step(Rank& r) {
    std::int64_t shard = 0;
    std::int64_t h2d = 0;
    std::vector<OpId> deps;
    for (const auto& [key, op] : r.reduce_op) deps.push_back(op);
    for (const auto& [key, op] : r.expert_reduce_op) deps.push_back(op);
    const std::int64_t master = sim::dtype_bytes(dt_.master.value_or(dt_.params));
    for (const ParamGroup& g : r.groups) {
      if (!deepspeed_cpu_step(g)) continue;
      const std::int64_t n = optimizer_shard(g);
      shard += n;
      if (!g.params_on_host) h2d += n * sim::dtype_bytes(dt_.params);
      if (!g.grads_on_host) {
        deps.push_back(copy(r, sim::CopyDirection::kD2H, g.name + ".grads_d2h",
                            OpCategory::kOffload, g.layer, n * master, {}));
      }
    }
    if (shard == 0) return std::nullopt;
    if (s_.offload.zenflow.enabled) return zenflow_step(r, shard, h2d, std::move(deps));
    sim::OpSizes sz;
    sz.bytes = cpu_step_bytes_per_param(dt_, false) * shard;
    sz.flops = cpu_step_flops_per_param(false) * static_cast<double>(shard);
    OpId done = add(r, r.cpu, "partition.adam.cpu", OpKind::kHostCompute, OpCategory::kCpuOptimizer,
                    -1, cm_.host_compute(r.rank, sz.bytes, sz.flops, cpu_threads()), sz, deps);
    if (h2d > 0) {
      done = copy(r, sim::CopyDirection::kH2D, "partition.params_h2d", OpCategory::kOffload, -1,
                  h2d, {done});
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
  std::optional<OpId> zenflow_topk_update(Rank& r, std::vector<OpId> deps) {
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
  std::int64_t zenflow_selected(const Rank& r) const {
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
  std::optional<OpId> zenflow_step(Rank& r, std::int64_t shard, std::int64_t h2d,
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
      add(r, r.cpu, "partition.zenflow_adam.worker", OpKind::kHostCompute,
          OpCategory::kCpuOptimizer, -1, cm_.host_compute(r.rank, w.bytes, w.flops, worker), w, {});
      const std::int64_t master = sim::dtype_bytes(dt_.master.value_or(dt_.params));
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
      done = add(r, r.cpu, "partition.zenflow_adam.cpu", OpKind::kHostCompute,
                 OpCategory::kCpuOptimizer, -1, cm_.host_compute(r.rank, sz.bytes, sz.flops, main),
                 sz, std::move(deps));
    }
    if (h2d > 0) {
      done = copy(r, sim::CopyDirection::kH2D, "partition.zenflow.params_h2d", OpCategory::kOffload,
                  -1, h2d / n, {done});
    }
    return done;
  }

  // The CPU update of one group (Megatron's HybridDeviceOptimizer, FSDP CPU offload), layer by
  // layer, and its copy back to the GPU.
  OpId cpu_group_step(Rank& r, ParamGroup& g, std::vector<OpId> deps, bool& started) {
    const std::int64_t shard = optimizer_shard(g);
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
    if (!g.grads_on_host) {
      deps = {copy(r, sim::CopyDirection::kD2H, g.name + ".grads_d2h", OpCategory::kOffload,
                   g.layer, shard * sim::dtype_bytes(dt_.grads), deps)};
    }
    // Megatron's HybridDeviceOptimizer keeps the fp32 master on the GPU and updates a pinned
    // host clone of it (see hdo_step_bytes_per_param); FSDP's master lives on the host.
    const bool hdo = g.master_on_hbm && g.mem.master_bytes > 0;
    sim::OpSizes sz;
    sz.bytes = (hdo ? hdo_step_bytes_per_param(dt_) : cpu_step_bytes_per_param(dt_, true)) * shard;
    sz.flops =
        (hdo ? kAdamFlopsPerParam : cpu_step_flops_per_param(true)) * static_cast<double>(shard);
    OpId done = add(r, r.cpu, g.name + ".adam.cpu", OpKind::kHostCompute, OpCategory::kCpuOptimizer,
                    g.layer, cm_.host_compute(r.rank, sz.bytes, sz.flops, cpu_threads()), sz, deps);
    if (!g.params_on_host) {
      // HybridDeviceOptimizer copies the updated fp32 master back into the GPU's main
      // parameter (the distributed optimizer then casts it to the model parameter on the
      // GPU, a pass of a few milliseconds not modelled); the others copy the narrowed one.
      const std::int64_t bytes =
          shard * sim::dtype_bytes(hdo ? dt_.master.value_or(dt_.params) : dt_.params);
      done = copy(r, sim::CopyDirection::kH2D, g.name + (hdo ? ".master_h2d" : ".params_h2d"),
                  OpCategory::kOffload, g.layer, bytes, {done});
    }
    return done;
  }

  // The update of one group on the GPU, with its states streamed in and out when they live on
  // the host.
  OpId gpu_group_step(Rank& r, ParamGroup& g, std::vector<OpId> deps) {
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
    sz.bytes = adam_bytes_per_param(dt_) * shard;
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

  // SuperOffload's sub-groups (superoffload_stage3.py, _create_fp16_sub_groups, and ZeRO-3's
  // _create_fp32_partitions): the rank's partition is cut, in parameter order, into sub-groups
  // that close once they reach sub_group_size elements, and sub-group i stays on the GPU when
  // i < int((1 - ratio) · N). Here a parameter group stays on the GPU when its first element
  // falls within those first sub-groups: its fp32 master, moments and gradients are allocated
  // on the HBM and it updates with the GPU optimizer. These are the groups the backward reaches
  // last, so the CPU has no update left to start once the backward ends (the "tail buckets" n').
  void superoffload_placement(Rank& r) {
    const OffloadPolicy::SuperOffload& so = s_.offload.superoffload;
    if (!so.enabled || !s_.offload.optimizer_on_cpu) return;
    std::int64_t partition = 0;
    for (const ParamGroup& g : r.groups) {
      if (g.opt_on_host) partition += optimizer_shard(g);
    }
    const std::int64_t sub_groups =
        std::max<std::int64_t>(1, ceil_div(partition, so.sub_group_size));
    const auto on_gpu =
        static_cast<std::int64_t>((1.0 - so.ratio) * static_cast<double>(sub_groups));
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
  void superoffload_step(Rank& r) {
    superoffload_done_.clear();
    superoffload_waited_.reset();
    CostModel::CpuThreads worker = cpu_threads();
    worker.core_fraction = s_.offload.superoffload.cpuadam_cores_perc;
    const CostModel::CpuThreads main = cpu_threads();
    const std::int64_t master = sim::dtype_bytes(dt_.master.value_or(dt_.params));
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
      prev = copy(r, sim::CopyDirection::kH2D, g.name + ".params_h2d", OpCategory::kOffload,
                  g.layer, shard * sim::dtype_bytes(dt_.params), {narrow});
      superoffload_done_[g.name] = prev;
    }
    superoffload_waited_ = *last_update;
  }

  // The op after which a group's updated parameters are on the GPU under SuperOffload: its
  // narrowing copy for a host group; the GPU optimizer, once step() has waited for the
  // worker's updates, for a group kept on the GPU.
  OpId superoffload_done(Rank& r, ParamGroup& g, std::vector<OpId> deps) {
    if (auto it = superoffload_done_.find(g.name); it != superoffload_done_.end()) {
      return it->second;
    }
    if (superoffload_waited_) deps.push_back(*superoffload_waited_);
    return gpu_group_step(r, g, std::move(deps));
  }

  void optimizer(Rank& r) {
    for (OpId reduce : deferred_reduce_) b_.op_at(reduce).deps.push_back(last_compute_);
    deferred_reduce_.clear();
    {
      std::vector<OpId> reduces;
      for (const auto& [key, op] : r.reduce_op) reduces.push_back(op);
      grad_passes(r, reduces);
    }
    const std::optional<OpId> flat = deepspeed_flat_step(r);
    if (s_.offload.superoffload.enabled) superoffload_step(r);
    bool cpu_step_started = false;
    for (ParamGroup& g : r.groups) {
      const int key = g.reduce_key();
      const std::map<int, OpId>& reduced = g.expert ? r.expert_reduce_op : r.reduce_op;
      auto it = reduced.find(key);
      std::vector<OpId> deps;
      if (it != reduced.end()) deps.push_back(it->second);
      const int gdp = g.expert ? edp() : dp();
      OpId done{};
      if (flat && deepspeed_cpu_step(g)) {
        done = *flat;
      } else if (s_.offload.superoffload.enabled) {
        done = superoffload_done(r, g, std::move(deps));
      } else if (g.opt_on_host && s_.offload.optimizer_on_cpu) {
        done = cpu_group_step(r, g, std::move(deps), cpu_step_started);
      } else {
        done = gpu_group_step(r, g, std::move(deps));
      }
      if (gdtype_ == sim::DType::kFp8 && g.layer >= 0) done = fp8_weight_cast(r, g, done);
      // ZeRO-1/2: updated parameter shards are all-gathered for the next step.
      if (gdp > 1 && !shard_params() && dp_sharding(s_.parallelism).optimizer) {
        collective(
            r, r.comm, g.name + ".params_allgather", OpCategory::kComm, g.layer,
            sim::CollectiveKind::kAllGather, g.expert ? r.edp_group : r.dp_group,
            g.params * sim::dtype_bytes(dt_.all_gather) / (zenflow(g) ? zenflow_interval() : 1),
            {done});
      }
    }
  }

  const Scenario& s_;
  const CostModel& cm_;
  sim::PlanBuilder& b_;
  BuiltStep& out_;
  LayerDims d_;
  int layers_per_chunk_ = 1;
  int micro_batches_ = 1;
  int last_label_ = 0;
  sim::DType gdtype_ = sim::DType::kBf16;
  sim::DType adtype_ = sim::DType::kBf16;
  // FP8 (training.fp8_recipe as resolved; Blackwell needs no transposed FP8 copies).
  TrainingConfig::Fp8Recipe fp8_recipe_ = TrainingConfig::Fp8Recipe::kDelayed;
  bool fp8_blackwell_ = false;
  // Set while a gathered GEMM's input was quantized before its all-gather: its GEMMs cast nothing.
  bool fp8_input_cast_ = false;
  ResolvedDtypes dt_;
  std::vector<PoolId> hbm_pools_;
  std::vector<LayerPolicy> policies_;
  std::vector<LayerDims> ldims_;  // per layer (MoE layers carry their expert sizes)
  ExpertFetchCounts xfetch_;      // how host-resident routed experts come back (MoE)
  std::map<SendKey, OpId> sends_;
  std::map<OpId, std::string> recv_names_;  // the display name of each send's receive
  std::vector<std::pair<OpId, SendKey>> pending_recv_;
  std::vector<OpId> deferred_reduce_;  // gradient reductions that wait for the whole backward
  // SuperOffload (superoffload_step): per host group the op that puts its update on the GPU,
  // and the worker's last update, which step() waits for.
  std::map<std::string, OpId> superoffload_done_;
  std::optional<OpId> superoffload_waited_;
  OpId last_compute_;         // the latest op emitted on the current rank's compute lane
  bool static_only_ = false;  // BuildOptions::static_only
  // Cross-lane dependencies of the next compute op (a ring attention's last dK,dV transfer).
  std::vector<OpId> next_compute_deps_;
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
  HostSegment host_seg_;
  std::optional<OpId> host_wait_;  // a synchronisation whose next op is not issued yet
  struct NextHostOps {
    double ops = 1.0;
    bool backward = false;
  };
  std::optional<NextHostOps> next_host_ops_;  // next_host_ops(): for the next issued op only
  bool in_backward_task_ = false;             // building a backward task
  std::optional<OpId> host_prev_first_;       // the first GPU op of the task's previous segment
  double host_prev_gpu_s_ = 0.0;              // that segment's GPU time after its first op
  bool host_behind_ = false;                  // a marker of this task may hold the GPU back
  bool host_one_segment_ = false;             // the optimizer: no cut at layer changes
};

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

LayerPolicy layer_policy(const Scenario& s, const LayerDims& d, int layer) {
  LayerPolicy lp;
  std::set<std::string> named;
  std::array<bool, kNumActs> host{};
  bool any_host_rule = false;
  for (const OffloadRule& r : s.offload.rules) {
    if (!r.layers.contains(layer, s.model.layers, s.parallelism.pp, s.parallelism.virtual_stages)) {
      continue;
    }
    const bool to_host = r.where == Placement::kHost;
    switch (r.cls) {
      case TensorClass::kActivations:
        host.fill(to_host);
        break;
      case TensorClass::kNamedActivation:
        named.insert(r.name);
        for (int a = 0; a < kNumActs; ++a) {
          if (r.name == maxtext_name(static_cast<Act>(a))) host[a] = to_host;
        }
        break;
      case TensorClass::kParams:
        lp.params_on_host = to_host;
        lp.param_prefetch = std::max(1, r.prefetch_layers);
        break;
      case TensorClass::kGrads:
        lp.grads_on_host = to_host;
        break;
      case TensorClass::kOptimizerStates:
        lp.opt_on_host = to_host;
        break;
      case TensorClass::kMasterWeights:
        lp.master_on_host = to_host;
        lp.master_on_hbm = !to_host;
        break;
    }
    if (to_host && (r.cls == TensorClass::kActivations || r.cls == TensorClass::kNamedActivation)) {
      lp.prefetch = any_host_rule ? std::max(lp.prefetch, r.prefetch_layers) : r.prefetch_layers;
      lp.chunk_bytes = r.chunk_bytes;
      any_host_rule = true;
    }
  }
  lp.acts = layer_activations(d, recompute_mode(s.recompute, layer), named);
  for (int a = 0; a < kNumActs; ++a) lp.on_host[a] = lp.acts.saved[a] && host[a];
  return lp;
}
GroupPlacement non_layer_placement(const Scenario& s) {
  GroupPlacement p;
  for (const OffloadRule& r : s.offload.rules) {
    if (r.layers.kind != LayerSelection::Kind::kAll) continue;
    const bool to_host = r.where == Placement::kHost;
    switch (r.cls) {
      case TensorClass::kParams:
        p.params_on_host = to_host;
        break;
      case TensorClass::kGrads:
        p.grads_on_host = to_host;
        break;
      case TensorClass::kOptimizerStates:
        p.opt_on_host = to_host;
        break;
      case TensorClass::kMasterWeights:
        p.master_on_host = to_host;
        p.master_on_hbm = !to_host;
        break;
      default:
        break;
    }
  }
  return p;
}

namespace {

// Model FLOPs (whole job): 3 × forward (forward, activation grad, weight grad) of every layer
// and the LM head, attention counted in full (Megatron/PaLM convention); the hardware FLOPs add
// the recomputed forward ops.
void set_step_flops(const Scenario& s, BuiltStep& out) {
  const LayerDims d = layer_dims(s.model, s.training, ParallelConfig{});
  const double sequences =
      static_cast<double>(s.training.global_batch) / static_cast<double>(s.training.micro_batch);
  double fwd = lm_head_forward_flops(d);
  for (int l = 0; l < s.model.layers; ++l) {
    fwd +=
        s.model.moe.experts > 0
            ? layer_forward_flops(layer_dims(s.model, s.training, ParallelConfig{}, l, true), false)
            : layer_forward_flops(d, false);
  }
  out.model_flops_per_step = 3.0 * fwd * sequences;
  double recompute = 0.0;
  for (int l = 0; l < s.model.layers; ++l) {
    std::set<std::string> named;
    for (const OffloadRule& r : s.offload.rules) {
      if (r.cls == TensorClass::kNamedActivation &&
          r.layers.contains(l, s.model.layers, s.parallelism.pp, s.parallelism.virtual_stages)) {
        named.insert(r.name);
      }
    }
    const LayerDims dl =
        s.model.moe.experts > 0 ? layer_dims(s.model, s.training, ParallelConfig{}, l, true) : d;
    const LayerActivations a = layer_activations(dl, recompute_mode(s.recompute, l), named);
    for (int op = 0; op < kNumFwdOps; ++op) {
      if (a.recompute[op]) recompute += fwd_op_flops(dl, static_cast<FwdOp>(op), false);
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
  out.runtime = runtime_model(s.hardware.runtime, profile.provenance.profile_name,
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

  if (options.micro_batches == 0 && !options.static_only) {
    // The closed-form size is within a few percent of the plan's (plan_size_test): 5% more room
    // keeps the ops and tensors from being moved as the plan grows.
    const PlanSize size = estimate_plan_size(s);
    b.reserve(static_cast<std::size_t>(size.ops * 1.05) + 64,
              static_cast<std::size_t>(size.tensors * 1.05) + 64);
  }
  StepBuilder builder(s, cm, b, out, options);
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
