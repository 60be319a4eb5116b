// Runtime overheads: what a training framework's runtime adds on each GPU beyond the tensors of
// the step (hardware.runtime in a scenario) — the CUDA context, NCCL's communicator buffers, the
// cuBLAS workspace, block rounding — and a replay of the framework's device allocator (PyTorch's
// CUDA caching allocator with or without expandable segments, XLA's BFC allocator inside JAX's
// preallocated pool) over a step's allocs and frees, giving reserved memory and fragmentation.
// Every figure names its source next to it in runtime.cc.
//
//   models::RuntimeModel rt = models::runtime_model(HardwareConfig::Runtime::kPytorch, 9,  // H100
//                                                   80 * kGiB, {{.ranks = 8}});
//   std::int64_t outside = rt.cuda_context_bytes + rt.nccl_bytes;  // not in the allocator
//   std::vector<models::AllocEvent> events = ...;                   // in simulated order
//   models::AllocatorReplay a = models::replay_allocator(rt, events, rt.allocator_limit_bytes);
//   fmt::print("reserved {} of allocated {}\n", a.reserved_peak_bytes, a.allocated_peak_bytes);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/scenario.h"

namespace offsim::models {

// One NCCL communicator a rank belongs to (a process group with more than one rank).
struct NcclCommunicator {
  int ranks = 1;
  bool nvlink = true;  // all ranks in one NVLink domain (else over PCIe or the network)
};

struct RuntimeModel {
  HardwareConfig::Runtime runtime = HardwareConfig::Runtime::kNone;
  std::int64_t cuda_context_bytes = 0;      // driver, module images: outside the allocator
  std::int64_t nccl_bytes = 0;              // communicator buffers: outside the allocator
  std::int64_t cublas_workspace_bytes = 0;  // allocated through the framework's allocator
  std::int64_t block_rounding_bytes = 1;    // every allocation is rounded up to a multiple
  // The most the framework's device allocator may hold: HBM less what lives outside it
  // (PyTorch), or the preallocated fraction (JAX).
  std::int64_t allocator_limit_bytes = 0;
  // JAX preallocates the whole pool at start: reserved memory is the pool, whatever is used.
  bool preallocated = false;
  std::vector<std::string> notes;  // assumptions that decide the figures, for the report's flags
};

// `compute_capability_major` is the GPU's architecture (the profile's gpu.compute_capability:
// 8 A100 and Ada, 9 Hopper, 10 and 12 Blackwell); `hbm_bytes` is the HBM the allocator can see.
RuntimeModel runtime_model(HardwareConfig::Runtime runtime, int compute_capability_major,
                           std::int64_t hbm_bytes, const std::vector<NcclCommunicator>& comms);

// The size an allocation of `bytes` really takes.
std::int64_t rounded_allocation(const RuntimeModel& rt, std::int64_t bytes);

// One allocation or free on a rank's device allocator, in the order the step makes them.
struct AllocEvent {
  std::uint32_t tensor = 0;  // any id, unique among live allocations
  std::int64_t bytes = 0;    // as requested (rounded by the replay)
  bool free = false;
  // The stream (lane) that allocates: PyTorch caches freed blocks per stream, so blocks freed
  // on one stream are not reused by another. BFC (JAX) shares one region.
  std::uint32_t stream = 0;
};

struct AllocatorReplay {
  std::int64_t allocated_peak_bytes = 0;  // sum of live (rounded) blocks, largest
  std::int64_t reserved_peak_bytes = 0;   // memory the allocator holds from the driver, largest
  // The first allocation that found no room under the limit, even after releasing cached
  // memory (index into the events; -1: none). The replay goes on unbounded after it.
  std::int64_t first_failure = -1;
  std::int64_t reserved_at_failure_bytes = 0;
};

AllocatorReplay replay_allocator(const RuntimeModel& rt, const std::vector<AllocEvent>& events,
                                 std::int64_t limit_bytes);

}  // namespace offsim::models
