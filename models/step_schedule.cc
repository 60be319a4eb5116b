// StepBuilder: pipeline schedules (Megatron-LM's 1F1B and interleaved 1F1B), the forward and
// backward tasks they run, parameter and activation prefetch points, offload back-pressure,
// and the pipeline's sends and their receives on the peer stages.
#include "models/step_builder_impl.h"

#include <algorithm>

namespace offsim::models::detail {

namespace {

// Megatron-LM's schedules (megatron/core/pipeline_parallel/schedules.py). `extra`: warm-up
// forwards beyond the schedule's own (one with the combined 1F1B of moe_a2a_overlap, so that the
// forward and the backward of each steady-state step are independent: schedules.py, and
// combined_1f1b_schedule_for_no_pipelining for one stage).
std::vector<Task> pipeline_schedule(int stage, int pp, int v, int m, bool interleaved, int extra) {
  std::vector<Task> tasks;
  if (!interleaved || v == 1) {
    const int warmup = std::min(pp - stage - 1 + extra, m);
    int f = 0;
    int b = 0;
    for (; f < warmup; ++f) tasks.push_back({true, f, 0});
    while (f < m) {
      tasks.push_back({true, f++, 0, true});
      tasks.push_back({false, b++, 0, true});
    }
    while (b < m) tasks.push_back({false, b++, 0});
    return tasks;
  }
  const int total = m * v;
  int warmup = (m == pp) ? total : std::min((pp - stage - 1) * 2 + (v - 1) * pp + extra, total);
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
    tasks[tasks.size() - 2].steady = tasks.back().steady = true;
  }
  for (int i = remaining; i < total; ++i) tasks.push_back(bwd_task(i));
  return tasks;
}

}  // namespace

