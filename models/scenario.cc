#include "models/scenario.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "models/formulas.h"

namespace offsim::models {

namespace {

template <class Enum, std::size_t N>
std::optional<Enum> parse_enum(std::string_view s, const Enum (&values)[N]) {
  for (Enum v : values) {
    if (s == to_string(v)) return v;
  }
  return std::nullopt;
}

}  // namespace

const char* to_string(ModelArch::Activation v) {
  switch (v) {
    case ModelArch::Activation::kGelu:
      return "gelu";
    case ModelArch::Activation::kSwiGlu:
      return "swiglu";
  }
  return "?";
}
const char* to_string(ModelArch::Norm v) {
  switch (v) {
    case ModelArch::Norm::kLayerNorm:
      return "layernorm";
    case ModelArch::Norm::kRmsNorm:
      return "rmsnorm";
  }
  return "?";
}
const char* to_string(ModelArch::AttentionImpl v) {
  switch (v) {
    case ModelArch::AttentionImpl::kFlash:
      return "flash";
    case ModelArch::AttentionImpl::kClassic:
      return "classic";
    case ModelArch::AttentionImpl::kFlash2:
      return "flash2";
  }
  return "?";
}
const char* to_string(ParallelConfig::BackwardPrefetch v) {
  switch (v) {
    case ParallelConfig::BackwardPrefetch::kPre:
      return "pre";
    case ParallelConfig::BackwardPrefetch::kPost:
      return "post";
    case ParallelConfig::BackwardPrefetch::kNone:
      return "none";
  }
  return "?";
}
const char* to_string(ParallelConfig::ParamGather v) {
  switch (v) {
    case ParallelConfig::ParamGather::kPerLayer:
      return "per_layer";
    case ParallelConfig::ParamGather::kPerTensorSynchronized:
      return "per_tensor_synchronized";
  }
  return "?";
}
const char* to_string(ParallelConfig::CpCommType v) {
  switch (v) {
    case ParallelConfig::CpCommType::kP2P:
      return "p2p";
    case ParallelConfig::CpCommType::kA2A:
      return "a2a";
  }
  return "?";
}
const char* to_string(ParallelConfig::MoeDispatcher v) {
  switch (v) {
    case ParallelConfig::MoeDispatcher::kAllToAll:
      return "alltoall";
    case ParallelConfig::MoeDispatcher::kDeepEp:
      return "deepep";
    case ParallelConfig::MoeDispatcher::kHybridEp:
      return "hybridep";
  }
  return "?";
}

const char* to_string(TrainingConfig::Fp8Recipe v) {
  switch (v) {
    case TrainingConfig::Fp8Recipe::kDelayed:
      return "delayed";
    case TrainingConfig::Fp8Recipe::kCurrent:
      return "current";
    case TrainingConfig::Fp8Recipe::kMxfp8:
      return "mxfp8";
    case TrainingConfig::Fp8Recipe::kBlockwise:
      return "blockwise";
  }
  return "?";
}

const char* to_string(TrainingConfig::MoeGroupedGemm v) {
  switch (v) {
    case TrainingConfig::MoeGroupedGemm::kMultiStream:
      return "multi_stream";
    case TrainingConfig::MoeGroupedGemm::kSingleKernel:
      return "single_kernel";
    case TrainingConfig::MoeGroupedGemm::kSequential:
      return "sequential";
  }
  return "?";
}

const char* to_string(CudaGraphModule v) {
  switch (v) {
    case CudaGraphModule::kAttn:
      return "attn";
    case CudaGraphModule::kMlp:
      return "mlp";
    case CudaGraphModule::kMoeRouter:
      return "moe_router";
    case CudaGraphModule::kMoePreprocess:
      return "moe_preprocess";
    case CudaGraphModule::kMoe:
      return "moe";
    case CudaGraphModule::kLayer:
      return "layer";
  }
  return "?";
}

const char* to_string(ParallelConfig::PipelineSchedule v) {
  switch (v) {
    case ParallelConfig::PipelineSchedule::k1F1B:
      return "1f1b";
    case ParallelConfig::PipelineSchedule::kInterleaved1F1B:
      return "interleaved_1f1b";
  }
  return "?";
}
const char* to_string(RecomputeConfig::Mode v) {
  switch (v) {
    case RecomputeConfig::Mode::kNone:
      return "none";
    case RecomputeConfig::Mode::kSelective:
      return "selective";
    case RecomputeConfig::Mode::kFull:
      return "full";
  }
  return "?";
}
const char* to_string(RecomputeModule v) {
  switch (v) {
    case RecomputeModule::kCoreAttn:
      return "core_attn";
    case RecomputeModule::kLayernorm:
      return "layernorm";
    case RecomputeModule::kMoeAct:
      return "moe_act";
    case RecomputeModule::kMlaUpProj:
      return "mla_up_proj";
    case RecomputeModule::kMlp:
      return "mlp";
    case RecomputeModule::kMoe:
      return "moe";
    case RecomputeModule::kSharedExperts:
      return "shared_experts";
  }
  return "?";
}
const char* to_string(RecomputeConfig::Rerun v) {
  return v == RecomputeConfig::Rerun::kLayer ? "layer" : "needed";
}
const char* to_string(TensorClass v) {
  switch (v) {
    case TensorClass::kParams:
      return "params";
    case TensorClass::kGrads:
      return "grads";
    case TensorClass::kOptimizerStates:
      return "optimizer_states";
    case TensorClass::kMasterWeights:
      return "master_weights";
    case TensorClass::kActivations:
      return "activations";
    case TensorClass::kNamedActivation:
      return "named_activation";
  }
  return "?";
}
const char* to_string(Placement v) {
  switch (v) {
    case Placement::kHbm:
      return "hbm";
    case Placement::kHost:
      return "host";
  }
  return "?";
}

std::optional<ModelArch::Activation> activation_from_string(std::string_view s) {
  static constexpr ModelArch::Activation kAll[] = {ModelArch::Activation::kGelu,
                                                   ModelArch::Activation::kSwiGlu};
  return parse_enum(s, kAll);
}
std::optional<ModelArch::Norm> norm_from_string(std::string_view s) {
  static constexpr ModelArch::Norm kAll[] = {ModelArch::Norm::kLayerNorm,
                                             ModelArch::Norm::kRmsNorm};
  return parse_enum(s, kAll);
}
std::optional<ModelArch::AttentionImpl> attention_impl_from_string(std::string_view s) {
  static constexpr ModelArch::AttentionImpl kAll[] = {ModelArch::AttentionImpl::kFlash,
                                                      ModelArch::AttentionImpl::kClassic,
                                                      ModelArch::AttentionImpl::kFlash2};
  return parse_enum(s, kAll);
}
std::optional<ParallelConfig::PipelineSchedule> pipeline_schedule_from_string(std::string_view s) {
  static constexpr ParallelConfig::PipelineSchedule kAll[] = {
      ParallelConfig::PipelineSchedule::k1F1B, ParallelConfig::PipelineSchedule::kInterleaved1F1B};
  return parse_enum(s, kAll);
}
std::optional<ParallelConfig::CpCommType> cp_comm_type_from_string(std::string_view s) {
  static constexpr ParallelConfig::CpCommType kAll[] = {ParallelConfig::CpCommType::kP2P,
                                                        ParallelConfig::CpCommType::kA2A};
  return parse_enum(s, kAll);
}
std::optional<ParallelConfig::MoeDispatcher> moe_dispatcher_from_string(std::string_view s) {
  static constexpr ParallelConfig::MoeDispatcher kAll[] = {
      ParallelConfig::MoeDispatcher::kAllToAll, ParallelConfig::MoeDispatcher::kDeepEp,
      ParallelConfig::MoeDispatcher::kHybridEp};
  return parse_enum(s, kAll);
}
std::optional<ParallelConfig::BackwardPrefetch> backward_prefetch_from_string(std::string_view s) {
  static constexpr ParallelConfig::BackwardPrefetch kAll[] = {
      ParallelConfig::BackwardPrefetch::kPre, ParallelConfig::BackwardPrefetch::kPost,
      ParallelConfig::BackwardPrefetch::kNone};
  return parse_enum(s, kAll);
}
std::optional<ParallelConfig::ParamGather> param_gather_from_string(std::string_view s) {
  static constexpr ParallelConfig::ParamGather kAll[] = {
      ParallelConfig::ParamGather::kPerLayer, ParallelConfig::ParamGather::kPerTensorSynchronized};
  return parse_enum(s, kAll);
}
std::optional<TrainingConfig::Fp8Recipe> fp8_recipe_from_string(std::string_view s) {
  static constexpr TrainingConfig::Fp8Recipe kAll[] = {
      TrainingConfig::Fp8Recipe::kDelayed, TrainingConfig::Fp8Recipe::kCurrent,
      TrainingConfig::Fp8Recipe::kMxfp8, TrainingConfig::Fp8Recipe::kBlockwise};
  return parse_enum(s, kAll);
}
std::optional<TrainingConfig::MoeGroupedGemm> moe_grouped_gemm_from_string(std::string_view s) {
  static constexpr TrainingConfig::MoeGroupedGemm kAll[] = {
      TrainingConfig::MoeGroupedGemm::kMultiStream, TrainingConfig::MoeGroupedGemm::kSingleKernel,
      TrainingConfig::MoeGroupedGemm::kSequential};
  return parse_enum(s, kAll);
}
std::optional<CudaGraphModule> cuda_graph_module_from_string(std::string_view s) {
  static constexpr CudaGraphModule kAll[] = {
      CudaGraphModule::kAttn,          CudaGraphModule::kMlp, CudaGraphModule::kMoeRouter,
      CudaGraphModule::kMoePreprocess, CudaGraphModule::kMoe, CudaGraphModule::kLayer};
  return parse_enum(s, kAll);
}
std::optional<RecomputeConfig::Mode> recompute_mode_from_string(std::string_view s) {
  static constexpr RecomputeConfig::Mode kAll[] = {RecomputeConfig::Mode::kNone,
                                                   RecomputeConfig::Mode::kSelective,
                                                   RecomputeConfig::Mode::kFull};
  return parse_enum(s, kAll);
}
std::optional<RecomputeModule> recompute_module_from_string(std::string_view s) {
  static constexpr RecomputeModule kAll[] = {
      RecomputeModule::kCoreAttn,     RecomputeModule::kLayernorm, RecomputeModule::kMoeAct,
      RecomputeModule::kMlaUpProj,    RecomputeModule::kMlp,       RecomputeModule::kMoe,
      RecomputeModule::kSharedExperts};
  return parse_enum(s, kAll);
}
std::optional<RecomputeConfig::Rerun> recompute_rerun_from_string(std::string_view s) {
  static constexpr RecomputeConfig::Rerun kAll[] = {RecomputeConfig::Rerun::kNeeded,
                                                    RecomputeConfig::Rerun::kLayer};
  return parse_enum(s, kAll);
}
std::optional<TensorClass> tensor_class_from_string(std::string_view s) {
  static constexpr TensorClass kAll[] = {
      TensorClass::kParams,        TensorClass::kGrads,       TensorClass::kOptimizerStates,
      TensorClass::kMasterWeights, TensorClass::kActivations, TensorClass::kNamedActivation};
  return parse_enum(s, kAll);
}
std::optional<Placement> placement_from_string(std::string_view s) {
  static constexpr Placement kAll[] = {Placement::kHbm, Placement::kHost};
  return parse_enum(s, kAll);
}
const char* to_string(OffloadPolicy::CpuStep v) {
  switch (v) {
    case OffloadPolicy::CpuStep::kPerGroup:
      return "per_group";
    case OffloadPolicy::CpuStep::kFlatPartition:
      return "flat_partition";
  }
  return "?";
}
std::optional<OffloadPolicy::CpuStep> cpu_step_from_string(std::string_view s) {
  static constexpr OffloadPolicy::CpuStep kAll[] = {OffloadPolicy::CpuStep::kPerGroup,
                                                    OffloadPolicy::CpuStep::kFlatPartition};
  return parse_enum(s, kAll);
}

const char* to_string(OffloadPolicy::CpuAdam v) {
  switch (v) {
    case OffloadPolicy::CpuAdam::kDeepSpeed:
      return "deepspeed";
    case OffloadPolicy::CpuAdam::kTorchFused:
      return "torch_fused";
    case OffloadPolicy::CpuAdam::kTorch:
      return "torch";
  }
  return "?";
}
std::optional<OffloadPolicy::CpuAdam> cpu_adam_from_string(std::string_view s) {
  static constexpr OffloadPolicy::CpuAdam kAll[] = {OffloadPolicy::CpuAdam::kDeepSpeed,
                                                    OffloadPolicy::CpuAdam::kTorchFused,
                                                    OffloadPolicy::CpuAdam::kTorch};
  return parse_enum(s, kAll);
}

const char* to_string(OffloadPolicy::ExpertFetch v) {
  switch (v) {
    case OffloadPolicy::ExpertFetch::kWhole:
      return "whole";
    case OffloadPolicy::ExpertFetch::kRouted:
      return "routed";
  }
  return "?";
}
std::optional<OffloadPolicy::ExpertFetch> expert_fetch_from_string(std::string_view s) {
  static constexpr OffloadPolicy::ExpertFetch kAll[] = {OffloadPolicy::ExpertFetch::kWhole,
                                                        OffloadPolicy::ExpertFetch::kRouted};
  return parse_enum(s, kAll);
}

const char* to_string(HardwareConfig::Runtime v) {
  switch (v) {
    case HardwareConfig::Runtime::kNone:
      return "none";
    case HardwareConfig::Runtime::kPytorch:
      return "pytorch";
    case HardwareConfig::Runtime::kPytorchExpandable:
      return "pytorch_expandable";
    case HardwareConfig::Runtime::kJax:
      return "jax";
  }
  return "?";
}
std::optional<HardwareConfig::Runtime> runtime_from_string(std::string_view s) {
  static constexpr HardwareConfig::Runtime kAll[] = {
      HardwareConfig::Runtime::kNone, HardwareConfig::Runtime::kPytorch,
      HardwareConfig::Runtime::kPytorchExpandable, HardwareConfig::Runtime::kJax};
  return parse_enum(s, kAll);
}

const std::vector<std::string>& activation_names() {
  static const std::vector<std::string> kNames = {"decoder_layer_input",
                                                  "query_proj",
                                                  "key_proj",
                                                  "value_proj",
                                                  "context",
                                                  "out_proj",
                                                  "mlpwi",
                                                  "mlpwo"};
  return kNames;
}

bool PipelineLayout::even() const {
  if (!counts.empty()) {
    return static_cast<std::int64_t>(counts.size()) == chunks() &&
           std::accumulate(counts.begin(), counts.end(), std::int64_t{0}) == layers;
  }
  return chunks() > 0 && slots() % chunks() == 0;
}

PipelineLayout::Span PipelineLayout::span(int stage, int chunk) const {
  const std::int64_t run = static_cast<std::int64_t>(chunk) * pp + stage;
  if (!counts.empty()) {
    if (run < 0 || run >= static_cast<std::int64_t>(counts.size())) return {};
    const auto end = counts.begin() + run;
    return {std::accumulate(counts.begin(), end, 0), counts[static_cast<std::size_t>(run)]};
  }
  const std::int64_t per = slots() / std::max<std::int64_t>(1, chunks());
  const std::int64_t first = std::clamp<std::int64_t>(run * per - embedding_slots, 0, layers);
  const std::int64_t end = std::clamp<std::int64_t>((run + 1) * per - embedding_slots, 0, layers);
  return {static_cast<int>(first), static_cast<int>(end - first)};
}

std::pair<int, int> PipelineLayout::place(int layer) const {
  if (!counts.empty()) {
    int first = 0;
    for (std::size_t run = 0; run < counts.size(); ++run) {
      first += counts[run];
      if (layer < first) {
        const auto r = static_cast<int>(run);
        return {r % pp, r / pp};
      }
    }
    const int last = static_cast<int>(counts.size()) - 1;
    return {last % pp, last / pp};
  }
  const std::int64_t per = std::max<std::int64_t>(1, slots() / std::max<std::int64_t>(1, chunks()));
  const std::int64_t run = (layer + embedding_slots) / per;
  return {static_cast<int>(run % pp), static_cast<int>(run / pp)};
}

std::int64_t PipelineLayout::stage_layers(int stage) const {
  std::int64_t n = 0;
  for (int c = 0; c < virtual_stages; ++c) n += span(stage, c).count;
  return n;
}

namespace {
std::vector<int> layout_counts(const ParallelConfig& p) {
  std::vector<int> counts;
  counts.reserve(p.layout.size());
  for (const ParallelConfig::StageLayout& stage : p.layout) counts.push_back(stage.decoders);
  return counts;
}
}  // namespace

namespace {

// Expansion is bounded so that "(t|)*999999999" is an error, not a gigabyte.
constexpr std::size_t kMaxLayoutChars = 1 << 16;

// The count of "*n" at text[i] (i at the '*'); advances i past it. nullopt: no "*digits" there,
// or a count above kMaxLayoutChars.
std::optional<std::size_t> layout_repeat(const std::string& text, std::size_t& i) {
  if (i >= text.size() || text[i] != '*') return std::nullopt;
  std::size_t j = i + 1;
  std::size_t n = 0;
  while (j < text.size() && text[j] >= '0' && text[j] <= '9') {
    n = n * 10 + static_cast<std::size_t>(text[j] - '0');
    if (n > kMaxLayoutChars) return std::nullopt;
    ++j;
  }
  if (j == i + 1) return std::nullopt;
  i = j;
  return n;
}

// One substitution pass: "(...)*n" (groups) or "x*n" (single characters), as Megatron's two
// regular expressions in that order.
sim::Result<std::string> unroll_pass(const std::string& text, bool groups) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    std::string unit(1, text[i]);
    std::size_t next = i + 1;
    const bool group = groups && text[i] == '(';
    if (group) {
      const std::size_t close = text.find(')', i);
      if (close == std::string::npos) {
        return sim::fail(sim::ErrorCode::kInvalidInput, "a layout whose every '(' closes");
      }
      unit = text.substr(i + 1, close - i - 1);
      next = close + 1;
    }
    std::size_t repeat = 1;
    const bool repeatable = groups ? group : text[i] != '*';
    if (repeatable && next < text.size() && text[next] == '*') {
      const auto n = layout_repeat(text, next);
      if (!n) {
        return sim::fail(sim::ErrorCode::kInvalidInput, "a count of at most {} after each '*'",
                         kMaxLayoutChars);
      }
      repeat = *n;
    } else if (group) {
      unit = text.substr(i, next - i);  // "(...)" without a count: kept, refused as a layer
    }
    if (out.size() + unit.size() * repeat > kMaxLayoutChars) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "a layout of at most {} layers and separators", kMaxLayoutChars);
    }
    for (std::size_t k = 0; k < repeat; ++k) out += unit;
    i = next;
  }
  return out;
}

}  // namespace

