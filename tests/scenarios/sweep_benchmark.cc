// Sweep speed: points evaluated per second on one core over the example sweeps, and the cost of
// one full scenario (the 70B on 8×H100 examples). Each point is evaluated as `offsim sweep` does
// it: steps that provably reach a periodic steady state are simulated for 4 micro-batches and
// extrapolated exactly (models/README.md), the others in full; the _full_path variant simulates
// every micro-batch of every point, for comparison.
#include <benchmark/benchmark.h>

#include <string>

#include "models/evaluate.h"
#include "scenarios/scenario_loader.h"
#include "scenarios/sweep_runner.h"

namespace offsim::scenarios {
namespace {

std::string example(const std::string& name) {
  return std::string(OFFSIM_SOURCE_DIR) + "/scenarios/examples/" + name;
}

// items_per_second = sweep points per second on one thread. `steady_state`: let evaluate() use
// its exact steady-state fast path (the default, as `offsim sweep` does); false: simulate every
// micro-batch. Counter steady_state_points: points whose report came from the fast path.
void BM_SweepPoints(benchmark::State& state, const std::string& file_name, bool steady_state) {
  auto file = load_scenario_file(example(file_name));
  if (!file || !file->sweep) {
    state.SkipWithError("cannot load the example sweep");
    return;
  }
  std::vector<Node> docs;
  for (std::int64_t i = 0; i < file->sweep->size(); ++i) {
    docs.push_back(*apply_point(file->base, file->sweep->point(i)));
  }
  models::EvalOptions options;
  options.steady_state = steady_state;
  std::int64_t fast_points = 0;
  for (const Node& doc : docs) {
    auto scenario = scenario_from_document(doc, file->base_dir);
    if (!scenario) continue;
    auto eval = models::evaluate(*scenario, options);
    fast_points += eval && eval->steady_state ? 1 : 0;
  }
  std::size_t next = 0;
  std::int64_t errors = 0;
  for (auto _ : state) {
    PointOutcome outcome = evaluate_document(docs[next], file->base_dir, options);
    errors += outcome.report ? 0 : 1;
    benchmark::DoNotOptimize(outcome);
    next = (next + 1) % docs.size();
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["points"] = static_cast<double>(docs.size());
  state.counters["error_points"] = static_cast<double>(errors);
  state.counters["steady_state_points"] = static_cast<double>(fast_points);
}
BENCHMARK_CAPTURE(BM_SweepPoints, two_b_a100_sweep, std::string("2b-1xa100-sweep.yaml"), true)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SweepPoints, two_b_a100_sweep_full_path, std::string("2b-1xa100-sweep.yaml"),
                  false)
    ->Unit(benchmark::kMillisecond);

// One evaluation of a full example scenario (loading and checking included); counter
// steady_state: 1 when the fast path was taken.
void BM_RunScenario(benchmark::State& state, const std::string& file_name) {
  auto file = load_scenario_file(example(file_name));
  if (!file) {
    state.SkipWithError("cannot load the example");
    return;
  }
  auto scenario = scenario_from_document(file->base, file->base_dir);
  bool fast = false;
  if (scenario) {
    auto eval = models::evaluate(*scenario, {});
    fast = eval && eval->steady_state;
  }
  for (auto _ : state) {
    PointOutcome outcome = evaluate_document(file->base, file->base_dir);
    benchmark::DoNotOptimize(outcome);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["steady_state"] = fast ? 1.0 : 0.0;
}
BENCHMARK_CAPTURE(BM_RunScenario, llama70b_8xh100_offload,
                  std::string("llama70b-8xh100-offload.yaml"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_RunScenario, llama3_70b_8xh200_activation_offload,
                  std::string("llama3-70b-8xh200-activation-offload.yaml"))
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace offsim::scenarios

BENCHMARK_MAIN();
