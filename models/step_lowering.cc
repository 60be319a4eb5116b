// StepBuilder: the lowering of one transformer layer (forward, backward, recompute), its
// attention (flash, ring and all-to-all context parallelism), tensor-parallel collectives and
// their overlap, and the LM head with its loss.
#include "models/step_builder_impl.h"

#include <algorithm>

namespace offsim::models::detail {

// The attention core of one layer on this rank: one kernel, or with context parallelism the
// ring (cp_comm_type p2p) or all-to-all (a2a) form Transformer Engine runs.
OpId StepBuilder::attention(Rank& r, const std::string& name, OpCategory cat, int layer,
                            bool backward) {
  const ParallelConfig& p = s_.parallelism;
  if (p.cp > 1 && p.cp_comm_type == ParallelConfig::CpCommType::kA2A) {
    return ulysses_attention(r, name, cat, layer, backward);
  }
  if (p.cp > 1) return ring_attention(r, name, cat, layer, backward);
  return attention_kernel(r, name, cat, layer, attention_shape(backward, d_.s, d_.a, d_.kvh));
}

sim::AttentionShape StepBuilder::attention_shape(bool backward, std::int64_t seq,
                                                 std::int64_t heads, std::int64_t kv_heads) const {
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

OpId StepBuilder::attention_kernel(Rank& r, const std::string& name, OpCategory cat, int layer,
                                   const sim::AttentionShape& shape, std::vector<OpId> deps) {
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
OpId StepBuilder::ring_attention(Rank& r, const std::string& name, OpCategory cat, int layer,
                                 bool backward) {
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
OpId StepBuilder::cp_transfer(Rank& r, const std::string& name, int layer, std::int64_t bytes,
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
OpId StepBuilder::ulysses_attention(Rank& r, const std::string& name, OpCategory cat, int layer,
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

OpId StepBuilder::rotary(Rank& r, const std::string& name, int layer) {
  if (!rotary_positions()) return last_compute_;
  const std::int64_t elems = d_.tokens() * (d_.q() + d_.kv());
  return elementwise(r, name, OpCategory::kCompute, layer, 2 * elems * d_.e,
                     3.0 * static_cast<double>(elems));
}

// TP collective after a row-parallel GEMM (all-reduce, or reduce-scatter with SP) and before
// a column-parallel GEMM with SP (all-gather). On the compute lane: Megatron runs them on the
// compute stream and the next GEMM needs their result.
void StepBuilder::tp_reduce(Rank& r, const std::string& name, OpCategory cat, int layer) {
  if (d_.t == 1) return;
  const std::int64_t bytes = d_.tokens() * d_.h * d_.e;
  collective(r, r.compute, name, cat, layer,
             d_.sp > 1 ? sim::CollectiveKind::kReduceScatter : sim::CollectiveKind::kAllReduce,
             r.tp_group, bytes);
}

void StepBuilder::tp_gather(Rank& r, const std::string& name, OpCategory cat, int layer) {
  if (d_.t == 1 || d_.sp == 1) return;
  collective(r, r.compute, name, cat, layer, sim::CollectiveKind::kAllGather, r.tp_group,
             d_.tokens() * d_.h * d_.e);
}

// A column-parallel GEMM after the sequence-parallel all-gather of its input (forward), or a
// row-parallel dgrad after the all-gather of the output gradient (backward). tp_comm_overlap:
// Transformer Engine's ring exchange (userbuffers, copy engines): the GEMM on the rank's own
// m/tp rows runs at once while the next chunk comes from the ring neighbour, each of the
// tp − 1 transfers on the TP lane, each chunk's GEMM once its rows are there.
// FP8: Transformer Engine quantizes the rank's own rows (m / sp) before the all-gather, which
// then moves FP8 (1 byte per value); `from_norm`: the input is a norm's output.
OpId StepBuilder::gathered_gemm(Rank& r, const std::string& gather, const std::string& name,
                                OpCategory cat, int layer, GemmDims g, bool from_norm) {
  const bool fp8 = gdtype_ == sim::DType::kFp8;
  if (fp8) fp8_cast(r, name, cat, layer, ceil_div(g.m, d_.sp) * g.k, from_norm);
  fp8_input_cast_ = fp8;
  const OpId out = gathered_gemm_of(r, gather, name, cat, layer, g, fp8 ? 1 : d_.e);
  fp8_input_cast_ = false;
  return out;
}

OpId StepBuilder::gathered_gemm_of(Rank& r, const std::string& gather, const std::string& name,
                                   OpCategory cat, int layer, GemmDims g, std::int64_t elem_bytes) {
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
      next = add(r, r.tp_lane, fmt::format("{}{}", gather, i + 1), OpKind::kP2P, OpCategory::kComm,
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
OpId StepBuilder::scattered_gemm(Rank& r, const std::string& name, const std::string& reduce,
                                 OpCategory cat, int layer, GemmDims g) {
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
std::optional<OpId> StepBuilder::async_tp_reduce(Rank& r, const std::string& name, int layer) {
  if (d_.t == 1 || !s_.parallelism.tp_async_grad_reduce) return std::nullopt;
  return collective(
      r, r.tp_lane, name, OpCategory::kComm, layer,
      d_.sp > 1 ? sim::CollectiveKind::kReduceScatter : sim::CollectiveKind::kAllReduce, r.tp_group,
      d_.tokens() * d_.h * d_.e, {last_compute_});
}

void StepBuilder::finish_tp_reduce(Rank& r, std::optional<OpId> reduce, const std::string& name,
                                   int layer) {
  if (reduce) {
    next_compute_deps_.push_back(*reduce);
  } else {
    tp_reduce(r, name, OpCategory::kComm, layer);
  }
}

// Megatron-LM 2021 accumulated each micro-batch's weight gradients into param.main_grad with a
// separate add (read main_grad and grad, write main_grad); gradient-accumulation fusion (the
// wgrad GEMM accumulating in place) removed that pass.
void StepBuilder::grad_accumulation(Rank& r, const std::string& name, int layer,
                                    std::int64_t params) {
  const std::int64_t bytes = 3 * params * sim::dtype_bytes(dt_.grads);
  elementwise(r, name, OpCategory::kCompute, layer, bytes, static_cast<double>(params));
}

// The forward ops of one layer; returns the last.
OpId StepBuilder::layer_forward(Rank& r, int mb, int l, Fetch& fetch) {
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

OpId StepBuilder::head_forward(Rank& r, int mb) {
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
  return elementwise(r, p + ".loss.fwd", OpCategory::kCompute, -1, d_.tokens() * d_.v * (d_.e + 4),
                     static_cast<double>(5 * d_.tokens() * d_.v));
}

// Chunked (fused linear) cross entropy: per chunk of tokens, the logits GEMM, the loss and its
// gradient, the data-gradient GEMM into the saved gradient of the head's input and the
// weight-gradient GEMM, then the chunk's fp32 logits are freed. The same GEMM and elementwise
// work as the unchunked head, moved from the backward into the forward; the live logits shrink
// from tokens × vocab to one chunk's. Saved for the backward: the final-norm input and output
// and the gradient of the head's input (tokens × hidden each, like the residual).
OpId StepBuilder::head_forward_chunked(Rank& r, int mb, std::int64_t chunks) {
  const std::string p = fmt::format("mb{}.head", lbl(mb));
  const TensorId t = tensor(r.hbm, p + ".act", 3 * residual_bytes(), TensorCategory::kActivations);
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

OpId StepBuilder::head_backward(Rank& r, int mb) {
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

// Recomputes the forward ops of layer l that the backward needs and nobody saved; `emit`
// sees every op.
void StepBuilder::recompute_forward(Rank& r, const std::string& p, int l, const OpSink& emit) {
  const auto& rc = policies_[l].acts.recompute;
  const OpCategory rcat = OpCategory::kRecompute;
  const std::int64_t g = d_.gated ? 2 : 1;
  const auto idx = [](FwdOp o) { return static_cast<int>(o); };
  if (rc[idx(FwdOp::kLn1)]) {
    emit(elementwise(r, p + ".ln1.recompute", rcat, l, 2 * residual_bytes(), norm_flops()));
  }
  if (rc[idx(FwdOp::kQkv)]) {
    if (d_.t > 1 && d_.sp > 1) {
      emit(collective(r, r.compute, p + ".qkv.tp_allgather.recompute", OpCategory::kComm, l,
                      sim::CollectiveKind::kAllGather, r.tp_group, d_.tokens() * d_.h * d_.e));
    }
    emit(gemm(r, p + ".qkv.recompute", rcat, l, d_.tokens(), d_.qkv_n(), d_.h));
    if (rotary_positions()) emit(rotary(r, p + ".rope.recompute", l));
  }
  if (rc[idx(FwdOp::kCore)]) emit(attention(r, p + ".attn.recompute", rcat, l, false));
  if (rc[idx(FwdOp::kOutProj)]) {
    emit(gemm(r, p + ".out_proj.recompute", rcat, l, d_.tokens(), d_.h, d_.o()));
    if (d_.t > 1) {
      emit(collective(
          r, r.compute, p + ".out_proj.tp_reduce.recompute", OpCategory::kComm, l,
          d_.sp > 1 ? sim::CollectiveKind::kReduceScatter : sim::CollectiveKind::kAllReduce,
          r.tp_group, d_.tokens() * d_.h * d_.e));
    }
  }
  if (rc[idx(FwdOp::kRes1)] || rc[idx(FwdOp::kLn2)]) {
    emit(
        elementwise(r, p + ".res1_ln2.recompute", rcat, l, res1_ln2_fwd_bytes(), 2 * norm_flops()));
  }
  if (ld(l).moe && (rc[idx(FwdOp::kMlpWi)] || rc[idx(FwdOp::kAct)] || rc[idx(FwdOp::kMlpWo)])) {
    // The MoE FFN is re-run whole (router, dispatch, experts, combine).
    moe_forward(r, p, rcat, l, emit, ".recompute");
  } else if (rc[idx(FwdOp::kMlpWi)]) {
    if (d_.t > 1 && d_.sp > 1) {
      emit(collective(r, r.compute, p + ".mlp.tp_allgather.recompute", OpCategory::kComm, l,
                      sim::CollectiveKind::kAllGather, r.tp_group, d_.tokens() * d_.h * d_.e));
    }
    emit(gemm(r, p + ".mlpwi.recompute", rcat, l, d_.tokens(), d_.f * g, d_.h));
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
void StepBuilder::ffn_backward(Rank& r, const std::string& p, int l) {
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
OpId StepBuilder::attention_backward(Rank& r, const std::string& p, int l) {
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
OpId StepBuilder::layer_backward(Rank& r, int mb, int l, Fetch& fetch,
                                 std::optional<OpId> act_after, std::optional<SendKey> recv) {
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
    const std::int64_t experts =
        r.expert_group_of_layer.count(l) != 0 ? r.groups[r.expert_group_of_layer.at(l)].params : 0;
    grad_accumulation(r, p + ".grad_accum", l, group(r, l).params + experts);
    grads_done(r, l, mb, last_compute_);
    return last_compute_;
  }
  grads_done(r, l, mb, last);
  return last;
}

}  // namespace offsim::models::detail