std::optional<char> pipeline_layer_letter(std::string_view name) {
  if (name == "E" || name == "embedding") return 'E';
  if (name == "t" || name == "decoder") return 't';
  if (name == "m" || name == "mtp") return 'm';
  if (name == "L" || name == "loss") return 'L';
  return std::nullopt;
}

sim::Result<std::vector<ParallelConfig::StageLayout>> parse_pipeline_layout(std::string text) {
  std::erase(text, ',');
  std::erase(text, ' ');
  OFFSIM_ASSIGN_OR_RETURN(text, unroll_pass(text, true));
  OFFSIM_ASSIGN_OR_RETURN(text, unroll_pass(text, false));
  std::vector<ParallelConfig::StageLayout> stages(1);
  for (const char c : text) {
    ParallelConfig::StageLayout& st = stages.back();
    switch (c) {
      case '|':
        stages.emplace_back();
        break;
      case 'E':
      case 'L':
        if (c == 'E' ? st.embedding : st.loss) {
          return sim::fail(sim::ErrorCode::kInvalidInput, "'{}' at most once", c);
        }
        (c == 'E' ? st.embedding : st.loss) = true;
        break;
      case 't':
        ++st.decoders;
        break;
      case 'm':
        ++st.mtp;
        break;
      default:
        return sim::fail(sim::ErrorCode::kInvalidInput,
                         "layers E, t, m, L (embedding, decoder, mtp, loss) separated by '|'; "
                         "'{}' is none",
                         c);
    }
  }
  return stages;
}

