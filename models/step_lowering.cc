// StepBuilder: the lowering of one transformer layer (forward, backward, recompute), its
// attention (flash, ring and all-to-all context parallelism), tensor-parallel collectives and
// their overlap, and the LM head with its loss.
#include "models/step_builder_impl.h"

#include <algorithm>
#include <utility>

#include "models/plan_size.h"

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
             cm_.attention(r.rank, shape, d_.attention, d_.dropout), sz, std::move(deps));
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
void StepBuilder::tp_reduce(Rank& r, const std::string& name, OpCategory cat, int layer,
                            std::int64_t rows) {
  if (d_.t == 1) return;
  const std::int64_t bytes = rows * d_.tokens() * d_.h * d_.e;
  collective(r, r.compute, name, cat, layer,
             d_.sp > 1 ? sim::CollectiveKind::kReduceScatter : sim::CollectiveKind::kAllReduce,
             r.tp_group, bytes);
}

void StepBuilder::tp_gather(Rank& r, const std::string& name, OpCategory cat, int layer,
                            std::int64_t rows) {
  if (d_.t == 1 || d_.sp == 1) return;
  collective(r, r.compute, name, cat, layer, sim::CollectiveKind::kAllGather, r.tp_group,
             rows * d_.tokens() * d_.h * d_.e);
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
    if (i > 0) {
      next_compute_deps_.push_back(recv);
      chunk_host_ops(cat);
    }
    out = gemm(r, fmt::format("{}.c{}", name, i), cat, layer, ceil_div(g.m, d_.t), g.n, g.k);
    recv = next;
  }
  return out;
}

// The GEMM chunks after the first of an overlapped tensor-parallel GEMM: one module call
// launches them all (its host time is charged to the first chunk), each chunk one op more.
void StepBuilder::chunk_host_ops(OpCategory cat) {
  next_host_ops(1.0, in_backward_task_ && cat != OpCategory::kRecompute);
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
    if (i > 0) chunk_host_ops(cat);
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
  const std::string p = pfx(mb, l);
  std::vector<OpId> ops;
  const auto push = [&](OpId op) {
    ops.push_back(op);
    return op;
  };
  Rank::Saved saved;
  std::vector<TensorId> staging;
  // The entries of the layer's forward recipe (plan_size.h); an MoE layer runs its MoE FFN in
  // place of the dense MLP's entries.
  bool ffn_done = false;
  for (const LayerOpEntry& e : layer_forward_recipe()) {
    if (e.ffn && ld(l).moe) {
      if (!std::exchange(ffn_done, true)) {
        moe_forward(r, p, OpCategory::kCompute, l, push, ".fwd", &fetch);
      }
      continue;
    }
    const GraphScope graph(*this, layer_region(e.ffn, e.first, l), l);
    push(forward_op(r, p, l, e));
    if (ops.size() > 1) continue;
    // The layer's first op waits for its parameters and allocates what the layer saves.
    for (OpId w : fetch.wait) b_.op_at(ops.front()).deps.push_back(w);
    r.layer_first_fwd[{mb, l}] = ops.front();
    staging = save_activations(r, l, p, ops.front(), saved);
  }
  const OpId last = ops.back();
  for (TensorId buf : fetch.buffers) b_.op_at(last).frees.push_back(buf);
  offload_activations(r, l, p, last, staging, saved);
  r.saved[{mb, l}] = std::move(saved);
  return last;
}

// One entry of the layer's forward recipe: its kernel, with a column-parallel GEMM's
// sequence-parallel all-gather before it (the GEMMs of the recipe read a norm's output) and
// the rotary embedding after it, a row-parallel GEMM's reduction after it.
OpId StepBuilder::forward_op(Rank& r, const std::string& p, int l, const LayerOpEntry& e) {
  const OpCategory cat = OpCategory::kCompute;
  const std::string name = p + "." + e.name + ".fwd";
  switch (e.shape) {
    case LayerOpShape::kAttention:
      return attention(r, name, cat, l, false);
    case LayerOpShape::kColumnGemm: {
      const OpId out = gathered_gemm(r, p + "." + e.comm, name, cat, l, layer_gemm(e.first),
                                     /*from_norm=*/true);
      if (e.rotary_after) rotary(r, p + ".rope.fwd", l);
      return out;
    }
    case LayerOpShape::kRowGemm:
      return scattered_gemm(r, name, p + "." + e.comm, cat, l, layer_gemm(e.first));
    case LayerOpShape::kElementwise:
      break;
  }
  const Traffic t = layer_elementwise(e.first);
  return elementwise(r, name, cat, l, t.bytes, t.flops);
}

