// The model catalogue, Hugging Face config import, parameter counts and offload presets.
#include <algorithm>
#include <cctype>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/scenario.h"

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

const std::vector<Entry>& catalogue() {
  static const std::vector<Entry> kEntries = [] {
    std::vector<Entry> e;
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
T parameter_count_as(const ModelArch& m) {
  const T h = static_cast<T>(m.hidden);
  const T q = static_cast<T>(m.heads) * static_cast<T>(m.head_dim);
  const T kv = static_cast<T>(m.kv_heads) * static_cast<T>(m.head_dim);
  const T ffn = static_cast<T>(m.ffn_hidden);
  const T norm = m.norm == Norm::kLayerNorm ? 2 * h : h;  // gain (+ bias)
  T layer = h * q + 2 * h * kv + q * h;                   // Wq, Wk, Wv, Wo
  const T mlp_in = m.activation == Act::kSwiGlu ? 2 * ffn : ffn;
  layer += h * mlp_in + ffn * h;
  if (m.linear_bias) layer += q + 2 * kv + h + mlp_in + h;
  layer += 2 * norm;
  T total = static_cast<T>(m.layers) * layer + norm;  // + final norm
  total += static_cast<T>(m.vocab_size) * h + static_cast<T>(m.max_positions) * h;
  if (!m.tied_embeddings) total += static_cast<T>(m.vocab_size) * h;
  return total;
}

}  // namespace

std::int64_t parameter_count(const ModelArch& m) {
  // Below the threshold every partial sum of the exact computation fits in 64 bits.
  const double estimate = parameter_count_as<double>(m);
  if (!(estimate >= 0.0 && estimate < 1.0e18)) return std::numeric_limits<std::int64_t>::max();
  return parameter_count_as<std::int64_t>(m);
}

sim::Result<ModelArch> model_from_hf_config(const std::string& json_text,
                                            const std::string& source) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "{}: not a JSON object", source);
  }
  const auto get_int = [&](const char* key, bool required,
                           std::int64_t fallback) -> sim::Result<std::int64_t> {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      if (required) {
        return sim::fail(sim::ErrorCode::kInvalidInput, "{}: missing key '{}' (an integer)", source,
                         key);
      }
      return fallback;
    }
    // Bounded so that parameter and byte counts stay in 64-bit integers.
    constexpr std::int64_t kMax = std::int64_t{1} << 24;
    if (!it->is_number_integer() || it->get<std::int64_t>() <= 0 ||
        (it->is_number_unsigned() && it->get<std::uint64_t>() > static_cast<std::uint64_t>(kMax)) ||
        it->get<std::int64_t>() > kMax) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "{}: '{}' must be a positive integer of at most {}", source, key, kMax);
    }
    return it->get<std::int64_t>();
  };
  for (const char* key : {"model_type", "_name_or_path"}) {
    auto it = j.find(key);
    if (it != j.end() && !it->is_string()) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "{}: '{}' must be a string", source, key);
    }
  }
  std::string type = j.value("model_type", std::string{});
  static const std::vector<std::string> kTypes = {"llama", "mistral", "qwen2", "gemma"};
  if (std::find(kTypes.begin(), kTypes.end(), type) == kTypes.end()) {
    return sim::fail(sim::ErrorCode::kUnsupported,
                     "{}: model_type '{}' is not supported; expected one of {}", source, type,
                     fmt::join(kTypes, ", "));
  }
  ModelArch m;
  m.name = j.value("_name_or_path", std::string{});
  if (m.name.empty()) m.name = source;
  OFFSIM_ASSIGN_OR_RETURN(m.hidden, get_int("hidden_size", true, 0));
  OFFSIM_ASSIGN_OR_RETURN(m.layers, get_int("num_hidden_layers", true, 0));
  OFFSIM_ASSIGN_OR_RETURN(m.heads, get_int("num_attention_heads", true, 0));
  OFFSIM_ASSIGN_OR_RETURN(m.kv_heads, get_int("num_key_value_heads", false, m.heads));
  OFFSIM_ASSIGN_OR_RETURN(m.ffn_hidden, get_int("intermediate_size", true, 0));
  OFFSIM_ASSIGN_OR_RETURN(m.vocab_size, get_int("vocab_size", true, 0));
  OFFSIM_ASSIGN_OR_RETURN(m.head_dim, get_int("head_dim", false, m.hidden / m.heads));
  if (m.heads % m.kv_heads != 0) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "{}: num_key_value_heads {} does not divide num_attention_heads {}", source,
                     m.kv_heads, m.heads);
  }
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
     "state on the host, the optimizer step on the CPU; parameters stream H2D one layer ahead."},
    {"megatron_optimizer_offload",
     "Megatron-Core distributed optimizer with optimizer_cpu_offload and "
     "optimizer_offload_fraction = fraction: that fraction of the optimizer state (moments and "
     "master weights) on the host and updated by the CPU."},
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