std::vector<ParallelConfig::StageLayout> scale_layout(
    const std::vector<ParallelConfig::StageLayout>& layout, std::int64_t layers) {
  std::vector<ParallelConfig::StageLayout> out = layout;
  // A stage that builds only decoder layers keeps one (a stage may not build nothing).
  std::int64_t total = 0;
  std::int64_t kept = 0;
  for (auto& st : out) {
    total += st.decoders;
    const bool only_decoders = st.decoders > 0 && !st.embedding && !st.loss && st.mtp == 0;
    st.decoders = only_decoders ? 1 : 0;
    kept += st.decoders;
  }
  if (total <= 0 || layers < kept) return layout;
  const std::int64_t rest = layers - kept;
  std::int64_t given = 0;
  std::vector<std::pair<std::int64_t, std::size_t>> remainders;  // (-remainder, stage)
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const std::int64_t share = layout[i].decoders * rest;
    out[i].decoders += static_cast<int>(share / total);
    given += share / total;
    remainders.emplace_back(-(share % total), i);
  }
  std::sort(remainders.begin(), remainders.end());
  for (std::size_t k = 0; given < rest && k < remainders.size(); ++k, ++given) {
    ++out[remainders[k].second].decoders;
  }
  return out;
}

std::string layout_string(const ParallelConfig& p) {
  std::string out;
  const auto run = [&out](char c, int n) {
    if (n <= 0) return;
    out += c;
    if (n > 1) out += fmt::format("*{}", n);
  };
  for (std::size_t i = 0; i < p.layout.size(); ++i) {
    const ParallelConfig::StageLayout& st = p.layout[i];
    if (i > 0) out += '|';
    run('E', st.embedding ? 1 : 0);
    run('t', st.decoders);
    run('m', st.mtp);
    run('L', st.loss ? 1 : 0);
  }
  return out;
}

PipelineLayout pipeline_layout(std::int64_t layers, const ParallelConfig& p) {
  return {.layers = layers,
          .pp = std::max(1, p.pp),
          .virtual_stages = std::max(1, p.virtual_stages),
          .embedding_slots = p.account_for_embedding_in_pipeline_split ? 1 : 0,
          .loss_slots = p.account_for_loss_in_pipeline_split ? 1 : 0,
          .counts = layout_counts(p)};
}

bool LayerSelection::contains(int layer, std::int64_t num_layers, int pp,
                              int virtual_stages) const {
  return contains(layer, PipelineLayout{.layers = num_layers,
                                        .pp = std::max(1, pp),
                                        .virtual_stages = std::max(1, virtual_stages)});
}

bool LayerSelection::contains(int layer, const PipelineLayout& layout) const {
  const std::int64_t num_layers = layout.layers;
  switch (kind) {
    case Kind::kAll:
      return true;
    case Kind::kList:
      return std::find(list.begin(), list.end(), layer) != list.end();
    case Kind::kFraction:
      return layer <
             static_cast<std::int64_t>(std::llround(fraction * static_cast<double>(num_layers)));
    case Kind::kFirst:
      return layer < count;
    case Kind::kStageFraction: {
      // The layer's position among the layers its stage holds, chunk by chunk, against the
      // stage's own layers (the fraction is of each rank's state).
      const auto [stage, chunk] = layout.place(layer);
      std::int64_t position = layer - layout.span(stage, chunk).first;
      for (int c = 0; c < chunk; ++c) position += layout.span(stage, c).count;
      const std::int64_t per_stage = layout.stage_layers(stage);
      return position <
             static_cast<std::int64_t>(std::llround(fraction * static_cast<double>(per_stage)));
    }
  }
  return false;
}

RecomputeConfig::Mode recompute_mode(const RecomputeConfig& r, int layer) {
  auto it = r.per_layer.find(layer);
  return it == r.per_layer.end() ? r.mode : it->second;
}

std::int64_t grad_accum_steps(const TrainingConfig& t, const ParallelConfig& p) {
  const std::int64_t per_step = t.micro_batch * p.dp;
  return per_step > 0 ? t.global_batch / per_step : 0;
}