// The re-run of one entry in the recompute. The checkpointed forward re-runs the same
// Transformer Engine modules: a GEMM whose collective the recipe re-runs (or any, when the whole
// layer re-runs) runs as in the forward (its all-gather, FP8 rows under fp8, or reduce-scatter,
// overlapped under tp_comm_overlap).
void StepBuilder::recompute_op(Rank& r, const std::string& p, int l, const LayerOpEntry& e,
                               const OpSink& emit) {
  const OpCategory rcat = OpCategory::kRecompute;
  const std::string name = p + "." + e.name + ".recompute";
  const std::string comm = p + "." + e.comm + ".recompute";
  const GemmDims g = layer_gemm(e.first);
  const bool with_comm = recomputes_comm(e, policies_[l].acts);
  switch (e.shape) {
    case LayerOpShape::kAttention:
      emit(attention(r, name, rcat, l, false));
      return;
    case LayerOpShape::kColumnGemm:
      emit(with_comm ? gathered_gemm(r, comm, name, rcat, l, g, /*from_norm=*/true)
                     : gemm(r, name, rcat, l, g.m, g.n, g.k));
      if (e.rotary_after && rotary_positions()) emit(rotary(r, p + ".rope.recompute", l));
      return;
    case LayerOpShape::kRowGemm:
      emit(with_comm ? scattered_gemm(r, name, comm, rcat, l, g)
                     : gemm(r, name, rcat, l, g.m, g.n, g.k));
      return;
    case LayerOpShape::kElementwise: {
      const Traffic t = layer_elementwise(e.first);
      emit(elementwise(r, name, rcat, l, t.bytes, t.flops));
      return;
    }
  }
}

// The GEMM of a recipe entry (its first FwdOp) on this rank: tokens × the output features.
StepBuilder::GemmDims StepBuilder::layer_gemm(FwdOp op) const {
  const std::int64_t g = d_.gated ? 2 : 1;
  switch (op) {
    case FwdOp::kQkv:
      return {d_.tokens(), d_.qkv_n(), d_.h};
    case FwdOp::kOutProj:
      return {d_.tokens(), d_.h, d_.o()};
    case FwdOp::kMlpWi:
      return {d_.tokens(), d_.f * g, d_.h};
    case FwdOp::kMlpWo:
      return {d_.tokens(), d_.h, d_.f};
    default:
      return {};
  }
}

// Bytes and FLOPs of a recipe entry's memory-bound kernel (its first FwdOp): the first norm;
// the first residual add fused with the second norm; the MLP activation (gated: reads both
// halves); the second residual add.
StepBuilder::Traffic StepBuilder::layer_elementwise(FwdOp op) const {
  const std::int64_t g = d_.gated ? 2 : 1;
  switch (op) {
    case FwdOp::kLn1:
      return {2 * residual_bytes(), static_cast<double>(norm_flops())};
    case FwdOp::kRes1:
      return {res1_ln2_fwd_bytes(), static_cast<double>(2 * norm_flops())};
    case FwdOp::kAct:
      return {d_.tokens() * d_.f * d_.e * (g + 1), static_cast<double>(8 * d_.tokens() * d_.f)};
    case FwdOp::kRes2:
      return {res2_fwd_bytes(), static_cast<double>(d_.tokens() * d_.h / d_.sp)};
    default:
      return {};
  }
}