// The rank's pipeline schedule, task by task; records where each micro-batch (pp = 1) or task
// (pp > 1) begins in the plan.
void StepBuilder::run_schedule(Rank& r) {
  const ParallelConfig& p = s_.parallelism;
  const int stage = r.stage;
  const bool interleaved = p.schedule == ParallelConfig::PipelineSchedule::kInterleaved1F1B;
  const bool combine = p.moe_a2a_overlap;
  const std::vector<Task> tasks = pipeline_schedule(stage, p.pp, p.virtual_stages, micro_batches_,
                                                    interleaved, combine ? 1 : 0);
  // Warm-up forwards: those before the first backward (the steady state's index origin).
  const auto first_bwd =
      std::find_if(tasks.begin(), tasks.end(), [](const Task& t) { return !t.forward; });
  const std::int64_t warmup = first_bwd - tasks.begin();
  std::int64_t forwards = 0;
  std::int64_t backwards = 0;
  std::vector<PassMarks> fmarks;
  std::vector<PassMarks> bmarks;
  OpId before_pair;  // the compute stream's latest op before a combined step
  for (std::size_t k = 0; k < tasks.size(); ++k) {
    const Task& t = tasks[k];
    // moe_a2a_overlap: a forward followed by a backward (the steady state) is one combined step.
    const bool pair_f = combine && t.steady && t.forward;
    const bool pair_b = combine && t.steady && !t.forward;
    // With combined steps a micro-batch's span is a combined step (one forward, the previous
    // micro-batch's backward): the first forward alone is not one.
    if (t.forward && p.pp == 1 && (!combine || t.steady)) {
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
    if (pair_f || pair_b) {
      std::vector<PassMarks>& marks = pair_f ? fmarks : bmarks;
      marks.clear();
      marks_ = &marks;
      a2a_lane_ = pair_f ? r.a2a : r.a2a_b;
    }
    if (pair_f) before_pair = last_compute_;
    if (pair_b) {
      swap_backward_lanes(r);
      // Its backward starts after what ran before the step (its micro-batch's forward).
      if (before_pair.valid()) next_compute_deps_.push_back(before_pair);
    }
    run_task(r, t);
    if (pair_b) {
      swap_backward_lanes(r);
      link_combined(fmarks, bmarks);
      // The next task starts once both passes are done (Megatron waits for both streams).
      if (r.last_compute_b.valid()) next_compute_deps_.push_back(r.last_compute_b);
    }
    marks_ = nullptr;
    a2a_lane_ = LaneId{};
    if (p.pp > 1) {
      pt.op_end = b_.peek().ops.size();
      pt.tensor_end = b_.peek().tensors.size();
      out_.pipeline_tasks.push_back(pt);
    }
  }
}

// A combined step's backward pass on its own lanes (and back): its compute stream, host
// thread, tensor- and context-parallel streams, and the latest op on its compute stream.
void StepBuilder::swap_backward_lanes(Rank& r) {
  std::swap(r.compute, r.compute_b);
  std::swap(r.issue, r.issue_b);
  std::swap(r.tp_lane, r.tp_lane_b);
  std::swap(r.cp_lane, r.cp_lane_b);
  std::swap(last_compute_, r.last_compute_b);
}

// The order Megatron-Core's combined 1F1B step runs the two passes in, layer pair by layer pair
// (model_chunk_schedule_plan.py: forward layer j beside backward layer n-1-j): on the compute
// stream the forward's attention, router and permutation (up to its dispatch), the backward's
// expert MLP (up to its dispatch), the forward's expert MLP, the backward's attention; on the
// communication stream the backward's combine, the forward's dispatch, the backward's dispatch,
// the forward's combine. Each mark waits for the one before it in these orders; what runs
// between them (the forward's unpermutation after its combine, the backward's unpermutation
// before its combine) is left to the streams' own order and shares the SMs. A dense layer is
// one piece in the attention's place. The backward's expert MLP is issued after the forward's
// host synchronisation. Layers left over in one pass run after the pairs.
void StepBuilder::link_combined(const std::vector<PassMarks>& f, const std::vector<PassMarks>& b) {
  const auto wait = [&](std::optional<OpId> op, std::optional<OpId> on) {
    if (op && on) b_.op_at(*op).deps.push_back(*on);
  };
  std::optional<OpId> prev_b_end;      // the previous pair's backward attention
  std::optional<OpId> prev_f_combine;  // the previous forward combine on the stream
  const std::size_t pairs = std::min(f.size(), b.size());
  for (std::size_t j = 0; j < pairs; ++j) {
    const PassMarks& fm = f[j];
    const PassMarks& bm = b[j];
    const bool fmoe = fm.a2a.size() >= 2;
    const bool bmoe = bm.a2a.size() >= 2;
    const std::optional<OpId> f_attn_end = fmoe ? std::optional(fm.before.front()) : fm.last;
    wait(fm.first, prev_b_end);
    std::optional<OpId> f_mlp_end = f_attn_end;
    if (bmoe) {
      wait(bm.after.front(), f_attn_end);
      wait(bm.after.front(), fm.sync);
    }
    if (fmoe) {
      wait(fm.after[fm.a2a.size() - 2], bmoe ? std::optional(bm.before[1]) : std::nullopt);
      f_mlp_end = fm.before.back();
    }
    wait(bmoe ? bm.after.back() : bm.first, f_mlp_end);
    if (fmoe && bmoe) {
      wait(fm.a2a.front(), bm.a2a.front());
      wait(bm.a2a[1], fm.a2a[fm.a2a.size() - 2]);
      wait(fm.a2a.back(), bm.a2a.back());
    }
    if (bmoe) wait(bm.a2a.front(), prev_f_combine);
    if (fmoe) prev_f_combine = fm.a2a.back();
    prev_b_end = bm.last;
  }
  if (f.size() > pairs && !b.empty()) wait(f[pairs].first, b.back().last);
}

sim::Status StepBuilder::build() {
  const ParallelConfig& p = s_.parallelism;
  for (int stage = 0; stage < p.pp; ++stage) {
    OFFSIM_RETURN_IF_ERROR(build_rank(stage));
  }
  link_norm_syncs();
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

// The receive of `send` on a lane of its peer: no work of its own, it ends when the send does.
OpId StepBuilder::receive(OpId send) {
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

std::int64_t StepBuilder::p2p_bytes() const {
  const bool scatter = !s_.parallelism.overlap_p2p_comm && d_.t > 1 && d_.sp == 1;
  return scatter ? ceil_div(residual_bytes(), d_.t) : residual_bytes();
}

// One forward or backward task of the schedule, a pass of its own on the host issue thread.
void StepBuilder::run_task(Rank& r, const Task& t) {
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

std::vector<int> StepBuilder::chunk_layers(int stage, int chunk) const {
  const PipelineLayout::Span span = layout_.span(stage, chunk);
  std::vector<int> ls;
  for (int i = 0; i < span.count; ++i) ls.push_back(span.first + i);
  // A layer-reduced step keeps the chunk's first n - n/2 and last n/2 layers (BuildOptions).
  if (kept_layers_ > 0 && kept_layers_ < span.count) {
    const int tail = kept_layers_ / 2;
    ls.erase(ls.begin() + (kept_layers_ - tail), ls.end() - tail);
  }
  // The multi-token-prediction modules follow the last decoder layer on the loss's chunk.
  if (has_head(stage, chunk)) {
    for (int l = static_cast<int>(s_.model.layers); l < built_layers(s_.model); ++l) {
      ls.push_back(l);
    }
  }
  return ls;
}

void StepBuilder::forward_task(Rank& r, const Task& t) {
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
    if (l >= s_.model.layers) mtp_input_forward(r, t.mb, l);
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
    const HeadOps head = head_forward(r, t.mb);
    note_first(head.first);  // a chunk of the loss alone receives its input here
    last = head.last;
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
    keep_stage_output(r, t, last);
  }
}

// Without deallocate_pipeline_outputs, the chunk's output (the last layer's residual stream,
// b·s·h, sequence-sharded under sequence parallelism) lives from the op that makes it until
// the chunk's backward is done.
void StepBuilder::keep_stage_output(Rank& r, const Task& t, OpId made) {
  if (s_.parallelism.deallocate_pipeline_outputs) return;
  const TensorId out = tensor(r.hbm, fmt::format("mb{}.c{}.stage_output", lbl(t.mb), t.chunk),
                              residual_bytes(), TensorCategory::kActivations);
  b_.op_at(made).allocs.push_back(out);
  r.stage_output[{t.mb, t.chunk}] = out;
}

// The kept output of the chunk (keep_stage_output) is freed with the chunk's backward.
void StepBuilder::release_stage_output(Rank& r, const Task& t, OpId done) {
  const auto kept = r.stage_output.find({t.mb, t.chunk});
  if (kept == r.stage_output.end()) return;
  b_.op_at(done).frees.push_back(kept->second);
  r.stage_output.erase(kept);
}

std::pair<int, int> StepBuilder::next_stage(int stage, int chunk) const {
  if (stage + 1 < s_.parallelism.pp) return {stage + 1, chunk};
  return {0, chunk + 1};
}

std::pair<int, int> StepBuilder::prev_stage(int stage, int chunk) const {
  if (stage > 0) return {stage - 1, chunk};
  return {s_.parallelism.pp - 1, chunk - 1};
}

void StepBuilder::backward_task(Rank& r, const Task& t) {
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
    const HeadOps head = head_backward(r, t.mb);
    note_first(head.first);
    task_first = head.first;
    last = head.last;
  }
  std::vector<OpId> firsts;
  // Parameter fetches (all-gathers, H2D copies) of the backward, in the order PyTorch FSDP's
  // backward_prefetch issues them (ParallelConfig::BackwardPrefetch): layer j's waits for the
  // layer `param_prefetch` steps earlier (its start with kPre, its gradients with kPost) and is
  // queued before that layer's gradient reduction; with kNone it is issued when layer j's own
  // backward is reached, behind the previous layer's reduction.
  // DeepSpeed's 2021 fetch synchronises the device before each module runs, which waits for any
  // prefetch as well: its backward fetches overlap nothing, as with kNone.
  const ParallelConfig::BackwardPrefetch mode =
      s_.parallelism.param_gather == ParallelConfig::ParamGather::kPerTensorSynchronized
          ? ParallelConfig::BackwardPrefetch::kNone
          : s_.parallelism.backward_prefetch;
  std::vector<std::optional<Fetch>> fetches(layers.size());
  const auto fetch_ready = [&](std::size_t j) {  // index of the layer whose hook issues it
    const auto k = static_cast<std::size_t>(std::max(1, policies_[layers[j]].param_prefetch));
    return j >= k ? j - k : 0;
  };
  const auto issue_fetch = [&](std::size_t j, std::optional<OpId> after) {
    fetches[j] = fetch_params(r, layers[j], fmt::format("mb{}.bwd", lbl(t.mb)), after);
  };
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const int l = layers[i];
    if (!fetches[i]) issue_fetch(i, i == 0 ? task_first : firsts[fetch_ready(i)]);
    Fetch& f = *fetches[i];
    const std::optional<OpId> act_after = activation_fetch_after(l, i, firsts, task_first);
    std::optional<SendKey> recv;
    if (!act_after && !has_head(r.stage, t.chunk)) recv = SendKey{false, t.mb, r.stage, t.chunk};
    last = layer_backward(r, t.mb, l, f, act_after, recv, [&](OpId grads_ready) {
      firsts.push_back(r.layer_first_bwd.at({t.mb, l}));
      if (mode == ParallelConfig::BackwardPrefetch::kNone) return;
      for (std::size_t j = i + 1; j < layers.size(); ++j) {
        if (fetches[j] || fetch_ready(j) > i) continue;
        const bool pre = mode == ParallelConfig::BackwardPrefetch::kPre;
        issue_fetch(j, pre ? firsts[fetch_ready(j)] : grads_ready);
      }
    });
    if (l >= s_.model.layers) last = mtp_input_backward(r, t.mb, l);
    note_first(firsts.back());
    if (!task_first) task_first = firsts.front();
  }
  end_backward_task(r, t, last, first && !has_head(r.stage, t.chunk));
  // The chunk's last layer's delayed weight gradients run after its send (Megatron-Core runs
  // them once the pipeline send is issued).
  flush_delayed_wgrads();
}

// Activation prefetch of the i-th layer `l` of a backward task: the H2D of its offloaded tensors
// once the backward of the layer `prefetch` steps earlier has started (`firsts`: the first op
// of each earlier layer's backward).
std::optional<OpId> StepBuilder::activation_fetch_after(int l, std::size_t i,
                                                        const std::vector<OpId>& firsts,
                                                        std::optional<OpId> task_first) const {
  if (i == 0) return task_first;
  if (policies_[l].prefetch == 0) return firsts[i - 1];
  const auto ka = static_cast<std::size_t>(std::max(1, policies_[l].prefetch));
  return i >= ka ? firsts[i - ka] : firsts[0];
}

// The end of a chunk's backward after its layers (`last`: its last op): the embedding's
// backward on the model's first chunk, else the input gradient's send to the previous stage.
// `embedding_only`: the chunk builds no layer and no head (PipelineLayout's embedding slot), so
// the embedding's backward is its first op, which receives the gradient and frees the output.
void StepBuilder::end_backward_task(Rank& r, const Task& t, OpId last, bool embedding_only) {
  if (!embedding_only) release_stage_output(r, t, last);
  if (has_embedding(r.stage, t.chunk)) {
    last = elementwise(r, fmt::format("mb{}.embed.bwd", lbl(t.mb)), OpCategory::kCompute, -1,
                       2 * residual_bytes(), 0.0);
    if (embedding_only) {
      pending_recv_.push_back({last, SendKey{false, t.mb, r.stage, t.chunk}});
      release_stage_output(r, t, last);
    }
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

}  // namespace offsim::models::detail