namespace {

sim::Unexpected invalid(std::string message) {
  return sim::fail(sim::ErrorCode::kInvalidInput, "{}", message);
}

sim::Status check_selection(const LayerSelection& sel, std::int64_t layers,
                            const std::string& path) {
  switch (sel.kind) {
    case LayerSelection::Kind::kAll:
      break;
    case LayerSelection::Kind::kList:
      for (int l : sel.list) {
        if (l < 0 || l >= layers) {
          return invalid(fmt::format("{}.layers: layer {} is outside 0..{} (model.layers {})", path,
                                     l, layers - 1, layers));
        }
      }
      break;
    case LayerSelection::Kind::kFraction:
    case LayerSelection::Kind::kStageFraction:
      if (!(sel.fraction >= 0.0 && sel.fraction <= 1.0)) {
        return invalid(fmt::format("{}.layers: fraction {} is not in [0, 1]", path, sel.fraction));
      }
      break;
    case LayerSelection::Kind::kFirst:
      if (sel.count < 0 || sel.count > layers) {
        return invalid(fmt::format("{}.layers: first {} layers is not in 0..model.layers {}", path,
                                   sel.count, layers));
      }
      break;
  }
  return sim::ok();
}

// Dtype combinations a framework can run (see dtype_preset() for the conventions).
sim::Status check_dtypes(const TrainingConfig& t) {
  const TensorDtypes& d = t.dtypes;
  const auto storage = [](const std::optional<sim::DType>& v, const char* key) -> sim::Status {
    if (v == sim::DType::kFp8) {
      return invalid(fmt::format(
          "training.dtypes.{}: fp8 storage is not modelled; expected fp32, bf16 or fp16", key));
    }
    return sim::ok();
  };
  if (d.params == sim::DType::kFp8) {
    // Transformer Engine's FP8 parameters (Megatron's --fp8-param-gather): the linear modules'
    // weights kept only as their FP8 copies, updated from an fp32 master copy.
    if (t.compute_dtype != sim::DType::kFp8) {
      return invalid(fmt::format(
          "training.dtypes.params: fp8 weights (Transformer Engine's FP8 parameters) need FP8 "
          "GEMMs; expected training.precision fp8, not {}",
          sim::to_string(t.compute_dtype)));
    }
    if (!t.fp32_master_weights && !d.master) {
      return invalid(
          "training.dtypes.params: fp8 weights are updated through a master copy; expected "
          "training.fp32_master_weights true");
    }
  }
  OFFSIM_RETURN_IF_ERROR(storage(d.grads, "grads"));
  OFFSIM_RETURN_IF_ERROR(storage(d.master, "master"));
  OFFSIM_RETURN_IF_ERROR(storage(d.first_moment, "first_moment"));
  OFFSIM_RETURN_IF_ERROR(storage(d.second_moment, "second_moment"));
  OFFSIM_RETURN_IF_ERROR(storage(d.reduce_scatter, "reduce_scatter"));
  const auto half = [](sim::DType x) { return x == sim::DType::kBf16 || x == sim::DType::kFp16; };
  const auto moment = [](const std::optional<sim::DType>& v, const char* key) -> sim::Status {
    if (v == sim::DType::kFp16) {
      return invalid(fmt::format(
          "training.dtypes.{}: fp16 Adam moments overflow (the second moment squares the "
          "gradients); frameworks offer fp32 or bf16 (optax mu_dtype)",
          key));
    }
    return sim::ok();
  };
  OFFSIM_RETURN_IF_ERROR(moment(d.first_moment, "first_moment"));
  OFFSIM_RETURN_IF_ERROR(moment(d.second_moment, "second_moment"));
  if (d.master && !t.fp32_master_weights) {
    return invalid(
        "training.dtypes.master: set, but training.fp32_master_weights is false (no master "
        "copy); remove one of them");
  }
  const ResolvedDtypes r = resolve_dtypes(t);
  if (t.store_param_remainders && !r.master_remainders) {
    return invalid(fmt::format(
        "training.store_param_remainders: keeps the 16 bits of an fp32 master that bf16 weights "
        "do not hold; expected bf16 params with an fp32 master, got {} params and {} master",
        sim::to_string(r.params), r.master ? sim::to_string(*r.master) : "no"));
  }
  if (half(r.params) && half(r.grads) && r.params != r.grads) {
    return invalid(fmt::format(
        "training.dtypes.grads: {} gradients with {} parameters: no framework mixes the two "
        "16-bit formats; expected {} or fp32",
        sim::to_string(r.grads), sim::to_string(r.params), sim::to_string(r.params)));
  }
  if (r.master && sim::dtype_bytes(*r.master) < sim::dtype_bytes(r.params)) {
    return invalid(fmt::format(
        "training.dtypes.master: a {} master copy of {} parameters is narrower than the weights "
        "it updates; expected fp32 or none",
        sim::to_string(*r.master), sim::to_string(r.params)));
  }
  const sim::DType compute =
      t.compute_dtype == sim::DType::kFp8 ? sim::DType::kBf16 : t.compute_dtype;
  const bool fp8_gather = r.all_gather == sim::DType::kFp8 && t.compute_dtype == sim::DType::kFp8;
  if (r.all_gather != r.params && r.all_gather != compute && !fp8_gather) {
    return invalid(fmt::format(
        "training.dtypes.all_gather: {} is neither the parameters' dtype ({}) nor the compute "
        "dtype ({}); frameworks gather weights as stored or cast to the compute dtype",
        sim::to_string(r.all_gather), sim::to_string(r.params), sim::to_string(compute)));
  }
  return sim::ok();
}

// Group-limited routing: both keys or neither, whole groups of experts, and room in the chosen
// groups for the token's top_k (Megatron-Core's router asserts the same).
sim::Status check_router_groups(const MoeConfig& e) {
  if (e.router_groups == 0 && e.router_group_topk == 0) return sim::ok();
  if (e.router_groups < 1 || e.experts % e.router_groups != 0) {
    return invalid(fmt::format(
        "model.moe.router_groups: {} must be a positive divisor of model.moe.experts ({}), with "
        "model.moe.router_group_topk",
        e.router_groups, e.experts));
  }
  if (e.router_group_topk < 1 || e.router_group_topk > e.router_groups) {
    return invalid(
        fmt::format("model.moe.router_group_topk: {} must be in 1..{} "
                    "(model.moe.router_groups)",
                    e.router_group_topk, e.router_groups));
  }
  const std::int64_t reachable = e.router_group_topk * (e.experts / e.router_groups);
  if (e.top_k > reachable) {
    return invalid(fmt::format(
        "model.moe.router_group_topk: {} groups of {} experts hold fewer than model.moe.top_k {}",
        e.router_group_topk, e.experts / e.router_groups, e.top_k));
  }
  return sim::ok();
}

// The expert count, widths and routing figures of an MoE model.
sim::Status check_moe_shape(const Scenario& s) {
  const MoeConfig& e = s.model.moe;
  if (e.experts > (std::int64_t{1} << 16)) {
    return invalid(
        fmt::format("model.moe.experts: {} is above offsim's limit of 65536", e.experts));
  }
  if (e.top_k < 1 || e.top_k > e.experts) {
    return invalid(fmt::format("model.moe.top_k: {} must be in 1..{} (model.moe.experts)", e.top_k,
                               e.experts));
  }
  OFFSIM_RETURN_IF_ERROR(check_router_groups(e));
  if (e.expert_ffn_hidden < 1 || e.expert_ffn_hidden > (std::int64_t{1} << 22)) {
    return invalid(fmt::format("model.moe.expert_ffn_hidden: {} must be in 1..{}",
                               e.expert_ffn_hidden, std::int64_t{1} << 22));
  }
  if (e.shared_experts < 0 || e.shared_experts > 64) {
    return invalid(fmt::format("model.moe.shared_experts: {} must be in 0..64", e.shared_experts));
  }
  if (e.shared_ffn_hidden < 0 || e.shared_ffn_hidden > (std::int64_t{1} << 22)) {
    return invalid(fmt::format("model.moe.shared_ffn_hidden: {} must be in 0..{}",
                               e.shared_ffn_hidden, std::int64_t{1} << 22));
  }
  if (e.first_k_dense < 0 || e.first_k_dense > s.model.layers) {
    return invalid(fmt::format("model.moe.first_k_dense: {} must be in 0..{} (model.layers)",
                               e.first_k_dense, s.model.layers));
  }
  if (e.layer_freq < 1) {
    return invalid(fmt::format("model.moe.layer_freq: {} must be >= 1", e.layer_freq));
  }
  if (!(e.capacity_factor == 0.0 || (e.capacity_factor > 0.0 && e.capacity_factor <= 1e6))) {
    return invalid(
        fmt::format("model.moe.capacity_factor: {} must be > 0 (or 0 for dropless routing)",
                    e.capacity_factor));
  }
  if (e.pad_to_capacity && !(e.capacity_factor > 0.0)) {
    return invalid(
        "model.moe.pad_to_capacity: padding to capacity needs a capacity "
        "(model.moe.capacity_factor > 0; Megatron-Core refuses it on dropless routing)");
  }
  if (!(e.load_imbalance >= 1.0 && e.load_imbalance <= static_cast<double>(e.experts))) {
    return invalid(fmt::format(
        "model.moe.load_imbalance: {} must be in [1, {}] (the most-loaded expert's tokens over "
        "the mean; at most model.moe.experts)",
        e.load_imbalance, e.experts));
  }
  return sim::ok();
}

// Measured per-expert token counts: one per expert, summing to the micro-batch's assignments.
sim::Status check_expert_loads(const Scenario& s) {
  const MoeConfig& e = s.model.moe;
  if (e.expert_loads.empty()) return sim::ok();
  if (static_cast<std::int64_t>(e.expert_loads.size()) != e.experts) {
    return invalid(fmt::format("model.moe.expert_loads: {} entries, expected one per expert ({})",
                               e.expert_loads.size(), e.experts));
  }
  double sum = 0.0;
  for (std::size_t i = 0; i < e.expert_loads.size(); ++i) {
    const double v = e.expert_loads[i];
    if (!(v >= 0.0 && v < 1e15)) {
      return invalid(fmt::format("model.moe.expert_loads[{}]: {} must be >= 0", i, v));
    }
    sum += v;
  }
  const double expected =
      static_cast<double>(s.training.micro_batch * s.training.seq_len * e.top_k);
  if (std::abs(sum - expected) > 0.5) {
    return invalid(fmt::format(
        "model.moe.expert_loads: sum {} differs from the {} token-expert assignments of a "
        "micro-batch (training.micro_batch × training.seq_len × model.moe.top_k)",
        sum, expected));
  }
  return sim::ok();
}

// Expert (and expert-tensor) parallelism folded into the tensor- and data-parallel grid, with the
// sequence parallelism and ZeRO stage Megatron-Core supports for MoE.
sim::Status check_expert_parallel(const Scenario& s) {
  const MoeConfig& e = s.model.moe;
  const ParallelConfig& p = s.parallelism;
  if (e.experts % p.ep != 0) {
    return invalid(
        fmt::format("parallelism.ep: {} does not divide model.moe.experts {}", p.ep, e.experts));
  }
  if (e.expert_ffn_hidden % p.etp != 0) {
    return invalid(fmt::format("parallelism.etp: {} does not divide model.moe.expert_ffn_hidden {}",
                               p.etp, e.expert_ffn_hidden));
  }
  const std::int64_t grid = static_cast<std::int64_t>(p.tp) * p.cp * p.dp;
  if (grid % (static_cast<std::int64_t>(p.ep) * p.etp) != 0) {
    return invalid(fmt::format(
        "parallelism.ep: ep × etp = {} does not divide tp × cp × dp = {} (Megatron-Core folds "
        "the expert-parallel grid into the tensor-, context- and data-parallel ranks)",
        p.ep * p.etp, grid));
  }
  const std::int64_t fs =
      e.shared_experts * (e.shared_ffn_hidden > 0 ? e.shared_ffn_hidden : e.expert_ffn_hidden);
  if (fs % p.tp != 0) {
    return invalid(
        fmt::format("parallelism.tp: {} does not divide the shared experts' FFN {}", p.tp, fs));
  }
  if (p.tp > 1 && !p.sequence_parallel) {
    return invalid(fmt::format(
        "parallelism.sequence_parallel: MoE with tp {} needs sequence parallelism (Megatron-Core "
        "requires it)",
        p.tp));
  }
  // Sharded parameters come back whole for each layer by all-gather, so the host-resident
  // experts cannot be fetched by the router's choice (offload.experts.fetch routed).
  if ((p.fsdp || p.zero_stage >= 3) &&
      s.offload.expert_fetch == OffloadPolicy::ExpertFetch::kRouted) {
    return invalid(fmt::format(
        "offload.experts.fetch: routed fetches the picked experts whole from the host; with "
        "parameters sharded over the expert-data-parallel ranks (zero_stage {}{}) expected "
        "offload.experts.fetch whole",
        p.zero_stage, p.fsdp ? ", fsdp" : ""));
  }
  if (s.offload.zenflow.enabled || s.offload.superoffload.enabled) {
    return invalid(
        "offload.cpu: ZenFlow and SuperOffload are modelled for dense models; expected neither "
        "with model.moe.experts > 0");
  }
  return sim::ok();
}

// The mixture-of-experts keys and expert parallelism.
// parallelism.moe_a2a_overlap as Megatron-Core's TransformerConfig checks
// overlap_moe_expert_parallel_comm, and what offsim does not model with it.
sim::Status check_moe_a2a_overlap(const Scenario& s) {
  const ParallelConfig& p = s.parallelism;
  if (p.delay_wgrad_compute && !p.moe_a2a_overlap) {
    return invalid(
        "parallelism.delay_wgrad_compute: needs parallelism.moe_a2a_overlap (Megatron-Core "
        "delays the weight gradients only in its combined 1F1B step)");
  }
  if (!p.moe_a2a_overlap) return sim::ok();
  const auto refuse = [](std::string_view why) {
    return invalid(fmt::format("parallelism.moe_a2a_overlap: {}", why));
  };
  if (s.model.moe.experts == 0 || p.ep < 2) {
    return refuse("needs an MoE model with expert parallelism (parallelism.ep > 1)");
  }
  if (p.pp > 1 &&
      (p.virtual_stages < 2 || p.schedule != ParallelConfig::PipelineSchedule::kInterleaved1F1B)) {
    return refuse(
        "with pipeline parallelism it needs the interleaved schedule (parallelism.virtual_stages "
        "> 1), as Megatron-Core asks");
  }
  const RecomputeConfig& rc = s.recompute;
  bool full = rc.mode == RecomputeConfig::Mode::kFull;
  for (const auto& [layer, mode] : rc.per_layer)
    full = full || mode == RecomputeConfig::Mode::kFull;
  if (full) return refuse("cannot be combined with full recompute (Megatron-Core refuses it)");
  if (rc.modules.has(RecomputeModule::kMoe) &&
      (rc.mode == RecomputeConfig::Mode::kSelective || !rc.per_layer.empty())) {
    return refuse("cannot be combined with recompute.modules moe (Megatron-Core refuses it)");
  }
  if (p.moe_shared_expert_overlap) {
    return refuse(
        "cannot be combined with parallelism.moe_shared_expert_overlap (Megatron-Core refuses it)");
  }
  if (s.model.mtp_layers > 1) {
    return refuse("supports at most one multi-token-prediction layer (model.mtp_layers)");
  }
  if (dp_sharding(p).params) {
    return refuse(
        "is not modelled with sharded parameters (parallelism.zero_stage 3 or fsdp): the two "
        "passes' gathers would share one stream");
  }
  for (const OffloadRule& rule : s.offload.rules) {
    if (rule.cls == TensorClass::kParams && rule.where == Placement::kHost) {
      return refuse(
          "is not modelled with parameters on the host (offload rules of class params): the two "
          "passes' fetches would share one copy stream");
    }
  }
  return sim::ok();
}

// parallelism.moe_dispatcher deepep and hybridep as Megatron-Core's MoEFlexTokenDispatcher and
// TransformerConfig check them, and what offsim does not model with them.
sim::Status check_moe_dispatcher(const Scenario& s) {
  const ParallelConfig& p = s.parallelism;
  if (p.moe_dispatcher == ParallelConfig::MoeDispatcher::kAllToAll) return sim::ok();
  const char* name = to_string(p.moe_dispatcher);
  const auto refuse = [name](std::string_view why) {
    return invalid(fmt::format("parallelism.moe_dispatcher: {} {}", name, why));
  };
  if (s.model.moe.experts == 0 || p.ep < 2) {
    return refuse("needs an MoE model with expert parallelism (parallelism.ep > 1)");
  }
  if (p.etp > 1) {
    return refuse(
        "is modelled with expert tensor parallelism 1 only (parallelism.etp 1): with etp > 1 the "
        "flex dispatcher replicates every token over the expert-TP ranks of one TP x EP group");
  }
  if (p.moe_shared_expert_overlap) {
    return refuse(
        "cannot be combined with parallelism.moe_shared_expert_overlap (Megatron-Core's flex "
        "dispatcher refuses it)");
  }
  if (s.model.moe.pad_to_capacity && p.moe_dispatcher == ParallelConfig::MoeDispatcher::kDeepEp) {
    return refuse(
        "cannot pad to capacity (model.moe.pad_to_capacity; Megatron-Core's flex dispatcher with "
        "the DeepEP backend refuses moe_pad_expert_input_to_capacity)");
  }
  return sim::ok();
}

sim::Status check_moe(const Scenario& s) {
  const MoeConfig& e = s.model.moe;
  const ParallelConfig& p = s.parallelism;
  if (p.ep < 1) return invalid(fmt::format("parallelism.ep: {} must be positive", p.ep));
  if (p.etp < 1) return invalid(fmt::format("parallelism.etp: {} must be positive", p.etp));
  if (e.experts < 0) return invalid(fmt::format("model.moe.experts: {} must be >= 0", e.experts));
  OFFSIM_RETURN_IF_ERROR(check_moe_a2a_overlap(s));
  OFFSIM_RETURN_IF_ERROR(check_moe_dispatcher(s));
  if (e.experts == 0) {
    if (p.ep > 1 || p.etp > 1) {
      return invalid(fmt::format(
          "parallelism.ep: expert parallelism ({} x etp {}) needs an MoE model (model.moe.experts "
          "> 0)",
          p.ep, p.etp));
    }
    return sim::ok();
  }
  OFFSIM_RETURN_IF_ERROR(check_moe_shape(s));
  OFFSIM_RETURN_IF_ERROR(check_expert_loads(s));
  OFFSIM_RETURN_IF_ERROR(check_expert_parallel(s));
  const MlaConfig& a = s.model.mla;
  if (a.kv_lora_rank < 0 || a.q_lora_rank < 0 || a.qk_nope_head_dim < 0 || a.qk_rope_head_dim < 0 ||
      a.v_head_dim < 0) {
    return invalid("model.mla: ranks and head dims must be >= 0");
  }
  return sim::ok();
}

sim::Status positive(std::int64_t v, const char* path) {
  if (v <= 0) return invalid(fmt::format("{}: {} must be positive", path, v));
  return sim::ok();
}

sim::Status at_most(std::int64_t v, std::int64_t limit, const char* path) {
  if (v > limit) {
    return invalid(fmt::format("{}: {} is above offsim's limit of {}", path, v, limit));
  }
  return sim::ok();
}

// The model's dimensions, and the bounds that keep every byte and FLOP count of the model in
// 64-bit integers (the largest published dense models are far inside them).
sim::Status check_sizes(const Scenario& s) {
  const ModelArch& m = s.model;
  OFFSIM_RETURN_IF_ERROR(positive(m.vocab_size, "model.vocab_size"));
  OFFSIM_RETURN_IF_ERROR(positive(m.hidden, "model.hidden"));
  OFFSIM_RETURN_IF_ERROR(positive(m.layers, "model.layers"));
  OFFSIM_RETURN_IF_ERROR(positive(m.heads, "model.heads"));
  OFFSIM_RETURN_IF_ERROR(positive(m.kv_heads, "model.kv_heads"));
  OFFSIM_RETURN_IF_ERROR(positive(m.head_dim, "model.head_dim"));
  OFFSIM_RETURN_IF_ERROR(positive(m.ffn_hidden, "model.ffn_hidden"));
  OFFSIM_RETURN_IF_ERROR(at_most(m.hidden, std::int64_t{1} << 20, "model.hidden"));
  OFFSIM_RETURN_IF_ERROR(at_most(m.ffn_hidden, std::int64_t{1} << 22, "model.ffn_hidden"));
  OFFSIM_RETURN_IF_ERROR(at_most(m.vocab_size, std::int64_t{1} << 24, "model.vocab_size"));
  OFFSIM_RETURN_IF_ERROR(at_most(m.layers, std::int64_t{1} << 16, "model.layers"));
  OFFSIM_RETURN_IF_ERROR(at_most(m.heads, std::int64_t{1} << 16, "model.heads"));
  OFFSIM_RETURN_IF_ERROR(at_most(m.head_dim, std::int64_t{1} << 16, "model.head_dim"));
  OFFSIM_RETURN_IF_ERROR(
      at_most(m.heads * m.head_dim, std::int64_t{1} << 20, "model.heads × model.head_dim"));
  OFFSIM_RETURN_IF_ERROR(at_most(m.max_positions, std::int64_t{1} << 24, "model.max_positions"));
  OFFSIM_RETURN_IF_ERROR(at_most(s.training.seq_len, std::int64_t{1} << 24, "training.seq_len"));
  OFFSIM_RETURN_IF_ERROR(at_most(s.training.micro_batch * s.training.seq_len, std::int64_t{1} << 28,
                                 "training.micro_batch × training.seq_len"));
  OFFSIM_RETURN_IF_ERROR(
      at_most(s.training.global_batch, std::int64_t{1} << 24, "training.global_batch"));
  if (m.heads % m.kv_heads != 0) {
    return invalid(
        fmt::format("model.kv_heads: {} does not divide model.heads {}", m.kv_heads, m.heads));
  }
  if (m.max_positions < 0) {
    return invalid(fmt::format("model.max_positions: {} must be >= 0", m.max_positions));
  }
  return sim::ok();
}

sim::Status check_training(const Scenario& s) {
  const ModelArch& m = s.model;
  const TrainingConfig& t = s.training;
  OFFSIM_RETURN_IF_ERROR(positive(t.global_batch, "training.global_batch"));
  OFFSIM_RETURN_IF_ERROR(positive(t.micro_batch, "training.micro_batch"));
  OFFSIM_RETURN_IF_ERROR(positive(t.seq_len, "training.seq_len"));
  if (m.max_positions > 0 && t.seq_len > m.max_positions) {
    return invalid(fmt::format("training.seq_len: {} exceeds model.max_positions {}", t.seq_len,
                               m.max_positions));
  }
  OFFSIM_RETURN_IF_ERROR(positive(t.loss_chunks, "training.loss_chunks"));
  if (t.loss_chunks > t.micro_batch * t.seq_len) {
    return invalid(fmt::format(
        "training.loss_chunks: {} chunks exceed the {} tokens of a micro-batch (micro_batch × "
        "seq_len); expected at most one chunk per token",
        t.loss_chunks, t.micro_batch * t.seq_len));
  }
  return sim::ok();
}

// Tensor parallelism divides the heads, KV heads, FFN width and (with sequence parallelism) the
// sequence; ZeRO stage and FSDP agree.
// parallelism.fsdp_shard: FSDP's hybrid sharding, groups of shard ranks that divide dp · cp.
sim::Status check_hybrid_sharding(const Scenario& s) {
  const ParallelConfig& p = s.parallelism;
  if (p.fsdp_shard == 0) return sim::ok();
  if (!p.fsdp && p.zero_stage != 3) {
    return invalid(fmt::format(
        "parallelism.fsdp_shard: {} shards parameters in groups; expected parallelism.fsdp true "
        "or zero_stage 3 (zero_stage is {})",
        p.fsdp_shard, p.zero_stage));
  }
  if (p.fsdp_shard < 2 || grad_dp(p) % p.fsdp_shard != 0) {
    return invalid(fmt::format(
        "parallelism.fsdp_shard: {} must be at least 2 and divide the data-parallel ranks dp × cp "
        "= {}",
        p.fsdp_shard, grad_dp(p)));
  }
  const OffloadPolicy& o = s.offload;
  const bool deepspeed_step =
      o.optimizer_on_cpu && (o.cpu_step == OffloadPolicy::CpuStep::kFlatPartition ||
                             o.zenflow.enabled || o.superoffload.enabled);
  if (p.param_gather != ParallelConfig::ParamGather::kPerLayer || deepspeed_step) {
    return invalid(
        "parallelism.fsdp_shard: hybrid sharding is modelled with per-layer gathers and a GPU or "
        "per-group CPU optimizer; expected param_gather per_layer and none of DeepSpeed's "
        "flat-partition, ZenFlow or SuperOffload CPU steps");
  }
  // The expert-parallel groups live inside a shard group (torchtitan's EP borrows from the shard
  // degree), so each replica holds whole experts.
  if (s.model.moe.experts > 0 && (p.tp * p.fsdp_shard) % (p.ep * p.etp) != 0) {
    return invalid(fmt::format(
        "parallelism.fsdp_shard: {} with tp {} gives shard groups of {} ranks, which the "
        "expert-parallel groups (ep {} x etp {}) must divide",
        p.fsdp_shard, p.tp, p.tp * p.fsdp_shard, p.ep, p.etp));
  }
  return sim::ok();
}

sim::Status check_tensor_parallel(const Scenario& s) {
  const ModelArch& m = s.model;
  const ParallelConfig& p = s.parallelism;
  if (m.heads % p.tp != 0) {
    return invalid(fmt::format("parallelism.tp: {} does not divide model.heads {}", p.tp, m.heads));
  }
  if (m.kv_heads % p.tp != 0) {
    return invalid(
        fmt::format("parallelism.tp: {} does not divide model.kv_heads {}", p.tp, m.kv_heads));
  }
  if (m.ffn_hidden % p.tp != 0) {
    return invalid(
        fmt::format("parallelism.tp: {} does not divide model.ffn_hidden {}", p.tp, m.ffn_hidden));
  }
  if (p.sequence_parallel && s.training.seq_len % p.tp != 0) {
    return invalid(fmt::format(
        "parallelism.sequence_parallel: training.seq_len {} is not divisible by parallelism.tp {}",
        s.training.seq_len, p.tp));
  }
  if (p.zero_stage < 0 || p.zero_stage > 3) {
    return invalid(
        fmt::format("parallelism.zero_stage: {} is not one of 0, 1, 2, 3", p.zero_stage));
  }
  if (p.fsdp && p.zero_stage != 0 && p.zero_stage != 3) {
    return invalid(fmt::format(
        "parallelism.fsdp: true shards like ZeRO-3 and contradicts parallelism.zero_stage {}",
        p.zero_stage));
  }
  OFFSIM_RETURN_IF_ERROR(check_hybrid_sharding(s));
  if (p.param_gather == ParallelConfig::ParamGather::kPerTensorSynchronized) {
    if (!p.fsdp && p.zero_stage != 3) {
      return invalid(fmt::format(
          "parallelism.param_gather: per_tensor_synchronized gathers sharded parameters; expected "
          "parallelism.zero_stage 3 or fsdp true (zero_stage is {})",
          p.zero_stage));
    }
    if (m.moe.experts > 0 || m.mla.kv_lora_rank > 0) {
      return invalid(
          "parallelism.param_gather: per_tensor_synchronized (DeepSpeed's 2021 ZeRO-3 fetch) is "
          "modelled for dense layers with standard attention; expected per_layer for a "
          "mixture-of-experts or multi-head latent attention model");
    }
  }
  return sim::ok();
}

// Pipeline stages and virtual stages divide the layers; the batch divides into micro-batches
// over the data-parallel ranks, and interleaved 1F1B gets a multiple of pp of them.
// parallelism.layout as Megatron-Core validates it (PipelineParallelLayerLayout.__init__ and
// validate_layer_layout): pp · virtual_stages entries, the embedding first and the loss last,
// each once, model.layers decoder layers, model.mtp_layers MTP modules after the last decoder
// layer. offsim builds the MTP modules on the loss's chunk (Megatron's default placement).
sim::Status check_layout(const Scenario& s) {
  const ParallelConfig& p = s.parallelism;
  const std::vector<ParallelConfig::StageLayout>& stages = p.layout;
  if (stages.empty()) return sim::ok();
  const std::int64_t chunks =
      static_cast<std::int64_t>(std::max(1, p.pp)) * std::max(1, p.virtual_stages);
  if (static_cast<std::int64_t>(stages.size()) != chunks) {
    return invalid(fmt::format(
        "parallelism.layout: {} stages; expected parallelism.pp × parallelism.virtual_stages = {}",
        stages.size(), chunks));
  }
  if (p.account_for_embedding_in_pipeline_split || p.account_for_loss_in_pipeline_split) {
    return invalid(
        "parallelism.layout: places the embedding and the loss itself; expected "
        "parallelism.account_for_embedding_in_pipeline_split and "
        "account_for_loss_in_pipeline_split false");
  }
  std::int64_t decoders = 0;
  int embeddings = 0;
  int losses = 0;
  int mtp = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const ParallelConfig::StageLayout& st = stages[i];
    decoders += st.decoders;
    embeddings += st.embedding ? 1 : 0;
    losses += st.loss ? 1 : 0;
    mtp += st.mtp;
    const bool last = i + 1 == stages.size();
    if (st.decoders == 0 && st.mtp == 0 && !st.embedding && !st.loss) {
      return invalid(fmt::format(
          "parallelism.layout: stage {} builds nothing; expected a decoder layer, the embedding, "
          "an MTP module or the loss in every stage",
          i));
    }
    if ((st.embedding && i != 0) || (st.loss && !last) || (st.mtp > 0 && !last)) {
      return invalid(fmt::format(
          "parallelism.layout: stage {} holds the {}; expected the embedding in the first stage "
          "and the loss and the MTP modules in the last (offsim builds MTP with the loss)",
          i, st.embedding && i != 0 ? "embedding" : (st.loss ? "loss" : "MTP modules")));
    }
  }
  if (embeddings != 1 || losses != 1) {
    return invalid(fmt::format(
        "parallelism.layout: {} embedding(s) and {} loss(es); expected exactly one of each (E in "
        "the first stage, L in the last)",
        embeddings, losses));
  }
  if (decoders != s.model.layers) {
    return invalid(
        fmt::format("parallelism.layout: {} decoder layers (t); expected model.layers = {}",
                    decoders, s.model.layers));
  }
  if (mtp != s.model.mtp_layers) {
    return invalid(
        fmt::format("parallelism.layout: {} MTP modules (m); expected model.mtp_layers = {}", mtp,
                    s.model.mtp_layers));
  }
  return sim::ok();
}

