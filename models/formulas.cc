#include "models/formulas.h"

#include <algorithm>
#include <cmath>

namespace offsim::models {

namespace {

using Mode = RecomputeConfig::Mode;

struct OpIo {
  std::vector<Act> in;
  std::vector<Act> out;
  std::vector<Act> backward_needs;
};

const std::array<OpIo, kNumFwdOps>& op_io() {
  static const std::array<OpIo, kNumFwdOps> kIo = {{
      {{Act::kX}, {Act::kLn1Out}, {Act::kX}},
      {{Act::kLn1Out}, {Act::kQ, Act::kK, Act::kV}, {Act::kLn1Out}},
      {{Act::kQ, Act::kK, Act::kV},
       {Act::kContext, Act::kCoreSaved},
       {Act::kQ, Act::kK, Act::kV, Act::kCoreSaved}},
      {{Act::kContext}, {Act::kOutProj}, {Act::kContext}},
      {{Act::kX, Act::kOutProj}, {Act::kH1, Act::kDrop1}, {Act::kDrop1}},
      {{Act::kH1}, {Act::kLn2Out}, {Act::kH1}},
      {{Act::kLn2Out}, {Act::kMlpWi}, {Act::kLn2Out}},
      {{Act::kMlpWi}, {Act::kActOut}, {Act::kMlpWi}},
      {{Act::kActOut}, {Act::kMlpWo}, {Act::kActOut}},
      {{Act::kH1, Act::kMlpWo}, {Act::kDrop2}, {Act::kDrop2}},
  }};
  return kIo;
}

int idx(Act a) { return static_cast<int>(a); }

}  // namespace

const char* to_string(Act a) {
  switch (a) {
    case Act::kX:
      return "input";
    case Act::kLn1Out:
      return "ln1_out";
    case Act::kQ:
      return "q";
    case Act::kK:
      return "k";
    case Act::kV:
      return "v";
    case Act::kCoreSaved:
      return "attn_core";
    case Act::kContext:
      return "context";
    case Act::kOutProj:
      return "out_proj";
    case Act::kDrop1:
      return "dropout1_mask";
    case Act::kH1:
      return "residual1";
    case Act::kLn2Out:
      return "ln2_out";
    case Act::kMlpWi:
      return "mlpwi";
    case Act::kActOut:
      return "mlp_act";
    case Act::kMlpWo:
      return "mlpwo";
    case Act::kDrop2:
      return "dropout2_mask";
  }
  return "?";
}

const char* maxtext_name(Act a) {
  switch (a) {
    case Act::kX:
      return "decoder_layer_input";
    case Act::kQ:
      return "query_proj";
    case Act::kK:
      return "key_proj";
    case Act::kV:
      return "value_proj";
    case Act::kContext:
      return "context";
    case Act::kOutProj:
      return "out_proj";
    case Act::kMlpWi:
      return "mlpwi";
    case Act::kMlpWo:
      return "mlpwo";
    default:
      return "";
  }
}

LayerDims layer_dims(const ModelArch& m, const TrainingConfig& t, const ParallelConfig& p) {
  LayerDims d;
  d.b = t.micro_batch;
  d.cp = p.cp;
  d.s = t.seq_len / p.cp;
  d.h = m.hidden;
  d.d = m.head_dim;
  d.t = p.tp;
  d.a = m.heads / p.tp;
  d.kvh = m.kv_heads / p.tp;
  d.f = m.ffn_hidden / p.tp;
  d.v = ceil_div(m.vocab_size, p.tp);
  d.sp = p.sequence_parallel ? p.tp : 1;
  d.e = t.compute_dtype == sim::DType::kFp32 ? 4 : 2;
  // Transformer Engine under fp8 saves each GEMM input quantized, one byte per element
  // (transformer_engine/pytorch/module/linear.py and layernorm_linear.py: the input quantizer
  // keeps the columnwise fp8 copy the wgrad GEMM reads; block scales, 1/32 or 1/128 of a byte,
  // are not counted). The activation function's input (the fc1 output) and attention's q, k, v
  // and O stay bf16.
  if (t.compute_dtype == sim::DType::kFp8) d.e_q = 1;
  d.gated = m.activation == ModelArch::Activation::kSwiGlu;
  d.dropout = m.dropout;
  d.flash = m.attention != ModelArch::AttentionImpl::kClassic;
  d.attention = m.attention;
  d.bias = m.linear_bias;
  d.layernorm = m.norm == ModelArch::Norm::kLayerNorm;
  if (m.mla.kv_lora_rank > 0) {
    // MLA as attention over all heads of head dim nope + rope; the projection GEMM has MLA's
    // FLOPs (its parameters on this rank, less the norms, per token and hidden unit).
    const MlaConfig& a = m.mla;
    d.d = a.qk_nope_head_dim + a.qk_rope_head_dim;
    d.kvh = d.a;
    d.vd = a.v_head_dim;
    const std::int64_t norms = (a.q_lora_rank > 0 ? a.q_lora_rank : 0) + a.kv_lora_rank;
    const std::int64_t proj =
        attention_parameter_count_per_rank(m, p.tp) - norms - d.a * a.v_head_dim * m.hidden;
    d.qkv_width = ceil_div(proj, m.hidden);
    const std::int64_t qk = a.qk_nope_head_dim + a.qk_rope_head_dim;
    const std::int64_t q_in = a.q_lora_rank > 0 ? a.q_lora_rank : m.hidden;
    const std::int64_t up_weights =
        q_in * d.a * qk + a.kv_lora_rank * d.a * (a.qk_nope_head_dim + a.v_head_dim);
    d.mla_up_n = d.a * (qk + a.qk_nope_head_dim + a.v_head_dim);
    d.mla_up_k = ceil_div(up_weights, d.mla_up_n);
    d.mla_latent = std::max<std::int64_t>(a.q_lora_rank, 0) + a.kv_lora_rank + a.qk_rope_head_dim;
  }
  return d;
}

std::int64_t act_bytes(const LayerDims& d, Act a) {
  const std::int64_t tok = d.tokens();
  const std::int64_t residual = tok * d.h * d.e / d.sp;  // a replicated b·s·h tensor
  if (d.moe) {
    // MoE FFN: routed experts over `routed` rows (grouped GEMMs), shared experts over all tokens.
    const std::int64_t rows_f = d.routed * d.fe + tok * d.fs;
    switch (a) {
      case Act::kLn2Out:
        return residual;
      case Act::kMlpWi:
        // The FC1 outputs, and what the MoE FFN keeps of its own input: the dispatched tokens
        // (the expert GEMM's input; fp8 under fp8, as Transformer Engine's GroupedLinear saves
        // it) and the fp32 router probabilities (re-created when the MoE FFN is recomputed).
        return rows_f * d.e * (d.gated ? 2 : 1) + d.routed * d.h * (d.e_q > 0 ? d.e_q : d.e) +
               d.moe_tokens * d.experts * 4;
      case Act::kActOut:
        return rows_f * (d.e_q > 0 ? d.e_q : d.e);
      case Act::kMlpWo:
        return residual + d.routed * d.h * d.e;
      default:
        break;
    }
  }
  switch (a) {
    case Act::kLn1Out:
    case Act::kLn2Out:
      // The GEMM's own input: its fp8 copy under fp8 (the rank's rows, gathered again in the
      // backward under sequence parallelism), else the bf16 tensor.
      return d.e_q > 0 ? tok * d.h * d.e_q / d.sp : residual;
    case Act::kX:
    case Act::kOutProj:
    case Act::kH1:
    case Act::kMlpWo:
      return residual;
    case Act::kQ:
      return tok * d.q() * d.e;
    case Act::kContext:
      // Under fp8 the out projection keeps its fp8 copy; FlashAttention's backward still reads
      // the bf16 output (O), which is then saved as well.
      if (d.e_q > 0) return tok * d.o() * (d.e_q + (d.flash ? d.e : 0));
      return tok * d.o() * d.e;
    case Act::kK:
    case Act::kV:
      return tok * d.kv() * d.e;
    case Act::kCoreSaved: {
      if (d.flash) return d.b * d.a * d.s * 4;  // fp32 logsumexp per query row
      const std::int64_t scores = d.b * d.a * d.s * d.s;
      // softmax output (e bytes); with dropout also its mask (1 byte) and output (e bytes)
      return scores * d.e + (d.dropout ? scores * (1 + d.e) : 0);
    }
    case Act::kDrop1:
    case Act::kDrop2:
      return d.dropout ? tok * d.h / d.sp : 0;
    case Act::kMlpWi:
      return tok * d.f * d.e * (d.gated ? 2 : 1);
    case Act::kActOut:
      return tok * d.f * (d.e_q > 0 ? d.e_q : d.e);
  }
  return 0;
}

std::int64_t LayerActivations::saved_bytes(const LayerDims& d) const {
  std::int64_t total = latent_bytes - shared_bytes;
  for (int i = 0; i < kNumActs; ++i) {
    if (saved[i]) total += act_bytes(d, static_cast<Act>(i));
  }
  return total;
}

std::int64_t LayerActivations::recomputed_bytes(const LayerDims& d) const {
  std::int64_t total = shared_bytes;
  for (int op = 0; op < kNumFwdOps; ++op) {
    if (!recompute[op]) continue;
    for (Act a : op_io()[op].out) {
      if (!saved[idx(a)]) total += act_bytes(d, a);
    }
  }
  return total;
}

namespace {

// What selective recompute with `modules` does not keep of what the backward needs (Megatron-
// Core: attention.py core_attn; transformer_layer.py layernorm, mlp (dense layers only);
// moe/experts.py moe_act; moe/moe_layer.py moe (MoE layers only); multi_latent_attention.py
// mla_up_proj). The op walk of layer_activations then re-runs what makes them.
void drop_selective(const LayerDims& d, const RecomputeModules& modules, LayerActivations& r) {
  using M = RecomputeModule;
  if (modules.has(M::kCoreAttn)) r.saved[idx(Act::kCoreSaved)] = false;
  if (modules.has(M::kLayernorm)) {
    r.saved[idx(Act::kLn1Out)] = false;
    r.saved[idx(Act::kLn2Out)] = false;
  }
  // The activation output of the experts (offsim keeps one tensor for the routed and the
  // shared experts' activations).
  if (modules.has(M::kMoeAct) && d.moe) r.saved[idx(Act::kActOut)] = false;
  if ((modules.has(M::kMlp) && !d.moe) || (modules.has(M::kMoe) && d.moe)) {
    r.saved[idx(Act::kMlpWi)] = false;
    r.saved[idx(Act::kActOut)] = false;
    r.saved[idx(Act::kMlpWo)] = false;
  }
  if (modules.has(M::kMlaUpProj) && d.mla_up_n > 0) {
    r.saved[idx(Act::kQ)] = false;
    r.saved[idx(Act::kK)] = false;
    r.saved[idx(Act::kV)] = false;
    r.mla_up_proj = true;
    r.latent_bytes = d.tokens() * d.mla_latent * d.e;
  }
}

}  // namespace

double recompute_op_flops(const LayerDims& d, const LayerActivations& acts, FwdOp op) {
  if (op == FwdOp::kQkv && acts.mla_up_proj) {
    return 2.0 * static_cast<double>(d.tokens()) * static_cast<double>(d.mla_up_n) *
           static_cast<double>(d.mla_up_k);
  }
  return fwd_op_flops(d, op, false);
}

LayerActivations layer_activations(const LayerDims& d, Mode mode, const RecomputeModules& modules,
                                   const std::set<std::string>& named_saved,
                                   RecomputeConfig::Rerun rerun) {
  LayerActivations r;
  std::array<bool, kNumActs> needed{};
  for (const OpIo& io : op_io()) {
    for (Act a : io.backward_needs) needed[idx(a)] = true;
  }
  if (d.flash) needed[idx(Act::kContext)] = true;  // FlashAttention's backward reads O
  if (!d.dropout) needed[idx(Act::kDrop1)] = needed[idx(Act::kDrop2)] = false;

  switch (mode) {
    case Mode::kNone:
      r.saved = needed;
      break;
    case Mode::kSelective:
      r.saved = needed;
      drop_selective(d, modules, r);
      break;
    case Mode::kFull:
      r.saved[idx(Act::kX)] = true;
      break;
  }
  for (int i = 0; i < kNumActs; ++i) {
    const std::string name = maxtext_name(static_cast<Act>(i));
    if (!name.empty() && named_saved.count(name) != 0) r.saved[i] = true;
  }
  if (r.mla_up_proj && r.saved[idx(Act::kQ)] && r.saved[idx(Act::kK)] && r.saved[idx(Act::kV)]) {
    r.mla_up_proj = false;  // named saves keep what the up projections make
    r.latent_bytes = 0;
  }
  // Walk the forward ops backwards: an op is re-run when it produces a tensor that is needed
  // and not saved; its own unsaved inputs then become needed too.
  std::array<bool, kNumActs> missing{};
  for (int i = 0; i < kNumActs; ++i) missing[i] = needed[i] && !r.saved[i];
  for (int op = kNumFwdOps - 1; op >= 0; --op) {
    bool produces = false;
    for (Act a : op_io()[op].out) produces = produces || missing[idx(a)];
    if (!produces) continue;
    r.recompute[op] = true;
    for (Act a : op_io()[op].in) {
      if (!r.saved[idx(a)]) missing[idx(a)] = true;
    }
  }
  if (mode == Mode::kFull && rerun == RecomputeConfig::Rerun::kLayer) {
    r.recompute.fill(true);
    r.whole_layer = true;
  }
  // shared_experts (moe/shared_experts.py, moe/moe_layer.py shared_experts_compute: the shared
  // experts run under tensor_parallel.checkpoint, which keeps only their input, the norm's
  // output the router keeps too): what the MoE FFN keeps of the shared experts goes, unless the
  // whole MoE FFN is re-run, which re-creates them anyway.
  if (mode == Mode::kSelective && modules.has(RecomputeModule::kSharedExperts) && d.moe &&
      d.fs > 0 && !r.recompute[static_cast<int>(FwdOp::kMlpWi)]) {
    const std::int64_t rows = d.tokens() * d.fs;
    const std::int64_t fc1 = rows * d.e * (d.gated ? 2 : 1);
    const std::int64_t act = rows * (d.e_q > 0 ? d.e_q : d.e);
    r.shared_bytes = (r.saved[idx(Act::kMlpWi)] ? fc1 : 0) + (r.saved[idx(Act::kActOut)] ? act : 0);
    r.shared_experts = r.shared_bytes > 0;
  }
  return r;
}

double fwd_op_flops(const LayerDims& d, FwdOp op, bool causal_attention) {
  const double tok = static_cast<double>(d.tokens());
  const double h = static_cast<double>(d.h);
  switch (op) {
    case FwdOp::kQkv:
      return 2.0 * tok * h * static_cast<double>(d.qkv_n());
    case FwdOp::kCore: {
      // QK^T and PV: 2 · (2·b·a·s·s_kv·d); half of it under a causal mask. With context
      // parallelism the rank's s queries meet all cp·s keys (its share of the whole product).
      const double full = 4.0 * static_cast<double>(d.b * d.a) * static_cast<double>(d.s) *
                          static_cast<double>(d.s * d.cp) * static_cast<double>(d.d);
      return causal_attention ? full / 2.0 : full;
    }
    case FwdOp::kOutProj:
      return 2.0 * tok * static_cast<double>(d.o()) * h;
    case FwdOp::kMlpWi:
      if (d.moe) {
        // Router GEMM + expert and shared-expert input projections.
        return 2.0 * static_cast<double>(d.moe_tokens) * h * static_cast<double>(d.experts) +
               2.0 * h * static_cast<double>(d.routed * d.fe + d.tokens() * d.fs) *
                   (d.gated ? 2.0 : 1.0);
      }
      return 2.0 * tok * h * static_cast<double>(d.f) * (d.gated ? 2.0 : 1.0);
    case FwdOp::kMlpWo:
      if (d.moe) return 2.0 * h * static_cast<double>(d.routed * d.fe + d.tokens() * d.fs);
      return 2.0 * tok * static_cast<double>(d.f) * h;
    default:
      return 0.0;
  }
}

double layer_forward_flops(const LayerDims& d, bool causal_attention) {
  double total = 0.0;
  for (int op = 0; op < kNumFwdOps; ++op) {
    total += fwd_op_flops(d, static_cast<FwdOp>(op), causal_attention);
  }
  return total;
}

double lm_head_forward_flops(const LayerDims& d) {
  return 2.0 * static_cast<double>(d.tokens()) * static_cast<double>(d.h) *
         static_cast<double>(d.v);
}

std::int64_t layer_parameter_count(const ModelArch& m) {
  ModelArch one = m;
  one.layers = 1;
  one.vocab_size = 0;
  one.max_positions = 0;
  one.tied_embeddings = true;
  const std::int64_t final_norm = m.norm == ModelArch::Norm::kLayerNorm ? 2 * m.hidden : m.hidden;
  return parameter_count(one) - final_norm;
}

std::int64_t layer_parameter_count_per_rank(const ModelArch& m, int tp) {
  const std::int64_t h = m.hidden;
  if (m.mla.kv_lora_rank > 0) {
    ModelArch dense = m;
    dense.mla = {};
    const std::int64_t gqa = layer_parameter_count_per_rank(dense, tp);
    return gqa - attention_parameter_count_per_rank(dense, tp) +
           attention_parameter_count_per_rank(m, tp);
  }
  const std::int64_t q = m.heads / tp * m.head_dim;
  const std::int64_t kv = m.kv_heads / tp * m.head_dim;
  const std::int64_t f = m.ffn_hidden / tp;
  const std::int64_t g = m.activation == ModelArch::Activation::kSwiGlu ? 2 : 1;
  const std::int64_t norm = m.norm == ModelArch::Norm::kLayerNorm ? 2 * h : h;
  std::int64_t n = h * (q + 2 * kv) + q * h + h * f * g + f * h + 2 * norm;
  if (m.linear_bias) n += (q + 2 * kv) + h + f * g + h;
  return n;
}

std::vector<std::int64_t> layer_parameter_tensors_per_rank(const ModelArch& m, int tp) {
  const std::int64_t h = m.hidden;
  const std::int64_t q = m.heads / tp * m.head_dim;
  const std::int64_t kv = m.kv_heads / tp * m.head_dim;
  const std::int64_t f = m.ffn_hidden / tp;
  const std::int64_t g = m.activation == ModelArch::Activation::kSwiGlu ? 2 : 1;
  const bool layer_norm = m.norm == ModelArch::Norm::kLayerNorm;
  std::vector<std::int64_t> out;
  const auto linear = [&](std::int64_t weight, std::int64_t bias) {
    out.push_back(weight);
    if (m.linear_bias) out.push_back(bias);
  };
  const auto norm = [&] {
    out.push_back(h);
    if (layer_norm) out.push_back(h);
  };
  norm();
  linear(h * (q + 2 * kv), q + 2 * kv);
  linear(q * h, h);
  norm();
  linear(h * f * g, f * g);
  linear(f * h, h);
  return out;
}

std::int64_t attention_parameter_count_per_rank(const ModelArch& m, int tp) {
  const std::int64_t h = m.hidden;
  const MlaConfig& a = m.mla;
  if (a.kv_lora_rank > 0) {
    // Megatron-Core MLA: down projections (and their norms) replicated, up projections
    // column-parallel over heads, output projection row-parallel.
    const std::int64_t heads = m.heads / tp;
    const std::int64_t qk = a.qk_nope_head_dim + a.qk_rope_head_dim;
    std::int64_t n = 0;
    if (a.q_lora_rank > 0) {
      n += h * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * heads * qk;
    } else {
      n += h * heads * qk;
    }
    n += h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank;
    n += a.kv_lora_rank * heads * (a.qk_nope_head_dim + a.v_head_dim);
    n += heads * a.v_head_dim * h;
    return n;
  }
  const std::int64_t q = m.heads / tp * m.head_dim;
  const std::int64_t kv = m.kv_heads / tp * m.head_dim;
  std::int64_t n = h * (q + 2 * kv) + q * h;
  if (m.linear_bias) n += (q + 2 * kv) + h;
  return n;
}

std::int64_t layer_parameter_count_per_rank(const ModelArch& m, int tp, int layer) {
  if (!is_moe_layer(m, layer)) return layer_parameter_count_per_rank(m, tp);
  const MoeConfig& e = m.moe;
  const std::int64_t h = m.hidden;
  const std::int64_t g = m.activation == ModelArch::Activation::kSwiGlu ? 2 : 1;
  const std::int64_t norm = m.norm == ModelArch::Norm::kLayerNorm ? 2 * h : h;
  const std::int64_t fs =
      e.shared_experts * (e.shared_ffn_hidden > 0 ? e.shared_ffn_hidden : e.expert_ffn_hidden) / tp;
  // Attention, two norms, the router (replicated) and the shared experts (tensor-parallel).
  return attention_parameter_count_per_rank(m, tp) + 2 * norm + e.experts * h +
         (e.router_bias ? e.experts : 0) + h * fs * g + fs * h;
}

std::int64_t expert_parameter_count_per_rank(const ModelArch& m, int ep, int etp) {
  const MoeConfig& e = m.moe;
  const std::int64_t h = m.hidden;
  const std::int64_t g = m.activation == ModelArch::Activation::kSwiGlu ? 2 : 1;
  const std::int64_t f = e.expert_ffn_hidden / etp;
  std::int64_t one = h * f * g + f * h;
  if (m.linear_bias) one += f * g + h;
  return e.experts / ep * one;
}

std::int64_t linear_weight_count_per_rank(const ModelArch& m, int tp, int layer) {
  ModelArch w = m;
  w.linear_bias = false;
  std::int64_t n = attention_parameter_count_per_rank(w, tp);
  const MlaConfig& a = m.mla;
  if (a.kv_lora_rank > 0) n -= a.kv_lora_rank + a.q_lora_rank;  // the down projections' norms
  const std::int64_t h = m.hidden;
  const std::int64_t g = m.activation == ModelArch::Activation::kSwiGlu ? 2 : 1;
  const MoeConfig& e = m.moe;
  const std::int64_t f =
      is_moe_layer(m, layer)
          ? e.shared_experts *
                (e.shared_ffn_hidden > 0 ? e.shared_ffn_hidden : e.expert_ffn_hidden) / tp
          : m.ffn_hidden / tp;
  return n + h * f * g + f * h;
}

std::int64_t expert_linear_weight_count_per_rank(const ModelArch& m, int ep, int etp) {
  ModelArch w = m;
  w.linear_bias = false;
  return expert_parameter_count_per_rank(w, ep, etp);
}

namespace {

// The tokens one rank routes per micro-batch: its sequences' share over context parallelism,
// split over the tensor-parallel ranks by sequence parallelism (LayerDims::moe_tokens).
std::int64_t moe_tokens_per_rank(const TrainingConfig& t, const ParallelConfig& p) {
  const std::int64_t sp = p.sequence_parallel ? p.tp : 1;
  return t.micro_batch * (t.seq_len / p.cp) / sp;
}

}  // namespace

std::vector<double> expert_rows(const ModelArch& m, const TrainingConfig& t,
                                const ParallelConfig& p) {
  const MoeConfig& e = m.moe;
  std::vector<double> rows(static_cast<std::size_t>(std::max<std::int64_t>(e.experts, 0)), 0.0);
  if (rows.empty()) return rows;
  // Token-expert assignments of one micro-batch over the expert-parallel group: ep ranks, each
  // holding the tokens of its etp expert-tensor-parallel peers.
  const double tokens = static_cast<double>(moe_tokens_per_rank(t, p));
  const double total = tokens * p.ep * p.etp * static_cast<double>(e.top_k);
  const double n = static_cast<double>(e.experts);
  const double mean = total / n;
  if (!e.expert_loads.empty() && e.expert_loads.size() == rows.size()) {
    double sum = 0.0;
    for (double v : e.expert_loads) sum += v;
    for (std::size_t i = 0; i < rows.size(); ++i)
      rows[i] = sum > 0 ? e.expert_loads[i] / sum * total : 0;
  } else {
    // The most-loaded expert carries load_imbalance × mean, the others share the rest evenly.
    const double max = std::min(total, std::max(1.0, e.load_imbalance) * mean);
    rows[0] = max;
    for (std::size_t i = 1; i < rows.size(); ++i) rows[i] = (total - max) / (n - 1.0);
  }
  if (e.capacity_factor > 0.0) {
    // Dropped above capacity; padded up to it.
    for (double& r : rows) {
      r = e.pad_to_capacity ? e.capacity_factor * mean : std::min(r, e.capacity_factor * mean);
    }
  }
  return rows;
}

double expected_local_experts_hit(const ModelArch& m, const TrainingConfig& t,
                                  const ParallelConfig& p) {
  const MoeConfig& e = m.moe;
  if (e.experts <= 0 || p.ep <= 0) return 0.0;
  const std::int64_t local = e.experts / p.ep;
  // The rank: the block of local experts with the most rows at the chosen capacity.
  const std::vector<double> capped = expert_rows(m, t, p);
  std::int64_t first = 0;
  double best = -1.0;
  for (std::int64_t r = 0; r < p.ep; ++r) {
    double sum = 0.0;
    for (std::int64_t j = r * local; j < (r + 1) * local; ++j)
      sum += capped[static_cast<std::size_t>(j)];
    if (sum > best) {
      best = sum;
      first = r * local;
    }
  }
  // Whether an expert is hit depends on the router's choice, not on what capacity drops.
  ModelArch dropless = m;
  dropless.moe.capacity_factor = 0.0;
  const std::vector<double> rows = expert_rows(dropless, t, p);
  const double tokens =
      static_cast<double>(moe_tokens_per_rank(t, p)) * static_cast<double>(p.ep * p.etp);
  if (!(tokens > 0.0)) return 0.0;
  double hit = 0.0;
  for (std::int64_t j = first; j < first + local; ++j) {
    const double q = std::clamp(rows[static_cast<std::size_t>(j)] / tokens, 0.0, 1.0);
    hit += 1.0 - std::pow(1.0 - q, tokens);
  }
  return hit;
}

ExpertFetchCounts expert_fetch_counts(const Scenario& s) {
  ExpertFetchCounts c;
  const ParallelConfig& p = s.parallelism;
  if (s.model.moe.experts <= 0 || p.ep <= 0) return c;
  const std::int64_t local = s.model.moe.experts / p.ep;
  c.expected_hit = expected_local_experts_hit(s.model, s.training, p);
  if (s.offload.expert_fetch == OffloadPolicy::ExpertFetch::kWhole) {
    c.fetched = c.with_layer = local;
    return c;
  }
  // Whole experts: the expectation rounded up (a tolerance keeps an exact count exact).
  c.fetched = std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(c.expected_hit - 1e-9)),
                                       0, local);
  if (!s.offload.expert_prediction_hit) {
    c.after_router = c.fetched;
    return c;
  }
  // The predictor names `fetched` experts; the misses are picked experts it did not name, as
  // many as the named ones nobody picked, so at most the local experts the micro-batch leaves
  // unpicked (a micro-batch that picks every local expert leaves no room for a miss).
  const double miss = (1.0 - std::clamp(*s.offload.expert_prediction_hit, 0.0, 1.0)) *
                      static_cast<double>(c.fetched);
  c.with_layer = c.fetched;
  c.after_router = std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(miss - 1e-9)), 0,
                                            std::min(c.fetched, local - c.fetched));
  return c;
}

