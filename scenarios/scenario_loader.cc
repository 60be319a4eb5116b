#include "scenarios/scenario_loader.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <functional>
#include <limits>
#include <set>

#include "sim/core/file_io.h"
#include "sim/platform/host.h"
#include "sim/platform/profile.h"
#include "sim/platform/system.h"

namespace offsim::scenarios {
namespace {

using models::ModelArch;
using models::OffloadPolicy;
using models::OffloadRule;
using models::ParallelConfig;
using models::RecomputeConfig;
using models::Scenario;
using sim::ErrorCode;

std::vector<std::string> system_names() {
  std::vector<std::string> names;
  for (const auto& system : sim::platform::list_systems()) names.push_back(system.name);
  return names;
}

sim::Unexpected type_error(const Node& node, const std::string& path, const std::string& what) {
  return sim::fail(ErrorCode::kInvalidInput, "{}: {}: expected {}, got {}", node.origin, path, what,
                   node.describe());
}

std::string join_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

// Edit distance between two short keys (typos such as "global_bach" or "modle").
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The error for a required key that is absent from `map`. When the map holds a key that looks
// like a misspelling of it, that key is the real mistake and the error points at it.
sim::Unexpected missing_key(const Node& map, const std::string& path, const std::string& key,
                            const std::string& expected) {
  for (const auto& [name, value] : map.entries) {
    if (name != key && edit_distance(name, key) <= 2) {
      return sim::fail(ErrorCode::kInvalidInput, "{}: {}: unknown key; did you mean '{}'?",
                       value.origin, join_path(path, name), key);
    }
  }
  return sim::fail(ErrorCode::kInvalidInput, "{}: {}: missing; {}", map.origin,
                   join_path(path, key), expected);
}

// Reads the keys of one map and reports any key nobody asked for.
class MapReader {
 public:
  MapReader(const Node& node, std::string path) : node_(node), path_(std::move(path)) {}

  const Node* get(const std::string& key) {
    known_.push_back(key);
    return node_.find(key);
  }
  const std::string& path() const { return path_; }
  std::string child(const std::string& key) const { return join_path(path_, key); }

  sim::Status finish() const {
    for (const auto& [key, value] : node_.entries) {
      if (std::find(known_.begin(), known_.end(), key) == known_.end()) {
        return sim::fail(ErrorCode::kInvalidInput, "{}: {}: unknown key; expected one of {}",
                         value.origin, child(key), fmt::join(known_, ", "));
      }
    }
    return sim::ok();
  }

 private:
  const Node& node_;
  std::string path_;
  std::vector<std::string> known_;
};

sim::Status expect_map(const Node& node, const std::string& path) {
  if (node.kind != NodeKind::kMap) return type_error(node, path, "a map");
  return sim::ok();
}

template <class Int>
sim::Status read_int(MapReader& r, const std::string& key, Int& out, std::int64_t min,
                     std::int64_t max = std::numeric_limits<Int>::max()) {
  const Node* node = r.get(key);
  if (node == nullptr) return sim::ok();
  const auto v = scalar_int(*node);
  const std::string what = max == std::numeric_limits<Int>::max()
                               ? fmt::format("an integer >= {}", min)
                               : fmt::format("an integer in {}..{}", min, max);
  if (!v || *v < min || *v > max) return type_error(*node, r.child(key), what);
  out = static_cast<Int>(*v);
  return sim::ok();
}

sim::Status read_double(MapReader& r, const std::string& key, double& out, double min, double max) {
  const Node* node = r.get(key);
  if (node == nullptr) return sim::ok();
  const auto v = scalar_double(*node);
  if (!v || *v < min || *v > max) {
    return type_error(*node, r.child(key), fmt::format("a number in [{}, {}]", min, max));
  }
  out = *v;
  return sim::ok();
}

sim::Status read_bool(MapReader& r, const std::string& key, bool& out) {
  const Node* node = r.get(key);
  if (node == nullptr) return sim::ok();
  const auto v = scalar_bool(*node);
  if (!v) return type_error(*node, r.child(key), "true or false");
  out = *v;
  return sim::ok();
}

sim::Result<std::string> string_of(const Node& node, const std::string& path) {
  if (node.kind != NodeKind::kScalar || node.scalar.empty()) {
    return type_error(node, path, "a non-empty string");
  }
  return node.scalar;
}

sim::Status read_string(MapReader& r, const std::string& key, std::string& out) {
  const Node* node = r.get(key);
  if (node == nullptr) return sim::ok();
  OFFSIM_ASSIGN_OR_RETURN(out, string_of(*node, r.child(key)));
  return sim::ok();
}

// An enum read through the models' from_string, listing every accepted spelling on error.
template <class Enum, std::size_t N>
sim::Result<Enum> enum_of(const Node& node, const std::string& path, const Enum (&all)[N],
                          std::optional<Enum> (*parse)(std::string_view)) {
  std::vector<std::string> names;
  for (Enum e : all) names.emplace_back(models::to_string(e));
  if (node.kind == NodeKind::kScalar) {
    if (auto v = parse(node.scalar)) return *v;
  }
  return type_error(node, path, fmt::format("one of {}", fmt::join(names, ", ")));
}

template <class Enum, std::size_t N>
sim::Status read_enum(MapReader& r, const std::string& key, Enum& out, const Enum (&all)[N],
                      std::optional<Enum> (*parse)(std::string_view)) {
  const Node* node = r.get(key);
  if (node == nullptr) return sim::ok();
  OFFSIM_ASSIGN_OR_RETURN(out, enum_of(*node, r.child(key), all, parse));
  return sim::ok();
}

constexpr ModelArch::Activation kActivations[] = {ModelArch::Activation::kGelu,
                                                  ModelArch::Activation::kSwiGlu};
constexpr ModelArch::Norm kNorms[] = {ModelArch::Norm::kLayerNorm, ModelArch::Norm::kRmsNorm};
constexpr ModelArch::AttentionImpl kAttentionImpls[] = {ModelArch::AttentionImpl::kFlash,
                                                        ModelArch::AttentionImpl::kClassic,
                                                        ModelArch::AttentionImpl::kFlash2};
constexpr ParallelConfig::PipelineSchedule kSchedules[] = {
    ParallelConfig::PipelineSchedule::k1F1B, ParallelConfig::PipelineSchedule::kInterleaved1F1B};
constexpr ParallelConfig::BackwardPrefetch kBackwardPrefetches[] = {
    ParallelConfig::BackwardPrefetch::kPre, ParallelConfig::BackwardPrefetch::kPost,
    ParallelConfig::BackwardPrefetch::kNone};
constexpr ParallelConfig::ParamGather kParamGathers[] = {
    ParallelConfig::ParamGather::kPerLayer, ParallelConfig::ParamGather::kPerTensorSynchronized};
constexpr ParallelConfig::CpCommType kCpCommTypes[] = {ParallelConfig::CpCommType::kP2P,
                                                       ParallelConfig::CpCommType::kA2A};
constexpr ParallelConfig::MoeDispatcher kMoeDispatchers[] = {
    ParallelConfig::MoeDispatcher::kAllToAll, ParallelConfig::MoeDispatcher::kDeepEp,
    ParallelConfig::MoeDispatcher::kHybridEp};
constexpr models::TrainingConfig::Fp8Recipe kFp8Recipes[] = {
    models::TrainingConfig::Fp8Recipe::kDelayed, models::TrainingConfig::Fp8Recipe::kCurrent,
    models::TrainingConfig::Fp8Recipe::kMxfp8, models::TrainingConfig::Fp8Recipe::kBlockwise};
constexpr models::TrainingConfig::MoeGroupedGemm kMoeGroupedGemms[] = {
    models::TrainingConfig::MoeGroupedGemm::kMultiStream,
    models::TrainingConfig::MoeGroupedGemm::kSingleKernel,
    models::TrainingConfig::MoeGroupedGemm::kSequential};
constexpr RecomputeConfig::Mode kRecomputeModes[] = {
    RecomputeConfig::Mode::kNone, RecomputeConfig::Mode::kSelective, RecomputeConfig::Mode::kFull};
constexpr RecomputeConfig::Rerun kRecomputeReruns[] = {RecomputeConfig::Rerun::kNeeded,
                                                       RecomputeConfig::Rerun::kLayer};
constexpr models::CudaGraphModule kCudaGraphModules[] = {
    models::CudaGraphModule::kAttn,      models::CudaGraphModule::kMlp,
    models::CudaGraphModule::kMoeRouter, models::CudaGraphModule::kMoePreprocess,
    models::CudaGraphModule::kMoe,       models::CudaGraphModule::kLayer};
constexpr models::RecomputeModule kRecomputeModules[] = {
    models::RecomputeModule::kCoreAttn,     models::RecomputeModule::kLayernorm,
    models::RecomputeModule::kMoeAct,       models::RecomputeModule::kMlaUpProj,
    models::RecomputeModule::kMlp,          models::RecomputeModule::kMoe,
    models::RecomputeModule::kSharedExperts};
constexpr models::Placement kPlacements[] = {models::Placement::kHbm, models::Placement::kHost};
constexpr models::OffloadPolicy::CpuStep kCpuSteps[] = {
    models::OffloadPolicy::CpuStep::kPerGroup, models::OffloadPolicy::CpuStep::kFlatPartition};
constexpr models::OffloadPolicy::CpuAdam kCpuAdams[] = {models::OffloadPolicy::CpuAdam::kDeepSpeed,
                                                        models::OffloadPolicy::CpuAdam::kTorchFused,
                                                        models::OffloadPolicy::CpuAdam::kTorch};
constexpr models::OffloadPolicy::ExpertFetch kExpertFetches[] = {
    models::OffloadPolicy::ExpertFetch::kWhole, models::OffloadPolicy::ExpertFetch::kRouted};

std::string resolve_path(const Node& node, const std::string& value, const std::string& base_dir) {
  namespace fs = std::filesystem;
  if (fs::path(value).is_absolute()) return value;
  if (node.origin.rfind("--set", 0) == 0 || base_dir.empty()) return value;
  return (fs::path(base_dir) / value).lexically_normal().string();
}

constexpr std::int64_t kMaxDim = std::int64_t{1} << 24;  // hidden sizes, vocab
constexpr std::int64_t kMaxLayers = 100'000;
constexpr std::int64_t kMaxBatch = std::int64_t{1} << 30;

// model.moe: the mixture-of-experts block (absent: a dense model).
sim::Status read_moe(const Node& node, models::MoeConfig& e) {
  OFFSIM_RETURN_IF_ERROR(expect_map(node, "model.moe"));
  MapReader r(node, "model.moe");
  OFFSIM_RETURN_IF_ERROR(read_int(r, "experts", e.experts, 1, 65536));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "top_k", e.top_k, 1, 65536));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "expert_ffn_hidden", e.expert_ffn_hidden, 1, kMaxDim));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "shared_experts", e.shared_experts, 0, 64));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "shared_ffn_hidden", e.shared_ffn_hidden, 0, kMaxDim));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "first_k_dense", e.first_k_dense, 0, kMaxLayers));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "layer_freq", e.layer_freq, 1, kMaxLayers));
  if (const Node* cf = r.get("capacity_factor")) {
    const auto v = scalar_double(*cf);
    if (!v || !(*v > 0.0) || *v > 1e6) {
      return type_error(*cf, r.child("capacity_factor"),
                        "a number > 0 (tokens an expert may take over the mean; omit the key for "
                        "dropless routing)");
    }
    e.capacity_factor = *v;
  }
  OFFSIM_RETURN_IF_ERROR(read_bool(r, "pad_to_capacity", e.pad_to_capacity));
  OFFSIM_RETURN_IF_ERROR(read_double(r, "load_imbalance", e.load_imbalance, 1.0, 65536.0));
  if (const Node* loads = r.get("expert_loads")) {
    if (loads->kind != NodeKind::kSequence || loads->items.empty()) {
      return type_error(*loads, r.child("expert_loads"),
                        "a list of per-expert token counts (one per expert)");
    }
    e.expert_loads.clear();
    for (std::size_t i = 0; i < loads->items.size(); ++i) {
      const auto v = scalar_double(loads->items[i]);
      if (!v || !(*v >= 0.0) || *v > 1e15) {
        return type_error(loads->items[i], fmt::format("{}.{}", r.child("expert_loads"), i),
                          "a token count >= 0");
      }
      e.expert_loads.push_back(*v);
    }
  }
  OFFSIM_RETURN_IF_ERROR(read_bool(r, "router_bias", e.router_bias));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "router_groups", e.router_groups, 0, 65536));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "router_group_topk", e.router_group_topk, 0, 65536));
  return r.finish();
}