sim::Status check_pipeline(const Scenario& s) {
  const ModelArch& m = s.model;
  const TrainingConfig& t = s.training;
  const ParallelConfig& p = s.parallelism;
  OFFSIM_RETURN_IF_ERROR(check_layout(s));
  const PipelineLayout layout = pipeline_layout(m.layers, p);
  if (!layout.even()) {
    const int slots = layout.embedding_slots + layout.loss_slots;
    return invalid(
        fmt::format("parallelism.pp: model.layers {}{} is not divisible by parallelism.pp × "
                    "parallelism.virtual_stages = {}",
                    m.layers,
                    slots == 0 ? std::string()
                               : fmt::format(" + {} (the embedding and loss slots of "
                                             "parallelism.account_for_*_in_pipeline_split)",
                                             slots),
                    layout.chunks()));
  }
  const bool interleaved = p.schedule == ParallelConfig::PipelineSchedule::kInterleaved1F1B;
  if (p.virtual_stages > 1 && !interleaved) {
    return invalid(
        fmt::format("parallelism.virtual_stages: {} needs parallelism.schedule interleaved_1f1b",
                    p.virtual_stages));
  }
  const std::int64_t per_step = t.micro_batch * p.dp;
  if (t.global_batch % per_step != 0) {
    return invalid(fmt::format(
        "training.global_batch: {} is not divisible by training.micro_batch × parallelism.dp = {}",
        t.global_batch, per_step));
  }
  const std::int64_t micro_batches = t.global_batch / per_step;
  if (interleaved && p.pp > 1 && micro_batches % p.pp != 0) {
    return invalid(fmt::format(
        "parallelism.schedule: interleaved 1F1B needs the micro-batches per step ({}) to be a "
        "multiple of parallelism.pp {}",
        micro_batches, p.pp));
  }
  return sim::ok();
}

