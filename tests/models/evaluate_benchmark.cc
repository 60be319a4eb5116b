// Speed of the training-step model: building and simulating a full Llama 3 70B step on 8 H100s
// with activation offload (FSDP over 8 GPUs, optimizer state on the host updated by the CPU,
// every saved activation offloaded), the case the design targets at under 100 ms on one core.
#include <benchmark/benchmark.h>

#include "models/evaluate.h"

namespace offsim::models {
namespace {

Scenario llama70b_offload(std::int64_t global_batch) {
  Scenario s;
  s.name = "llama3-70b-8xh100-offload";
  s.model = *find_model("llama3-70b");
  s.hardware.system = "dgx-h100";
  s.training = {.global_batch = global_batch, .micro_batch = 1, .seq_len = 4096};
  s.parallelism = {.dp = 8, .fsdp = true};
  s.offload = *offload_preset("zero_offload", {});
  s.offload.rules.push_back({.cls = TensorClass::kActivations, .where = Placement::kHost});
  return s;
}

void BM_BuildStep70B(benchmark::State& state) {
  const Scenario s = llama70b_offload(state.range(0));
  std::size_t ops = 0;
  for (auto _ : state) {
    auto step = build_step(s);
    ops = step->plan.ops.size();
    benchmark::DoNotOptimize(step);
  }
  state.counters["ops"] = static_cast<double>(ops);
}
BENCHMARK(BM_BuildStep70B)->Arg(8)->Arg(32)->Arg(256)->Unit(benchmark::kMillisecond);

void BM_Evaluate70B(benchmark::State& state) {
  const Scenario s = llama70b_offload(state.range(0));
  double step_s = 0.0;
  for (auto _ : state) {
    auto e = evaluate(s, {});
    step_s = e->report.step_time_s;
    benchmark::DoNotOptimize(e);
  }
  state.counters["simulated_step_s"] = step_s;
}
BENCHMARK(BM_Evaluate70B)->Arg(8)->Arg(32)->Arg(256)->Unit(benchmark::kMillisecond);

// A point of search space A (GPT-3 175B on 64 A100-80GB, global batch 256): tp 8, pp 8, dp 1,
// micro-batch 1, so 256 micro-batches through an 8-stage 1F1B pipeline. Arg: 1 = the default
// options (the pipeline steady state: a reduced step of 20 micro-batches, extrapolated), 0 = the
// full simulation; the counters give the path taken and the step's plan ops.
void BM_EvaluatePipelineGpt3(benchmark::State& state) {
  Scenario s;
  s.name = "gpt3-175b-64xa100-tp8-pp8";
  s.model = *find_model("gpt3-175b");
  s.hardware.system = "dgx-a100-80gb";
  s.hardware.nodes = 8;
  s.training = {.global_batch = 256, .micro_batch = 1, .seq_len = 2048};
  s.parallelism = {.dp = 1, .tp = 8, .pp = 8};
  EvalOptions options;
  options.steady_state = state.range(0) != 0;
  bool steady = false;
  std::int64_t ops = 0;
  for (auto _ : state) {
    auto e = evaluate(s, options);
    steady = e->steady_state;
    ops = e->report.plan_ops;
    benchmark::DoNotOptimize(e);
  }
  state.counters["steady_state"] = steady ? 1.0 : 0.0;
  state.counters["plan_ops"] = static_cast<double>(ops);
}
BENCHMARK(BM_EvaluatePipelineGpt3)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace offsim::models

BENCHMARK_MAIN();