// model.mla: DeepSeek multi-head latent attention ranks and head dims.
sim::Status read_mla(const Node& node, models::MlaConfig& a) {
  OFFSIM_RETURN_IF_ERROR(expect_map(node, "model.mla"));
  MapReader r(node, "model.mla");
  OFFSIM_RETURN_IF_ERROR(read_int(r, "q_lora_rank", a.q_lora_rank, 0, kMaxDim));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "kv_lora_rank", a.kv_lora_rank, 0, kMaxDim));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "qk_nope_head_dim", a.qk_nope_head_dim, 0, 65536));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "qk_rope_head_dim", a.qk_rope_head_dim, 0, 65536));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "v_head_dim", a.v_head_dim, 0, 65536));
  return r.finish();
}

sim::Status read_arch_fields(MapReader& r, ModelArch& m) {
  OFFSIM_RETURN_IF_ERROR(read_string(r, "name", m.name));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "vocab_size", m.vocab_size, 1, kMaxDim));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "hidden", m.hidden, 1, kMaxDim));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "layers", m.layers, 1, kMaxLayers));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "heads", m.heads, 1, kMaxDim));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "kv_heads", m.kv_heads, 1, kMaxDim));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "head_dim", m.head_dim, 1, kMaxDim));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "ffn_hidden", m.ffn_hidden, 1, kMaxDim));
  OFFSIM_RETURN_IF_ERROR(
      read_enum(r, "activation", m.activation, kActivations, models::activation_from_string));
  OFFSIM_RETURN_IF_ERROR(read_enum(r, "norm", m.norm, kNorms, models::norm_from_string));
  OFFSIM_RETURN_IF_ERROR(read_bool(r, "tied_embeddings", m.tied_embeddings));
  OFFSIM_RETURN_IF_ERROR(
      read_enum(r, "attention", m.attention, kAttentionImpls, models::attention_impl_from_string));
  OFFSIM_RETURN_IF_ERROR(read_bool(r, "linear_bias", m.linear_bias));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "max_positions", m.max_positions, 0, kMaxDim));
  OFFSIM_RETURN_IF_ERROR(read_bool(r, "dropout", m.dropout));
  if (const Node* moe = r.get("moe")) OFFSIM_RETURN_IF_ERROR(read_moe(*moe, m.moe));
  if (const Node* mla = r.get("mla")) OFFSIM_RETURN_IF_ERROR(read_mla(*mla, m.mla));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "mtp_layers", m.mtp_layers, 0, 64));
  return sim::ok();
}

sim::Result<ModelArch> catalogue_model(const Node& node, const std::string& path) {
  OFFSIM_ASSIGN_OR_RETURN(std::string name, string_of(node, path));
  auto m = models::find_model(name);
  if (!m) {
    std::vector<std::string> names;
    for (const auto& e : models::list_models()) names.push_back(e.name);
    return sim::fail(ErrorCode::kInvalidInput, "{}: {}: expected a catalogue model ({}), got {}",
                     node.origin, path, fmt::join(names, ", "), node.describe());
  }
  return *m;
}

sim::Result<ModelArch> read_model(const Node& node, const std::string& base_dir) {
  if (node.kind == NodeKind::kScalar) return catalogue_model(node, "model");
  if (node.kind != NodeKind::kMap) {
    return type_error(node, "model", "a catalogue name, an architecture map, or {hf_config: path}");
  }
  MapReader r(node, "model");
  ModelArch m;
  const Node* base = r.get("base");
  const Node* hf = r.get("hf_config");
  if (base != nullptr && hf != nullptr) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: model: expected either 'base' or 'hf_config', got both", hf->origin);
  }
  bool from_existing = false;
  if (base != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(m, catalogue_model(*base, "model.base"));
    from_existing = true;
  } else if (hf != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(std::string rel, string_of(*hf, "model.hf_config"));
    const std::string file = resolve_path(*hf, rel, base_dir);
    auto text = sim::read_input_file(file, sim::kHfConfigInput);
    if (!text) {
      return sim::fail(ErrorCode::kInvalidInput, "{}: model.hf_config: {}", hf->origin,
                       text.error().message);
    }
    auto arch = models::model_from_hf_config(*text, file);
    if (!arch) {
      return sim::fail(ErrorCode::kInvalidInput, "{}: model.hf_config: {}", hf->origin,
                       arch.error().message);
    }
    m = *arch;
    from_existing = true;
  }
  // Inline fields: a whole architecture, or changes to the base / imported one.
  OFFSIM_RETURN_IF_ERROR(read_arch_fields(r, m));
  OFFSIM_RETURN_IF_ERROR(r.finish());
  if (!from_existing) {
    for (const char* required : {"name", "vocab_size", "hidden", "layers", "heads"}) {
      if (node.find(required) == nullptr) {
        return missing_key(node, "model", required,
                           "an inline architecture needs name, vocab_size, hidden, layers, heads "
                           "(kv_heads, head_dim, ffn_hidden may be derived)");
      }
    }
  }
  // Derived defaults for inline architectures, printed by --print-effective.
  if (m.kv_heads == 0) m.kv_heads = m.heads;
  if (m.head_dim == 0 && m.heads > 0) m.head_dim = m.hidden / m.heads;
  if (m.ffn_hidden == 0) m.ffn_hidden = 4 * m.hidden;
  return m;
}

// hardware.system: required, one of the catalogue's systems.
sim::Status read_system(MapReader& r, const Node& node, models::HardwareConfig& h) {
  const Node* system = r.get("system");
  if (system == nullptr) {
    return missing_key(node, "hardware", "system",
                       fmt::format("expected one of {}", fmt::join(system_names(), ", ")));
  }
  OFFSIM_ASSIGN_OR_RETURN(h.system, string_of(*system, "hardware.system"));
  const auto known = system_names();
  if (!known.empty() && std::find(known.begin(), known.end(), h.system) == known.end()) {
    return type_error(*system, "hardware.system", fmt::format("one of {}", fmt::join(known, ", ")));
  }
  return sim::ok();
}