LayerDims layer_dims(const ModelArch& m, const TrainingConfig& t, const ParallelConfig& p,
                     int layer, bool useful) {
  LayerDims d = layer_dims(m, t, p);
  if (!is_moe_layer(m, layer)) return d;
  const MoeConfig& e = m.moe;
  d.moe = true;
  d.experts = e.experts;
  d.top_k = e.top_k;
  d.ep = p.ep;
  d.etp = p.etp;
  d.local_experts = e.experts / p.ep;
  d.padded = e.pad_to_capacity && e.capacity_factor > 0.0;
  d.routing_gather = p.moe_dispatcher == ParallelConfig::MoeDispatcher::kHybridEp;
  // MoEAlltoAllTokenDispatcher.dispatch_postprocess / combine_preprocess (Megatron-Core
  // token_dispatcher.py, "Permutation 2: Sort tokens by local expert"): with more than one
  // local expert, sort_chunks_by_idxs (dropless) or a transposed .contiguous() of the padded
  // [tp·ep, experts, capacity] rows, which copies only when tp·ep > 1.
  d.sorts_chunks = p.moe_dispatcher == ParallelConfig::MoeDispatcher::kAllToAll &&
                   d.local_experts > 1 && (!d.padded || p.ep * p.etp > 1);
  d.fe = e.expert_ffn_hidden / p.etp;
  d.fs = e.shared_experts * (e.shared_ffn_hidden > 0 ? e.shared_ffn_hidden : e.expert_ffn_hidden) /
         p.tp;
  d.moe_tokens = d.tokens() / d.sp;
  if (useful) {
    d.routed = d.moe_tokens * p.etp * e.top_k;
    d.max_rows = ceil_div(d.routed, d.local_experts);
    return d;
  }
  // The rank that holds the most-loaded block of local experts (experts placed contiguously,
  // as Megatron-Core assigns local experts) sets the step.
  const std::vector<double> rows = expert_rows(m, t, p);
  double best = -1.0;
  double best_max = 0.0;
  for (std::int64_t r = 0; r < p.ep; ++r) {
    double sum = 0.0;
    double mx = 0.0;
    for (std::int64_t j = r * d.local_experts; j < (r + 1) * d.local_experts; ++j) {
      sum += rows[static_cast<std::size_t>(j)];
      mx = std::max(mx, rows[static_cast<std::size_t>(j)]);
    }
    if (sum > best) {
      best = sum;
      best_max = mx;
    }
  }
  d.routed = static_cast<std::int64_t>(std::llround(best));
  d.max_rows = static_cast<std::int64_t>(std::llround(best_max));
  return d;
}

