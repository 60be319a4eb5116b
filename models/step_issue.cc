// StepBuilder: the framework's host issue thread (see host_issue_open): the host time of
// the ops a rank issues, cut into segments whose markers can hold the GPU back.
#include "models/step_builder_impl.h"

namespace offsim::models::detail {

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
void StepBuilder::host_issue_open(Rank& r, const std::string& first, int layer, bool on_compute) {
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
void StepBuilder::host_issue_note(OpId id, double host_s, double gpu_s, bool on_compute) {
  HostSegment& g = host_seg_;
  out_.host_issue_s += host_s;
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
void StepBuilder::host_issue_close(bool force) {
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
void StepBuilder::host_issue_end_task() {
  host_issue_close();
  graph_last_ = GraphRegion::kNone;
  graph_charged_ = false;
  host_prev_first_.reset();
  host_prev_gpu_s_ = 0.0;
  host_behind_ = false;
}

// The host work of the op being issued: what next_host_ops() set, else one PyTorch op (an
// eager op in the forward, recompute and optimizer, a backward node in a backward task). A
// grouped GEMM adds one cuBLAS launch per local expert (Transformer Engine's
// general_grouped_gemm loops over the GEMMs in C++).
// In a captured module (training.cuda_graph_modules) the module's first issued op costs one
// graph replay and the others nothing: their kernels are launched by the replay.
CostModel::HostOps StepBuilder::take_host_ops(OpCategory category, const sim::OpSizes& sizes) {
  NextHostOps next{.ops = 1.0, .backward = in_backward_task_ && category != OpCategory::kRecompute};
  if (next_host_ops_) next = *next_host_ops_;
  next_host_ops_.reset();
  CostModel::HostOps ops;
  if (captured(graph_region_)) {
    if (std::exchange(graph_charged_, true)) return ops;
    (next.backward ? ops.autograd : ops.eager) = kGraphReplayOps;
    return ops;
  }
  (next.backward ? ops.autograd : ops.eager) = next.ops;
  if (sizes.gemm.grouped) ops.launches = static_cast<double>(sizes.gemm.batch);
  return ops;
}

// --- per-layer CUDA graphs ------------------------------------------------------------------
// Megatron-Core captures a layer's modules separately (TransformerLayer._forward_attention,
// _forward_mlp, an MoE layer's part up to the router, MoELayer.preprocess); a graph's forward and
// backward are each one replay per layer and micro-batch.
bool StepBuilder::captured(GraphRegion region) const {
  const CudaGraphModules& g = s_.training.cuda_graph_modules;
  switch (region) {
    case GraphRegion::kAttn:
      return g.has(CudaGraphModule::kAttn);
    case GraphRegion::kMlp:
      return g.has(CudaGraphModule::kMlp);
    case GraphRegion::kMoeRouter:
      return g.has(CudaGraphModule::kMoeRouter);
    case GraphRegion::kMoe:
      return g.has(CudaGraphModule::kMoe);
    case GraphRegion::kLayer:
      return g.has(CudaGraphModule::kLayer);
    case GraphRegion::kNone:
      break;
  }
  return false;
}

// The attention module runs the input norm, the attention and the first residual add (with the
// second norm, which this recipe fuses into it); a dense layer's MLP module its MLP and the
// second residual add; an MoE layer's second residual add is outside its router's graph and
// inside a whole MoE module's. A whole-layer graph holds every entry of the layer.
// `ffn`: a dense MLP entry; `op`: the forward op the entry computes or differentiates.
StepBuilder::GraphRegion StepBuilder::layer_region(bool ffn, FwdOp op, int l) const {
  if (s_.training.cuda_graph_modules.has(CudaGraphModule::kLayer)) return GraphRegion::kLayer;
  if (ffn) return GraphRegion::kMlp;
  if (op == FwdOp::kRes2) {
    if (!ld(l).moe) return GraphRegion::kMlp;
    return s_.training.cuda_graph_modules.has(CudaGraphModule::kMoe) ? GraphRegion::kMoe
                                                                     : GraphRegion::kNone;
  }
  return GraphRegion::kAttn;
}

// The router's GEMM and top-k, and the shared experts when they run on the compute stream
// before it (not overlapped with the token exchange), are the moe_router graph's.
StepBuilder::GraphRegion StepBuilder::moe_region(const MoeOpEntry& e, int l) const {
  const CudaGraphModules& g = s_.training.cuda_graph_modules;
  if (g.has(CudaGraphModule::kLayer)) return GraphRegion::kLayer;
  if (g.has(CudaGraphModule::kMoe)) return GraphRegion::kMoe;
  const bool shared_overlapped = s_.parallelism.moe_shared_expert_overlap && ld(l).fs > 0;
  if (e.gemm == MoeGemm::kRouter || e.traffic == MoeTraffic::kTopk) return GraphRegion::kMoeRouter;
  if (e.shared && !shared_overlapped) return GraphRegion::kMoeRouter;
  return GraphRegion::kNone;
}

}  // namespace offsim::models::detail