// hardware.host: null, one of the host catalogue's names or a host file (a path ending in
// ".json", relative to the scenario file like hardware.profile), read here so that its errors
// carry the scenario's location.
sim::Status read_host(const Node& host, const std::string& base_dir, models::HardwareConfig& h) {
  if (is_null_scalar(host)) return sim::ok();
  OFFSIM_ASSIGN_OR_RETURN(h.host, string_of(host, "hardware.host"));
  if (sim::platform::is_host_file(h.host)) {
    h.host = resolve_path(host, h.host, base_dir);
    if (auto file = sim::platform::read_host_file(h.host); !file) {
      return sim::fail(ErrorCode::kInvalidInput, "{}: hardware.host: {}", host.origin,
                       file.error().message);
    }
    return sim::ok();
  }
  if (!sim::platform::find_host(h.host)) {
    std::vector<std::string> names;
    for (const auto& known_host : sim::platform::list_hosts()) names.push_back(known_host.name);
    return type_error(host, "hardware.host",
                      fmt::format("one of {} or a host file (.json)", fmt::join(names, ", ")));
  }
  return sim::ok();
}

// hardware.overrides: a map of figure paths, nested or dotted, to numbers, flattened in order.
sim::Status read_overrides(const Node& map, const std::string& prefix,
                           std::vector<std::pair<std::string, double>>& out) {
  for (const auto& [key, value] : map.entries) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (value.kind == NodeKind::kMap) {
      OFFSIM_RETURN_IF_ERROR(read_overrides(value, path, out));
      continue;
    }
    const auto v = scalar_double(value);
    if (!v) return type_error(value, "hardware.overrides." + path, "a number");
    out.emplace_back(path, *v);
  }
  return sim::ok();
}

sim::Status read_hardware(const Node& node, const std::string& base_dir,
                          models::HardwareConfig& h) {
  OFFSIM_RETURN_IF_ERROR(expect_map(node, "hardware"));
  MapReader r(node, "hardware");
  OFFSIM_RETURN_IF_ERROR(read_system(r, node, h));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "nodes", h.nodes, 1, 100'000));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "gpus", h.gpus, 0, 10'000'000));
  if (const Node* profile = r.get("profile")) {
    if (!is_null_scalar(*profile)) {
      OFFSIM_ASSIGN_OR_RETURN(std::string rel, string_of(*profile, "hardware.profile"));
      h.profile_path = resolve_path(*profile, rel, base_dir);
    }
  }
  if (const Node* rt = r.get("runtime")) {
    auto v = rt->kind == NodeKind::kScalar ? models::runtime_from_string(rt->scalar) : std::nullopt;
    if (!v)
      return type_error(*rt, "hardware.runtime", "one of none, pytorch, pytorch_expandable, jax");
    h.runtime = *v;
  }
  // hardware.host and hardware.overrides (a map of figure paths, nested or dotted, to numbers).
  if (const Node* host = r.get("host")) {
    OFFSIM_RETURN_IF_ERROR(read_host(*host, base_dir, h));
  }
  if (const Node* overrides = r.get("overrides")) {
    if (!is_null_scalar(*overrides)) {
      OFFSIM_RETURN_IF_ERROR(expect_map(*overrides, "hardware.overrides"));
      h.overrides.clear();
      OFFSIM_RETURN_IF_ERROR(read_overrides(*overrides, "", h.overrides));
    }
  }
  return r.finish();
}

// training.fp8_recipe: absent leaves the recipe to resolve() (the GPU's default).
sim::Status read_fp8_recipe(MapReader& r, models::TrainingConfig& t) {
  const Node* f = r.get("fp8_recipe");
  if (f == nullptr) return sim::ok();
  OFFSIM_ASSIGN_OR_RETURN(t.fp8_recipe, enum_of(*f, r.child("fp8_recipe"), kFp8Recipes,
                                                models::fp8_recipe_from_string));
  return sim::ok();
}

// training.cuda_graph_modules: a list of CudaGraphModule names.
sim::Status read_cuda_graph_modules(MapReader& r, models::TrainingConfig& t) {
  const Node* g = r.get("cuda_graph_modules");
  if (g == nullptr) return sim::ok();
  if (g->kind != NodeKind::kSequence) {
    return type_error(*g, "training.cuda_graph_modules",
                      "a list of modules (attn, mlp, moe_router, moe_preprocess)");
  }
  t.cuda_graph_modules = {};
  for (std::size_t i = 0; i < g->items.size(); ++i) {
    OFFSIM_ASSIGN_OR_RETURN(auto m,
                            enum_of(g->items[i], fmt::format("training.cuda_graph_modules.{}", i),
                                    kCudaGraphModules, models::cuda_graph_module_from_string));
    t.cuda_graph_modules.add(m);
  }
  return sim::ok();
}

sim::Status read_training(const Node& node, models::TrainingConfig& t) {
  OFFSIM_RETURN_IF_ERROR(expect_map(node, "training"));
  MapReader r(node, "training");
  for (const char* required : {"global_batch", "seq_len"}) {
    if (node.find(required) == nullptr) {
      return missing_key(node, "training", required, "expected an integer");
    }
  }
  OFFSIM_RETURN_IF_ERROR(read_int(r, "global_batch", t.global_batch, 1, kMaxBatch));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "micro_batch", t.micro_batch, 1, kMaxBatch));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "seq_len", t.seq_len, 1, kMaxDim));
  if (const Node* p = r.get("precision")) {
    auto d = p->kind == NodeKind::kScalar ? sim::dtype_from_string(p->scalar) : std::nullopt;
    if (!d || *d == sim::DType::kFp32) {
      return type_error(*p, "training.precision", "one of bf16, fp16, fp8");
    }
    t.compute_dtype = *d;
  }
  OFFSIM_RETURN_IF_ERROR(read_fp8_recipe(r, t));
  OFFSIM_RETURN_IF_ERROR(read_bool(r, "fp32_master_weights", t.fp32_master_weights));
  OFFSIM_RETURN_IF_ERROR(read_bool(r, "store_param_remainders", t.store_param_remainders));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "loss_chunks", t.loss_chunks, 1, kMaxDim));
  OFFSIM_RETURN_IF_ERROR(
      read_bool(r, "gradient_accumulation_fusion", t.gradient_accumulation_fusion));
  OFFSIM_RETURN_IF_ERROR(read_enum(r, "moe_grouped_gemm", t.moe_grouped_gemm, kMoeGroupedGemms,
                                   models::moe_grouped_gemm_from_string));
  OFFSIM_RETURN_IF_ERROR(read_cuda_graph_modules(r, t));
  // Storage dtypes by tensor class: a framework preset, then explicit entries over it.
  if (const Node* p = r.get("dtype_preset")) {
    std::vector<std::string> names;
    for (const models::PresetInfo& info : models::list_dtype_presets()) names.push_back(info.name);
    const std::string expected = fmt::format("one of {}", fmt::join(names, ", "));
    if (p->kind != NodeKind::kScalar) return type_error(*p, "training.dtype_preset", expected);
    sim::Result<models::TensorDtypes> preset = models::dtype_preset(p->scalar);
    if (!preset) return type_error(*p, "training.dtype_preset", expected);
    t.dtypes = *preset;
    t.dtype_preset = p->scalar;
  }
  if (const Node* d = r.get("dtypes")) {
    OFFSIM_RETURN_IF_ERROR(expect_map(*d, "training.dtypes"));
    MapReader dr(*d, "training.dtypes");
    const std::pair<const char*, std::optional<sim::DType> models::TensorDtypes::*> keys[] = {
        {"params", &models::TensorDtypes::params},
        {"grads", &models::TensorDtypes::grads},
        {"master", &models::TensorDtypes::master},
        {"first_moment", &models::TensorDtypes::first_moment},
        {"second_moment", &models::TensorDtypes::second_moment},
        {"all_gather", &models::TensorDtypes::all_gather},
        {"reduce_scatter", &models::TensorDtypes::reduce_scatter}};
    for (const auto& [key, member] : keys) {
      const Node* v = dr.get(key);
      if (v == nullptr) continue;
      const std::string path = dr.child(key);
      const bool master = std::string_view(key) == "master";
      if (master && v->kind == NodeKind::kScalar && v->scalar == "none") {
        // No separate master copy: the optimizer updates the weights in place.
        t.dtypes.master.reset();
        t.fp32_master_weights = false;
        continue;
      }
      auto dt = v->kind == NodeKind::kScalar ? sim::dtype_from_string(v->scalar) : std::nullopt;
      if (!dt) {
        return type_error(
            *v, path,
            master ? "one of fp32, bf16, fp16, fp8, none" : "one of fp32, bf16, fp16, fp8");
      }
      t.dtypes.*member = *dt;
    }
    OFFSIM_RETURN_IF_ERROR(dr.finish());
  }
  if (const Node* o = r.get("optimizer")) {
    if (o->kind != NodeKind::kScalar || o->scalar != "adamw") {
      return type_error(*o, "training.optimizer", "adamw");
    }
  }
  return r.finish();
}

