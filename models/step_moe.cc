// StepBuilder: the MoE FFN (Megatron-Core's all-to-all token dispatcher) from its recipes
// (plan_size.h moe_forward_recipe / moe_backward_recipe): router, dispatch and combine, the
// experts' grouped GEMMs, shared experts, router-aware expert fetch.
#include "models/step_builder_impl.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "sim/plan/shape_math.h"

namespace offsim::models::detail {

// Transformer Engine's compute streams for a grouped linear's per-expert GEMMs
// (transformer_engine/common/util/multi_stream.cpp get_num_compute_streams: 4;
// multi_stream_cublas_gemm in gemm/cublaslt_gemm.cu issues GEMM i on stream i % 4).
constexpr int kTeGroupedGemmStreams = 4;

// A grouped GEMM over the rank's local experts: the most-loaded expert with max_rows rows and
// the others sharing the rest evenly; `shape(rows)` gives one expert's GEMM for `rows` token
// rows. Its plan shape is the mean expert's, batched over the local experts. It runs as
// training.moe_grouped_gemm says (CostModel::grouped_gemm).
template <class Shape>
OpId StepBuilder::grouped_gemm(Rank& r, const std::string& name, OpCategory cat, int layer,
                               const LayerDims& md, bool weight_grad, Shape shape) {
  const std::int64_t n = md.local_experts;
  // FP8: Transformer Engine's GroupedLinear quantizes each expert's bf16 input (forward) or
  // output gradient (dgrad), all routed rows x k, as a dense FP8 GEMM does (gemm_as); the
  // wgrad (`weight_grad`, the recipe entry's pass) reuses them.
  if (gdtype_ == sim::DType::kFp8 && !fp8_input_cast_ && !weight_grad) {
    fp8_cast(r, name, cat, layer, md.routed * shape(md.routed).k, /*from_norm=*/false);
  }
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
  for (const sim::GemmShape& g : groups) sz.flops += sim::gemm_flops(g);
  int streams = 0;
  switch (s_.training.moe_grouped_gemm) {
    case TrainingConfig::MoeGroupedGemm::kMultiStream:
      streams = kTeGroupedGemmStreams;
      break;
    case TrainingConfig::MoeGroupedGemm::kSequential:
      streams = 1;
      break;
    case TrainingConfig::MoeGroupedGemm::kSingleKernel:
      break;
  }
  sim::OpCost cost = cm_.grouped_gemm(r.rank, groups, streams);
  if (gdtype_ == sim::DType::kFp8) cost = cm_.scale_kernel_time(r.rank, cost, fp8_gemm_scale_);
  return add(r, r.compute, name, OpKind::kGemm, cat, layer, std::move(cost), sz);
}

// Host-resident expert weights of layer l for one pass: {bytes prefetched with the layer,
// bytes the forward fetches after its router} (OffloadPolicy::expert_fetch, formulas.h
// expert_fetch_counts). The backward (`forward` false) knows the routing from the forward
// and prefetches the experts it fetched.
std::pair<std::int64_t, std::int64_t> StepBuilder::moe_expert_fetch_bytes(const Rank& r, int layer,
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
OpId StepBuilder::moe_routed_fetch(Rank& r, const std::string& p, int l, OpId topk, Fetch& fetch) {
  const TensorId buf =
      tensor(r.hbm, p + ".experts.routed_in", fetch.routed_bytes, TensorCategory::kBuffers);
  const OpId c = copy(r, sim::CopyDirection::kH2D, p + ".experts.routed_h2d", OpCategory::kOffload,
                      l, fetch.routed_bytes, {topk});
  b_.op_at(c).allocs.push_back(buf);
  fetch.buffers.push_back(buf);
  return c;
}

// Token dispatch / combine over the expert-parallel group: each rank sends its tokens' top_k
// copies (the all-to-all's (ep-1)/ep leave the rank) and the most-loaded rank receives its
// experts' rows; the slower of the two sets the collective. On the compute stream, as
// Megatron-Core's all-to-all token dispatcher runs it.
std::int64_t StepBuilder::alltoall_bytes(const LayerDims& md) const {
  const std::int64_t send = md.moe_tokens * md.top_k * md.h * md.e;
  const std::int64_t recv = md.routed / md.etp * md.h * md.e;
  return std::max(send, recv);
}

OpId StepBuilder::moe_exchange(Rank& r, LaneId lane, const std::string& name, int layer,
                               const LayerDims& md, bool probs, std::vector<OpId> deps) {
  if (s_.parallelism.moe_dispatcher == ParallelConfig::MoeDispatcher::kAllToAll) {
    return collective(r, lane, name, OpCategory::kComm, layer, sim::CollectiveKind::kAllToAll,
                      r.ep_group, probs ? probs_alltoall_bytes(md) : alltoall_bytes(md),
                      std::move(deps));
  }
  // DeepEP and HybridEP: each token with its top-k indices (int64) and weights (fp32); the
  // most-loaded rank's receive side sets the count as for the all-to-all.
  const std::int64_t tokens = probs ? 0 : std::max(md.moe_tokens, md.routed / md.top_k);
  const std::int64_t token_bytes = md.h * md.e + md.top_k * 12;
  const MoeConfig& moe = s_.model.moe;
  const ExpertRouting routing{.experts = md.experts,
                              .top_k = md.top_k,
                              .groups = moe.router_groups,
                              .group_topk = moe.router_group_topk};
  const CostModel::DeepEpTraffic t = cm_.deepep_traffic(r.ep_group, routing);
  const auto kernels = s_.parallelism.moe_dispatcher == ParallelConfig::MoeDispatcher::kHybridEp
                           ? CostModel::EpKernels::kHybridEp
                           : CostModel::EpKernels::kDeepEp;
  sim::OpCost cost = cm_.deepep(r.rank, t, tokens, token_bytes, kernels);
  sim::OpSizes sz;
  sz.bytes =
      static_cast<std::int64_t>(std::llround(static_cast<double>(tokens * token_bytes) *
                                             (t.nvlink_bytes_per_byte + t.nic_bytes_per_byte)));
  sz.collective = {.kind = sim::CollectiveKind::kAllToAll, .group = r.ep_group};
  return add(r, lane, name, OpKind::kCollective, OpCategory::kComm, layer, std::move(cost),
             std::move(sz), std::move(deps));
}

// The MoE FFN forward of layer l (after the second norm): the entries of moe_forward_recipe()
// (plan_size.h) in order. `emit` sees every compute-lane op.
// Dropless routing (Megatron-Core's token dispatchers) synchronises the host with the compute
// stream once, after the first permutation: the marker ".moe.host_sync" on the host lane
// waits for it plus the device-to-host round trip, and the host issues the next kernel only
// then (host_issue_open/close), so the GPU waits for the launch queue's refill.
// With moe_shared_expert_overlap the shared experts run on their own stream from the
// permutation on, and the unpermutation waits for them.
// `fetch` (the forward's): its routed_bytes of expert weights come in after the router's top-k
// and the first grouped GEMM waits for them.
void StepBuilder::moe_forward(Rank& r, const std::string& p, OpCategory cat, int l,
                              const OpSink& emit, const std::string& sfx, Fetch* fetch) {
  const LayerDims& md = ld(l);
  const bool overlap = s_.parallelism.moe_shared_expert_overlap && md.fs > 0;
  OpId weights_in{};  // the routed experts' fetch, when there is one (invalid: none)
  std::optional<OpId> shared_done;
  std::optional<OpId> sync;
  bool synced = false;  // an op after the synchronisation was emitted
  OpId prev{};
  for (const MoeOpEntry& e : moe_forward_recipe()) {
    // The shared experts' side stream starts where the dispatch synchronises, with or without
    // the synchronisation (experts padded to capacity have none).
    const bool sync_point = e.kind == MoeOpKind::kHostSync;
    if (sync_point && overlap) {
      const GraphScope graph(*this, moe_region(e, l), l);
      shared_done = moe_shared_forward_side(r, p, cat, l, sfx, prev);
    }
    if (!moe_entry_runs(e, md) || (e.shared && overlap)) continue;
    const GraphScope graph(*this, moe_region(e, l), l);
    if (e.kind == MoeOpKind::kRoutedFetch) {
      if (fetch != nullptr && fetch->routed_bytes > 0) {
        weights_in = moe_routed_fetch(r, p, l, prev, *fetch);
      }
      continue;
    }
    if (sync_point) {
      sync = moe_host_sync(r, p + "." + e.name + sfx, l, prev);
      if (marks_ != nullptr) pass_marks(l).sync = sync;
      continue;
    }
    if (e.host_ops > 0) next_host_ops(moe_forward_host_ops(e), false);
    const OpId id = moe_op(r, p + "." + e.name + sfx, cat, l, e, false);
    sim::Op& op = b_.op_at(id);
    if (e.kind == MoeOpKind::kGroupedGemm && weights_in.valid()) {
      op.deps.push_back(weights_in);  // the first grouped GEMM
      weights_in = OpId{};
    }
    if (e.traffic == MoeTraffic::kUnpermute && shared_done) op.deps.push_back(*shared_done);
    if (sync && !std::exchange(synced, true)) op.deps.push_back(*sync);
    emit(id);
    prev = id;
  }
}

// The host ops of a forward entry: the permutation's without MoELayer.preprocess's when a
// moe_preprocess graph replays them (one replay more).
double StepBuilder::moe_forward_host_ops(const MoeOpEntry& e) const {
  if (e.traffic != MoeTraffic::kPermute ||
      !s_.training.cuda_graph_modules.has(CudaGraphModule::kMoePreprocess)) {
    return e.host_ops;
  }
  return e.host_ops - kMoePreprocessHostOps + kGraphReplayOps;
}

// The host waits for the permutation (`after`) and the device-to-host copy of the token counts:
// the host issues nothing more until they are on the CPU, so the open segment ends and the
// marker holds the next issued op.
OpId StepBuilder::moe_host_sync(Rank& r, const std::string& name, int l, OpId after) {
  host_issue_close(/*force=*/true);
  sim::OpCost round_trip;
  round_trip.latency = cm_.host_sync_latency();
  const OpId sync =
      add(r, r.issue, name, OpKind::kMarker, OpCategory::kNone, l, round_trip, {}, {after});
  host_wait_ = sync;
  host_behind_ = true;
  return sync;
}

// One entry of the MoE recipes (plan_size.h) on this rank's compute lane: a GEMM's pass, a
// grouped GEMM's, a memory-bound kernel, or a collective over the expert-parallel,
// expert-tensor-parallel or tensor-parallel group.
OpId StepBuilder::moe_op(Rank& r, const std::string& name, OpCategory cat, int l,
                         const MoeOpEntry& e, bool backward) {
  const LayerDims& md = ld(l);
  const std::int64_t tokens = md.tokens() * md.h * md.e;
  switch (e.kind) {
    case MoeOpKind::kGemm: {
      const GemmMnk g = moe_gemm(md, e.gemm, e.pass, 0);
      if (e.pass == GemmPass::kWgrad) return wgrad_gemm(r, name, cat, l, g.m, g.n, g.k);
      return gemm(r, name, cat, l, g.m, g.n, g.k);
    }
    case MoeOpKind::kGroupedGemm:
      return grouped_gemm(r, name, cat, l, md, e.pass == GemmPass::kWgrad, [&](std::int64_t rows) {
        const GemmMnk g = moe_gemm(md, e.gemm, e.pass, rows);
        return sim::GemmShape{.m = g.m, .n = g.n, .k = g.k};
      });
    case MoeOpKind::kAllToAll: {
      if (!a2a_lane_.valid()) return moe_exchange(r, r.compute, name, l, md, e.probs);
      // A combined 1F1B step: on the pass's communication stream, after the compute op that
      // made its input (with delayed weight gradients, the last data-gradient op before them),
      // and the next compute op waits for it.
      const OpId before = last_compute_;
      const OpId id =
          moe_exchange(r, a2a_lane_, name, l, md, e.probs, {a2a_ready_.value_or(before)});
      next_compute_deps_.push_back(id);
      // The previous layer's delayed weight gradients run beside the combine.
      if (backward) flush_delayed_wgrads();
      if (marks_ != nullptr) {
        PassMarks& m = pass_marks(l);
        m.a2a.push_back(id);
        m.before.push_back(before);
        m.after.emplace_back();
      }
      return id;
    }
    case MoeOpKind::kRoutingGather: {
      // HybridEP's all_gather_into_tensor of the boolean routing map (tokens x experts) over the
      // expert-parallel group, on the stream the dispatch runs on.
      const std::int64_t bytes =
          static_cast<std::int64_t>(r.ep_group.size()) * md.moe_tokens * md.experts;
      if (!a2a_lane_.valid()) {
        return collective(r, r.compute, name, OpCategory::kComm, l, sim::CollectiveKind::kAllGather,
                          r.ep_group, bytes);
      }
      return collective(r, a2a_lane_, name, OpCategory::kComm, l, sim::CollectiveKind::kAllGather,
                        r.ep_group, bytes, {a2a_ready_.value_or(last_compute_)});
    }
    case MoeOpKind::kExpertGather:
    case MoeOpKind::kExpertScatter:
      return collective(r, r.compute, name, OpCategory::kComm, l,
                        e.kind == MoeOpKind::kExpertGather ? sim::CollectiveKind::kAllGather
                                                           : sim::CollectiveKind::kReduceScatter,
                        r.etp_group, md.routed * md.h * md.e);
    case MoeOpKind::kSharedGather:
      return collective(r, r.compute, name, OpCategory::kComm, l, sim::CollectiveKind::kAllGather,
                        r.tp_group, tokens);
    case MoeOpKind::kSharedReduce:
      return collective(
          r, r.compute, name, OpCategory::kComm, l,
          md.sp > 1 ? sim::CollectiveKind::kReduceScatter : sim::CollectiveKind::kAllReduce,
          r.tp_group, tokens);
    case MoeOpKind::kHostSync:     // moe_forward
    case MoeOpKind::kRoutedFetch:  // moe_forward
      return last_compute_;
    case MoeOpKind::kElementwise:
      break;
  }
  const Traffic t = moe_elementwise(md, e.traffic, backward);
  return elementwise(r, name, cat, l, t.bytes, t.flops);
}

// Bytes and FLOPs of the MoE FFN's memory-bound kernels (forward, or `backward`): the router's
// top-k over its fp32 logits; the permutation (read and write the top_k copies of the tokens);
// the all-to-all dispatcher's sort of the received rows by local expert and its inverse before
// the combine (read and write each row; the sort moves the rows' fp32 probabilities too:
// Transformer Engine's fused_sort_chunks_by_index(_with_probs), a row-map kernel and a copy
// kernel, the backward one copy back); the experts' and the shared experts' activations (gated:
// reads both halves, its backward writes both gradients); the unpermutation (read the top_k expert
// outputs and their weights, write the token sum; its backward also writes the top_k output
// gradients).
StepBuilder::Traffic StepBuilder::moe_elementwise(const LayerDims& md, MoeTraffic which,
                                                  bool backward) const {
  const std::int64_t g = md.gated ? 2 : 1;
  const std::int64_t t = md.moe_tokens;
  const std::int64_t assigned = t * md.top_k;
  const std::int64_t act_values = backward ? 2 * g + 1 : g + 1;
  const std::int64_t act_flops = backward ? 10 : 8;
  switch (which) {
    case MoeTraffic::kTopk:
      return {t * md.experts * 8, static_cast<double>(5 * t * md.experts)};
    case MoeTraffic::kPermute:
      return {2 * assigned * md.h * md.e, 0.0};
    case MoeTraffic::kSortChunks:  // with the fp32 probabilities
      return {2 * md.routed * (md.h * md.e + 4), 0.0};
    case MoeTraffic::kUnsortChunks:
      return {2 * md.routed * md.h * md.e, 0.0};
    case MoeTraffic::kExpertAct:
      return {md.routed * md.fe * md.e * act_values,
              static_cast<double>(act_flops * md.routed * md.fe)};
    case MoeTraffic::kUnpermute:
      return {((backward ? 2 : 1) * assigned + t) * md.h * md.e,
              static_cast<double>(2 * assigned * md.h)};
    case MoeTraffic::kSharedAct:
      return {md.tokens() * md.fs * md.e * act_values,
              static_cast<double>(act_flops * md.tokens() * md.fs)};
    case MoeTraffic::kNone:
      break;
  }
  return {};
}

// --moe-shared-expert-overlap: the shared-expert entries of the forward recipe on the rank's
// shared-expert stream, started once the tokens are permuted (`after`); they share the SMs with
// the routed path through the resources. Returns the last, which the unpermutation waits for.
OpId StepBuilder::moe_shared_forward_side(Rank& r, const std::string& p, OpCategory cat, int l,
                                          const std::string& sfx, OpId after) {
  std::vector<OpId> side;
  const LaneId saved = r.compute;
  const OpId saved_last = last_compute_;
  r.compute = r.moe_shared;
  for (const MoeOpEntry& e : moe_forward_recipe()) {
    if (!e.shared || !moe_entry_runs(e, ld(l))) continue;
    side.push_back(moe_op(r, p + "." + e.name + sfx, cat, l, e, false));
  }
  r.compute = saved;
  last_compute_ = saved_last;
  b_.op_at(side.front()).deps.push_back(after);
  return side.back();
}

// The MoE FFN backward: the entries of moe_backward_recipe() (plan_size.h) in order.
// With parallelism.delay_wgrad_compute in a combined step (a2a_lane_ set) the experts' grouped
// weight-gradient GEMMs run after their data gradients (Megatron-Core's mlp.backward, then
// mlp.backward_dw, on the compute stream), and the dispatch's all-to-alls back to the tokens
// wait for the data gradients only (the backward_dw records no stream event), so they overlap
// the weight gradients; the shared experts' weight gradients are delayed with the attention
// block's (layer_backward).
void StepBuilder::moe_backward(Rank& r, const std::string& p, OpCategory cat, int l) {
  const LayerDims& md = ld(l);
  const bool delay = s_.parallelism.delay_wgrad_compute && a2a_lane_.valid();
  const bool delay_shared = defers_wgrads(l);
  std::vector<const MoeOpEntry*> delayed;
  for (const MoeOpEntry& e : moe_backward_recipe()) {
    if (!moe_entry_runs(e, md)) continue;
    const GraphScope graph(*this, moe_region(e, l), l);
    if (delay_shared && e.shared && e.kind == MoeOpKind::kGemm && e.pass == GemmPass::kWgrad) {
      // With the attention block's, after the next layer's combine (moe_op flushed the previous
      // layer's at this layer's combine, before the shared experts' backward).
      delayed_wgrads_of(p).emits.emplace_back([this, &r, p, cat, l, &e] {
        if (e.host_ops > 0) next_host_ops(e.host_ops, true);
        return moe_op(r, p + "." + e.name, cat, l, e, true);
      });
      continue;
    }
    if (delay && e.kind == MoeOpKind::kGroupedGemm && e.pass == GemmPass::kWgrad) {
      delayed.push_back(&e);
      continue;
    }
    if (!delayed.empty() && e.kind == MoeOpKind::kAllToAll) {
      a2a_ready_ = last_compute_;
      for (const MoeOpEntry* w : delayed) {
        if (w->host_ops > 0) next_host_ops(w->host_ops, true);
        moe_op(r, p + "." + w->name, cat, l, *w, true);
      }
      delayed.clear();
    }
    if (e.host_ops > 0) next_host_ops(e.host_ops, true);
    moe_op(r, p + "." + e.name, cat, l, e, true);
  }
  a2a_ready_.reset();
}

}  // namespace offsim::models::detail
