// The model catalogue, Hugging Face config import, parameter counts and offload presets.
#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string_view>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/scenario.h"
#include "sim/core/escape.h"
#include "sim/core/json_reader.h"

namespace offsim::models {

namespace {

using Act = ModelArch::Activation;
using Norm = ModelArch::Norm;

struct Entry {
  ModelArch arch;
  std::string source;
  std::vector<std::string> aliases;
};

// GPT-3 / Megatron GPT: multi-head attention, GELU MLP of 4h, LayerNorm, biases, learned
// positions, dropout, tied input/output embeddings (Megatron shares the word embedding with the
// LM head).
ModelArch gpt(std::string name, std::int64_t vocab, std::int64_t hidden, std::int64_t layers,
              std::int64_t heads, std::int64_t max_positions) {
  return ModelArch{.name = std::move(name),
                   .vocab_size = vocab,
                   .hidden = hidden,
                   .layers = layers,
                   .heads = heads,
                   .kv_heads = heads,
                   .head_dim = hidden / heads,
                   .ffn_hidden = 4 * hidden,
                   .activation = Act::kGelu,
                   .norm = Norm::kLayerNorm,
                   .tied_embeddings = true,
                   .attention = ModelArch::AttentionImpl::kFlash,
                   .linear_bias = true,
                   .max_positions = max_positions,
                   .dropout = true};
}

// Llama family: GQA, SwiGLU, RMSNorm, rotary positions, no biases, no dropout, untied.
ModelArch llama(std::string name, std::int64_t vocab, std::int64_t hidden, std::int64_t layers,
                std::int64_t heads, std::int64_t kv_heads, std::int64_t ffn) {
  return ModelArch{.name = std::move(name),
                   .vocab_size = vocab,
                   .hidden = hidden,
                   .layers = layers,
                   .heads = heads,
                   .kv_heads = kv_heads,
                   .head_dim = hidden / heads,
                   .ffn_hidden = ffn,
                   .activation = Act::kSwiGlu,
                   .norm = Norm::kRmsNorm,
                   .tied_embeddings = false,
                   .attention = ModelArch::AttentionImpl::kFlash};
}

// GPT-3 and the Megatron-LM scaling study's GPT shapes.
void add_gpt_models(std::vector<Entry>& e) {
  const std::string gpt3 = "Brown et al. 2020 (GPT-3), Table 2.1; vocabulary 50257, context 2048";
  e.push_back({gpt("gpt3-125m", 50257, 768, 12, 12, 2048), gpt3, {}});
  e.push_back({gpt("gpt3-350m", 50257, 1024, 24, 16, 2048), gpt3, {}});
  e.push_back({gpt("gpt3-760m", 50257, 1536, 24, 16, 2048), gpt3, {}});
  e.push_back({gpt("gpt3-1.3b", 50257, 2048, 24, 16, 2048), gpt3, {}});
  e.push_back({gpt("gpt3-2.7b", 50257, 2560, 32, 32, 2048), gpt3, {}});
  e.push_back({gpt("gpt3-6.7b", 50257, 4096, 32, 32, 2048), gpt3, {}});
  // The paper prints d_model 5140; 40 heads × 128 = 5120 is the size actually used.
  e.push_back({gpt("gpt3-13b", 50257, 5120, 40, 40, 2048), gpt3 + " (d_model 5120)", {}});
  e.push_back({gpt("gpt3-175b", 50257, 12288, 96, 96, 2048), gpt3, {"gpt3"}});

  const std::string mlm =
      "Narayanan et al. SC'21 (arXiv 2104.04473), Table 1; vocabulary 51200, sequence 2048";
  const struct {
    const char* name;
    std::int64_t heads, hidden, layers;
  } kMegatron[] = {{"megatron-1.7b", 24, 2304, 24},      {"megatron-3.6b", 32, 3072, 30},
                   {"megatron-7.5b", 32, 4096, 36},      {"megatron-18.4b", 48, 6144, 40},
                   {"megatron-39.1b", 64, 8192, 48},     {"megatron-76.1b", 80, 10240, 60},
                   {"megatron-145.6b", 96, 12288, 80},   {"megatron-310.1b", 128, 16384, 96},
                   {"megatron-529.6b", 128, 20480, 105}, {"megatron-1008b", 160, 25600, 128}};
  for (const auto& m : kMegatron) {
    e.push_back({gpt(m.name, 51200, m.hidden, m.layers, m.heads, 2048), mlm, {}});
  }
  e.push_back({gpt("megatron-174.6b", 51200, 12288, 96, 96, 2048),
               "Narayanan et al. SC'21, Table 2 (GPT-3 175B shape, vocabulary 51200)",
               {}});
}

// Llama 2 and 3, Mistral, Gemma and Qwen2.5 (dense, gated MLP, RMSNorm).
void add_llama_family(std::vector<Entry>& e) {
  const std::string l2 = "Touvron et al. 2023 (Llama 2) / meta-llama config.json; vocab 32000";
  e.push_back({llama("llama2-7b", 32000, 4096, 32, 32, 32, 11008), l2, {}});
  e.push_back({llama("llama2-13b", 32000, 5120, 40, 40, 40, 13824), l2, {}});
  e.push_back({llama("llama2-70b", 32000, 8192, 80, 64, 8, 28672), l2, {}});
  const std::string l3 =
      "Meta 2024 (The Llama 3 Herd of Models), Table 3 / config.json; vocab 128256";
  e.push_back({llama("llama3-8b", 128256, 4096, 32, 32, 8, 14336), l3, {"llama3.1-8b"}});
  e.push_back({llama("llama3-70b", 128256, 8192, 80, 64, 8, 28672), l3, {"llama3.1-70b"}});
  e.push_back({llama("llama3-405b", 128256, 16384, 126, 128, 8, 53248), l3, {"llama3.1-405b"}});
  e.push_back({llama("mistral-7b", 32000, 4096, 32, 32, 8, 14336),
               "mistralai/Mistral-7B-v0.1 config.json",
               {}});

  // The project brief's ~2B example: Gemma 2B (google/gemma-2b config.json): 18 layers, hidden
  // 2048, 8 heads with one KV head, head_dim 256, gated GELU MLP of 16384 (modelled as the
  // gated MLP: same shapes and FLOPs as SwiGLU), vocabulary 256000, tied embeddings.
  ModelArch gemma = llama("gemma-2b", 256000, 2048, 18, 8, 1, 16384);
  gemma.head_dim = 256;
  gemma.tied_embeddings = true;
  e.push_back({gemma, "google/gemma-2b config.json (GeGLU modelled as a gated MLP)", {"2b"}});
  // The brief's 70B example is Llama 2 70B / Llama 3 70B above; "70b" names Llama 3 70B.
  e.back().aliases.push_back("gemma-2b-like");
  // Qwen2.5 (Qwen/Qwen2.5-1.5B and -3B config.json): SwiGLU, RMSNorm, GQA with 2 KV heads,
  // vocabulary 151936, tied embeddings; the q/k/v projection biases (a few thousand
  // parameters per layer) are not modelled. The DeepSpeed ZenFlow/core-binding measurements use
  // them (docs/validation.md).
  for (auto [name, hidden, layers, heads, ffn] : {std::tuple{"qwen2.5-1.5b", 1536, 28, 12, 8960},
                                                  std::tuple{"qwen2.5-3b", 2048, 36, 16, 11008}}) {
    ModelArch q = llama(name, 151936, hidden, layers, heads, 2, ffn);
    q.tied_embeddings = true;
    e.push_back({q, "Qwen/Qwen2.5 config.json (q/k/v biases not modelled)", {}});
  }
}

void add_moe_models(std::vector<Entry>& e) {
  // Mixture-of-experts models (config.json of each Hugging Face repository).
  const auto moe = [](ModelArch m, std::int64_t experts, std::int64_t top_k,
                      std::int64_t expert_ffn) {
    m.moe.experts = experts;
    m.moe.top_k = top_k;
    m.moe.expert_ffn_hidden = expert_ffn;
    return m;
  };
  // Qwen3-MoE: head_dim 128, no shared experts, every layer MoE (decoder_sparse_step 1); its
  // per-head q/k RMSNorms (2 × 128 parameters per layer) are not counted.
  ModelArch q30 = moe(llama("qwen3-30b-a3b", 151936, 2048, 48, 32, 4, 6144), 128, 8, 768);
  q30.head_dim = 128;
  e.push_back({q30,
               "Qwen/Qwen3-30B-A3B config.json (128 experts, top-8, moe_intermediate_size 768); "
               "Qwen3 technical report: 30.5B total, 3.3B active",
               {"qwen3-30b"}});
  ModelArch q235 = moe(llama("qwen3-235b-a22b", 151936, 4096, 94, 64, 4, 12288), 128, 8, 1536);
  q235.head_dim = 128;
  e.push_back({q235,
               "Qwen/Qwen3-235B-A22B config.json (128 experts, top-8, moe_intermediate_size "
               "1536); Qwen3 technical report: 235B total, 22B active",
               {"qwen3-235b"}});
  e.push_back({moe(llama("mixtral-8x7b", 32000, 4096, 32, 32, 8, 14336), 8, 2, 14336),
               "mistralai/Mixtral-8x7B-v0.1 config.json (8 experts, top-2); Jiang et al. 2024: "
               "46.7B total, 12.9B active",
               {}});
  e.push_back({moe(llama("mixtral-8x22b", 32768, 6144, 56, 48, 8, 16384), 8, 2, 16384),
               "mistralai/Mixtral-8x22B-v0.1 config.json (8 experts, top-2, vocabulary 32768); "
               "Mistral AI: 141B total, 39B active",
               {}});
  // gpt-oss: head_dim 64, biases on the attention projections, the experts and the router;
  // its attention sinks and the 128-token sliding window of every other layer are not
  // modelled (full causal attention is simulated on all layers).
  const auto gpt_oss = [&](std::string name, std::int64_t layers, std::int64_t experts) {
    ModelArch m = moe(llama(std::move(name), 201088, 2880, layers, 64, 8, 2880), experts, 4, 2880);
    m.head_dim = 64;
    m.linear_bias = true;
    m.moe.router_bias = true;
    return m;
  };
  e.push_back({gpt_oss("gpt-oss-20b", 24, 32),
               "openai/gpt-oss-20b config.json (32 experts, top-4); gpt-oss model card: 20.91B "
               "total, 3.61B active (embedding excluded)",
               {}});
  e.push_back({gpt_oss("gpt-oss-120b", 36, 128),
               "openai/gpt-oss-120b config.json (128 experts, top-4); gpt-oss model card: "
               "116.83B total, 5.13B active (embedding excluded)",
               {}});
  // DeepSeek-V3: MLA (q_lora_rank 1536, kv_lora_rank 512, nope 128 + rope 64, v 128), 256
  // routed + 1 shared expert of 2048, top-8, first 3 layers dense (18432), one MTP module.
  ModelArch ds = moe(llama("deepseek-v3", 129280, 7168, 61, 128, 128, 18432), 256, 8, 2048);
  ds.head_dim = 128;
  ds.moe.shared_experts = 1;
  ds.moe.first_k_dense = 3;
  ds.moe.router_groups = 8;  // n_group 8, topk_group 4: a token's experts on at most 4 nodes
  ds.moe.router_group_topk = 4;
  ds.mla = {.q_lora_rank = 1536,
            .kv_lora_rank = 512,
            .qk_nope_head_dim = 128,
            .qk_rope_head_dim = 64,
            .v_head_dim = 128};
  ds.mtp_layers = 1;
  e.push_back({ds,
               "deepseek-ai/DeepSeek-V3 config.json; DeepSeek-V3 technical report (arXiv "
               "2412.19437): 671B total, 37B active, + 14B MTP module",
               {"deepseek-r1"}});
}

const std::vector<Entry>& catalogue() {
  static const std::vector<Entry> kEntries = [] {
    std::vector<Entry> e;
    add_gpt_models(e);
    add_llama_family(e);
    add_moe_models(e);
    return e;
  }();
  return kEntries;
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

std::vector<CatalogueEntry> list_models() {
  std::vector<CatalogueEntry> out;
  for (const Entry& e : catalogue()) out.push_back({e.arch.name, e.source});
  return out;
}

sim::Result<ModelArch> find_model(std::string_view name) {
  const std::string key = lower(name);
  for (const Entry& e : catalogue()) {
    if (e.arch.name == key) return e.arch;
    for (const std::string& a : e.aliases) {
      if (a == key) return e.arch;
    }
  }
  if (key == "70b") return find_model("llama3-70b");
  std::vector<std::string> names;
  for (const Entry& e : catalogue()) names.push_back(e.arch.name);
  return sim::fail(sim::ErrorCode::kNotFound, "model '{}' is not in the catalogue; known: {}", name,
                   fmt::join(names, ", "));
}

namespace {

// The parameter count, generic over the arithmetic type so that it can first be estimated in
// double: unchecked architectures (fuzzed input) must never overflow 64-bit integers.
template <class T>
T parameter_count_as(const ModelArch& m, bool active = false) {
  const T h = static_cast<T>(m.hidden);
  const T q = static_cast<T>(m.heads) * static_cast<T>(m.head_dim);
  const T kv = static_cast<T>(m.kv_heads) * static_cast<T>(m.head_dim);
  const T ffn = static_cast<T>(m.ffn_hidden);
  const T norm = m.norm == Norm::kLayerNorm ? 2 * h : h;  // gain (+ bias)
  T attn = h * q + 2 * h * kv + q * h;                    // Wq, Wk, Wv, Wo
  if (m.linear_bias) attn += q + 2 * kv + h;
  const MlaConfig& a = m.mla;
  if (a.kv_lora_rank > 0) {
    // DeepSeek-V2/V3 MLA: q down (+ norm) and up, kv down (with the shared rope key) (+ norm)
    // and up, output projection.
    const T heads = static_cast<T>(m.heads);
    const T qk = static_cast<T>(a.qk_nope_head_dim + a.qk_rope_head_dim);
    const T ql = static_cast<T>(a.q_lora_rank);
    const T kvl = static_cast<T>(a.kv_lora_rank);
    attn = a.q_lora_rank > 0 ? h * ql + ql + ql * heads * qk : h * heads * qk;
    attn += h * (kvl + static_cast<T>(a.qk_rope_head_dim)) + kvl;
    attn += kvl * heads * static_cast<T>(a.qk_nope_head_dim + a.v_head_dim);
    attn += heads * static_cast<T>(a.v_head_dim) * h;
  }
  const T gate = m.activation == Act::kSwiGlu ? 2 : 1;
  T dense_ffn = h * gate * ffn + ffn * h;
  if (m.linear_bias) dense_ffn += gate * ffn + h;
  const MoeConfig& e = m.moe;
  const T fe = static_cast<T>(e.expert_ffn_hidden);
  T expert = h * gate * fe + fe * h;
  if (m.linear_bias) expert += gate * fe + h;
  const T fs = static_cast<T>(e.shared_ffn_hidden > 0 ? e.shared_ffn_hidden : e.expert_ffn_hidden);
  const T experts_used = static_cast<T>(active ? std::min(e.top_k, e.experts) : e.experts);
  T moe_ffn = experts_used * expert + static_cast<T>(e.shared_experts) * (h * gate * fs + fs * h) +
              static_cast<T>(e.experts) * h + (e.router_bias ? static_cast<T>(e.experts) : 0);
  T total = norm;  // final norm
  for (std::int64_t l = 0; l < m.layers; ++l) {
    total += attn + 2 * norm + (is_moe_layer(m, static_cast<int>(l)) ? moe_ffn : dense_ffn);
    if (e.experts == 0) {
      // Dense: every layer alike.
      total += (static_cast<T>(m.layers) - 1) * (attn + 2 * norm + dense_ffn);
      break;
    }
  }
  total += static_cast<T>(m.vocab_size) * h + static_cast<T>(m.max_positions) * h;
  if (!m.tied_embeddings) total += static_cast<T>(m.vocab_size) * h;
  return total;
}

}  // namespace

bool is_moe_layer(const ModelArch& m, int layer) {
  const MoeConfig& e = m.moe;
  // A multi-token-prediction module's layer (index layers + k) is built as the last decoder
  // layer is (Megatron's num_floating_point_operations: last_layer_is_moe).
  if (m.mtp_layers > 0 && layer >= m.layers) layer = static_cast<int>(m.layers) - 1;
  if (e.experts <= 0 || layer < e.first_k_dense) return false;
  // Megatron moe_layer_freq / DeepSeek moe_layer_freq: every layer_freq-th layer after the dense
  // ones.
  return e.layer_freq <= 1 || (layer - e.first_k_dense) % e.layer_freq == 0;
}

std::int64_t active_parameter_count(const ModelArch& m) {
  const double estimate = parameter_count_as<double>(m, true);
  if (!(estimate >= 0.0 && estimate < 1.0e18)) return std::numeric_limits<std::int64_t>::max();
  return parameter_count_as<std::int64_t>(m, true);
}

std::int64_t mtp_parameter_count(const ModelArch& m) {
  if (m.mtp_layers <= 0) return 0;
  // One MoE-or-dense transformer layer (as the model's last), the 2h -> h projection of the
  // concatenated embedding and hidden state, and the two norms before it.
  ModelArch one = m;
  one.layers = 1;
  one.vocab_size = 0;
  one.max_positions = 0;
  one.tied_embeddings = true;
  one.moe.first_k_dense = 0;
  const std::int64_t norm = m.norm == Norm::kLayerNorm ? 2 * m.hidden : m.hidden;
  const std::int64_t layer = parameter_count(one) - norm;
  return m.mtp_layers * (layer + 2 * m.hidden * m.hidden + 3 * norm);
}

std::int64_t parameter_count(const ModelArch& m) {
  // Below the threshold every partial sum of the exact computation fits in 64 bits.
  const double estimate = parameter_count_as<double>(m);
  if (!(estimate >= 0.0 && estimate < 1.0e18)) return std::numeric_limits<std::int64_t>::max();
  return parameter_count_as<std::int64_t>(m);
}

namespace {

// A count >= 0 under `key` of a Hugging Face config into `out`; an absent or null key leaves it.
// `found` tells whether the key was there.
sim::Status hf_count(const nlohmann::json& j, const std::string& source, const char* key,
                     std::int64_t& out, bool* found = nullptr) {
  constexpr std::int64_t kMax = std::int64_t{1} << 24;
  auto it = j.find(key);
  if (found != nullptr) *found = false;
  if (it == j.end() || it->is_null()) return sim::ok();
  if (!it->is_number_integer() || it->get<std::int64_t>() < 0 || it->get<std::int64_t>() > kMax) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "{}: '{}' must be an integer in 0..{}", source,
                     key, kMax);
  }
  out = it->get<std::int64_t>();
  if (found != nullptr) *found = true;
  return sim::ok();
}

// The routed experts per token, shared experts, expert width and MoE layer pattern of a config
// with `experts` experts.
sim::Status read_hf_experts(const nlohmann::json& j, const std::string& source,
                            std::int64_t experts, ModelArch& m) {
  MoeConfig& e = m.moe;
  e.experts = experts;
  bool found = false;
  OFFSIM_RETURN_IF_ERROR(hf_count(j, source, "num_experts_per_tok", e.top_k, &found));
  if (!found) OFFSIM_RETURN_IF_ERROR(hf_count(j, source, "experts_per_token", e.top_k, &found));
  if (!found || e.top_k == 0) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "{}: missing key 'num_experts_per_tok' (a positive integer) for {} experts",
                     source, experts);
  }
  if (e.top_k > experts) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "{}: 'num_experts_per_tok' {} exceeds the {} experts", source, e.top_k,
                     experts);
  }
  // Mixtral and gpt-oss: intermediate_size is the expert's; the others name it separately.
  e.expert_ffn_hidden = m.ffn_hidden;
  OFFSIM_RETURN_IF_ERROR(hf_count(j, source, "moe_intermediate_size", e.expert_ffn_hidden));
  OFFSIM_RETURN_IF_ERROR(hf_count(j, source, "n_shared_experts", e.shared_experts));
  OFFSIM_RETURN_IF_ERROR(hf_count(j, source, "first_k_dense_replace", e.first_k_dense));
  OFFSIM_RETURN_IF_ERROR(hf_count(j, source, "moe_layer_freq", e.layer_freq));
  OFFSIM_RETURN_IF_ERROR(hf_count(j, source, "decoder_sparse_step", e.layer_freq));
  if (e.layer_freq == 0) e.layer_freq = 1;
  if (e.expert_ffn_hidden == 0) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "{}: 'moe_intermediate_size' must be positive",
                     source);
  }
  return sim::ok();
}

