// A small MoE scenario shared by the model tests: Qwen3-30B-A3B cut to 4 layers on 8 H100s,
// TP 2 with sequence parallelism, EP 4, ZeRO-1, 8 sequences of 4,096 tokens.
#pragma once

#include "models/scenario.h"

namespace offsim::fixtures {

inline models::Scenario small_moe_scenario() {
  models::Scenario s;
  s.name = "moe";
  auto m = models::find_model("qwen3-30b-a3b");
  if (m) s.model = *m;
  s.model.layers = 4;
  s.hardware.system = "dgx-h100";
  s.training = {.global_batch = 8, .micro_batch = 1, .seq_len = 4096};
  s.parallelism = {.dp = 4, .tp = 2, .pp = 1, .sequence_parallel = true, .zero_stage = 1};
  s.parallelism.ep = 4;
  return s;
}

}  // namespace offsim::fixtures