// Context parallelism as Megatron-Core and Transformer Engine run it: the sequence in 2·cp
// chunks (causal load balancing), fused/flash attention only, a2a splitting heads over cp.
sim::Status check_context_parallel(const Scenario& s) {
  const ParallelConfig& p = s.parallelism;
  OFFSIM_RETURN_IF_ERROR(positive(p.cp, "parallelism.cp"));
  if (p.cp == 1) return sim::ok();
  const std::int64_t chunks = 2 * static_cast<std::int64_t>(p.cp);
  if (s.training.seq_len % chunks != 0) {
    return invalid(fmt::format(
        "parallelism.cp: {} needs training.seq_len {} to split into 2 × cp = {} equal chunks", p.cp,
        s.training.seq_len, chunks));
  }
  if (s.model.attention == ModelArch::AttentionImpl::kClassic) {
    return invalid(fmt::format(
        "parallelism.cp: {} needs model.attention flash or flash2 (context parallelism runs "
        "fused attention kernels on each block: Transformer Engine's, or PyTorch's SDPA under "
        "torchtitan)",
        p.cp));
  }
  if (s.model.mla.kv_lora_rank > 0) {
    return invalid(fmt::format(
        "parallelism.cp: {} with multi-head latent attention is not modelled (use cp 1)", p.cp));
  }
  if (p.cp_comm_type == ParallelConfig::CpCommType::kA2A) {
    const std::int64_t heads = s.model.heads / p.tp;
    const std::int64_t kv_heads = s.model.kv_heads / p.tp;
    if (heads % p.cp != 0 || kv_heads % p.cp != 0) {
      return invalid(fmt::format(
          "parallelism.cp: {} does not divide the attention heads per tensor-parallel rank "
          "({} query, {} key/value), which cp_comm_type a2a splits over the CP group",
          p.cp, heads, kv_heads));
    }
  }
  return sim::ok();
}