// One entry of the head's recipes (plan_size.h head_forward_recipe, head_backward_recipe) over
// `n` tokens (a chunk's, or the micro-batch's). A collective the parallelism does not have emits
// nothing; the entry then gives the last compute-stream op.
OpId StepBuilder::head_op(Rank& r, const std::string& prefix, const HeadOpEntry& e,
                          std::int64_t n) {
  const std::string name = prefix + "." + e.name;
  const std::int64_t logits_bytes = n * d_.v * (d_.e + 4);
  const std::int64_t residual = residual_bytes() * head_rows();
  const double norm = static_cast<double>(norm_flops() * head_rows());
  switch (e.kind) {
    case HeadOpKind::kFinalNorm:
      return elementwise(r, name, OpCategory::kCompute, -1, 2 * residual, norm);
    case HeadOpKind::kTpGather:
      tp_gather(r, name, OpCategory::kComm, -1, head_rows());
      return last_compute_;
    case HeadOpKind::kLogits:
      return head_gemm(r, name, n, d_.v, d_.h);
    case HeadOpKind::kLoss:
      return elementwise(r, name, OpCategory::kCompute, -1, logits_bytes,
                         static_cast<double>(5 * n * d_.v));
    case HeadOpKind::kLossGrad:
      return elementwise(r, name, OpCategory::kCompute, -1, logits_bytes,
                         static_cast<double>(3 * n * d_.v));
    case HeadOpKind::kDgrad:
      return head_gemm(r, name, n, d_.h, d_.v);
    case HeadOpKind::kWgrad:
      return head_gemm(r, name, d_.h, d_.v, n, /*weight_grad=*/true);
    case HeadOpKind::kLossScale:
      return elementwise(r, name, OpCategory::kCompute, -1, 2 * residual,
                         static_cast<double>(residual / d_.e));
    case HeadOpKind::kTpReduce:
      tp_reduce(r, name, OpCategory::kComm, -1, head_rows());
      return last_compute_;
    case HeadOpKind::kFinalNormGrad:
      break;
  }
  return elementwise(r, name, OpCategory::kCompute, -1, 3 * residual, 2 * norm);
}

// The head's forward (head_forward_recipe). Saved until the head's backward: the final-norm
// input and output and, unchunked, the fp32 logits' softmax the vocabulary-parallel cross
// entropy keeps; chunked (fused linear cross entropy), the gradient of the head's input (tokens ×
// hidden, like the residual) instead. The per-chunk entries, last in the recipe, run chunk by
// chunk. Returns the last op.
StepBuilder::HeadOps StepBuilder::head_forward(Rank& r, int mb) {
  const std::string p = fmt::format("mb{}.head", lbl(mb));
  const std::int64_t chunks = std::max<std::int64_t>(1, s_.training.loss_chunks);
  const bool chunked = chunks > 1;
  const std::int64_t tokens = d_.tokens() * head_rows();
  const std::int64_t residual = residual_bytes() * head_rows();
  const std::int64_t bytes = chunked ? 3 * residual : 2 * residual + tokens * d_.v * 4;
  const TensorId t = tensor(r.hbm, p + ".act", bytes, TensorCategory::kActivations);
  const std::span<const HeadOpEntry> recipe = head_forward_recipe(chunked);
  const auto per_chunk =
      std::find_if(recipe.begin(), recipe.end(), [](const HeadOpEntry& e) { return e.per_chunk; });
  std::optional<OpId> first;
  OpId last{};
  for (auto e = recipe.begin(); e != per_chunk; ++e) {
    last = head_op(r, p, *e, tokens);
    if (!first) first = last;
    if (e->kind == HeadOpKind::kFinalNorm) b_.op_at(last).allocs.push_back(t);
  }
  for (std::int64_t c = 0; c < chunks && per_chunk != recipe.end(); ++c) {
    last = head_chunk(r, p, std::span<const HeadOpEntry>(per_chunk, recipe.end()), c, chunks);
    if (!first) first = last;
  }
  r.head_saved[mb] = t;
  return {first.value_or(last), last};
}