sim::Result<OffloadPolicy> offload_preset(std::string_view name, const PresetOptions& o) {
  OffloadPolicy p;
  p.preset = std::string(name);
  const int k = o.prefetch_layers;
  // The JAX/MaxText presets name what is saved or offloaded and rematerialize the rest.
  const auto names = [&](std::vector<std::string> list) {
    for (const std::string& n : list) p.rules.push_back(named(n, k));
    p.remat_unsaved = true;
  };
  if (name == "none") return p;
  if (name == "jax_offload_dot_with_no_batch_dims" || name == "maxtext_minimal_offloaded") {
    names({"query_proj", "key_proj", "value_proj", "out_proj", "mlpwi", "mlpwo"});
    return p;
  }
  if (name == "jax_save_and_offload_only_these_names") {
    if (o.names.empty()) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "offload preset {}: needs the names to offload (one or more of {})", name,
                       fmt::join(activation_names(), ", "));
    }
    for (const std::string& n : o.names) {
      const auto& all = activation_names();
      if (std::find(all.begin(), all.end(), n) == all.end()) {
        return sim::fail(sim::ErrorCode::kInvalidInput, "offload preset {}: '{}' is not one of {}",
                         name, n, fmt::join(all, ", "));
      }
    }
    names(o.names);
    return p;
  }
  if (name == "maxtext_qkv_proj_offloaded") {
    names({"query_proj", "key_proj", "value_proj"});
    return p;
  }
  if (name == "maxtext_decoder_layer_input_offloaded") {
    names({"decoder_layer_input"});
    return p;
  }
  if (name == "megatron_activation_offload") {
    OffloadRule r{
        .cls = TensorClass::kActivations, .where = Placement::kHost, .prefetch_layers = k};
    if (o.num_layers >= 0) {
      r.layers.kind = LayerSelection::Kind::kFirst;
      r.layers.count = o.num_layers;
    }
    p.rules.push_back(r);
    return p;
  }
  if (name == "zero_offload" || name == "fsdp_cpu_offload" ||
      name == "megatron_optimizer_offload") {
    if (!(o.fraction > 0.0 && o.fraction <= 1.0)) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "offload preset {}: fraction {} is not in (0, 1]", name, o.fraction);
    }
    LayerSelection sel;
    if (o.fraction < 1.0) sel = {.kind = LayerSelection::Kind::kFraction, .fraction = o.fraction};
    p.rules.push_back({.cls = TensorClass::kOptimizerStates,
                       .layers = sel,
                       .where = Placement::kHost,
                       .prefetch_layers = k});
    p.rules.push_back({.cls = TensorClass::kMasterWeights,
                       .layers = sel,
                       .where = Placement::kHost,
                       .prefetch_layers = k});
    if (name != "megatron_optimizer_offload") {
      p.rules.push_back({.cls = TensorClass::kGrads,
                         .layers = sel,
                         .where = Placement::kHost,
                         .prefetch_layers = k});
    }
    if (name == "fsdp_cpu_offload") {
      p.rules.push_back({.cls = TensorClass::kParams,
                         .layers = sel,
                         .where = Placement::kHost,
                         .prefetch_layers = k});
    }
    p.optimizer_on_cpu = true;
    return p;
  }
  std::vector<std::string> all;
  for (const PresetDef& d : kPresets) all.push_back(d.name);
  return sim::fail(sim::ErrorCode::kNotFound, "offload preset '{}' is unknown; known: {}", name,
                   fmt::join(all, ", "));
}

}  // namespace offsim::models