// Multi-head latent attention (DeepSeek-V3): present when kv_lora_rank is.
sim::Status read_hf_mla(const nlohmann::json& j, const std::string& source, ModelArch& m) {
  MlaConfig& a = m.mla;
  OFFSIM_RETURN_IF_ERROR(hf_count(j, source, "kv_lora_rank", a.kv_lora_rank));
  if (a.kv_lora_rank == 0) return sim::ok();
  OFFSIM_RETURN_IF_ERROR(hf_count(j, source, "q_lora_rank", a.q_lora_rank));
  OFFSIM_RETURN_IF_ERROR(hf_count(j, source, "qk_nope_head_dim", a.qk_nope_head_dim));
  OFFSIM_RETURN_IF_ERROR(hf_count(j, source, "qk_rope_head_dim", a.qk_rope_head_dim));
  OFFSIM_RETURN_IF_ERROR(hf_count(j, source, "v_head_dim", a.v_head_dim));
  if (a.qk_nope_head_dim + a.qk_rope_head_dim == 0 || a.v_head_dim == 0) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "{}: MLA (kv_lora_rank) needs qk_nope_head_dim/qk_rope_head_dim and "
                     "v_head_dim",
                     source);
  }
  m.head_dim = a.v_head_dim;
  return sim::ok();
}