// parallelism.layout: Megatron's string ("Et*4|(t*4|)*14,tmL") or its list of lists of layer
// names ([[embedding, decoder], [decoder, mtp, loss]]); a list item may also be one stage's
// letters ("Ett").
sim::Status read_layout(const Node& node, ParallelConfig& p) {
  const std::string path = "parallelism.layout";
  const auto parsed =
      [&](const Node& n, const std::string& at,
          const std::string& text) -> sim::Result<std::vector<ParallelConfig::StageLayout>> {
    auto stages = models::parse_pipeline_layout(text);
    if (!stages) return type_error(n, at, stages.error().message);
    return stages;
  };
  if (node.kind == NodeKind::kScalar && !node.scalar.empty()) {
    OFFSIM_ASSIGN_OR_RETURN(p.layout, parsed(node, path, node.scalar));
    return sim::ok();
  }
  if (node.kind != NodeKind::kSequence || node.items.empty()) {
    return type_error(node, path,
                      "a layout string such as \"Et*4|(t*4|)*14,tmL\" or a list of stages");
  }
  p.layout.clear();
  for (std::size_t i = 0; i < node.items.size(); ++i) {
    const Node& stage = node.items[i];
    const std::string at = fmt::format("{}[{}]", path, i);
    std::string text;
    if (stage.kind == NodeKind::kScalar) {
      text = stage.scalar;
    } else if (stage.kind == NodeKind::kSequence) {
      for (const Node& layer : stage.items) {
        const auto letter = layer.kind == NodeKind::kScalar
                                ? models::pipeline_layer_letter(layer.scalar)
                                : std::nullopt;
        if (!letter) {
          return type_error(layer, at,
                            "a layer name: embedding, decoder, mtp or loss (or E, t, m, L)");
        }
        text += *letter;
      }
    } else {
      return type_error(stage, at, "a stage: a list of layer names or a string of E, t, m, L");
    }
    OFFSIM_ASSIGN_OR_RETURN(const auto one, parsed(stage, at, text));
    if (one.size() != 1) return type_error(stage, at, "one stage (no '|')");
    p.layout.push_back(one.front());
  }
  return sim::ok();
}

// The expert-, context- and tensor-parallel keys of `parallelism`.
sim::Status read_model_parallel_keys(MapReader& r, ParallelConfig& p) {
  OFFSIM_RETURN_IF_ERROR(read_bool(r, "moe_shared_expert_overlap", p.moe_shared_expert_overlap));
  OFFSIM_RETURN_IF_ERROR(read_bool(r, "moe_a2a_overlap", p.moe_a2a_overlap));
  OFFSIM_RETURN_IF_ERROR(read_enum(r, "moe_dispatcher", p.moe_dispatcher, kMoeDispatchers,
                                   models::moe_dispatcher_from_string));
  OFFSIM_RETURN_IF_ERROR(read_bool(r, "delay_wgrad_compute", p.delay_wgrad_compute));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "ep", p.ep, 1, 4096));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "etp", p.etp, 1, 4096));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "cp", p.cp, 1, 4096));
  OFFSIM_RETURN_IF_ERROR(
      read_enum(r, "cp_comm_type", p.cp_comm_type, kCpCommTypes, models::cp_comm_type_from_string));
  OFFSIM_RETURN_IF_ERROR(read_bool(r, "tp_async_grad_reduce", p.tp_async_grad_reduce));
  return read_bool(r, "tp_comm_overlap", p.tp_comm_overlap);
}

sim::Status read_parallelism(const Node& node, ParallelConfig& p) {
  OFFSIM_RETURN_IF_ERROR(expect_map(node, "parallelism"));
  MapReader r(node, "parallelism");
  OFFSIM_RETURN_IF_ERROR(read_int(r, "dp", p.dp, 1, 1'000'000));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "tp", p.tp, 1, 4096));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "pp", p.pp, 1, 4096));
  OFFSIM_RETURN_IF_ERROR(read_bool(r, "sequence_parallel", p.sequence_parallel));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "zero_stage", p.zero_stage, 0, 3));
  OFFSIM_RETURN_IF_ERROR(read_bool(r, "fsdp", p.fsdp));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "fsdp_shard", p.fsdp_shard, 0, 1'000'000));
  OFFSIM_RETURN_IF_ERROR(read_bool(r, "account_for_embedding_in_pipeline_split",
                                   p.account_for_embedding_in_pipeline_split));
  OFFSIM_RETURN_IF_ERROR(
      read_bool(r, "account_for_loss_in_pipeline_split", p.account_for_loss_in_pipeline_split));
  if (const Node* layout = r.get("layout")) OFFSIM_RETURN_IF_ERROR(read_layout(*layout, p));
  OFFSIM_RETURN_IF_ERROR(read_enum(r, "backward_prefetch", p.backward_prefetch, kBackwardPrefetches,
                                   models::backward_prefetch_from_string));
  OFFSIM_RETURN_IF_ERROR(read_enum(r, "param_gather", p.param_gather, kParamGathers,
                                   models::param_gather_from_string));
  OFFSIM_RETURN_IF_ERROR(
      read_enum(r, "schedule", p.schedule, kSchedules, models::pipeline_schedule_from_string));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "virtual_stages", p.virtual_stages, 1, 1024));
  OFFSIM_RETURN_IF_ERROR(read_bool(r, "overlap_grad_reduce", p.overlap_grad_reduce));
  OFFSIM_RETURN_IF_ERROR(read_bool(r, "overlap_p2p_comm", p.overlap_p2p_comm));
  OFFSIM_RETURN_IF_ERROR(
      read_bool(r, "deallocate_pipeline_outputs", p.deallocate_pipeline_outputs));
  OFFSIM_RETURN_IF_ERROR(read_model_parallel_keys(r, p));
  return r.finish();
}

sim::Status read_recompute(const Node& node, RecomputeConfig& rc) {
  if (node.kind == NodeKind::kScalar) {
    OFFSIM_ASSIGN_OR_RETURN(
        rc.mode, enum_of(node, "recompute", kRecomputeModes, models::recompute_mode_from_string));
    return sim::ok();
  }
  if (node.kind != NodeKind::kMap) {
    return type_error(node, "recompute", "a mode (none, selective, full) or a map");
  }
  MapReader r(node, "recompute");
  OFFSIM_RETURN_IF_ERROR(
      read_enum(r, "mode", rc.mode, kRecomputeModes, models::recompute_mode_from_string));
  OFFSIM_RETURN_IF_ERROR(
      read_enum(r, "rerun", rc.rerun, kRecomputeReruns, models::recompute_rerun_from_string));
  if (const Node* modules = r.get("modules")) {
    if (modules->kind != NodeKind::kSequence) {
      return type_error(*modules, "recompute.modules",
                        "a list of modules (core_attn, layernorm, moe_act, mla_up_proj, mlp, moe, "
                        "shared_experts)");
    }
    rc.modules.bits = 0;
    for (std::size_t i = 0; i < modules->items.size(); ++i) {
      OFFSIM_ASSIGN_OR_RETURN(auto m,
                              enum_of(modules->items[i], fmt::format("recompute.modules.{}", i),
                                      kRecomputeModules, models::recompute_module_from_string));
      rc.modules.add(m);
    }
  }
  if (const Node* per = r.get("per_layer")) {
    if (per->kind != NodeKind::kMap) {
      return type_error(*per, "recompute.per_layer", "a map of layer index -> mode");
    }
    for (const auto& [key, value] : per->entries) {
      const std::string path = "recompute.per_layer." + key;
      const auto layer = scalar_int(make_scalar(key));
      if (!layer || *layer < 0 || *layer > kMaxLayers) {
        return sim::fail(ErrorCode::kInvalidInput, "{}: {}: expected a layer index, got \"{}\"",
                         value.origin, path, key);
      }
      OFFSIM_ASSIGN_OR_RETURN(
          auto mode, enum_of(value, path, kRecomputeModes, models::recompute_mode_from_string));
      rc.per_layer[static_cast<int>(*layer)] = mode;
    }
  }
  return r.finish();
}

sim::Result<models::LayerSelection> read_layers(const Node& node, const std::string& path) {
  models::LayerSelection sel;
  const std::string what =
      "all, a list of layer indices, {fraction: f}, {stage_fraction: f} or {first: n}";
  if (node.kind == NodeKind::kScalar && !node.quoted && node.scalar == "all") return sel;
  if (node.kind == NodeKind::kSequence) {
    sel.kind = models::LayerSelection::Kind::kList;
    for (std::size_t i = 0; i < node.items.size(); ++i) {
      const auto v = scalar_int(node.items[i]);
      if (!v || *v < 0 || *v > kMaxLayers) {
        return type_error(node.items[i], fmt::format("{}.{}", path, i), "a layer index >= 0");
      }
      sel.list.push_back(static_cast<int>(*v));
    }
    return sel;
  }
  if (node.kind == NodeKind::kMap && node.entries.size() == 1) {
    MapReader r(node, path);
    if (node.find("fraction") != nullptr) {
      sel.kind = models::LayerSelection::Kind::kFraction;
      OFFSIM_RETURN_IF_ERROR(read_double(r, "fraction", sel.fraction, 0.0, 1.0));
      return sel;
    }
    if (node.find("stage_fraction") != nullptr) {
      sel.kind = models::LayerSelection::Kind::kStageFraction;
      OFFSIM_RETURN_IF_ERROR(read_double(r, "stage_fraction", sel.fraction, 0.0, 1.0));
      return sel;
    }
    if (node.find("first") != nullptr) {
      sel.kind = models::LayerSelection::Kind::kFirst;
      OFFSIM_RETURN_IF_ERROR(read_int(r, "first", sel.count, 0, kMaxLayers));
      return sel;
    }
  }
  return type_error(node, path, what);
}