sim::Status check_parallelism(const Scenario& s) {
  const ParallelConfig& p = s.parallelism;
  OFFSIM_RETURN_IF_ERROR(positive(p.dp, "parallelism.dp"));
  OFFSIM_RETURN_IF_ERROR(positive(p.tp, "parallelism.tp"));
  OFFSIM_RETURN_IF_ERROR(positive(p.pp, "parallelism.pp"));
  OFFSIM_RETURN_IF_ERROR(positive(p.virtual_stages, "parallelism.virtual_stages"));
  OFFSIM_RETURN_IF_ERROR(check_moe(s));
  OFFSIM_RETURN_IF_ERROR(check_context_parallel(s));
  OFFSIM_RETURN_IF_ERROR(check_tensor_parallel(s));
  return check_pipeline(s);
}

sim::Status check_recompute(const Scenario& s) {
  for (const auto& [layer, mode] : s.recompute.per_layer) {
    if (layer < 0 || layer >= s.model.layers) {
      return invalid(
          fmt::format("recompute.per_layer: layer {} is outside 0..{}", layer, s.model.layers - 1));
    }
  }
  // As Megatron-Core's TransformerConfig refuses it.
  if (s.recompute.modules.has(RecomputeModule::kMlaUpProj) && s.model.mla.kv_lora_rank <= 0) {
    return invalid(
        "recompute.modules: mla_up_proj needs multi-head latent attention (model.mla.kv_lora_rank "
        "> 0)");
  }
  // megatron/core/transformer/transformer_config.py: "shared_experts recompute cannot work with
  // --moe-shared-expert-overlap".
  if (s.recompute.modules.has(RecomputeModule::kSharedExperts) &&
      s.parallelism.moe_shared_expert_overlap && s.model.moe.shared_experts > 0) {
    return invalid(
        "recompute.modules: shared_experts cannot be combined with "
        "parallelism.moe_shared_expert_overlap (Megatron-Core refuses it: the overlapped shared "
        "experts run inside the token dispatcher, outside the checkpoint)");
  }
  return sim::ok();
}

sim::Status check_offload_rule(const OffloadRule& rule, std::int64_t layers,
                               const std::string& path) {
  OFFSIM_RETURN_IF_ERROR(check_selection(rule.layers, layers, path));
  if (rule.cls == TensorClass::kNamedActivation) {
    const auto& names = activation_names();
    if (std::find(names.begin(), names.end(), rule.name) == names.end()) {
      return invalid(
          fmt::format("{}.name: '{}' is not one of {}", path, rule.name, fmt::join(names, ", ")));
    }
  } else if (!rule.name.empty()) {
    return invalid(
        fmt::format("{}.name: '{}' is only allowed with class named_activation", path, rule.name));
  }
  if (rule.prefetch_layers < 0) {
    return invalid(fmt::format("{}.prefetch_layers: {} must be >= 0", path, rule.prefetch_layers));
  }
  if (rule.chunk_bytes < 0) {
    return invalid(fmt::format("{}.chunk_bytes: {} must be >= 0", path, rule.chunk_bytes));
  }
  return sim::ok();
}

// offload.experts: the predictor's hit fraction is a fraction and needs router-aware fetch.
sim::Status check_expert_fetch(const OffloadPolicy& o) {
  if (!o.expert_prediction_hit) return sim::ok();
  const double h = *o.expert_prediction_hit;
  if (!(h >= 0.0 && h <= 1.0)) {
    return invalid(fmt::format(
        "offload.experts.prediction_hit: {} must be in [0, 1] (the fraction of the routed experts "
        "the predictor names a layer ahead)",
        h));
  }
  if (o.expert_fetch != OffloadPolicy::ExpertFetch::kRouted) {
    return invalid(
        "offload.experts.prediction_hit: a predictor needs offload.experts.fetch: routed");
  }
  return sim::ok();
}

// offload.cpu.superoffload: DeepSpeed accepts super_offload, ratio and cpuadam_cores_perc only
// with ZeRO stage 3 (offload_config.py) and the optimizer on the CPU.
sim::Status check_superoffload(const Scenario& s) {
  const OffloadPolicy::SuperOffload& so = s.offload.superoffload;
  if (!so.enabled) return sim::ok();
  if (!s.offload.optimizer_on_cpu || s.parallelism.zero_stage != 3 || s.offload.zenflow.enabled) {
    return invalid(fmt::format(
        "offload.cpu.superoffload: SuperOffload runs on DeepSpeed ZeRO-3 with the optimizer on the "
        "CPU; expected offload.optimizer cpu (e.g. preset zero_offload), parallelism.zero_stage 3 "
        "and no offload.cpu.zenflow, got zero_stage {}",
        s.parallelism.zero_stage));
  }
  if (!(so.ratio >= 0.0 && so.ratio <= 1.0) ||
      !(so.cpuadam_cores_perc > 0.0 && so.cpuadam_cores_perc < 1.0) || so.sub_group_size < 1) {
    return invalid(fmt::format(
        "offload.cpu.superoffload: expected ratio in [0, 1], cpuadam_cores_perc in (0, 1) (the "
        "training process keeps the rest) and sub_group_size >= 1, got {}, {}, {}",
        so.ratio, so.cpuadam_cores_perc, so.sub_group_size));
  }
  return sim::ok();
}

sim::Status check_offload(const Scenario& s) {
  bool optimizer_on_host = false;
  for (std::size_t i = 0; i < s.offload.rules.size(); ++i) {
    const OffloadRule& rule = s.offload.rules[i];
    OFFSIM_RETURN_IF_ERROR(
        check_offload_rule(rule, s.model.layers, fmt::format("offload.rules[{}]", i)));
    if (rule.cls == TensorClass::kOptimizerStates && rule.where == Placement::kHost) {
      optimizer_on_host = true;
    }
  }
  if (s.training.store_param_remainders && optimizer_on_host) {
    return invalid(
        "training.store_param_remainders: Transformer Engine's FusedAdam keeps the remainders "
        "on the GPU; a host optimizer keeps a whole fp32 master; expected false with "
        "optimizer_states on host");
  }
  if (s.offload.optimizer_on_cpu && !optimizer_on_host) {
    return invalid("offload.optimizer_on_cpu: true needs a rule placing optimizer_states on host");
  }
  const OffloadPolicy::ZenFlow& zf = s.offload.zenflow;
  if (zf.enabled) {
    if (!s.offload.optimizer_on_cpu ||
        s.offload.cpu_step != OffloadPolicy::CpuStep::kFlatPartition) {
      return invalid(
          "offload.cpu.zenflow: ZenFlow extends DeepSpeed's ZeRO-Offload step; expected "
          "offload.optimizer cpu and offload.cpu.step flat_partition");
    }
    if (!(zf.topk_ratio >= 0.0 && zf.topk_ratio <= 1.0) || zf.update_interval < 1 ||
        !(zf.reserved_cores >= 0.0 && zf.reserved_cores < 1.0)) {
      return invalid(fmt::format(
          "offload.cpu.zenflow: expected topk_ratio in [0, 1], update_interval >= 1 and "
          "pt_reserved_cores_perc in [0, 1), got {}, {}, {}",
          zf.topk_ratio, zf.update_interval, zf.reserved_cores));
    }
  }
  OFFSIM_RETURN_IF_ERROR(check_superoffload(s));
  return check_expert_fetch(s.offload);
}

sim::Status check_hardware(const Scenario& s) {
  const HardwareConfig& h = s.hardware;
  const ParallelConfig& p = s.parallelism;
  if (h.nodes < 1) return invalid(fmt::format("hardware.nodes: {} must be >= 1", h.nodes));
  if (h.gpus < 0) return invalid(fmt::format("hardware.gpus: {} must be >= 0", h.gpus));
  const std::int64_t used = static_cast<std::int64_t>(stage_ranks(p)) * p.pp;
  if (h.gpus > 0 && used != h.gpus && p.cp > 1) {
    return invalid(fmt::format(
        "parallelism: dp × tp × pp × cp = {} × {} × {} × {} = {} does not equal hardware.gpus {}",
        p.dp, p.tp, p.pp, p.cp, used, h.gpus));
  }
  if (h.gpus > 0 && used != h.gpus) {
    return invalid(
        fmt::format("parallelism: dp × tp × pp = {} × {} × {} = {} does not equal hardware.gpus {}",
                    p.dp, p.tp, p.pp, used, h.gpus));
  }
  return sim::ok();
}