// The mixture-of-experts and MLA keys of a Hugging Face config (Mixtral, Qwen3-MoE, DeepSeek-V3,
// gpt-oss); absent keys leave a dense model.
sim::Status read_hf_moe(const nlohmann::json& j, const std::string& type, const std::string& source,
                        ModelArch& m) {
  std::int64_t experts = 0;
  for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts"}) {
    std::int64_t v = 0;
    bool found = false;
    OFFSIM_RETURN_IF_ERROR(hf_count(j, source, key, v, &found));
    if (found && v > 0) experts = v;
  }
  if (experts == 0) return sim::ok();
  OFFSIM_RETURN_IF_ERROR(read_hf_experts(j, source, experts, m));
  if (type == "gpt_oss") {
    m.moe.router_bias = true;
    auto bias = j.find("attention_bias");
    m.linear_bias = bias == j.end() || (bias->is_boolean() && bias->get<bool>());
  }
  OFFSIM_RETURN_IF_ERROR(read_hf_mla(j, source, m));
  OFFSIM_RETURN_IF_ERROR(hf_count(j, source, "num_nextn_predict_layers", m.mtp_layers));
  // DeepSeek's group-limited routing; one group (DeepSeek-V2-Lite) limits nothing.
  std::int64_t groups = 0;
  std::int64_t group_topk = 0;
  OFFSIM_RETURN_IF_ERROR(hf_count(j, source, "n_group", groups));
  OFFSIM_RETURN_IF_ERROR(hf_count(j, source, "topk_group", group_topk));
  if (groups > 1 && group_topk < groups) {
    m.moe.router_groups = groups;
    m.moe.router_group_topk = group_topk;
  }
  return sim::ok();
}

