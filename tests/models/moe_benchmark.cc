// Speed of the mixture-of-experts step: DeepSeek-V3 (671B, 58 MoE layers of 256 experts) on 256
// GB200 GPUs (EP 64 × expert-DP 4, DP 256, full recompute, optimizer on the CPUs), built and
// simulated on one core; the target is under 1 s per step (evaluate, and the full simulation
// without the steady-state fast path).
#include <benchmark/benchmark.h>

#include "models/evaluate.h"

namespace offsim::models {
namespace {

Scenario deepseek_v3_256() {
  Scenario s;
  s.name = "deepseek-v3-256xgb200";
  s.model = *find_model("deepseek-v3");
  s.hardware.system = "gb200-nvl72";
  s.hardware.nodes = 64;
  s.training = {.global_batch = 1024, .micro_batch = 1, .seq_len = 4096};
  s.parallelism = {.dp = 256, .zero_stage = 1};
  s.parallelism.ep = 64;
  s.recompute.mode = RecomputeConfig::Mode::kFull;
  s.offload = *offload_preset("megatron_optimizer_offload", {.fraction = 1.0});
  return s;
}

void BM_BuildStepDeepSeekV3(benchmark::State& state) {
  const Scenario s = deepseek_v3_256();
  std::size_t ops = 0;
  for (auto _ : state) {
    auto step = build_step(s);
    ops = step->plan.ops.size();
    benchmark::DoNotOptimize(step);
  }
  state.counters["ops"] = static_cast<double>(ops);
}
BENCHMARK(BM_BuildStepDeepSeekV3)->Unit(benchmark::kMillisecond);

void BM_EvaluateDeepSeekV3(benchmark::State& state) {
  const Scenario s = deepseek_v3_256();
  EvalOptions options;
  options.steady_state = state.range(0) != 0;
  double step_s = 0.0;
  for (auto _ : state) {
    auto e = evaluate(s, options);
    step_s = e->report.step_time_s;
    benchmark::DoNotOptimize(e);
  }
  state.counters["simulated_step_s"] = step_s;
}
// 1: steady-state fast path (the default), 0: the whole step simulated.
BENCHMARK(BM_EvaluateDeepSeekV3)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace offsim::models

BENCHMARK_MAIN();