StaticMemory static_memory(std::int64_t params, const ParallelConfig& p, bool fp32_master,
                           sim::DType compute_dtype) {
  TrainingConfig t;
  t.compute_dtype = compute_dtype;
  t.fp32_master_weights = fp32_master;
  return static_memory(params, p, resolve_dtypes(t));
}

std::int64_t ResolvedDtypes::master_bytes() const {
  if (!master) return 0;
  return master_remainders ? sim::dtype_bytes(*master) - sim::dtype_bytes(params)
                           : sim::dtype_bytes(*master);
}

std::int64_t ResolvedDtypes::updated_bytes() const {
  return master ? master_bytes() : sim::dtype_bytes(params);
}

std::int64_t ResolvedDtypes::state_bytes_per_param() const {
  return sim::dtype_bytes(params) + sim::dtype_bytes(grads) + master_bytes() +
         sim::dtype_bytes(first_moment) + sim::dtype_bytes(second_moment);
}

ResolvedDtypes resolve_dtypes(const TrainingConfig& t) {
  // fp8 GEMMs keep their weights in bf16 (Transformer Engine casts per GEMM).
  const sim::DType storage =
      t.compute_dtype == sim::DType::kFp8 ? sim::DType::kBf16 : t.compute_dtype;
  const TensorDtypes& d = t.dtypes;
  ResolvedDtypes r;
  r.params = d.params.value_or(storage);
  // FP8 parameters (Transformer Engine's, Megatron's --fp8-param-gather) take bf16 gradients and
  // are gathered in FP8, except under MXFP8, whose updated shards Megatron gathers in bf16
  // through the gradient buffer (reuse_grad_buf_for_mxfp8_param_ag) and quantizes afterwards.
  const bool fp8_params = r.params == sim::DType::kFp8;
  r.grads = d.grads.value_or(fp8_params ? sim::DType::kBf16 : r.params);
  if (d.master) {
    r.master = *d.master;
  } else if (t.fp32_master_weights && r.params != sim::DType::kFp32) {
    r.master = sim::DType::kFp32;
  }
  if (r.master == r.params) r.master.reset();  // the weights are their own master
  r.master_remainders =
      t.store_param_remainders && r.master == sim::DType::kFp32 && r.params == sim::DType::kBf16;
  r.first_moment = d.first_moment.value_or(sim::DType::kFp32);
  r.second_moment = d.second_moment.value_or(sim::DType::kFp32);
  const bool mxfp8 = t.fp8_recipe == TrainingConfig::Fp8Recipe::kMxfp8;
  r.all_gather = d.all_gather.value_or(fp8_params && mxfp8 ? sim::DType::kBf16 : r.params);
  r.reduce_scatter = d.reduce_scatter.value_or(r.grads);
  return r;
}

