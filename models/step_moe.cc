// StepBuilder: the MoE FFN (Megatron-Core's all-to-all token dispatcher): router, dispatch
// and combine, the experts' grouped GEMMs, shared experts, router-aware expert fetch.
#include "models/step_builder_impl.h"

#include <algorithm>

namespace offsim::models::detail {

// A grouped GEMM over the rank's local experts: the most-loaded expert with max_rows rows and
// the others sharing the rest evenly; `shape(rows)` gives one expert's GEMM for `rows` token
// rows. Its plan shape is the mean expert's, batched over the local experts.
template <class Shape>
OpId StepBuilder::grouped_gemm(Rank& r, const std::string& name, OpCategory cat, int layer,
                               const LayerDims& md, Shape shape) {
  const std::int64_t n = md.local_experts;
  // FP8: Transformer Engine's GroupedLinear quantizes each expert's bf16 input (forward) or
  // output gradient (dgrad), all routed rows x k, as a dense FP8 GEMM does (gemm_as); the
  // wgrad reuses them.
  if (gdtype_ == sim::DType::kFp8 && !fp8_input_cast_ && !name.ends_with(".wgrad")) {
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

// The MoE FFN forward of layer l (after the second norm): router, dispatch, the experts'
// grouped GEMMs, combine, and the shared experts. `emit` sees every compute-lane op.
// Dropless routing (Megatron-Core's token dispatchers) synchronises the host with the compute
// stream once, after the first permutation: the marker ".moe.host_sync" on the host lane
// waits for it plus the device-to-host round trip, and the host issues the next kernel only
// then (host_issue_open/close), so the GPU waits for the launch queue's refill.
// With moe_shared_expert_overlap the shared experts run on their own stream from the
// permutation on, and the unpermutation waits for them.
// `fetch` (the forward's): its routed_bytes of expert weights come in after the router.
void StepBuilder::moe_forward(Rank& r, const std::string& p, OpCategory cat, int l,
                              const OpSink& emit, const std::string& sfx, Fetch* fetch) {
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
  const OpId sync = add(r, r.issue, p + ".moe.host_sync" + sfx, OpKind::kMarker, OpCategory::kNone,
                        l, round_trip, {}, {permute});
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

OpId StepBuilder::emit_id(const OpSink& emit, OpId id) {
  emit(id);
  return id;
}

// Dispatch (tokens, then the routing probabilities, as two all-to-alls: Megatron-Core's
// MoEAlltoAllTokenDispatcher.dispatch_all_to_all), the experts' grouped GEMMs, combine.
// `weights_in`: the router-aware expert fetch the first grouped GEMM waits for.
void StepBuilder::moe_routed_forward(Rank& r, const std::string& p, OpCategory cat, int l,
                                     const std::string& sfx, const OpSink& emit,
                                     std::optional<OpId> weights_in) {
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
void StepBuilder::moe_shared_forward(Rank& r, const std::string& p, OpCategory cat, int l,
                                     const std::string& sfx, const OpSink& emit) {
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
OpId StepBuilder::moe_shared_forward_side(Rank& r, const std::string& p, OpCategory cat, int l,
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

// The MoE FFN backward: shared experts, then combine's gradient back to the experts, their
// data- and weight-gradient grouped GEMMs, and the dispatch's gradient back to the tokens.
void StepBuilder::moe_backward(Rank& r, const std::string& p, OpCategory cat, int l) {
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
  grouped_gemm(r, p + ".experts.fc2.grouped_gemm.dgrad", cat, l, md,
               [&](std::int64_t rows) { return sim::GemmShape{.m = rows, .n = md.fe, .k = md.h}; });
  next_host_ops(2, true);
  grouped_gemm(r, p + ".experts.fc2.grouped_gemm.wgrad", cat, l, md,
               [&](std::int64_t rows) { return sim::GemmShape{.m = md.fe, .n = md.h, .k = rows}; });
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

}  // namespace offsim::models::detail