// training.cuda_graph_modules as Megatron-Core's TransformerConfig checks per-layer graphs
// (transformer_config.py, __post_init__): MoE modules need an MoE model, mlp a dense layer,
// moe_preprocess needs moe_router and dropless routing; no full recompute, no MoE recompute with
// moe_router, no activation offload (its "cpu_offloading").
sim::Status check_cuda_graphs(const Scenario& s) {
  const CudaGraphModules& g = s.training.cuda_graph_modules;
  if (g.empty()) return sim::ok();
  const auto refuse = [](std::string_view why) {
    return invalid(fmt::format("training.cuda_graph_modules: {}", why));
  };
  const bool moe = s.model.moe.experts > 0;
  if ((g.has(CudaGraphModule::kMoeRouter) || g.has(CudaGraphModule::kMoePreprocess) ||
       g.has(CudaGraphModule::kMoe)) &&
      !moe) {
    return refuse("moe_router, moe_preprocess and moe need an MoE model (model.moe.experts > 0)");
  }
  if (g.has(CudaGraphModule::kLayer) && g.bits != CudaGraphModules::of(CudaGraphModule::kLayer)) {
    return refuse("layer captures the whole layer as one graph; list no other module with it");
  }
  if (g.has(CudaGraphModule::kMoe) && g.has(CudaGraphModule::kMoeRouter)) {
    return refuse("moe and moe_router cannot both be captured (Megatron-Core)");
  }
  const bool whole_moe = g.has(CudaGraphModule::kMoe) || g.has(CudaGraphModule::kLayer);
  if (whole_moe && moe && !s.model.moe.pad_to_capacity) {
    return refuse(
        "an MoE layer's dispatch is captured only with its experts padded to capacity "
        "(model.moe.pad_to_capacity; dropless routing synchronises with the host)");
  }
  if (g.has(CudaGraphModule::kMoePreprocess) && !g.has(CudaGraphModule::kMoeRouter)) {
    return refuse("moe_preprocess is captured only together with moe_router (Megatron-Core)");
  }
  if (g.has(CudaGraphModule::kMoePreprocess) && s.model.moe.capacity_factor > 0.0) {
    return refuse(
        "moe_preprocess cannot be captured with a capacity factor (model.moe.capacity_factor): "
        "the preprocess then copies to the host and synchronises");
  }
  if (g.has(CudaGraphModule::kMlp)) {
    bool dense = false;
    for (int l = 0; l < static_cast<int>(s.model.layers) && !dense; ++l) {
      dense = !is_moe_layer(s.model, l);
    }
    if (!dense) return refuse("mlp captures a dense layer's MLP, and every layer is MoE");
  }
  const RecomputeConfig& rc = s.recompute;
  bool full = rc.mode == RecomputeConfig::Mode::kFull;
  for (const auto& [layer, mode] : rc.per_layer)
    full = full || mode == RecomputeConfig::Mode::kFull;
  if (full) {
    return refuse(
        "per-layer CUDA graphs do not support full recompute (recompute.mode full; Megatron-Core "
        "allows it only with a full-iteration graph)");
  }
  const bool selective = rc.mode == RecomputeConfig::Mode::kSelective || !rc.per_layer.empty();
  if (selective && rc.modules.has(RecomputeModule::kMoe) && g.has(CudaGraphModule::kMoeRouter)) {
    return refuse("moe_router cannot be captured with recompute module moe (Megatron-Core)");
  }
  for (const OffloadRule& rule : s.offload.rules) {
    const bool act =
        rule.cls == TensorClass::kActivations || rule.cls == TensorClass::kNamedActivation;
    if (act && rule.where == Placement::kHost) {
      return refuse("CUDA graphs are not supported with activation offload to the host");
    }
  }
  return sim::ok();
}

std::atomic<std::int64_t> g_scenario_checks{0};

}  // namespace

std::int64_t scenario_checks_run() { return g_scenario_checks.load(std::memory_order_relaxed); }

sim::Status check_scenario(const Scenario& s) {
  g_scenario_checks.fetch_add(1, std::memory_order_relaxed);
  OFFSIM_RETURN_IF_ERROR(check_sizes(s));
  OFFSIM_RETURN_IF_ERROR(check_training(s));
  OFFSIM_RETURN_IF_ERROR(check_parallelism(s));
  OFFSIM_RETURN_IF_ERROR(check_recompute(s));
  OFFSIM_RETURN_IF_ERROR(check_offload(s));
  OFFSIM_RETURN_IF_ERROR(check_dtypes(s.training));
  OFFSIM_RETURN_IF_ERROR(check_cuda_graphs(s));
  return check_hardware(s);
}

sim::Status check_scenario(const Scenario& s, int gpus_per_node) {
  OFFSIM_RETURN_IF_ERROR(check_scenario(s));
  return check_gpu_count(s, gpus_per_node);
}

sim::Status check_gpu_count(const Scenario& s, int gpus_per_node) {
  const ParallelConfig& p = s.parallelism;
  const std::int64_t used = static_cast<std::int64_t>(stage_ranks(p)) * p.pp;
  const std::int64_t available = static_cast<std::int64_t>(s.hardware.nodes) * gpus_per_node;
  if (s.hardware.gpus > available) {
    return invalid(
        fmt::format("hardware.gpus: {} is more than the {} GPUs of hardware.nodes {} × {} per node",
                    s.hardware.gpus, available, s.hardware.nodes, gpus_per_node));
  }
  if (s.hardware.gpus == 0 && used != available) {
    return invalid(
        fmt::format("parallelism: {} = {} does not equal the {} GPUs of hardware.nodes {} × {} "
                    "per node (set hardware.gpus to use fewer)",
                    p.cp > 1 ? "dp × tp × pp × cp" : "dp × tp × pp", used, available,
                    s.hardware.nodes, gpus_per_node));
  }
  return sim::ok();
}

namespace {

struct DtypePreset {
  const char* name;
  const char* description;
  TensorDtypes dtypes;
};

const std::vector<DtypePreset>& dtype_presets() {
  using sim::DType;
  const auto mixed = [](DType half, DType grads, DType reduce) {
    return TensorDtypes{.params = half,
                        .grads = grads,
                        .master = DType::kFp32,
                        .first_moment = DType::kFp32,
                        .second_moment = DType::kFp32,
                        .all_gather = half,
                        .reduce_scatter = reduce};
  };
  const TensorDtypes fp32_weights{.params = DType::kFp32,
                                  .grads = DType::kFp32,
                                  .master = DType::kFp32,
                                  .first_moment = DType::kFp32,
                                  .second_moment = DType::kFp32,
                                  .all_gather = DType::kFp32,
                                  .reduce_scatter = DType::kFp32};
  TensorDtypes fsdp2 = fp32_weights;
  fsdp2.all_gather = DType::kBf16;
  TensorDtypes maxtext_mu = fp32_weights;
  maxtext_mu.first_moment = DType::kBf16;
  static const std::vector<DtypePreset> kPresets = {
      {"megatron_fp16",
       "Megatron-LM --fp16: fp16 weights, fp32 main_grad buffer, fp32 master and Adam moments = "
       "18 B/param without the distributed optimizer, 6 + 12/d with it (Megatron-Core "
       "docs/distrib_optimizer.md, 'float16 param, fp32 grads'); params gathered in fp16, "
       "gradients reduced in fp32",
       mixed(DType::kFp16, DType::kFp32, DType::kFp32)},
      {"megatron_bf16",
       "Megatron-LM --bf16: bf16 weights; --bf16 turns on accumulate_allreduce_grads_in_fp32, so "
       "main_grad and its reduction are fp32; fp32 master and moments = 18 B/param "
       "(megatron/training/arguments.py; docs/distrib_optimizer.md)",
       mixed(DType::kBf16, DType::kFp32, DType::kFp32)},
      {"megatron_fp32",
       "Megatron-LM without --fp16/--bf16: fp32 weights are their own master, fp32 grads and "
       "moments = 16 B/param (docs/distrib_optimizer.md, 'fp32 param, fp32 grads')",
       fp32_weights},
      {"deepspeed_fp16",
       "DeepSpeed fp16 (FP16_Optimizer / ZeRO): fp16 weights and gradients, fp32 master and "
       "moments = 2 + 2 + 12 = 16 B/param (Rajbhandari et al., ZeRO, SC'20, K = 12)",
       mixed(DType::kFp16, DType::kFp16, DType::kFp16)},
      {"deepspeed_bf16",
       "DeepSpeed bf16 (BF16_Optimizer): bf16 weights, gradients accumulated and reduced in fp32 "
       "(data_types.grad_accum_dtype defaults to fp32 with bf16), fp32 master and moments = "
       "18 B/param (DeepSpeed config docs, 'bf16' and 'data_types')",
       mixed(DType::kBf16, DType::kFp32, DType::kFp32)},
      {"fsdp2_mixed",
       "PyTorch FSDP2 fully_shard with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): "
       "sharded fp32 parameters are the optimizer's weights, all-gathered in bf16, gradients "
       "reduce-scattered and kept in fp32, fp32 Adam moments = 16 B/param (torch.distributed.fsdp "
       "docs)",
       fsdp2},
      {"maxtext_default",
       "MaxText base.yml weight_dtype: float32: fp32 weights (their own master), fp32 gradients "
       "and Adam moments = 16 B/param, weights all-gathered in fp32 and cast to bf16 for compute",
       fp32_weights},
      {"maxtext_bf16_mu",
       "MaxText with mu_dtype: bfloat16 (optax.adamw mu_dtype): as maxtext_default with a bf16 "
       "first moment = 14 B/param",
       maxtext_mu},
  };
  return kPresets;
}

}  // namespace

std::vector<PresetInfo> list_dtype_presets() {
  std::vector<PresetInfo> out;
  for (const DtypePreset& p : dtype_presets()) out.push_back({p.name, p.description});
  return out;
}

sim::Result<TensorDtypes> dtype_preset(std::string_view name) {
  std::vector<std::string> names;
  for (const DtypePreset& p : dtype_presets()) {
    if (name == p.name) return p.dtypes;
    names.emplace_back(p.name);
  }
  return invalid(fmt::format("training.dtype_preset: unknown preset '{}'; expected one of {}", name,
                             fmt::join(names, ", ")));
}

}  // namespace offsim::models