// The largest value of each dimension offsim accepts, named by the config key: the same bounds
// as check_scenario() (they keep every byte and FLOP count in 64-bit integers), so that an
// imported config fails here with its own key rather than later with a derived model.* key.
std::int64_t hf_max_of(std::string_view key) {
  if (key == "hidden_size") return std::int64_t{1} << 20;
  if (key == "intermediate_size") return std::int64_t{1} << 22;
  if (key == "vocab_size") return std::int64_t{1} << 24;
  return std::int64_t{1} << 16;  // layers, heads, head_dim
}

// A positive dimension under `key`, at most hf_max_of(key); `fallback` when it is absent and
// not `required`.
sim::Result<std::int64_t> hf_dim(const nlohmann::json& j, const std::string& source,
                                 const char* key, bool required, std::int64_t fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "{}: missing key '{}' (an integer)", source,
                       key);
    }
    return fallback;
  }
  const std::int64_t kMax = hf_max_of(key);
  if (!it->is_number_integer() || it->get<std::int64_t>() <= 0 ||
      (it->is_number_unsigned() && it->get<std::uint64_t>() > static_cast<std::uint64_t>(kMax)) ||
      it->get<std::int64_t>() > kMax) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "{}: '{}' must be a positive integer of at most {}, got {}", source, key, kMax,
                     sim::escape_for_message(it->dump()));
  }
  return it->get<std::int64_t>();
}