// The per-chunk entries of the chunked head on chunk c, tokens [c·tokens/C, (c+1)·tokens/C)
// (chunks differ by at most one token): the chunk's fp32 logits live from its logits GEMM to its
// weight-gradient GEMM. Returns the last op.
OpId StepBuilder::head_chunk(Rank& r, const std::string& p, std::span<const HeadOpEntry> entries,
                             std::int64_t c, std::int64_t chunks) {
  const std::int64_t tokens = d_.tokens() * head_rows();
  const std::int64_t n = (c + 1) * tokens / chunks - c * tokens / chunks;
  const std::string q = fmt::format("{}.chunk{}", p, c);
  const TensorId logits = tensor(r.hbm, q + ".logits", n * d_.v * 4, TensorCategory::kActivations);
  OpId last{};
  for (const HeadOpEntry& e : entries) {
    last = head_op(r, q, e, n);
    if (e.kind == HeadOpKind::kLogits) b_.op_at(last).allocs.push_back(logits);
    if (e.kind == HeadOpKind::kWgrad) b_.op_at(last).frees.push_back(logits);
  }
  return last;
}

// The head's backward (head_backward_recipe): the last op frees what the forward saved. Returns
// the first op.
StepBuilder::HeadOps StepBuilder::head_backward(Rank& r, int mb) {
  const std::string p = fmt::format("mb{}.head", lbl(mb));
  const bool chunked = s_.training.loss_chunks > 1;
  std::optional<OpId> first;
  OpId last{};
  for (const HeadOpEntry& e : head_backward_recipe(chunked)) {
    last = head_op(r, p, e, d_.tokens() * head_rows());
    if (!first) first = last;
  }
  b_.op_at(last).frees.push_back(r.head_saved.at(mb));
  grads_done(r, -2, mb, last);
  return {first.value_or(last), last};
}

// Multi-token prediction, module k (Megatron-Core MultiTokenPredictionLayer.forward, in
// megatron/core/transformer/multi_token_prediction.py): the embedding of the input shifted by
// k + 1 tokens (the model's word embedding), enorm and hnorm (the embedding's and the previous
// depth's hidden state), their concatenation through eh_proj (a column-parallel 2h -> h linear,
// its output gathered over the tensor-parallel group), then the module's transformer layer `l`
// (built as a decoder layer) and its final norm (the head's, over head_rows() tokens). Saved for
// the backward: the projection's input (2h per token) and the norms' inputs.
void StepBuilder::mtp_input_forward(Rank& r, int mb, int l) {
  const std::string p = pfx(mb, l) + ".mtp";
  const TensorId saved =
      tensor(r.hbm, p + ".inputs", 4 * residual_bytes(), TensorCategory::kActivations);
  const OpId embed =
      elementwise(r, p + ".embed", OpCategory::kCompute, l, 2 * residual_bytes(), 0.0);
  b_.op_at(embed).allocs.push_back(saved);
  r.mtp_saved[{mb, l}] = saved;
  elementwise(r, p + ".norms", OpCategory::kCompute, l, 4 * residual_bytes(),
              2.0 * static_cast<double>(norm_flops()));
  gathered_gemm(r, p + ".eh_proj.ag", p + ".eh_proj", OpCategory::kCompute, l,
                {d_.tokens(), d_.h / d_.t, 2 * d_.h});
  if (d_.t > 1) {
    collective(r, r.compute, p + ".eh_proj.gather", OpCategory::kComm, l,
               sim::CollectiveKind::kAllGather, r.tp_group, d_.tokens() * d_.h * d_.e);
  }
}

// The backward of mtp_input_forward, after the module's layer: the projection's dgrad and
// wgrad, the norms' and the embedding's backward; frees the saved inputs. Returns the last op.
OpId StepBuilder::mtp_input_backward(Rank& r, int mb, int l) {
  const std::string p = pfx(mb, l) + ".mtp";
  gemm(r, p + ".eh_proj.dgrad", OpCategory::kCompute, l, d_.tokens(), 2 * d_.h, d_.h / d_.t);
  wgrad_gemm(r, p + ".eh_proj.wgrad", OpCategory::kCompute, l, 2 * d_.h, d_.h / d_.t, d_.tokens());
  tp_reduce(r, p + ".eh_proj.reduce", OpCategory::kComm, l);
  elementwise(r, p + ".norms.bwd", OpCategory::kCompute, l, 6 * residual_bytes(),
              4.0 * static_cast<double>(norm_flops()));
  const OpId last =
      elementwise(r, p + ".embed.bwd", OpCategory::kCompute, l, 2 * residual_bytes(), 0.0);
  b_.op_at(last).frees.push_back(r.mtp_saved.at({mb, l}));
  r.mtp_saved.erase({mb, l});
  return last;
}

