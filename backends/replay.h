// replay(): executes a Plan on a Device and returns the measured Timeline.
//
// Each lane of a run rank becomes one stream; ops are issued in plan order (which is issue order
// within every lane); a cross-lane dependency becomes an event recorded after the producer and
// waited on before the consumer; an op's allocs are stream-ordered pool allocations made before
// its work and its frees releases after it; copies, GEMMs, attention, elementwise passes,
// collectives, p2p and host compute run as the device's real operations on scratch operands.
// Warm-up steps run first, then measured steps; each op's span is the median over the measured
// steps of its start and end events, relative to a per-rank origin event at the step's start.
//
// Which ranks run. A lane belongs to its `rank` and an HBM pool to its `owner` (typed fields of
// the Plan; names are never read); lanes without a rank (e.g. a host's CPU) run on the first run
// rank. `ReplayOptions::ranks` picks the ranks to run
// (empty: every rank the plan names, which must not exceed the device's). Ops of ranks that do
// not run — the peers that a representative rank with multiplicity k stands for — are skipped,
// and a dependency on a skipped op counts as met. A collective runs among the members of its
// group that do run; with a single member left it runs as a local memory pass over its bytes
// (the network part is then missing from the measurement). A p2p op is a send or a receive by
// its `sizes.p2p_role`; a receive is posted without waiting for its paired send (same
// `p2p_pair`), and the device matches the two. With the peer not running, a send runs as a
// local copy of its bytes and a receive does nothing.
//
// Attention. Before the first step the device prepares each attention shape (device.h,
// prepare_attention()): a fused kernel (cuDNN's SDPA graphs on CUDA) where it can, else the
// fallback kernel; ReplayResult::attention names, per op, the kernel and why a fallback ran.
//
// Watchdog. Each step's synchronize() waits max(watchdog_timeout, watchdog_factor × the step's
// predicted time + (fallback_attention_factor − watchdog_factor) × the predicted time of the
// attention ops on a fallback kernel). An op's predicted time is its span in `forecast` when
// given, else its cost in isolation (latency + work / max_rate); the step's is the forecast's
// makespan, else the longest lane's sum. When it fires, the error names the first unfinished op
// in issue order, its predicted time, its own budget and how long the step waited.
//
// Memory. After the measured steps the device's split (plan tensors, runtime overheads, replay
// scratch) is read per run rank; then one more step, not timed, marks each rank's pool after each
// op's allocations and after its frees, and the marks come back in device-time order
// (RankMemory::marks), with the high-water marks they reach.
//
//   ReplayOptions o;
//   o.device = DeviceKind::kCpu;
//   o.measured_steps = 3;
//   sim::Result<ReplayResult> r = replay(plan, o);
//   if (!r) { fmt::print(stderr, "{}\n", r.error().message); return 2; }
//   sim::write_text_file_atomic("measured.json", sim::timeline_to_json(r->timeline).dump());
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "backends/cpu_device.h"
#include "backends/device.h"
#include "sim/core/result.h"
#include "sim/plan/plan.h"
#include "sim/trace/timeline.h"

namespace offsim::backends {

struct ReplayOptions {
  DeviceKind device = DeviceKind::kCpu;
  int warmup_steps = 1;
  int measured_steps = 3;
  std::vector<int> ranks;  // global ranks to run; empty: all ranks the plan names
  // Run every rank the plan's representatives stand for (sim::expand_representatives()), so
  // data- and tensor-parallel collectives and pipeline transfers meet real peers on the device;
  // the result keeps the spans of the plan's own ops (its representatives), so it compares with
  // the forecast. `ranks` must then be empty.
  bool all_ranks = false;
  // The watchdog's floor, factors and the forecast it scales with (see above). `forecast` is the
  // predicted Timeline of the plan passed to replay() (ops by the same ids); may be null.
  std::chrono::milliseconds watchdog_timeout{60000};
  double watchdog_factor = 10.0;
  double fallback_attention_factor = 150.0;
  const sim::Timeline* forecast = nullptr;
  bool memory_marks = true;  // run the untimed step that marks the pools after each op
  CpuDeviceOptions cpu;      // for DeviceKind::kCpu; `ranks` is set by replay()
  int first_gpu = 0;         // for DeviceKind::kCuda: run rank i uses GPU first_gpu + i
  // Ranks that other processes run (`replay --mpi`, backends/mpi_replay.h). In communicators the
  // device's local indices ranks.size(), ranks.size() + 1, ... stand for them, in this order, so
  // collectives and p2p with them go through the device (which carries them across processes)
  // instead of running locally. Lanes without a rank run only where `run_unranked_lanes`.
  std::vector<int> remote_ranks;
  bool run_unranked_lanes = true;
  // Called before each step's work is issued (the MPI replay aligns the processes' steps).
  std::function<sim::Status(int step)> before_step;
};

// Per plan pool of a run rank's HBM: what the device's allocator saw in the measured steps.
struct PoolHighWater {
  std::string pool;                      // "rank0.hbm"
  std::int64_t planned_peak_bytes = 0;   // peak of the plan's tensor bytes in measured order
  std::int64_t used_high_bytes = 0;      // the allocator's most bytes in use (initial included)
  std::int64_t reserved_high_bytes = 0;  // the allocator's most bytes reserved
};

// The kernel an attention op ran on (forward, backward or recompute; see prepare_attention()).
struct AttentionOpKernel {
  std::string op;
  sim::OpCategory category = sim::OpCategory::kNone;  // the op's category
  bool backward = false;
  AttentionKernelChoice kernel;
};

// One run rank's device memory: the split after the measured steps, the forecast's peak of the
// rank's HBM pool (-1 without a forecast) and the marks step's samples in device-time order.
struct RankMemory {
  int rank = 0;  // global
  MemorySplit split;
  std::int64_t forecast_peak_bytes = -1;
  std::vector<MemoryMark> marks;      // used_bytes filled from the plan where the device has none
  std::vector<std::string> mark_ops;  // the op of each mark ("after allocs"/"after frees" in tag)
  std::int64_t used_high_bytes = 0;   // the highest mark
  std::int64_t reserved_high_bytes = -1;
  std::string used_high_op;  // the op whose mark reached used_high_bytes first
};

struct ReplayResult {
  sim::Timeline timeline;                 // source "measured"; spans of run ranks' ops only
  std::vector<sim::Duration> step_times;  // makespan of each measured step
  std::vector<PoolHighWater> pools;
  DeviceInfo device;
  std::vector<int> ranks;        // the global ranks that ran (all of them with all_ranks)
  std::int64_t skipped_ops = 0;  // ops of ranks that did not run
  std::vector<AttentionOpKernel> attention;  // every attention op that ran, in plan order
  std::vector<RankMemory> memory;            // by local rank
  sim::Duration watchdog_deadline{0};        // per step
};

// The attention kernels and the memory of a replay as text for `offsim replay`: fused and
// fallback counts (with reasons and example ops), and per rank the forecast's peak next to the
// measured split and high-water marks.
std::string replay_report_text(const ReplayResult& result);

sim::Result<ReplayResult> replay(const sim::Plan& plan, const ReplayOptions& options);

// Replays on a device the caller made (tests inject faults this way). The device must have at
// least as many ranks as are run.
sim::Result<ReplayResult> replay_on(Device& device, const sim::Plan& plan,
                                    const ReplayOptions& options);

// The devices this build can replay on: always the CPU device, then each visible GPU.
std::vector<DeviceInfo> list_devices();

}  // namespace offsim::backends
