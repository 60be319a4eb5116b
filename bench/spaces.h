// spaces: the cluster-scale search spaces the benchmarks measure (target offsim_bench_spaces).
//
// Space A: GPT-3 175B on 64 A100-80GB (8 DGX A100 nodes), global batch 256, sequence 2048.
// Space B: Megatron-1T (megatron-1008b, Narayanan et al. SC'21 Table 1) on 1,024 A100-80GB
// (128 nodes), global batch 1,024, sequence 2048. Both cross tp {1,2,4,8} x pp {1,2,...} (A: up
// to 32, B: up to 64; dp = GPUs / (tp * pp)) x micro-batch {1,2,4,8} x recompute {none, selective,
// full} x offload {none, optimizer, activations}; see space_points() for the rules that drop a
// combination and for how every point is set up.
//
//   const bench::SpaceDef def = bench::space_definition(bench::Space::kA);
//   std::vector<bench::SpacePoint> points = bench::space_points(def);  // 747 points
//   for (const bench::SpacePoint& p : points) {
//     auto e = models::evaluate(p.scenario, {});
//   }
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/scenario.h"

namespace offsim::bench {

enum class Space { kA, kB };

struct SpaceDef {
  std::string name;    // "space-a"
  std::string model;   // catalogue name
  std::string system;  // catalogue name
  int nodes = 1;
  int gpus = 1;
  std::int64_t global_batch = 0;
  std::int64_t seq_len = 0;
  std::vector<int> tp;
  std::vector<int> pp;
  std::vector<std::int64_t> micro_batch;
};

SpaceDef space_definition(Space space);
std::optional<Space> space_from_name(const std::string& name);  // "space-a" / "space-b"

enum class OffloadAxis { kNone, kOptimizer, kActivations };
const char* to_string(OffloadAxis offload);

struct SpacePoint {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  std::int64_t micro_batch = 1;
  models::RecomputeConfig::Mode recompute = models::RecomputeConfig::Mode::kNone;
  OffloadAxis offload = OffloadAxis::kNone;
  models::Scenario scenario;
  std::string label;  // "tp8.pp16.dp1.mb1.full.none"
};

// Why a combination of the axes is not a point (empty: it is one): dp = gpus / (tp * pp) must be
// a whole number >= 1, global_batch must split into whole micro-batches on every data-parallel
// rank (global_batch % (dp * micro_batch) == 0), the layers must split evenly over the pipeline
// stages and the attention heads over the tensor-parallel ranks.
std::string dropped_because(const SpaceDef& def, int tp, int pp, std::int64_t micro_batch);

// Every point, in axis order (tp, pp, micro-batch, recompute, offload; the last fastest).
// Each is a Megatron-style setup: sequence parallelism with tp > 1, the distributed optimizer
// (ZeRO-1) with dp > 1, the 1F1B schedule, bf16 with fp32 master weights; offload "optimizer" is
// the preset megatron_optimizer_offload (all of the optimizer state on the host, updated by the
// CPU) and "activations" the preset megatron_activation_offload (every saved activation).
std::vector<SpacePoint> space_points(const SpaceDef& def);

// The reference step of space B: Megatron-1T's published layout (tp 8, pp 64; dp 2 on 1,024
// GPUs), micro-batch 1, full recompute, no offload.
SpacePoint megatron_1t_reference();

}  // namespace offsim::bench