// The config as a JSON object that is a Hugging Face config.json of a supported model_type;
// returns that type.
sim::Result<std::string> hf_model_type(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "{}: expected a JSON object, got {}", source,
                     sim::json_type_name(j));
  }
  // Another of offsim's files given where a config.json is expected: say which.
  if (const std::string kind = sim::json_document_kind(j);
      !kind.empty() && kind != "a Hugging Face config.json") {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "{}: this is {}, expected a Hugging Face config.json (with model_type, "
                     "hidden_size, num_hidden_layers, ...)",
                     source, kind);
  }
  for (const char* key : {"model_type", "_name_or_path"}) {
    auto it = j.find(key);
    if (it != j.end() && !it->is_string()) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "{}: '{}' must be a string", source, key);
    }
  }
  std::string type = j.value("model_type", std::string{});
  static const std::vector<std::string> kTypes = {"llama",     "mistral",     "qwen2",
                                                  "gemma",     "qwen3",       "mixtral",
                                                  "qwen3_moe", "deepseek_v3", "gpt_oss"};
  if (std::find(kTypes.begin(), kTypes.end(), type) == kTypes.end()) {
    return sim::fail(sim::ErrorCode::kUnsupported,
                     "{}: model_type '{}' is not supported; expected one of {}", source,
                     sim::escape_for_message(type), fmt::join(kTypes, ", "));
  }
  return type;
}

// Hidden size, layers, heads, KV heads, FFN width, vocabulary and head size.
sim::Status read_hf_dims(const nlohmann::json& j, const std::string& source, ModelArch& m) {
  OFFSIM_ASSIGN_OR_RETURN(m.hidden, hf_dim(j, source, "hidden_size", true, 0));
  OFFSIM_ASSIGN_OR_RETURN(m.layers, hf_dim(j, source, "num_hidden_layers", true, 0));
  OFFSIM_ASSIGN_OR_RETURN(m.heads, hf_dim(j, source, "num_attention_heads", true, 0));
  OFFSIM_ASSIGN_OR_RETURN(m.kv_heads, hf_dim(j, source, "num_key_value_heads", false, m.heads));
  OFFSIM_ASSIGN_OR_RETURN(m.ffn_hidden, hf_dim(j, source, "intermediate_size", true, 0));
  OFFSIM_ASSIGN_OR_RETURN(m.vocab_size, hf_dim(j, source, "vocab_size", true, 0));
  if (!j.contains("head_dim") && m.hidden % m.heads != 0) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "{}: hidden_size {} is not a multiple of num_attention_heads {} (and there is "
                     "no head_dim key giving the head size)",
                     source, m.hidden, m.heads);
  }
  OFFSIM_ASSIGN_OR_RETURN(m.head_dim, hf_dim(j, source, "head_dim", false, m.hidden / m.heads));
  if (m.heads * m.head_dim > (std::int64_t{1} << 20)) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "{}: num_attention_heads {} x head_dim {} is {}, above offsim's limit of {}",
                     source, m.heads, m.head_dim, m.heads * m.head_dim, std::int64_t{1} << 20);
  }
  if (m.kv_heads > m.heads || m.heads % m.kv_heads != 0) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "{}: num_key_value_heads {} does not divide num_attention_heads {}", source,
                     m.kv_heads, m.heads);
  }
  return sim::ok();
}

}  // namespace

sim::Result<ModelArch> model_from_hf_config(const std::string& json_text,
                                            const std::string& source) {
  // Strict JSON: a duplicate key (which a plain parse resolves silently, last one wins) is an
  // error naming the key and its line.
  OFFSIM_ASSIGN_OR_RETURN(const nlohmann::json j, sim::parse_json_text(json_text, source));
  OFFSIM_ASSIGN_OR_RETURN(const std::string type, hf_model_type(j, source));
  ModelArch m;
  m.name = sim::escape_for_message(j.value("_name_or_path", std::string{}));
  if (m.name.empty()) m.name = source;
  OFFSIM_RETURN_IF_ERROR(read_hf_dims(j, source, m));
  // Every supported family uses a gated MLP (SwiGLU; Gemma's GeGLU has the same shapes),
  // RMSNorm and rotary positions. Qwen2's QKV biases (3 small vectors per layer) are ignored.
  m.activation = Act::kSwiGlu;
  m.norm = Norm::kRmsNorm;
  const bool tied_default = type == "gemma";
  auto tie = j.find("tie_word_embeddings");
  if (tie != j.end() && !tie->is_boolean()) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "{}: 'tie_word_embeddings' must be a boolean",
                     source);
  }
  m.tied_embeddings = tie != j.end() ? tie->get<bool>() : tied_default;
  m.attention = ModelArch::AttentionImpl::kFlash;
  OFFSIM_RETURN_IF_ERROR(read_hf_moe(j, type, source, m));
  return m;
}