sim::Result<OffloadRule> read_rule(const Node& node, const std::string& path) {
  if (node.kind != NodeKind::kMap) return type_error(node, path, "a rule map");
  MapReader r(node, path);
  OffloadRule rule;
  const Node* tensor = r.get("tensor");
  if (tensor == nullptr) {
    return missing_key(node, path, "tensor", "expected a tensor class");
  }
  const auto& names = models::activation_names();
  bool tensor_ok = false;
  if (tensor->kind == NodeKind::kScalar) {
    if (auto cls = models::tensor_class_from_string(tensor->scalar)) {
      rule.cls = *cls;
      tensor_ok = true;
    } else if (std::find(names.begin(), names.end(), tensor->scalar) != names.end()) {
      rule.cls = models::TensorClass::kNamedActivation;
      rule.name = tensor->scalar;
      tensor_ok = true;
    }
  }
  if (!tensor_ok) {
    return type_error(*tensor, path + ".tensor",
                      fmt::format("params, grads, optimizer_states, master_weights, activations, "
                                  "named_activation or an activation name ({})",
                                  fmt::join(names, ", ")));
  }
  if (const Node* name = r.get("name")) {
    if (rule.cls != models::TensorClass::kNamedActivation) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "{}: {}.name: only allowed with tensor: named_activation", name->origin,
                       path);
    }
    OFFSIM_ASSIGN_OR_RETURN(std::string n, string_of(*name, path + ".name"));
    if (std::find(names.begin(), names.end(), n) == names.end()) {
      return type_error(*name, path + ".name", fmt::format("one of {}", fmt::join(names, ", ")));
    }
    if (!rule.name.empty() && rule.name != n) {
      return sim::fail(ErrorCode::kInvalidInput, "{}: {}.name: '{}' contradicts tensor '{}'",
                       name->origin, path, n, rule.name);
    }
    rule.name = n;
  }
  if (rule.cls == models::TensorClass::kNamedActivation && rule.name.empty()) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: {}.name: missing; tensor named_activation needs one of {}", node.origin,
                     path, fmt::join(names, ", "));
  }
  if (const Node* layers = r.get("layers")) {
    OFFSIM_ASSIGN_OR_RETURN(rule.layers, read_layers(*layers, path + ".layers"));
  }
  OFFSIM_RETURN_IF_ERROR(
      read_enum(r, "where", rule.where, kPlacements, models::placement_from_string));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "prefetch_layers", rule.prefetch_layers, 0, 1024));
  OFFSIM_RETURN_IF_ERROR(
      read_int(r, "chunk_bytes", rule.chunk_bytes, 0, std::numeric_limits<std::int64_t>::max()));
  OFFSIM_RETURN_IF_ERROR(r.finish());
  return rule;
}

sim::Result<OffloadPolicy> preset_of(const Node& name_node, const models::PresetOptions& options,
                                     const std::string& path) {
  OFFSIM_ASSIGN_OR_RETURN(std::string name, string_of(name_node, path));
  auto policy = models::offload_preset(name, options);
  if (!policy) {
    std::vector<std::string> names;
    for (const auto& p : models::list_presets()) names.push_back(p.name);
    if (policy.error().code == ErrorCode::kNotFound ||
        std::find(names.begin(), names.end(), name) == names.end()) {
      return type_error(name_node, path, fmt::format("a preset ({})", fmt::join(names, ", ")));
    }
    return sim::fail(ErrorCode::kInvalidInput, "{}: {}: {}", name_node.origin, path,
                     policy.error().message);
  }
  policy->preset = name;
  return std::move(*policy);
}

// offload.experts: how host-resident routed experts come back (fetch: whole | routed) and the
// hit fraction of a predictor of the next layer's experts (prediction_hit, absent: none).
sim::Status read_expert_fetch(const Node& node, OffloadPolicy& policy) {
  if (node.kind != NodeKind::kMap) {
    return type_error(node, "offload.experts", "a map with fetch and prediction_hit");
  }
  MapReader x(node, "offload.experts");
  OFFSIM_RETURN_IF_ERROR(
      read_enum(x, "fetch", policy.expert_fetch, kExpertFetches, models::expert_fetch_from_string));
  double hit = -1.0;
  OFFSIM_RETURN_IF_ERROR(read_double(x, "prediction_hit", hit, 0.0, 1.0));
  if (hit >= 0.0) policy.expert_prediction_hit = hit;
  return x.finish();
}

// offload.cpu.zenflow (DeepSpeed's zero_optimization.zenflow, zenflow_config.py): the defaults
// are DeepSpeed's, except update_interval, whose default "auto" adapts at run time and is taken
// as 4, the value DeepSpeed's ZenFlow tutorial and the core-binding blog's zf_config.json set.
// select_interval is accepted for completeness: the selection runs once per epoch ("auto") and
// is not charged per step.
sim::Result<models::OffloadPolicy::ZenFlow> read_zenflow(const Node& node) {
  if (node.kind != NodeKind::kMap) {
    return type_error(node, "offload.cpu.zenflow",
                      "a map with topk_ratio, update_interval, overlap_step, "
                      "pt_reserved_cores_perc and select_interval");
  }
  models::OffloadPolicy::ZenFlow z;
  z.enabled = true;
  MapReader r(node, "offload.cpu.zenflow");
  OFFSIM_RETURN_IF_ERROR(read_double(r, "topk_ratio", z.topk_ratio, 0.0, 1.0));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "update_interval", z.update_interval, 1, 65536));
  OFFSIM_RETURN_IF_ERROR(read_bool(r, "overlap_step", z.overlap_step));
  OFFSIM_RETURN_IF_ERROR(read_double(r, "pt_reserved_cores_perc", z.reserved_cores, 0.0, 0.99));
  int select_interval = 0;
  OFFSIM_RETURN_IF_ERROR(read_int(r, "select_interval", select_interval, 1, 1 << 30));
  OFFSIM_RETURN_IF_ERROR(r.finish());
  if (select_interval > 0 && select_interval < z.update_interval) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: offload.cpu.zenflow.select_interval: expected at least update_interval "
                     "({}), got {} (DeepSpeed refuses it)",
                     node.origin, z.update_interval, select_interval);
  }
  return z;
}

// offload.cpu.superoffload (DeepSpeed's zero_optimization.offload_optimizer with super_offload:
// true, offload_config.py): ratio, cpuadam_cores_perc and the ZeRO-3 sub_group_size that cuts
// the rank's partition into the optimizer's sub-groups; absent keys take DeepSpeed's defaults.
sim::Result<models::OffloadPolicy::SuperOffload> read_superoffload(const Node& node) {
  if (node.kind != NodeKind::kMap) {
    return type_error(node, "offload.cpu.superoffload",
                      "a map with ratio, cpuadam_cores_perc and sub_group_size");
  }
  models::OffloadPolicy::SuperOffload so;
  so.enabled = true;
  MapReader r(node, "offload.cpu.superoffload");
  OFFSIM_RETURN_IF_ERROR(read_double(r, "ratio", so.ratio, 0.0, 1.0));
  OFFSIM_RETURN_IF_ERROR(read_double(r, "cpuadam_cores_perc", so.cpuadam_cores_perc, 0.01, 0.99));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "sub_group_size", so.sub_group_size, 1));
  OFFSIM_RETURN_IF_ERROR(r.finish());
  return so;
}

