// GPU microbenchmarks over the backend's CUDA device (built only with CUDA): each call runs one
// timed sample with CUDA events and returns its seconds; measure_machine() runs them all with
// the stopping rule of timing.h and collects the Samples that fit.h turns into a profile.
//
// They go through backends::Device on purpose: the profile then describes the very cuBLASLt
// calls, kernels, copies and NCCL calls the replay issues, so a replay's forecast and its
// measurement share one source of truth.
//
//   auto bench = calibrate::MicroBench::open(/*first_gpu=*/0, /*gpus=*/1);
//   if (!bench) return bench.error();                    // kNoDevice: "no GPU: ..."
//   sim::Result<double> s = bench->gemm({.m = 8192, .n = 8192, .k = 8192});
//   sim::Result<Samples> all = calibrate::measure_machine(options);
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "backends/device.h"
#include "calibrate/calibrate.h"
#include "calibrate/fit.h"

namespace offsim::calibrate {

class MicroBench {
 public:
  static sim::Result<MicroBench> open(int first_gpu, int gpus);

  int gpus() const { return gpus_; }
  const backends::DeviceInfo& info() const { return device_->info(); }

  // One sample each, in seconds (CUDA events around `reps` back-to-back runs, divided by reps).
  // GEMMs instead time each of `reps` runs alone, right after a pass that evicts L2 (nvbench's
  // rule: operands come from HBM, as in a training step, and the GPU is busy, not idle, when
  // the timed kernel starts). With heat_s > 0 the same GEMM first runs back to back for about
  // that long, so that the timed runs find the clocks where a training step holds them: at the
  // power limit on random data, not at an idle GPU's boost (on an H200, 8192^3 bf16 went from
  // about 790 TFLOP/s in short runs to 655-679 sustained at 700 W, SM clock 1440-1545 of
  // 1980 MHz: docs/gpu-check/2026-12-04-h200/sustained-*.json).
  sim::Result<double> gemm(const sim::GemmShape& shape, int reps = 3, double heat_s = 0.0);
  sim::Result<double> attention(const sim::AttentionShape& shape, int reps = 3);
  // The kernel attention() runs for `shape` on GPU 0 (prepared now, outside the timing).
  sim::Result<AttentionKernel> attention_kernel(const sim::AttentionShape& shape);
  sim::Result<double> memory_kernel(std::int64_t bytes, int reps = 3);  // bytes read + written
  // H2D/D2H/D2D on GPU 0, or H2D on `gpus` GPUs at once (the slowest one's time).
  sim::Result<double> copy(CopyLink link, bool pinned, std::int64_t bytes, int gpus = 1);
  sim::Result<double> collective(sim::CollectiveKind kind, std::int64_t bytes);
  sim::Result<double> launch_gap(int launches = 200);
  sim::Result<double> copy_submit_gap(int copies = 200);
  // An H2D copy and a GEMM (or a memory-bound kernel) alone and together.
  sim::Result<InterferenceSample> interference(bool with_gemm, std::int64_t copy_bytes);
  sim::Result<AllocatorSample> allocator_sample();
  std::int64_t context_bytes() const { return context_bytes_; }

 private:
  struct Lane {
    backends::StreamId stream;
    backends::EventId start, end;
  };
  sim::Result<double> elapsed_s(const Lane& lane);
  sim::Status sync();

  std::unique_ptr<backends::Device> device_;
  int gpus_ = 0;
  std::int64_t context_bytes_ = 0;
  std::vector<Lane> compute_, copy_in_, copy_out_;  // per GPU
  // Scratch, grown on demand: [rank][kind] → buffers of the largest size asked so far.
  struct Scratch {
    backends::Buffer a, b, c;
    std::int64_t bytes = 0;
  };
  std::vector<Scratch> device_scratch_, pinned_scratch_, pageable_scratch_;
  Scratch l2_flush_;  // GPU 0: overwritten before every timed GEMM (see gemm())
  std::uint64_t next_key_ = 1;
  std::optional<backends::CommId> comm_;  // all GPUs, made on first use
};

sim::Result<Samples> measure_machine(const CalibrateOptions& options);

}  // namespace offsim::calibrate