// --- Offload presets ----------------------------------------------------------------------------

namespace {

struct PresetDef {
  const char* name;
  const char* description;
};

constexpr PresetDef kPresets[] = {
    {"none", "Everything on HBM, optimizer on the GPU."},
    {"jax_offload_dot_with_no_batch_dims",
     "JAX checkpoint policy offload_dot_with_no_batch_dims(offload_src='device', "
     "offload_dst='pinned_host'): the outputs of every projection matmul (query_proj, key_proj, "
     "value_proj, out_proj, mlpwi, mlpwo) are saved on the host; use with recompute.mode full so "
     "the rest of the layer is rematerialized."},
    {"jax_save_and_offload_only_these_names",
     "JAX checkpoint policy save_and_offload_only_these_names(names_which_can_be_offloaded=names, "
     "offload_dst='pinned_host'): the named activations go to the host; use with recompute.mode "
     "full for the rest."},
    {"maxtext_minimal_offloaded",
     "MaxText remat_policy: minimal_offloaded = offload_dot_with_no_batch_dims (all projection "
     "outputs to host, rest rematerialized)."},
    {"maxtext_qkv_proj_offloaded",
     "MaxText remat_policy: qkv_proj_offloaded: query_proj, key_proj, value_proj on host, rest "
     "rematerialized."},
    {"maxtext_decoder_layer_input_offloaded",
     "MaxText remat_policy: custom with decoder_layer_input: offload: each layer's input on host, "
     "the layer rematerialized in backward (full recompute with offloaded checkpoints)."},
    {"megatron_activation_offload",
     "Megatron-Core / Transformer Engine cpu_offloading with cpu_offloading_num_layers = "
     "num_layers (default: all): every saved activation of those layers goes to the host after "
     "the layer's forward and is reloaded one layer ahead of its backward. Megatron refuses it "
     "with pipeline parallelism (flagged)."},
    {"zero_offload",
     "DeepSpeed ZeRO-Offload (zero_optimization.offload_optimizer.device = cpu, stage 2): fp32 "
     "master weights, Adam moments and gradients on the host, the Adam update on the CPU; bf16 "
     "parameters stay on the GPU."},
    {"fsdp_cpu_offload",
     "PyTorch FSDP CPUOffload(offload_params=True): sharded parameters, gradients and optimizer "
     "state on the host, the optimizer step on the CPU with torch.optim's default for CPU "
     "tensors (offload.cpu.adam: torch; torch_fused for AdamW(fused=True)); parameters stream "
     "H2D one layer ahead."},
    {"megatron_optimizer_offload",
     "Megatron-Core distributed optimizer with optimizer_cpu_offload and "
     "optimizer_offload_fraction = fraction (HybridDeviceOptimizer): that fraction of each "
     "rank's parameters (the first layers of every pipeline stage) has its Adam moments on the "
     "host and is updated there by torch AdamW on a pinned fp32 clone of the master, which goes "
     "back to the GPU's fp32 main parameter; the master weights stay on the GPU. Without "
     "overlap_cpu_optimizer_d2h_h2d (Megatron's default; offload.cpu.overlap_d2h_h2d) every "
     "gradient goes down, then the CPU updates them all, then every master goes back."},
    // Framework names, one each (several are the same policy under the name its users know).
    {"te_cpu_offload",
     "Transformer Engine get_cpu_offload_context(enabled=True, num_layers=...): the saved "
     "activations of num_layers layers (default: all) go to the host after each layer's forward "
     "and come back one layer ahead of its backward (as megatron_activation_offload)."},
    {"megatron_fine_grained_activation_offload",
     "Megatron-LM fine-grained activation offload (PR #1752): only the named activations "
     "(names, default the QKV projections query_proj, key_proj, value_proj) go to the host; the "
     "rest stays on HBM, nothing is recomputed."},
    {"fsdp2_cpu_offload_policy",
     "PyTorch FSDP2 fully_shard(offload_policy=CPUOffloadPolicy(pin_memory=True)): sharded "
     "parameters, gradients and optimizer state in pinned host memory, the optimizer step on the "
     "CPU (as fsdp_cpu_offload)."},
    {"torchtitan_activation_offload",
     "torchtitan / torch.autograd.graph.save_on_cpu(pin_memory=True) activation offload: every "
     "saved activation to pinned host memory, prefetched one layer ahead of its backward."},
    {"inductor_activation_offload",
     "PyTorch Inductor activation offload (PRs #167880 / #168316): saved activations copied to "
     "the host on a side stream and prefetched ahead of the backward."},
    {"offloaded_gradient_checkpointing",
     "Offloaded gradient checkpointing (e.g. torch.utils.checkpoint with save_on_cpu, "
     "Unsloth): each layer's input checkpoint on the host, the layer recomputed in the backward; "
     "use with recompute.mode full."},
    {"jax_pinned_host_opt_state",
     "JAX optimizer state with memory_kind=\"pinned_host\" (MaxText "
     "optimizer_memory_host_offload): "
     "Adam moments and fp32 master weights in pinned host memory, streamed to the device for an "
     "update on the GPU."},
    {"jax_pinned_host_params",
     "JAX parameters with memory_kind=\"pinned_host\" (MaxText parameter_memory_host_offload): "
     "weights in pinned host memory, streamed to the device one layer ahead of use."},
    {"jax_pinned_host_params_and_opt_state",
     "Both of the above: parameters and optimizer state on pinned host memory, update on the GPU."},
    {"maxtext_full", "MaxText remat_policy: full: nothing saved but each layer's input."},
    {"maxtext_minimal",
     "MaxText remat_policy: minimal (checkpoint_dots): every projection output saved on HBM, the "
     "rest rematerialized."},
    {"maxtext_minimal_with_context",
     "MaxText remat_policy: minimal_with_context: as minimal, plus the attention context."},
    {"maxtext_save_qkv_proj",
     "MaxText remat_policy: save_qkv_proj: query_proj, key_proj, value_proj saved on HBM."},
    {"maxtext_save_out_proj", "MaxText remat_policy: save_out_proj: out_proj saved on HBM."},
    {"maxtext_save_dot_except_mlpwi",
     "MaxText remat_policy: save_dot_except_mlpwi: every projection output but mlpwi on HBM."},
    {"maxtext_save_dot_except_mlp",
     "MaxText remat_policy: save_dot_except_mlp: the attention projections on HBM, the MLP "
     "rematerialized."},
};

// MaxText remat_policy names and the preset each stands for (with recompute.mode full).
constexpr std::pair<const char*, const char*> kMaxTextRematPolicies[] = {
    {"full", "maxtext_full"},
    {"minimal", "maxtext_minimal"},
    {"minimal_with_context", "maxtext_minimal_with_context"},
    {"save_qkv_proj", "maxtext_save_qkv_proj"},
    {"save_out_proj", "maxtext_save_out_proj"},
    {"save_dot_except_mlpwi", "maxtext_save_dot_except_mlpwi"},
    {"save_dot_except_mlp", "maxtext_save_dot_except_mlp"},
    {"qkv_proj_offloaded", "maxtext_qkv_proj_offloaded"},
    {"minimal_offloaded", "maxtext_minimal_offloaded"},
};

OffloadRule named(const std::string& name, int prefetch) {
  return OffloadRule{.cls = TensorClass::kNamedActivation,
                     .name = name,
                     .where = Placement::kHost,
                     .prefetch_layers = prefetch};
}

}  // namespace