// offload.cpu: how the host step runs (bind_cores, threads, step) and the DeepSpeed steps that
// extend ZeRO-Offload (zenflow, superoffload).
sim::Status read_cpu(const Node& cpu, OffloadPolicy& policy) {
  if (cpu.kind != NodeKind::kMap) {
    return type_error(cpu, "offload.cpu",
                      "a map with bind_cores, threads, step, overlap_d2h_h2d, adam, zenflow "
                      "and superoffload");
  }
  MapReader c(cpu, "offload.cpu");
  OFFSIM_RETURN_IF_ERROR(read_bool(c, "bind_cores", policy.cpu_bind_cores));
  OFFSIM_RETURN_IF_ERROR(read_int(c, "threads", policy.cpu_threads, 1, 65536));
  OFFSIM_RETURN_IF_ERROR(
      read_enum(c, "step", policy.cpu_step, kCpuSteps, models::cpu_step_from_string));
  OFFSIM_RETURN_IF_ERROR(read_bool(c, "overlap_d2h_h2d", policy.cpu_overlap_d2h_h2d));
  OFFSIM_RETURN_IF_ERROR(
      read_enum(c, "adam", policy.cpu_adam, kCpuAdams, models::cpu_adam_from_string));
  if (const Node* zf = c.get("zenflow")) {
    OFFSIM_ASSIGN_OR_RETURN(policy.zenflow, read_zenflow(*zf));
  }
  if (const Node* so = c.get("superoffload")) {
    OFFSIM_ASSIGN_OR_RETURN(policy.superoffload, read_superoffload(*so));
  }
  OFFSIM_RETURN_IF_ERROR(c.finish());
  if (policy.zenflow.enabled && policy.cpu_step != models::OffloadPolicy::CpuStep::kFlatPartition) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: offload.cpu.zenflow: ZenFlow extends DeepSpeed's ZeRO-Offload step; "
                     "expected offload.cpu.step: flat_partition (the zero_offload preset)",
                     cpu.origin);
  }
  // Megatron's and FSDP's host step: per group, not DeepSpeed's own.
  const bool per_group =
      policy.cpu_step == models::OffloadPolicy::CpuStep::kPerGroup && !policy.superoffload.enabled;
  if (!policy.cpu_overlap_d2h_h2d && !per_group) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: offload.cpu.overlap_d2h_h2d: false orders the copies of Megatron's "
                     "per-group host step (HybridDeviceOptimizer); expected offload.cpu.step: "
                     "per_group without superoffload, or overlap_d2h_h2d left out",
                     cpu.origin);
  }
  if (policy.cpu_adam != models::OffloadPolicy::CpuAdam::kDeepSpeed && !per_group) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: offload.cpu.adam: {} names the CPU Adam of a per-group host step; "
                     "DeepSpeed's flat-partition step and SuperOffload run DeepSpeed's CPU Adam "
                     "(expected deepspeed, or offload.cpu.step: per_group)",
                     cpu.origin, models::to_string(policy.cpu_adam));
  }
  if (policy.zenflow.enabled && policy.superoffload.enabled) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: offload.cpu: zenflow and superoffload are two different DeepSpeed "
                     "optimizers; expected at most one of them",
                     cpu.origin);
  }
  return sim::ok();
}

sim::Result<OffloadPolicy> read_offload(const Node& node) {
  if (node.kind == NodeKind::kScalar) return preset_of(node, {}, "offload");
  if (node.kind != NodeKind::kMap) {
    return type_error(node, "offload", "a preset name or a map with preset or rules");
  }
  MapReader r(node, "offload");
  OffloadPolicy policy;
  const Node* preset = r.get("preset");
  const Node* rules = r.get("rules");
  if (preset != nullptr && rules != nullptr) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: offload: expected either 'preset' (with its options) or 'rules', got "
                     "both",
                     rules->origin);
  }
  models::PresetOptions options;
  OFFSIM_RETURN_IF_ERROR(read_int(r, "num_layers", options.num_layers, -1, kMaxLayers));
  OFFSIM_RETURN_IF_ERROR(read_double(r, "fraction", options.fraction, 0.0, 1.0));
  OFFSIM_RETURN_IF_ERROR(read_int(r, "prefetch_layers", options.prefetch_layers, 0, 1024));
  if (const Node* names = r.get("names")) {
    if (names->kind != NodeKind::kSequence) {
      return type_error(*names, "offload.names", "a list of activation names");
    }
    for (std::size_t i = 0; i < names->items.size(); ++i) {
      OFFSIM_ASSIGN_OR_RETURN(std::string n,
                              string_of(names->items[i], fmt::format("offload.names.{}", i)));
      options.names.push_back(std::move(n));
    }
  }
  const bool has_options = node.find("num_layers") || node.find("fraction") ||
                           node.find("prefetch_layers") || node.find("names");
  if (preset != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(policy, preset_of(*preset, options, "offload.preset"));
  } else if (has_options) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: offload: num_layers, fraction, prefetch_layers and names are preset "
                     "options; expected a 'preset' key with them",
                     node.origin);
  }
  if (rules != nullptr) {
    if (rules->kind != NodeKind::kSequence) {
      return type_error(*rules, "offload.rules", "a list of rules");
    }
    for (std::size_t i = 0; i < rules->items.size(); ++i) {
      OFFSIM_ASSIGN_OR_RETURN(OffloadRule rule,
                              read_rule(rules->items[i], fmt::format("offload.rules.{}", i)));
      policy.rules.push_back(std::move(rule));
    }
  }
  if (const Node* opt = r.get("optimizer")) {
    if (opt->kind != NodeKind::kScalar || (opt->scalar != "cpu" && opt->scalar != "gpu")) {
      return type_error(*opt, "offload.optimizer", "cpu or gpu");
    }
    policy.optimizer_on_cpu = opt->scalar == "cpu";
  }
  if (const Node* label = r.get("label")) {
    OFFSIM_ASSIGN_OR_RETURN(policy.preset, string_of(*label, "offload.label"));
  }
  if (const Node* cpu = r.get("cpu")) OFFSIM_RETURN_IF_ERROR(read_cpu(*cpu, policy));
  if (const Node* x = r.get("experts")) OFFSIM_RETURN_IF_ERROR(read_expert_fetch(*x, policy));
  OFFSIM_RETURN_IF_ERROR(r.finish());
  return policy;
}

Node scalar_node(const std::string& s) { return make_scalar(s); }
Node quoted_node(const std::string& s) { return make_scalar(s, {}, true); }
template <class T>
Node number_node(T v) {
  return make_scalar(fmt::format("{}", v));
}
Node bool_node(bool b) { return make_scalar(b ? "true" : "false"); }

void put(Node& map, const std::string& key, Node value) {
  map.entries.emplace_back(key, std::move(value));
}

Node layers_node(const models::LayerSelection& sel) {
  switch (sel.kind) {
    case models::LayerSelection::Kind::kAll:
      return scalar_node("all");
    case models::LayerSelection::Kind::kList: {
      Node seq = make_sequence();
      for (int l : sel.list) seq.items.push_back(number_node(l));
      return seq;
    }
    case models::LayerSelection::Kind::kFraction: {
      Node m = make_map();
      put(m, "fraction", number_node(sel.fraction));
      return m;
    }
    case models::LayerSelection::Kind::kFirst: {
      Node m = make_map();
      put(m, "first", number_node(sel.count));
      return m;
    }
    case models::LayerSelection::Kind::kStageFraction: {
      Node m = make_map();
      put(m, "stage_fraction", number_node(sel.fraction));
      return m;
    }
  }
  return scalar_node("all");
}

// A scalar `key: VALUE` written as shorthand for `key: {field: VALUE}` becomes that map, so that
// an override can set another field beside it.
void expand_shorthand(Node& doc, const char* key, const char* field) {
  Node* node = doc.find(key);
  if (node == nullptr || node->kind != NodeKind::kScalar) return;
  Node value = *node;
  node->kind = NodeKind::kMap;
  node->entries.clear();
  node->scalar.clear();
  node->quoted = false;
  node->entries.emplace_back(field, std::move(value));
}

}  // namespace

sim::Result<ScenarioFile> load_scenario_file(const std::string& path,
                                             const std::vector<std::string>& overrides,
                                             const LoadOptions& options) {
  ScenarioFile file;
  file.path = path;
  file.base_dir = std::filesystem::path(path).parent_path().string();
  OFFSIM_ASSIGN_OR_RETURN(Node doc, load_document_file(path, options.limits));
  if (doc.kind != NodeKind::kMap) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: expected a map with model, hardware, training, ... at the top, got {}",
                     doc.origin, doc.describe());
  }
  // `model: NAME` is shorthand for `model: {base: NAME}`; expand it when an override changes a
  // field of the model (e.g. --set model.layers=4 for a scaled replay).
  const bool overrides_model = std::any_of(overrides.begin(), overrides.end(), [](const auto& a) {
    return a.rfind("model.", 0) == 0 && a.rfind("model.base=", 0) != 0;
  });
  if (overrides_model) expand_shorthand(doc, "model", "base");
  for (const std::string& assignment : overrides) {
    // `offload: NAME` is shorthand for `offload: {preset: NAME}` and `recompute: MODE` for
    // `recompute: {mode: MODE}`: expanded when an override sets a field inside
    // (--set offload.prefetch_layers=2, --set recompute.modules=[layernorm]).
    if (assignment.rfind("offload.", 0) == 0) expand_shorthand(doc, "offload", "preset");
    if (assignment.rfind("recompute.", 0) == 0) expand_shorthand(doc, "recompute", "mode");
    OFFSIM_RETURN_IF_ERROR(apply_override(doc, assignment));
  }
  if (const Node* sweep = doc.find("sweep")) {
    if (!is_null_scalar(*sweep)) {
      OFFSIM_ASSIGN_OR_RETURN(file.sweep, parse_sweep(*sweep, options.max_sweep_points));
      for (const std::string& assignment : overrides) {
        const std::string key = assignment.substr(0, assignment.find('='));
        for (const std::string& axis : file.sweep->axis_paths()) {
          if (axis == key || axis.rfind(key + ".", 0) == 0 || key.rfind(axis + ".", 0) == 0) {
            return sim::fail(ErrorCode::kInvalidInput,
                             "--set {}: the sweep also varies '{}'; remove the axis or the "
                             "override",
                             assignment, axis);
          }
        }
      }
    }
    std::erase_if(doc.entries, [](const auto& e) { return e.first == "sweep"; });
  }
  file.base = std::move(doc);
  return file;
}