// Recomputes the forward ops of layer l that the backward needs and nobody saved: the entries
// of the layer's forward recipe its recompute marks; `emit` sees every op.
// An MoE layer's FFN is re-run whole (router, dispatch, experts, combine), or, when only its
// activation output was dropped (recompute module moe_act), its activations alone, and under
// recompute module shared_experts its shared experts' forward (moe_partial_recompute_entry). Under
// mla_up_proj the QKV entry re-runs MLA's up projections from the kept latents (no collective:
// the latents are the rank's own) and the rotary embedding.
void StepBuilder::recompute_forward(Rank& r, const std::string& p, int l, const OpSink& emit) {
  const LayerActivations& acts = policies_[l].acts;
  bool ffn_done = false;
  for (const LayerOpEntry& e : layer_forward_recipe()) {
    const bool shared_only = acts.shared_experts && e.ffn && ld(l).moe;
    if (!recomputes(e, acts) && !shared_only) continue;
    if (e.ffn && ld(l).moe) {
      if (std::exchange(ffn_done, true)) continue;
      if (recomputes(e, acts) && !moe_activation_only(acts)) {
        moe_forward(r, p, OpCategory::kRecompute, l, emit, ".recompute");
        continue;
      }
      for (const MoeOpEntry& m : moe_forward_recipe()) {
        if (!moe_partial_recompute_entry(m, acts) || !moe_entry_runs(m, ld(l))) continue;
        const GraphScope graph(*this, moe_region(m, l), l);
        emit(moe_op(r, p + "." + m.name + ".recompute", OpCategory::kRecompute, l, m, false));
      }
      continue;
    }
    const GraphScope graph(*this, layer_region(e.ffn, e.first, l), l);
    if (e.first == FwdOp::kQkv && acts.mla_up_proj) {
      const LayerDims& d = ld(l);
      emit(gemm(r, p + ".mla_up_proj.recompute", OpCategory::kRecompute, l, d.tokens(), d.mla_up_n,
                d.mla_up_k));
      if (e.rotary_after && rotary_positions()) emit(rotary(r, p + ".rope.recompute", l));
      continue;
    }
    recompute_op(r, p, l, e, emit);
  }
}

namespace {

// The backward recipe in its three runs: the second residual's entries (before the MLP's), the
// dense MLP's (`ffn`) and the attention block's (after the MLP's).
struct BackwardRuns {
  std::span<const LayerBackwardEntry> res2;
  std::span<const LayerBackwardEntry> ffn;
  std::span<const LayerBackwardEntry> attention;
};
BackwardRuns backward_runs() {
  const std::span<const LayerBackwardEntry> all = layer_backward_recipe();
  const auto is_ffn = [](const LayerBackwardEntry& e) { return e.ffn; };
  const auto first = std::find_if(all.begin(), all.end(), is_ffn);
  const auto last = std::find_if_not(first, all.end(), is_ffn);
  return {.res2 = {all.begin(), first}, .ffn = {first, last}, .attention = {last, all.end()}};
}

}  // namespace

// Entries of the layer's backward recipe, in order; `emit` sees each entry's op (a gradient
// reduction is started after its dgrad and finished after the next wgrad). Returns the last op.
OpId StepBuilder::backward_entries(Rank& r, const std::string& p, int l,
                                   std::span<const LayerBackwardEntry> entries,
                                   const OpSink& emit) {
  OpId last{};
  std::string reduce_name;
  std::optional<std::optional<OpId>> reduce;
  for (const LayerBackwardEntry& e : entries) {
    const GraphScope graph(*this, layer_region(e.ffn, e.of, l), l);
    if (e.kind == LayerBackwardKind::kGradReduce) {
      reduce_name = p + "." + e.name;
      reduce = async_tp_reduce(r, reduce_name, l);
      continue;
    }
    if (defer_wgrads_ && e.kind == LayerBackwardKind::kWgrad) {
      // Delayed: its gradient reduction has no weight gradient to run beside.
      delayed_wgrads_->emits.emplace_back([this, &r, p, l, &e] { return backward_op(r, p, l, e); });
      if (reduce) {
        finish_tp_reduce(r, *reduce, reduce_name, l);
        reduce.reset();
      }
      continue;
    }
    last = backward_op(r, p, l, e);
    emit(last);
    if (e.kind == LayerBackwardKind::kWgrad && reduce) {
      finish_tp_reduce(r, *reduce, reduce_name, l);
      reduce.reset();
    }
  }
  return last;
}