bool DpSharding::of(TensorClass cls) const {
  switch (cls) {
    case TensorClass::kParams:
      return params;
    case TensorClass::kGrads:
      return grads;
    case TensorClass::kOptimizerStates:
    case TensorClass::kMasterWeights:
      return optimizer;
    case TensorClass::kActivations:
    case TensorClass::kNamedActivation:
      return false;
  }
  return false;
}

DpSharding dp_sharding(const ParallelConfig& p) {
  return {.params = p.fsdp || p.zero_stage >= 3,
          .grads = p.fsdp || p.zero_stage >= 2,
          .optimizer = p.fsdp || p.zero_stage >= 1};
}

StaticMemory static_memory(std::int64_t params, const ParallelConfig& p, const ResolvedDtypes& d) {
  const DpSharding shard = dp_sharding(p);
  const bool shard_params = shard.params;
  const bool shard_grads = shard.grads;
  const bool shard_opt = shard.optimizer;
  const std::int64_t dp = shard_dp(p);
  StaticMemory m;
  m.params_bytes = sim::dtype_bytes(d.params) * (shard_params ? ceil_div(params, dp) : params);
  m.grads_bytes = sim::dtype_bytes(d.grads) * (shard_grads ? ceil_div(params, dp) : params);
  const std::int64_t opt_params = shard_opt ? ceil_div(params, dp) : params;
  m.master_bytes = d.master_bytes() * opt_params;
  m.optimizer_bytes =
      (sim::dtype_bytes(d.first_moment) + sim::dtype_bytes(d.second_moment)) * opt_params +
      m.master_bytes;
  return m;
}

}  // namespace offsim::models