sim::Result<Scenario> scenario_from_document(const Node& doc, const std::string& base_dir) {
  OFFSIM_RETURN_IF_ERROR(expect_map(doc, "(top level)"));
  MapReader r(doc, "");
  Scenario s;
  for (const char* required : {"model", "hardware", "training"}) {
    if (doc.find(required) == nullptr) {
      return missing_key(doc, "", required, "a scenario needs model, hardware and training");
    }
  }
  OFFSIM_RETURN_IF_ERROR(read_string(r, "name", s.name));
  OFFSIM_ASSIGN_OR_RETURN(s.model, read_model(*r.get("model"), base_dir));
  OFFSIM_RETURN_IF_ERROR(read_hardware(*r.get("hardware"), base_dir, s.hardware));
  OFFSIM_RETURN_IF_ERROR(read_training(*r.get("training"), s.training));
  if (const Node* p = r.get("parallelism"))
    OFFSIM_RETURN_IF_ERROR(read_parallelism(*p, s.parallelism));
  if (const Node* rc = r.get("recompute")) OFFSIM_RETURN_IF_ERROR(read_recompute(*rc, s.recompute));
  if (const Node* o = r.get("offload")) {
    OFFSIM_ASSIGN_OR_RETURN(s.offload, read_offload(*o));
  } else {
    s.offload.preset = "none";
  }
  // remat_policy: NAME — MaxText's one name for recompute (full) and what is saved or offloaded.
  if (const Node* remat = r.get("remat_policy"); remat != nullptr && !is_null_scalar(*remat)) {
    OFFSIM_ASSIGN_OR_RETURN(std::string policy, string_of(*remat, "remat_policy"));
    for (const char* other : {"recompute", "offload"}) {
      if (const Node* n = doc.find(other)) {
        return sim::fail(ErrorCode::kInvalidInput,
                         "{}: remat_policy: sets recompute and offload itself; remove '{}' (at "
                         "{}) or remat_policy",
                         remat->origin, other, n->origin);
      }
    }
    auto preset = models::maxtext_remat_preset(policy);
    if (!preset) {
      return type_error(*remat, "remat_policy",
                        fmt::format("a MaxText remat_policy, one of {}",
                                    fmt::join(models::maxtext_remat_policies(), ", ")));
    }
    OFFSIM_ASSIGN_OR_RETURN(s.offload, models::offload_preset(*preset, {}));
    s.recompute = models::RecomputeConfig{};
    s.recompute.mode = models::RecomputeConfig::Mode::kFull;
  }
  r.get("sweep");  // split off by load_scenario_file; tolerated in documents built by hand
  OFFSIM_RETURN_IF_ERROR(r.finish());
  if (s.name.empty()) {
    // The file name is the natural default; it is printed with the effective scenario.
    const auto slash = doc.origin.find_last_of('/');
    std::string stem = doc.origin.substr(slash == std::string::npos ? 0 : slash + 1);
    stem = stem.substr(0, stem.find(':'));
    s.name = stem.substr(0, stem.rfind('.'));
  }
  return s;
}

std::string locate_message(const std::string& message, const Node& doc) {
  const auto colon = message.find(": ");
  std::string path = message.substr(0, colon == std::string::npos ? message.size() : colon);
  if (colon == std::string::npos || path.find(' ') != std::string::npos) {
    return fmt::format("{}: {}", doc.origin, message);
  }
  // "offload.rules[2].layers" -> "offload.rules.2.layers"
  std::string dotted;
  for (char c : path) {
    if (c == '[') {
      dotted += '.';
    } else if (c != ']') {
      dotted += c;
    }
  }
  // The YAML spells the CPU optimizer as offload.optimizer.
  if (dotted == "offload.optimizer_on_cpu") dotted = "offload.optimizer";
  std::string probe = dotted;
  while (!probe.empty()) {
    if (const Node* node = find_path(doc, probe))
      return fmt::format("{}: {}", node->origin, message);
    const auto dot = probe.rfind('.');
    probe = dot == std::string::npos ? std::string() : probe.substr(0, dot);
  }
  return fmt::format("{}: {}", doc.origin, message);
}

sim::Result<models::ResolvedScenario> resolve_loaded(const Scenario& scenario, const Node& doc) {
  models::ResolveOptions options;
  options.locate = [&doc](const std::string& message) { return locate_message(message, doc); };
  return models::resolve(scenario, options);
}

sim::Status check_loaded(const Scenario& scenario, const Node& doc) {
  OFFSIM_RETURN_IF_ERROR(resolve_loaded(scenario, doc));
  return sim::ok();
}

sim::Result<models::ResolvedScenario> resolve_document(const Node& doc,
                                                       const std::string& base_dir) {
  OFFSIM_ASSIGN_OR_RETURN(Scenario scenario, scenario_from_document(doc, base_dir));
  return resolve_loaded(scenario, doc);
}