// One entry of the layer's backward recipe: a dgrad (after the all-gather of its output
// gradient), a wgrad, the attention core's or the rotary embedding's backward, or a memory-bound
// kernel's backward.
OpId StepBuilder::backward_op(Rank& r, const std::string& p, int l, const LayerBackwardEntry& e) {
  const OpCategory cat = OpCategory::kCompute;
  const std::string name = p + "." + e.name;
  const GemmDims g = layer_gemm(e.of);
  switch (e.kind) {
    case LayerBackwardKind::kDgrad:
      if (*e.gather != '\0') {
        return gathered_gemm(r, p + "." + e.gather, name, cat, l, {g.m, g.k, g.n});
      }
      return gemm(r, name, cat, l, g.m, g.k, g.n);
    case LayerBackwardKind::kWgrad:
      return wgrad_gemm(r, name, cat, l, g.k, g.n, g.m);
    case LayerBackwardKind::kAttention:
      return attention(r, name, cat, l, true);
    case LayerBackwardKind::kRotary:
      return rotary(r, name, l);
    case LayerBackwardKind::kGradReduce:  // backward_entries
      return last_compute_;
    case LayerBackwardKind::kElementwise:
      break;
  }
  const Traffic t = layer_elementwise_backward(e.of);
  return elementwise(r, name, cat, l, t.bytes, t.flops);
}

// Bytes and FLOPs of a backward recipe entry's memory-bound kernel: the second residual add's;
// the MLP activation's (gated: both halves' gradients); the first residual add fused with the
// second norm; the first norm's.
StepBuilder::Traffic StepBuilder::layer_elementwise_backward(FwdOp op) const {
  const std::int64_t g = d_.gated ? 2 : 1;
  switch (op) {
    case FwdOp::kRes2:
      return {2 * residual_bytes() + dropout_mask_bytes(),
              static_cast<double>(d_.tokens() * d_.h / d_.sp)};
    case FwdOp::kAct:
      return {d_.tokens() * d_.f * d_.e * (2 * g + 1),
              static_cast<double>(10 * d_.tokens() * d_.f)};
    case FwdOp::kRes1:
      return {6 * residual_bytes() + dropout_mask_bytes(), static_cast<double>(4 * norm_flops())};
    case FwdOp::kLn1:
      return {3 * residual_bytes(), static_cast<double>(2 * norm_flops())};
    default:
      return {};
  }
}

// The second residual's backward of layer l: the layer's first op after the recompute.
void StepBuilder::res2_backward(Rank& r, const std::string& p, int l, const OpSink& emit) {
  backward_entries(r, p, l, backward_runs().res2, emit);
}

// The FFN's backward of layer l (MoE or dense), after the second residual's.
void StepBuilder::ffn_backward(Rank& r, const std::string& p, int l) {
  if (ld(l).moe) {
    moe_backward(r, p, OpCategory::kCompute, l);
    return;
  }
  backward_entries(r, p, l, backward_runs().ffn, [](OpId) {});
}

// The attention block's backward of layer l, from the first residual and second norm to
// the first norm; returns the first norm's backward (the layer's last op).
OpId StepBuilder::attention_backward(Rank& r, const std::string& p, int l) {
  return backward_entries(r, p, l, backward_runs().attention, [](OpId) {});
}