std::vector<PresetInfo> list_presets() {
  std::vector<PresetInfo> out;
  for (const PresetDef& p : kPresets) out.push_back({p.name, p.description});
  return out;
}

std::vector<std::string> maxtext_remat_policies() {
  std::vector<std::string> out;
  for (const auto& [policy, preset] : kMaxTextRematPolicies) out.push_back(policy);
  return out;
}

sim::Result<std::string> maxtext_remat_preset(std::string_view policy) {
  for (const auto& [name, preset] : kMaxTextRematPolicies) {
    if (policy == name) return std::string(preset);
  }
  return sim::fail(sim::ErrorCode::kInvalidInput,
                   "MaxText remat_policy '{}' is not modelled (expected one of {}; 'custom' is "
                   "written as offload rules)",
                   policy, fmt::join(maxtext_remat_policies(), ", "));
}

namespace {

bool one_of(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// MaxText remat policies: the named activations kept on HBM (saved, not rematerialized) under
// full recompute.
std::optional<std::vector<std::string>> hbm_saved_names(std::string_view name) {
  const std::vector<std::string> dots = {"query_proj", "key_proj", "value_proj",
                                         "out_proj",   "mlpwi",    "mlpwo"};
  if (name == "maxtext_minimal") return dots;
  if (name == "maxtext_minimal_with_context") {
    std::vector<std::string> list = dots;
    list.push_back("context");
    return list;
  }
  if (name == "maxtext_save_qkv_proj") return {{"query_proj", "key_proj", "value_proj"}};
  if (name == "maxtext_save_out_proj") return {{"out_proj"}};
  if (name == "maxtext_save_dot_except_mlpwi") {
    return {{"query_proj", "key_proj", "value_proj", "out_proj", "mlpwo"}};
  }
  if (name == "maxtext_save_dot_except_mlp") {
    return {{"query_proj", "key_proj", "value_proj", "out_proj"}};
  }
  return std::nullopt;
}

// The JAX/MaxText presets that name what is offloaded and rematerialize the rest.
std::optional<std::vector<std::string>> host_offloaded_names(std::string_view name,
                                                             const PresetOptions& o) {
  if (name == "jax_offload_dot_with_no_batch_dims" || name == "maxtext_minimal_offloaded") {
    return {{"query_proj", "key_proj", "value_proj", "out_proj", "mlpwi", "mlpwo"}};
  }
  if (name == "jax_save_and_offload_only_these_names") return o.names;
  if (name == "maxtext_qkv_proj_offloaded") return {{"query_proj", "key_proj", "value_proj"}};
  if (name == "maxtext_decoder_layer_input_offloaded") return {{"decoder_layer_input"}};
  return std::nullopt;
}

sim::Status check_activation_names(std::string_view preset, const std::vector<std::string>& list) {
  const auto& all = activation_names();
  for (const std::string& n : list) {
    if (std::find(all.begin(), all.end(), n) == all.end()) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "offload preset {}: '{}' is not one of {}",
                       preset, n, fmt::join(all, ", "));
    }
  }
  return sim::ok();
}

// jax_pinned_host_*: optimizer state (with the master weights) and/or parameters on the host.
void add_pinned_host(std::string_view name, int k, OffloadPolicy& p) {
  auto host = [&](TensorClass cls) {
    p.rules.push_back({.cls = cls, .where = Placement::kHost, .prefetch_layers = k});
  };
  if (name != "jax_pinned_host_params") {
    host(TensorClass::kOptimizerStates);
    host(TensorClass::kMasterWeights);
  }
  if (name != "jax_pinned_host_opt_state") host(TensorClass::kParams);
}

