// Closed-form checks of models/formulas.h: saved activations against Korthikanti et al. 2022
// ("Reducing Activation Recomputation in Large Transformer Models", Table 2), FLOPs against the
// Megatron-LM formula and 6·N·tokens, static memory against the ZeRO paper's 2Ψ + 2Ψ + 12Ψ.
#include "models/formulas.h"

#include <gtest/gtest.h>

namespace offsim::models {
namespace {

using Mode = RecomputeConfig::Mode;

// GPT-style layer as in Korthikanti et al.: MHA, GELU MLP of 4h, dropout, classic attention.
ModelArch gpt_layer() {
  ModelArch m;
  m.name = "gpt";
  m.vocab_size = 51200;
  m.hidden = 2304;
  m.layers = 24;
  m.heads = 24;
  m.kv_heads = 24;
  m.head_dim = 96;
  m.ffn_hidden = 4 * 2304;
  m.activation = ModelArch::Activation::kGelu;
  m.norm = ModelArch::Norm::kLayerNorm;
  m.attention = ModelArch::AttentionImpl::kClassic;
  m.linear_bias = true;
  m.dropout = true;
  m.max_positions = 2048;
  return m;
}

LayerDims dims(const ModelArch& m, int tp, bool sp, std::int64_t b = 2, std::int64_t s = 2048) {
  TrainingConfig t{.global_batch = 8, .micro_batch = b, .seq_len = s};
  ParallelConfig p{.tp = tp, .sequence_parallel = sp};
  return layer_dims(m, t, p);
}

TEST(Activations, NoRecomputeMatchesKorthikanti) {
  // s·b·h·34 + 5·a·s²·b bytes per layer (fp16 activations, t = 1).
  const ModelArch m = gpt_layer();
  const LayerDims d = dims(m, 1, false);
  const std::int64_t s = 2048, b = 2, h = 2304, a = 24;
  const LayerActivations acts = layer_activations(d, Mode::kNone, {});
  EXPECT_EQ(acts.saved_bytes(d), s * b * h * 34 + 5 * a * s * s * b);
}

TEST(Activations, TensorParallelWithoutSequenceParallel) {
  // s·b·h·(10 + 24/t + 5·a·s/(h·t)) with t = 8.
  const ModelArch m = gpt_layer();
  const LayerDims d = dims(m, 8, false);
  const std::int64_t s = 2048, b = 2, h = 2304, a = 24, t = 8;
  EXPECT_EQ(layer_activations(d, Mode::kNone, {}).saved_bytes(d),
            s * b * h * 10 + s * b * h * 24 / t + 5 * a * s * s * b / t);
}

TEST(Activations, SequenceParallelDividesEverything) {
  // s·b·h/t · (34 + 5·a·s/h).
  const ModelArch m = gpt_layer();
  const LayerDims d = dims(m, 4, true);
  const std::int64_t s = 2048, b = 2, h = 2304, a = 24, t = 4;
  EXPECT_EQ(layer_activations(d, Mode::kNone, {}).saved_bytes(d),
            s * b * h * 34 / t + 5 * a * s * s * b / t);
}

TEST(Activations, SelectiveRecomputeDropsTheAttentionCore) {
  // 34·s·b·h/t with sequence parallel; 10 + 24/t without.
  const ModelArch m = gpt_layer();
  const std::int64_t s = 2048, b = 2, h = 2304;
  const LayerDims sp = dims(m, 4, true);
  const LayerActivations a = layer_activations(sp, Mode::kSelective, {});
  EXPECT_EQ(a.saved_bytes(sp), s * b * h * 34 / 4);
  for (int op = 0; op < kNumFwdOps; ++op) {
    EXPECT_EQ(a.recompute[op], op == static_cast<int>(FwdOp::kCore)) << op;
  }
  const LayerDims nosp = dims(m, 8, false);
  EXPECT_EQ(layer_activations(nosp, Mode::kSelective, {}).saved_bytes(nosp),
            s * b * h * 10 + s * b * h * 24 / 8);
}

TEST(Activations, FullRecomputeKeepsOnlyTheLayerInput) {
  // 2·s·b·h, or 2·s·b·h/t with sequence parallel; every forward op re-runs.
  const ModelArch m = gpt_layer();
  const std::int64_t s = 2048, b = 2, h = 2304;
  const LayerDims d = dims(m, 8, false);
  const LayerActivations a = layer_activations(d, Mode::kFull, {});
  EXPECT_EQ(a.saved_bytes(d), 2 * s * b * h);
  for (int op = 0; op < kNumFwdOps; ++op) EXPECT_TRUE(a.recompute[op]) << op;
  const LayerDims dsp = dims(m, 8, true);
  EXPECT_EQ(layer_activations(dsp, Mode::kFull, {}).saved_bytes(dsp), 2 * s * b * h / 8);
}

TEST(Activations, FlashAttentionSavesLogsumexpInsteadOfScores) {
  // 34·s·b·h + 4 bytes · b·a·s (fp32 logsumexp); no s² term.
  ModelArch m = gpt_layer();
  m.attention = ModelArch::AttentionImpl::kFlash;
  const LayerDims d = dims(m, 1, false);
  const std::int64_t s = 2048, b = 2, h = 2304, a = 24;
  EXPECT_EQ(layer_activations(d, Mode::kNone, {}).saved_bytes(d), 34 * s * b * h + 4 * b * a * s);
}

TEST(Activations, GqaSwiGluWithoutDropout) {
  // Llama 3 70B layer, t = 1, b = 1, s = 4096, flash:
  //  x, ln1_out, h1, ln2_out: 4 · 2sh; q, context: 2 · 2s·q; k, v: 2 · 2s·kv;
  //  mlpwi (gate + up): 2 · 2s·f; act: 2s·f; lse: 4·a·s.
  ModelArch m;
  m.vocab_size = 128256;
  m.hidden = 8192;
  m.layers = 80;
  m.heads = 64;
  m.kv_heads = 8;
  m.head_dim = 128;
  m.ffn_hidden = 28672;
  m.activation = ModelArch::Activation::kSwiGlu;
  m.norm = ModelArch::Norm::kRmsNorm;
  const LayerDims d = dims(m, 1, false, 1, 4096);
  const std::int64_t s = 4096, h = 8192, q = 8192, kv = 1024, f = 28672, a = 64;
  const std::int64_t expected =
      4 * 2 * s * h + 2 * 2 * s * q + 2 * 2 * s * kv + 2 * 2 * s * f + 2 * s * f + 4 * a * s;
  EXPECT_EQ(layer_activations(d, Mode::kNone, {}).saved_bytes(d), expected);
}

TEST(Activations, Fp8GemmsSaveTheirInputsQuantized) {
  // Llama 3 70B layer as above under fp8 (Transformer Engine): the QKV, MLP-in and MLP-out
  // GEMM inputs are kept as one-byte copies; the out projection keeps its fp8 copy beside the
  // bf16 attention output that FlashAttention's backward reads; x, h1, q, k, v, the fc1 output
  // and the logsumexp stay as they were. With sequence parallelism the norm outputs are the
  // rank's rows.
  ModelArch m;
  m.vocab_size = 128256;
  m.hidden = 8192;
  m.layers = 80;
  m.heads = 64;
  m.kv_heads = 8;
  m.head_dim = 128;
  m.ffn_hidden = 28672;
  m.activation = ModelArch::Activation::kSwiGlu;
  m.norm = ModelArch::Norm::kRmsNorm;
  const std::int64_t s = 4096, h = 8192, q = 8192, kv = 1024, f = 28672, a = 64;
  TrainingConfig t{.global_batch = 8, .micro_batch = 1, .seq_len = s};
  t.compute_dtype = sim::DType::kFp8;
  const LayerDims d = layer_dims(m, t, ParallelConfig{});
  EXPECT_EQ(d.e_q, 1);
  const std::int64_t expected = 2 * 2 * s * h + 2 * 1 * s * h + 2 * s * q + 3 * s * q +
                                2 * 2 * s * kv + 2 * 2 * s * f + 1 * s * f + 4 * a * s;
  EXPECT_EQ(layer_activations(d, Mode::kNone, {}).saved_bytes(d), expected);
  EXPECT_EQ(act_bytes(d, Act::kLn1Out), s * h);
  EXPECT_EQ(act_bytes(d, Act::kActOut), s * f);

  const LayerDims sp = layer_dims(m, t, ParallelConfig{.tp = 4, .sequence_parallel = true});
  EXPECT_EQ(act_bytes(sp, Act::kLn2Out), s * h / 4);
  EXPECT_EQ(act_bytes(sp, Act::kContext), s * (q / 4) * 3);

  // bf16 GEMMs keep the bf16 inputs.
  t.compute_dtype = sim::DType::kBf16;
  const LayerDims bf = layer_dims(m, t, ParallelConfig{});
  EXPECT_EQ(bf.e_q, 0);
  EXPECT_EQ(act_bytes(bf, Act::kActOut), 2 * s * f);
}

TEST(Activations, DotOffloadPolicyRecomputesNoGemm) {
  // offload_dot_with_no_batch_dims under full remat: every projection output is saved, so only
  // norms, attention core, residuals and the activation function re-run.
  const ModelArch m = gpt_layer();
  const LayerDims d = dims(m, 1, false);
  const LayerActivations a = layer_activations(
      d, Mode::kFull, {"query_proj", "key_proj", "value_proj", "out_proj", "mlpwi", "mlpwo"});
  EXPECT_FALSE(a.recompute[static_cast<int>(FwdOp::kQkv)]);
  EXPECT_FALSE(a.recompute[static_cast<int>(FwdOp::kOutProj)]);
  EXPECT_FALSE(a.recompute[static_cast<int>(FwdOp::kMlpWi)]);
  EXPECT_FALSE(a.recompute[static_cast<int>(FwdOp::kMlpWo)]);
  EXPECT_TRUE(a.recompute[static_cast<int>(FwdOp::kCore)]);
  EXPECT_TRUE(a.recompute[static_cast<int>(FwdOp::kLn1)]);
  EXPECT_TRUE(a.recompute[static_cast<int>(FwdOp::kAct)]);
  // Saved: x + q + k + v + out_proj + mlpwi + mlpwo = 2sbh · (1 + 3 + 1 + 4 + 1).
  const std::int64_t sbh2 = 2 * 2048 * 2 * 2304;
  EXPECT_EQ(a.saved_bytes(d), sbh2 * 10);
}

TEST(Flops, LayerForwardMatchesMegatron) {
  // 24·b·s·h² + 4·b·s²·h per layer forward (full attention products).
  const ModelArch m = gpt_layer();
  const LayerDims d = dims(m, 1, false);
  const double b = 2, s = 2048, h = 2304;
  EXPECT_DOUBLE_EQ(layer_forward_flops(d, false), 24 * b * s * h * h + 4 * b * s * s * h);
  // Causal attention halves only the s² term.
  EXPECT_DOUBLE_EQ(layer_forward_flops(d, true), 24 * b * s * h * h + 2 * b * s * s * h);
}

TEST(Flops, StepMatchesSixNTokensPlusAttention) {
  // 3 · (l · fwd + LM head) = 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) (Narayanan et al. 2021,
  // without the recompute forward); its first term is 6·N·tokens for N = 12·l·h².
  const ModelArch m = gpt_layer();
  const LayerDims d = dims(m, 1, false);
  const double B = 2, s = 2048, h = 2304, l = 24, V = 51200;
  const double step = 3 * (l * layer_forward_flops(d, false) + lm_head_forward_flops(d));
  const double megatron = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
  EXPECT_NEAR(step / megatron, 1.0, 1e-12);
  EXPECT_NEAR(72 * B * s * l * h * h, 6 * (12 * l * h * h) * B * s, 1.0);
}

TEST(Flops, TensorParallelSplitsEveryGemm) {
  const ModelArch m = gpt_layer();
  EXPECT_DOUBLE_EQ(layer_forward_flops(dims(m, 8, false), false) * 8,
                   layer_forward_flops(dims(m, 1, false), false));
}

TEST(StaticMemory, ZeroStagesMatchClosedForms) {
  // Ψ = 1,000,000 params, dp = 4, fp32 master: params 2Ψ, grads 2Ψ, optimizer 12Ψ, divided by dp
  // from ZeRO-3 / ZeRO-2 / ZeRO-1 on respectively.
  const std::int64_t psi = 1'000'000;
  struct Case {
    int stage;
    bool fsdp;
    std::int64_t params, grads, opt;
  } cases[] = {{0, false, 2 * psi, 2 * psi, 12 * psi},
               {1, false, 2 * psi, 2 * psi, 3 * psi},
               {2, false, 2 * psi, psi / 2, 3 * psi},
               {3, false, psi / 2, psi / 2, 3 * psi},
               {0, true, psi / 2, psi / 2, 3 * psi}};
  for (const Case& c : cases) {
    ParallelConfig p{.dp = 4, .zero_stage = c.stage, .fsdp = c.fsdp};
    const StaticMemory m = static_memory(psi, p, true, sim::DType::kBf16);
    EXPECT_EQ(m.params_bytes, c.params) << c.stage << c.fsdp;
    EXPECT_EQ(m.grads_bytes, c.grads) << c.stage << c.fsdp;
    EXPECT_EQ(m.optimizer_bytes, c.opt) << c.stage << c.fsdp;
  }
  // Without master weights: 8Ψ of moments.
  EXPECT_EQ(static_memory(psi, {}, false, sim::DType::kBf16).optimizer_bytes, 8 * psi);
}

// ZeRO's stages (Rajbhandari et al., SC'20, section 5): stage 1 shards the optimizer state,
// 2 also the gradients, 3 also the parameters; FSDP's full shard shards all three; activations
// are never sharded over data parallelism.
TEST(DpSharding, ZeroStagesAndFsdp) {
  using C = TensorClass;
  const C classes[] = {C::kParams,        C::kGrads,       C::kOptimizerStates,
                       C::kMasterWeights, C::kActivations, C::kNamedActivation};
  // Expected per stage 0..3, then FSDP, in the order of `classes`.
  const bool expected[5][6] = {{false, false, false, false, false, false},
                               {false, false, true, true, false, false},
                               {false, true, true, true, false, false},
                               {true, true, true, true, false, false},
                               {true, true, true, true, false, false}};
  for (int row = 0; row < 5; ++row) {
    ParallelConfig p;
    p.dp = 8;
    p.zero_stage = row < 4 ? row : 0;
    p.fsdp = row == 4;
    const DpSharding shard = dp_sharding(p);
    EXPECT_EQ(shard.params, expected[row][0]) << row;
    EXPECT_EQ(shard.grads, expected[row][1]) << row;
    EXPECT_EQ(shard.optimizer, expected[row][2]) << row;
    for (int c = 0; c < 6; ++c) EXPECT_EQ(shard.of(classes[c]), expected[row][c]) << row << c;
  }
}

TEST(Parameters, LayerPerRankSumsToLayer) {
  const ModelArch m = gpt_layer();
  // Column-parallel parts split by t; norms (2 · 2h) and row-parallel biases (2 · h) replicated.
  const std::int64_t h = m.hidden;
  const std::int64_t replicated = 4 * h + 2 * h;
  EXPECT_EQ((layer_parameter_count_per_rank(m, 8) - replicated) * 8 + replicated,
            layer_parameter_count(m));
  EXPECT_EQ(layer_parameter_count_per_rank(m, 1), layer_parameter_count(m));
  // 12h² + 13h (Megatron).
  EXPECT_EQ(layer_parameter_count(m), 12 * h * h + 13 * h);
}

TEST(Parameters, LayerTensorsAsMegatronRegistersThem) {
  // GPT (LayerNorm, biases): 12 tensors, QKV weight 3h² second; Llama (RMSNorm, no biases, gated
  // MLP fused): 6. Each list sums to the layer's count on the rank.
  const ModelArch gpt = gpt_layer();
  const std::int64_t h = gpt.hidden;
  for (const int tp : {1, 8}) {
    const std::vector<std::int64_t> t = layer_parameter_tensors_per_rank(gpt, tp);
    ASSERT_EQ(t.size(), 12u);
    EXPECT_EQ(t[0], h);
    EXPECT_EQ(t[2], 3 * h * h / tp);
    std::int64_t sum = 0;
    for (std::int64_t n : t) sum += n;
    EXPECT_EQ(sum, layer_parameter_count_per_rank(gpt, tp)) << tp;
  }
  const ModelArch llama = *find_model("llama3-8b");
  const std::vector<std::int64_t> t = layer_parameter_tensors_per_rank(llama, 2);
  ASSERT_EQ(t.size(), 6u);
  std::int64_t sum = 0;
  for (std::int64_t n : t) sum += n;
  EXPECT_EQ(sum, layer_parameter_count_per_rank(llama, 2));
}

}  // namespace
}  // namespace offsim::models