// `recv`: without an earlier op to prefetch after, the reload waits for the gradient
// arriving from the next pipeline stage.
OpId StepBuilder::layer_backward(Rank& r, int mb, int l, Fetch& fetch,
                                 std::optional<OpId> act_after, std::optional<SendKey> recv,
                                 const std::function<void(OpId)>& before_reduce) {
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
  // The previous layer's delayed weight gradients run after this layer's combine all-to-all
  // (moe_op), or first when its backward has none: before its recompute, which in a combined
  // step waits for the paired forward, whose start waits for them.
  if (delayed_wgrads_ && !(ld(l).moe && ld(l).ep > 1)) flush_delayed_wgrads();
  recompute_forward(r, p, l, rc_op);
  res2_backward(r, p, l, [&](OpId op) { first_op(op); });
  ffn_backward(r, p, l);
  const bool defer = defers_wgrads(l);
  // A guard: this layer's combine or its start flushed the previous layer's already; the MoE
  // backward may have opened this layer's (the shared experts').
  if (defer) {
    delayed_wgrads_of(p);
  } else {
    flush_delayed_wgrads();
  }
  defer_wgrads_ = defer;
  const OpId last = attention_backward(r, p, l);
  defer_wgrads_ = false;
  // After the layer's last op (with delayed weight gradients, the last of them): the frees, the
  // gradient accumulation and the reduction.
  std::vector<TensorId> frees;
  if (const TensorId saved_hbm = r.saved.at({mb, l}).hbm; saved_hbm.valid()) {
    frees.push_back(saved_hbm);
  }
  frees.insert(frees.end(), reloaded.begin(), reloaded.end());
  if (recomp_t) frees.push_back(*recomp_t);
  frees.insert(frees.end(), fetch.buffers.begin(), fetch.buffers.end());
  const auto finish = [this, &r, p, l, mb, frees](OpId end,
                                                  const std::function<void(OpId)>& before) {
    sim::Op& lo = b_.op_at(end);
    lo.frees.insert(lo.frees.end(), frees.begin(), frees.end());
    if (!s_.training.gradient_accumulation_fusion) {
      const std::int64_t experts = r.expert_group_of_layer.count(l) != 0
                                       ? r.groups[r.expert_group_of_layer.at(l)].params
                                       : 0;
      grad_accumulation(r, p + ".grad_accum", l, group(r, l).params + experts);
      end = last_compute_;
    }
    if (before) before(end);
    grads_done(r, l, mb, end);
    return end;
  };
  if (defer && !delayed_wgrads_->emits.empty()) {
    // The next layers' backward and the fetches before_reduce issues follow the data gradients.
    delayed_wgrads_->after = [finish](OpId end) { finish(end, nullptr); };
    before_reduce(last);
    return last;
  }
  delayed_wgrads_.reset();
  return finish(last, before_reduce);
}

// The delayed weight gradients of the layer last built, on the compute stream after what it
// holds now; the next compute op's cross-lane waits (an all-to-all's) are not theirs.
void StepBuilder::flush_delayed_wgrads() {
  if (!delayed_wgrads_) return;
  DelayedWgrads d = std::move(*delayed_wgrads_);
  delayed_wgrads_.reset();
  if (d.emits.empty()) return;
  std::vector<OpId> held = std::exchange(next_compute_deps_, {});
  OpId last{};
  for (const std::function<OpId()>& emit : d.emits) last = emit();
  next_compute_deps_ = std::move(held);
  if (d.after) d.after(last);
}

StepBuilder::DelayedWgrads& StepBuilder::delayed_wgrads_of(const std::string& prefix) {
  if (delayed_wgrads_ && delayed_wgrads_->prefix != prefix) flush_delayed_wgrads();
  if (!delayed_wgrads_) delayed_wgrads_ = DelayedWgrads{.prefix = prefix};
  return *delayed_wgrads_;
}

// Whether layer l's backward in a combined step delays its weight gradients
// (parallelism.delay_wgrad_compute): the decoder layers', not the multi-token-prediction
// modules'.
bool StepBuilder::defers_wgrads(int l) const {
  return s_.parallelism.delay_wgrad_compute && a2a_lane_.valid() && l < s_.model.layers;
}

}  // namespace offsim::models::detail