namespace {

Node moe_node(const models::MoeConfig& e) {
  Node moe = make_map();
  put(moe, "experts", number_node(e.experts));
  put(moe, "top_k", number_node(e.top_k));
  put(moe, "expert_ffn_hidden", number_node(e.expert_ffn_hidden));
  put(moe, "shared_experts", number_node(e.shared_experts));
  put(moe, "shared_ffn_hidden", number_node(e.shared_ffn_hidden));
  put(moe, "first_k_dense", number_node(e.first_k_dense));
  put(moe, "layer_freq", number_node(e.layer_freq));
  if (e.capacity_factor > 0.0) put(moe, "capacity_factor", number_node(e.capacity_factor));
  if (e.pad_to_capacity) put(moe, "pad_to_capacity", bool_node(true));
  put(moe, "load_imbalance", number_node(e.load_imbalance));
  if (!e.expert_loads.empty()) {
    Node loads = make_sequence();
    for (double v : e.expert_loads) loads.items.push_back(number_node(v));
    put(moe, "expert_loads", std::move(loads));
  }
  put(moe, "router_bias", bool_node(e.router_bias));
  if (e.router_groups > 0 || e.router_group_topk > 0) {
    put(moe, "router_groups", number_node(e.router_groups));
    put(moe, "router_group_topk", number_node(e.router_group_topk));
  }
  return moe;
}

Node mla_node(const models::MlaConfig& a) {
  Node mla = make_map();
  put(mla, "q_lora_rank", number_node(a.q_lora_rank));
  put(mla, "kv_lora_rank", number_node(a.kv_lora_rank));
  put(mla, "qk_nope_head_dim", number_node(a.qk_nope_head_dim));
  put(mla, "qk_rope_head_dim", number_node(a.qk_rope_head_dim));
  put(mla, "v_head_dim", number_node(a.v_head_dim));
  return mla;
}

Node model_node(const ModelArch& m) {
  Node model = make_map();
  put(model, "name", quoted_node(m.name));
  put(model, "vocab_size", number_node(m.vocab_size));
  put(model, "hidden", number_node(m.hidden));
  put(model, "layers", number_node(m.layers));
  put(model, "heads", number_node(m.heads));
  put(model, "kv_heads", number_node(m.kv_heads));
  put(model, "head_dim", number_node(m.head_dim));
  put(model, "ffn_hidden", number_node(m.ffn_hidden));
  put(model, "activation", scalar_node(models::to_string(m.activation)));
  put(model, "norm", scalar_node(models::to_string(m.norm)));
  put(model, "tied_embeddings", bool_node(m.tied_embeddings));
  put(model, "attention", scalar_node(models::to_string(m.attention)));
  put(model, "linear_bias", bool_node(m.linear_bias));
  put(model, "max_positions", number_node(m.max_positions));
  put(model, "dropout", bool_node(m.dropout));
  if (m.moe.experts > 0) put(model, "moe", moe_node(m.moe));
  if (m.mla.kv_lora_rank > 0) put(model, "mla", mla_node(m.mla));
  if (m.mtp_layers > 0) put(model, "mtp_layers", number_node(m.mtp_layers));
  return model;
}

Node hardware_node(const models::HardwareConfig& h) {
  Node hw = make_map();
  put(hw, "system", quoted_node(h.system));
  put(hw, "nodes", number_node(h.nodes));
  put(hw, "gpus", number_node(h.gpus));
  if (h.runtime != models::HardwareConfig::Runtime::kNone) {
    put(hw, "runtime", scalar_node(models::to_string(h.runtime)));
  }
  put(hw, "profile", h.profile_path.empty() ? Node{} : quoted_node(h.profile_path));
  put(hw, "host", h.host.empty() ? Node{} : quoted_node(h.host));
  Node overrides = make_map();
  for (const auto& [path, value] : h.overrides) put(overrides, path, number_node(value));
  put(hw, "overrides", std::move(overrides));
  return hw;
}

Node training_node(const models::TrainingConfig& t) {
  Node training = make_map();
  put(training, "global_batch", number_node(t.global_batch));
  put(training, "micro_batch", number_node(t.micro_batch));
  put(training, "seq_len", number_node(t.seq_len));
  put(training, "precision", scalar_node(sim::to_string(t.compute_dtype)));
  if (t.fp8_recipe) put(training, "fp8_recipe", scalar_node(models::to_string(*t.fp8_recipe)));
  put(training, "fp32_master_weights", bool_node(t.fp32_master_weights));
  if (t.store_param_remainders) put(training, "store_param_remainders", bool_node(true));
  put(training, "loss_chunks", number_node(t.loss_chunks));
  put(training, "gradient_accumulation_fusion", bool_node(t.gradient_accumulation_fusion));
  put(training, "moe_grouped_gemm", scalar_node(models::to_string(t.moe_grouped_gemm)));
  if (!t.cuda_graph_modules.empty()) {
    Node graphs = make_sequence();
    for (const models::CudaGraphModule m : kCudaGraphModules) {
      if (t.cuda_graph_modules.has(m)) graphs.items.push_back(scalar_node(models::to_string(m)));
    }
    put(training, "cuda_graph_modules", std::move(graphs));
  }
  if (!t.dtype_preset.empty()) put(training, "dtype_preset", scalar_node(t.dtype_preset));
  Node dtypes = make_map();
  const std::pair<const char*, const std::optional<sim::DType>*> entries[] = {
      {"params", &t.dtypes.params},
      {"grads", &t.dtypes.grads},
      {"master", &t.dtypes.master},
      {"first_moment", &t.dtypes.first_moment},
      {"second_moment", &t.dtypes.second_moment},
      {"all_gather", &t.dtypes.all_gather},
      {"reduce_scatter", &t.dtypes.reduce_scatter}};
  bool any = false;
  for (const auto& [key, value] : entries) {
    if (!*value) continue;
    put(dtypes, key, scalar_node(sim::to_string(**value)));
    any = true;
  }
  if (any) put(training, "dtypes", std::move(dtypes));
  put(training, "optimizer", scalar_node("adamw"));
  return training;
}

Node parallelism_node(const ParallelConfig& p) {
  Node par = make_map();
  put(par, "dp", number_node(p.dp));
  put(par, "tp", number_node(p.tp));
  put(par, "pp", number_node(p.pp));
  put(par, "sequence_parallel", bool_node(p.sequence_parallel));
  put(par, "zero_stage", number_node(p.zero_stage));
  put(par, "fsdp", bool_node(p.fsdp));
  if (p.fsdp_shard > 0) put(par, "fsdp_shard", number_node(p.fsdp_shard));
  if (p.account_for_embedding_in_pipeline_split) {
    put(par, "account_for_embedding_in_pipeline_split", bool_node(true));
  }
  if (p.account_for_loss_in_pipeline_split) {
    put(par, "account_for_loss_in_pipeline_split", bool_node(true));
  }
  if (!p.layout.empty()) put(par, "layout", quoted_node(models::layout_string(p)));
  if (p.backward_prefetch != ParallelConfig::BackwardPrefetch::kPre) {
    put(par, "backward_prefetch", scalar_node(models::to_string(p.backward_prefetch)));
  }
  if (p.param_gather != ParallelConfig::ParamGather::kPerLayer) {
    put(par, "param_gather", scalar_node(models::to_string(p.param_gather)));
  }
  put(par, "schedule", scalar_node(models::to_string(p.schedule)));
  put(par, "virtual_stages", number_node(p.virtual_stages));
  put(par, "overlap_grad_reduce", bool_node(p.overlap_grad_reduce));
  put(par, "overlap_p2p_comm", bool_node(p.overlap_p2p_comm));
  if (!p.deallocate_pipeline_outputs) put(par, "deallocate_pipeline_outputs", bool_node(false));
  if (p.moe_shared_expert_overlap) put(par, "moe_shared_expert_overlap", bool_node(true));
  if (p.moe_a2a_overlap) put(par, "moe_a2a_overlap", bool_node(true));
  if (p.moe_dispatcher != ParallelConfig::MoeDispatcher::kAllToAll) {
    put(par, "moe_dispatcher", scalar_node(models::to_string(p.moe_dispatcher)));
  }
  if (p.delay_wgrad_compute) put(par, "delay_wgrad_compute", bool_node(true));
  if (p.tp_async_grad_reduce) put(par, "tp_async_grad_reduce", bool_node(true));
  if (p.tp_comm_overlap) put(par, "tp_comm_overlap", bool_node(true));
  if (p.ep > 1 || p.etp > 1) {
    put(par, "ep", number_node(p.ep));
    put(par, "etp", number_node(p.etp));
  }
  if (p.cp > 1) {
    put(par, "cp", number_node(p.cp));
    put(par, "cp_comm_type", scalar_node(models::to_string(p.cp_comm_type)));
  }
  return par;
}

Node recompute_node(const RecomputeConfig& recompute) {
  Node rc = make_map();
  put(rc, "mode", scalar_node(models::to_string(recompute.mode)));
  Node per = make_map();
  for (const auto& [layer, mode] : recompute.per_layer) {
    put(per, std::to_string(layer), scalar_node(models::to_string(mode)));
  }
  put(rc, "per_layer", std::move(per));
  Node modules = make_sequence();
  for (int m = 0; m < models::kNumRecomputeModules; ++m) {
    const auto module = static_cast<models::RecomputeModule>(m);
    if (recompute.modules.has(module))
      modules.items.push_back(scalar_node(models::to_string(module)));
  }
  put(rc, "modules", std::move(modules));
  put(rc, "rerun", scalar_node(models::to_string(recompute.rerun)));
  return rc;
}

Node offload_node(const OffloadPolicy& o) {
  Node off = make_map();
  put(off, "label", quoted_node(o.preset.empty() ? "custom" : o.preset));
  Node rules = make_sequence();
  for (const OffloadRule& rule : o.rules) {
    Node rn = make_map();
    put(rn, "tensor", scalar_node(models::to_string(rule.cls)));
    if (rule.cls == models::TensorClass::kNamedActivation) put(rn, "name", scalar_node(rule.name));
    put(rn, "layers", layers_node(rule.layers));
    put(rn, "where", scalar_node(models::to_string(rule.where)));
    put(rn, "prefetch_layers", number_node(rule.prefetch_layers));
    put(rn, "chunk_bytes", number_node(rule.chunk_bytes));
    rules.items.push_back(std::move(rn));
  }
  put(off, "rules", std::move(rules));
  put(off, "optimizer", scalar_node(o.optimizer_on_cpu ? "cpu" : "gpu"));
  const bool flat = o.cpu_step == models::OffloadPolicy::CpuStep::kFlatPartition;
  const bool torch_adam = o.cpu_adam != models::OffloadPolicy::CpuAdam::kDeepSpeed;
  if (o.cpu_bind_cores || o.cpu_threads > 0 || flat || o.superoffload.enabled ||
      !o.cpu_overlap_d2h_h2d || torch_adam) {
    Node cpu = make_map();
    put(cpu, "bind_cores", bool_node(o.cpu_bind_cores));
    if (o.cpu_threads > 0) put(cpu, "threads", number_node(o.cpu_threads));
    if (flat) put(cpu, "step", scalar_node(models::to_string(o.cpu_step)));
    if (!o.cpu_overlap_d2h_h2d) put(cpu, "overlap_d2h_h2d", bool_node(false));
    if (torch_adam) put(cpu, "adam", scalar_node(models::to_string(o.cpu_adam)));
    if (o.zenflow.enabled) {
      Node zf = make_map();
      put(zf, "topk_ratio", number_node(o.zenflow.topk_ratio));
      put(zf, "update_interval", number_node(o.zenflow.update_interval));
      put(zf, "overlap_step", bool_node(o.zenflow.overlap_step));
      put(zf, "pt_reserved_cores_perc", number_node(o.zenflow.reserved_cores));
      put(cpu, "zenflow", std::move(zf));
    }
    if (o.superoffload.enabled) {
      Node so = make_map();
      put(so, "ratio", number_node(o.superoffload.ratio));
      put(so, "cpuadam_cores_perc", number_node(o.superoffload.cpuadam_cores_perc));
      put(so, "sub_group_size", number_node(o.superoffload.sub_group_size));
      put(cpu, "superoffload", std::move(so));
    }
    put(off, "cpu", std::move(cpu));
  }
  if (o.expert_fetch != models::OffloadPolicy::ExpertFetch::kWhole || o.expert_prediction_hit) {
    Node x = make_map();
    put(x, "fetch", scalar_node(models::to_string(o.expert_fetch)));
    if (o.expert_prediction_hit) put(x, "prediction_hit", number_node(*o.expert_prediction_hit));
    put(off, "experts", std::move(x));
  }
  return off;
}

}  // namespace

Node scenario_to_document(const Scenario& s) {
  Node root = make_map();
  put(root, "name", quoted_node(s.name));
  put(root, "model", model_node(s.model));
  put(root, "hardware", hardware_node(s.hardware));
  put(root, "training", training_node(s.training));
  put(root, "parallelism", parallelism_node(s.parallelism));
  put(root, "recompute", recompute_node(s.recompute));
  put(root, "offload", offload_node(s.offload));
  return root;
}

}  // namespace offsim::scenarios
