// CpuDevice: the Device interface on the host, so the replay logic is tested without a GPU.
//
// One thread per stream runs that stream's work in order; events carry steady_clock time
// stamps; the pool is byte accounting with a capacity; copies are real memcpy; GEMM is a blocked
// fp32 product; collectives are in-process reductions between the simulated ranks' buffers.
// Work is scaled down so that tests stay fast (see CpuDeviceOptions): the timings measure the
// replay's ordering and overheads, not a GPU.
//
//   CpuDeviceOptions o;
//   o.ranks = 2;
//   o.pool_capacity_bytes = 64 << 20;
//   o.fail_alloc_at = 3;                 // fault injection: the 4th allocate() fails
//
// Memory marks are exact: each is taken by the stream's thread when it reaches the mark, from the
// pool's byte accounting; memory_split() has no runtime overheads and counts the scratch bytes
// the replay asked for (what a GPU would hold), not the scaled-down bytes held here.
//   std::unique_ptr<Device> dev = make_cpu_device(o);
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "backends/device.h"

namespace offsim::backends {

struct CpuDeviceOptions {
  int ranks = 1;  // simulated ranks (each with its own pool)
  std::int64_t pool_capacity_bytes = std::numeric_limits<std::int64_t>::max();  // per rank

  // Scale-down rule. Scratch buffers hold at most `max_buffer_bytes` real bytes; copies,
  // elementwise passes, host compute and collectives touch at most that many bytes; a GEMM uses
  // min(m, max_gemm_dim) × min(n, ·) × min(k, ·) fp32 and one batch; attention one head with
  // seq and head_dim capped at `max_attention_dim`.
  std::int64_t max_buffer_bytes = std::int64_t{1} << 20;
  std::int64_t max_gemm_dim = 64;
  std::int64_t max_attention_dim = 32;

  // Fault injection (issue 6). Counted over calls in the order they are made (deterministic):
  // the `fail_alloc_at`-th allocate() (0-based) fails as out of memory; the
  // `stall_collective_at`-th collective() call never reaches its communicator, like a peer that
  // hangs, so only the watchdog in synchronize() can end it. -1 disables.
  std::int64_t fail_alloc_at = -1;
  std::int64_t stall_collective_at = -1;
  // The `stall_attention_at`-th attention() call never ends (a kernel that hangs).
  std::int64_t stall_attention_at = -1;

  // Attention kernel bookkeeping. The CPU device has one kernel, a scaled-down reference; without
  // this function prepare_attention() reports it as a fallback ("cpu reference"). With it, the
  // function says why a shape would run on the fallback kernel, and "" makes the reference stand
  // for the fused kernel, so tests drive the replay's fused/fallback reporting and its watchdog.
  std::function<std::string(const sim::AttentionShape&)> attention_fallback;
};

std::unique_ptr<Device> make_cpu_device(const CpuDeviceOptions& options);

}  // namespace offsim::backends
