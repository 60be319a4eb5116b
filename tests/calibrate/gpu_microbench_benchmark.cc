// Google Benchmark front end of the calibration microbenchmarks, timed manually from CUDA
// events (UseManualTime). Without a GPU every benchmark reports the reason and skips.
//
//   build/release/tests/calibrate/calibrate_gpu_benchmark --benchmark_filter=H2D
#include <benchmark/benchmark.h>

#include <memory>

#include "calibrate/microbench.h"

namespace offsim::calibrate {
namespace {

MicroBench* bench(benchmark::State& state) {
  static std::unique_ptr<MicroBench> instance;
  static std::string error;
  if (!instance && error.empty()) {
    auto opened = MicroBench::open(0, 1);
    if (opened) {
      instance = std::make_unique<MicroBench>(std::move(opened).value());
    } else {
      error = opened.error().message;
    }
  }
  if (!instance) state.SkipWithError(error.c_str());
  return instance.get();
}

template <class F>
void run(benchmark::State& state, F&& one, double bytes_or_flops, bool flops) {
  MicroBench* b = bench(state);
  if (!b) return;
  for (auto _ : state) {
    sim::Result<double> s = one(*b);
    if (!s) {
      state.SkipWithError(s.error().message.c_str());
      return;
    }
    state.SetIterationTime(*s);
  }
  state.counters[flops ? "FLOP/s" : "bytes/s"] = benchmark::Counter(
      bytes_or_flops * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_Gemm(benchmark::State& state) {
  const std::int64_t d = state.range(0);
  const sim::GemmShape g{.m = d, .n = d, .k = d, .dtype = static_cast<sim::DType>(state.range(1))};
  run(
      state, [&](MicroBench& b) { return b.gemm(g, 1); }, 2.0 * d * d * d, true);
}
BENCHMARK(BM_Gemm)
    ->ArgsProduct({{1024, 2048, 4096, 8192},
                   {static_cast<int>(sim::DType::kBf16), static_cast<int>(sim::DType::kFp16),
                    static_cast<int>(sim::DType::kFp8)}})
    ->UseManualTime();

void BM_PinnedH2D(benchmark::State& state) {
  const std::int64_t bytes = state.range(0);
  run(
      state, [&](MicroBench& b) { return b.copy(CopyLink::kH2D, true, bytes); }, bytes, false);
}
BENCHMARK(BM_PinnedH2D)->RangeMultiplier(16)->Range(4096, 1 << 30)->UseManualTime();

void BM_PinnedD2H(benchmark::State& state) {
  const std::int64_t bytes = state.range(0);
  run(
      state, [&](MicroBench& b) { return b.copy(CopyLink::kD2H, true, bytes); }, bytes, false);
}
BENCHMARK(BM_PinnedD2H)->RangeMultiplier(16)->Range(4096, 1 << 30)->UseManualTime();

void BM_PageableH2D(benchmark::State& state) {
  const std::int64_t bytes = state.range(0);
  run(
      state, [&](MicroBench& b) { return b.copy(CopyLink::kH2D, false, bytes); }, bytes, false);
}
BENCHMARK(BM_PageableH2D)->RangeMultiplier(16)->Range(1 << 20, 1 << 30)->UseManualTime();

void BM_Bidirectional(benchmark::State& state) {
  const std::int64_t bytes = state.range(0);
  run(
      state, [&](MicroBench& b) { return b.copy(CopyLink::kBidirectional, true, bytes); },
      2.0 * bytes, false);
}
BENCHMARK(BM_Bidirectional)->RangeMultiplier(16)->Range(1 << 20, 1 << 30)->UseManualTime();

void BM_MemoryKernel(benchmark::State& state) {
  const std::int64_t bytes = state.range(0);
  run(
      state, [&](MicroBench& b) { return b.memory_kernel(bytes, 1); }, bytes, false);
}
BENCHMARK(BM_MemoryKernel)->RangeMultiplier(16)->Range(1 << 20, 1 << 30)->UseManualTime();

void BM_Attention(benchmark::State& state) {
  const sim::AttentionShape a{.batch = 1,
                              .heads = 32,
                              .kv_heads = 8,
                              .seq_q = state.range(0),
                              .seq_kv = state.range(0),
                              .head_dim = 128,
                              .causal = true};
  run(
      state, [&](MicroBench& b) { return b.attention(a, 1); }, attention_flops(a), true);
}
BENCHMARK(BM_Attention)->Arg(1024)->Arg(4096)->UseManualTime();

void BM_LaunchGap(benchmark::State& state) {
  run(
      state, [&](MicroBench& b) { return b.launch_gap(100); }, 1.0, false);
}
BENCHMARK(BM_LaunchGap)->UseManualTime();

}  // namespace
}  // namespace offsim::calibrate

BENCHMARK_MAIN();