// Whole-layer activation offload, of the first `num_layers` layers when given.
void add_activation_offload(const PresetOptions& o, OffloadPolicy& p) {
  OffloadRule r{.cls = TensorClass::kActivations,
                .where = Placement::kHost,
                .prefetch_layers = o.prefetch_layers};
  if (o.num_layers >= 0) {
    r.layers.kind = LayerSelection::Kind::kFirst;
    r.layers.count = o.num_layers;
  }
  p.rules.push_back(r);
}

// ZeRO-Offload, FSDP CPU offload and Megatron's optimizer offload: optimizer state and master
// weights on the host with a CPU update; gradients too (not Megatron), parameters too (FSDP).
sim::Status add_optimizer_offload(std::string_view name, const PresetOptions& o, OffloadPolicy& p) {
  if (!(o.fraction > 0.0 && o.fraction <= 1.0)) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "offload preset {}: fraction {} is not in (0, 1]", name, o.fraction);
  }
  // Megatron-Core's HybridDeviceOptimizer offloads `fraction` of the parameters each rank
  // updates (hybrid_optimizer.py: offload_threshold = the rank's GPU parameter count times
  // offload_fraction), so every pipeline stage offloads that share of its own layers. The
  // distributed optimizer keeps its fp32 main parameter on the GPU and hands it to the
  // HybridDeviceOptimizer, which updates a pinned host clone and copies it back: the moments
  // move (8 bytes per parameter, the published 3.8 GB per 25%), the master stays.
  const bool megatron = name == "megatron_optimizer_offload";
  LayerSelection sel;
  if (o.fraction < 1.0) {
    sel = {
        .kind = megatron ? LayerSelection::Kind::kStageFraction : LayerSelection::Kind::kFraction,
        .fraction = o.fraction};
  }
  auto host = [&](TensorClass cls) {
    p.rules.push_back({.cls = cls,
                       .layers = sel,
                       .where = Placement::kHost,
                       .prefetch_layers = o.prefetch_layers});
  };
  host(TensorClass::kOptimizerStates);
  if (megatron) {
    // Megatron-Core's OptimizerConfig.overlap_cpu_optimizer_d2h_h2d defaults to False; its
    // optimizer/__init__.py builds the CPU optimizer as torch AdamW with fused=True.
    p.cpu_overlap_d2h_h2d = false;
    p.cpu_adam = OffloadPolicy::CpuAdam::kTorchFused;
    p.rules.push_back({.cls = TensorClass::kMasterWeights,
                       .layers = LayerSelection{},
                       .where = Placement::kHbm,
                       .prefetch_layers = o.prefetch_layers});
  } else {
    host(TensorClass::kMasterWeights);
  }
  if (name != "megatron_optimizer_offload") host(TensorClass::kGrads);
  if (name == "fsdp_cpu_offload" || name == "fsdp2_cpu_offload_policy") {
    host(TensorClass::kParams);
    // FSDP steps whatever optimizer the script builds; a plain torch.optim.AdamW on CPU
    // parameters takes torch's default for CPU tensors, the single-tensor for-loop.
    p.cpu_adam = OffloadPolicy::CpuAdam::kTorch;
  }
  p.optimizer_on_cpu = true;
  if (name == "zero_offload") p.cpu_step = OffloadPolicy::CpuStep::kFlatPartition;
  return sim::ok();
}

}  // namespace

sim::Result<OffloadPolicy> offload_preset(std::string_view name, const PresetOptions& o) {
  OffloadPolicy p;
  p.preset = std::string(name);
  const int k = o.prefetch_layers;
  if (name == "none" || name == "maxtext_full") return p;
  if (auto list = hbm_saved_names(name)) {
    for (const std::string& n : *list) {
      OffloadRule r = named(n, k);
      r.where = Placement::kHbm;
      p.rules.push_back(r);
    }
    return p;
  }
  if (name == "megatron_fine_grained_activation_offload") {
    const std::vector<std::string> list =
        o.names.empty() ? std::vector<std::string>{"query_proj", "key_proj", "value_proj"}
                        : o.names;
    OFFSIM_RETURN_IF_ERROR(check_activation_names(name, list));
    for (const std::string& n : list) p.rules.push_back(named(n, k));
    return p;
  }
  if (one_of(name, {"jax_pinned_host_opt_state", "jax_pinned_host_params",
                    "jax_pinned_host_params_and_opt_state"})) {
    add_pinned_host(name, k, p);
    return p;
  }
  if (name == "offloaded_gradient_checkpointing") {
    p.rules.push_back(named("decoder_layer_input", k));
    return p;
  }
  if (auto list = host_offloaded_names(name, o)) {
    if (name == "jax_save_and_offload_only_these_names") {
      if (o.names.empty()) {
        return sim::fail(sim::ErrorCode::kInvalidInput,
                         "offload preset {}: needs the names to offload (one or more of {})", name,
                         fmt::join(activation_names(), ", "));
      }
      OFFSIM_RETURN_IF_ERROR(check_activation_names(name, o.names));
    }
    for (const std::string& n : *list) p.rules.push_back(named(n, k));
    p.remat_unsaved = true;
    return p;
  }
  if (one_of(name, {"megatron_activation_offload", "te_cpu_offload",
                    "torchtitan_activation_offload", "inductor_activation_offload"})) {
    add_activation_offload(o, p);
    return p;
  }
  if (one_of(name, {"zero_offload", "fsdp_cpu_offload", "fsdp2_cpu_offload_policy",
                    "megatron_optimizer_offload"})) {
    OFFSIM_RETURN_IF_ERROR(add_optimizer_offload(name, o, p));
    return p;
  }
  std::vector<std::string> all;
  for (const PresetDef& d : kPresets) all.push_back(d.name);
  return sim::fail(sim::ErrorCode::kNotFound, "offload preset '{}' is unknown; known: {}", name,
                   fmt::join(all, ", "));
}

}  // namespace offsim::models
