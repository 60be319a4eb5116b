#include "bench/spaces.h"

#include <fmt/format.h>

namespace offsim::bench {

namespace {

using Mode = models::RecomputeConfig::Mode;

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kNone:
      return "none";
    case Mode::kSelective:
      return "selective";
    case Mode::kFull:
      return "full";
  }
  return "?";
}

SpacePoint make_point(const SpaceDef& def, int tp, int pp, std::int64_t mb, Mode mode,
                      OffloadAxis offload) {
  SpacePoint p;
  p.tp = tp;
  p.pp = pp;
  p.dp = def.gpus / (tp * pp);
  p.micro_batch = mb;
  p.recompute = mode;
  p.offload = offload;
  p.label = fmt::format("tp{}.pp{}.dp{}.mb{}.{}.{}", tp, pp, p.dp, mb, mode_name(mode),
                        to_string(offload));
  models::Scenario& s = p.scenario;
  s.name = def.name + "." + p.label;
  s.model = *models::find_model(def.model);
  s.hardware.system = def.system;
  s.hardware.nodes = def.nodes;
  s.training.global_batch = def.global_batch;
  s.training.micro_batch = mb;
  s.training.seq_len = def.seq_len;
  s.parallelism.dp = p.dp;
  s.parallelism.tp = tp;
  s.parallelism.pp = pp;
  s.parallelism.sequence_parallel = tp > 1;
  s.parallelism.zero_stage = p.dp > 1 ? 1 : 0;
  s.recompute.mode = mode;
  const char* preset = offload == OffloadAxis::kOptimizer     ? "megatron_optimizer_offload"
                       : offload == OffloadAxis::kActivations ? "megatron_activation_offload"
                                                              : "none";
  s.offload = *models::offload_preset(preset, {});
  return p;
}

}  // namespace

SpaceDef space_definition(Space space) {
  SpaceDef d;
  d.system = "dgx-a100-80gb";
  d.seq_len = 2048;
  d.tp = {1, 2, 4, 8};
  d.micro_batch = {1, 2, 4, 8};
  if (space == Space::kA) {
    d.name = "space-a";
    d.model = "gpt3-175b";
    d.nodes = 8;
    d.global_batch = 256;
    d.pp = {1, 2, 4, 8, 16, 32};
  } else {
    d.name = "space-b";
    d.model = "megatron-1008b";
    d.nodes = 128;
    d.global_batch = 1024;
    d.pp = {1, 2, 4, 8, 16, 32, 64};
  }
  d.gpus = d.nodes * 8;
  return d;
}

std::optional<Space> space_from_name(const std::string& name) {
  if (name == "space-a") return Space::kA;
  if (name == "space-b") return Space::kB;
  return std::nullopt;
}

const char* to_string(OffloadAxis offload) {
  switch (offload) {
    case OffloadAxis::kNone:
      return "none";
    case OffloadAxis::kOptimizer:
      return "optimizer";
    case OffloadAxis::kActivations:
      return "activations";
  }
  return "?";
}

std::string dropped_because(const SpaceDef& def, int tp, int pp, std::int64_t micro_batch) {
  if (def.gpus % (tp * pp) != 0) {
    return fmt::format("tp * pp = {} does not divide {} GPUs", tp * pp, def.gpus);
  }
  const std::int64_t dp = def.gpus / (tp * pp);
  if (def.global_batch % (dp * micro_batch) != 0) {
    return fmt::format(
        "global batch {} is not a whole number of micro-batches of {} on {} "
        "data-parallel ranks",
        def.global_batch, micro_batch, dp);
  }
  const models::ModelArch model = *models::find_model(def.model);
  if (model.layers % pp != 0) return fmt::format("{} layers over pp {}", model.layers, pp);
  if (model.heads % tp != 0) return fmt::format("{} heads over tp {}", model.heads, tp);
  return {};
}

std::vector<SpacePoint> space_points(const SpaceDef& def) {
  std::vector<SpacePoint> out;
  for (int tp : def.tp) {
    for (int pp : def.pp) {
      for (std::int64_t mb : def.micro_batch) {
        if (!dropped_because(def, tp, pp, mb).empty()) continue;
        for (Mode mode : {Mode::kNone, Mode::kSelective, Mode::kFull}) {
          for (OffloadAxis o :
               {OffloadAxis::kNone, OffloadAxis::kOptimizer, OffloadAxis::kActivations}) {
            out.push_back(make_point(def, tp, pp, mb, mode, o));
          }
        }
      }
    }
  }
  return out;
}

SpacePoint megatron_1t_reference() {
  return make_point(space_definition(Space::kB), 8, 64, 1, Mode::kFull, OffloadAxis::kNone);
}

}  // namespace offsim::bench
