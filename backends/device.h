// Device: the small interface the replay drives — streams, events, a memory pool, scratch
// buffers, copies, GEMM/attention/elementwise launches, collectives, p2p and host compute.
//
// Two implementations: CpuDevice (cpu_device.h; a thread per stream, for tests in CI) and
// CudaDevice (cuda/cuda_device.h; CUDA streams and events, cudaMallocAsync, cuBLASLt, NCCL).
// Both are built on one skeleton (device_skeleton.h: handle tables, worker queues, the
// first-error latch, the watchdog, the teardown order) and supply only the work itself.
// Every call enqueues work on a stream and returns at once; errors that happen while the work
// runs are kept (the first one wins) and returned by synchronize(). The device owns every
// stream, event, buffer and communicator it hands out and releases them in its destructor.
//
//   std::unique_ptr<Device> dev = ...;                       // make_cpu_device(...) or CUDA
//   StreamId s = *dev->create_stream(0, "rank0.compute");
//   EventId t0 = *dev->create_event(0), t1 = *dev->create_event(0);
//   OFFSIM_RETURN_IF_ERROR(dev->record(s, t0));
//   OFFSIM_RETURN_IF_ERROR(dev->gemm(s, shape, a, b, c));
//   OFFSIM_RETURN_IF_ERROR(dev->record(s, t1));
//   OFFSIM_RETURN_IF_ERROR(dev->synchronize());
//   sim::Duration d = *dev->elapsed(t0, t1);
//
// Attention runs the kernel prepare_attention() chose for its shape (a fused flash-attention
// kernel, or a fallback that the replay report names); mark_memory() samples a rank's pool when
// the stream reaches the mark, so high-water marks follow device time; memory_split() says who
// holds the rank's memory (plan tensors, runtime overheads, the replay's own scratch).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "sim/core/result.h"
#include "sim/core/time.h"
#include "sim/plan/plan.h"

namespace offsim::backends {

enum class DeviceKind { kCpu, kCuda };
const char* to_string(DeviceKind kind);

// What a device is, for reports and the measured timeline's provenance.
struct DeviceInfo {
  DeviceKind kind = DeviceKind::kCpu;
  std::string name;                  // "NVIDIA H200", "cpu (simulated ranks)"
  int ranks = 0;                     // GPUs (or simulated ranks) this device drives
  std::int64_t memory_bytes = 0;     // per rank
  int compute_capability_major = 0;  // CUDA devices: 9 for H100; 0 when not a GPU
  int compute_capability_minor = 0;
  std::string driver_version;   // "" when not applicable
  std::string runtime_version;  // CUDA runtime
  std::string blas_version;     // cuBLAS
  std::string comm_version;     // NCCL
  std::string note;             // scale-down rule of the CPU device, clocks, ...
};

// Handles into a device's own tables; valid only for the device that returned them.
struct StreamId {
  std::uint32_t index = 0;
};
struct EventId {
  std::uint32_t index = 0;
};
struct CommId {
  std::uint32_t index = 0;
};

enum class MemoryKind { kDevice, kHostPinned, kHostPageable };
const char* to_string(MemoryKind kind);

// A scratch buffer (outside the pool): operands of the kernels and copies the replay launches.
struct Buffer {
  std::uint32_t index = 0;
  MemoryKind kind = MemoryKind::kDevice;
  int rank = 0;
  std::int64_t size_bytes = 0;
};

// High-water marks of one rank's pool, from the device's own accounting (CUDA: the memory
// pool's UsedMemHigh / ReservedMemHigh attributes).
struct PoolUsage {
  std::int64_t in_use_bytes = 0;
  std::int64_t used_high_bytes = 0;      // most bytes handed out at once
  std::int64_t reserved_high_bytes = 0;  // most bytes the allocator held (granularity included)
};

// The kernel attention() runs for a shape on a rank.
struct AttentionKernelChoice {
  bool fused = false;  // a fused flash-attention kernel (cuDNN's SDPA graphs)
  std::string kernel;  // "cudnn_sdpa", "fallback", "cpu reference"
  std::string reason;  // why not fused ("" when fused): library missing, shape unsupported, error
};

// A sample of a rank's pool, taken when the device reached the mark in its stream.
struct MemoryMark {
  std::uint64_t tag = 0;             // the caller's (the replay: 2·op index, +1 after the op)
  std::int64_t used_bytes = -1;      // live stream-ordered allocations then; -1: not known
  std::int64_t reserved_bytes = -1;  // bytes the allocator held then; -1: not known
};

// Who holds a rank's device memory, in bytes. total() sums the parts; device_used is the device's
// own figure for comparison (CUDA: total − free from cudaMemGetInfo), -1 when there is none.
struct MemorySplit {
  std::int64_t plan_used_high = 0;      // the pool: most bytes of plan tensors live at once
  std::int64_t plan_reserved_high = 0;  // the pool: most bytes the allocator reserved for them
  std::int64_t context = 0;             // runtime context and module images
  std::int64_t comm_buffers = 0;        // communication library buffers (NCCL)
  std::int64_t library_workspaces = 0;  // cuBLASLt and cuDNN workspaces
  std::int64_t replay_scratch = 0;      // operands of the replay's kernels, copies and collectives
  std::int64_t device_used = -1;
  // Allocations that failed at first and succeeded after the rank's streams were synchronized and
  // the pool's unused reservations released (what PyTorch's caching allocator does on OOM).
  std::int64_t allocator_retries = 0;
  std::int64_t runtime_overheads() const { return context + comm_buffers + library_workspaces; }
  std::int64_t total() const { return plan_reserved_high + runtime_overheads() + replay_scratch; }
};

class Device {
 public:
  virtual ~Device() = default;
  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual const DeviceInfo& info() const = 0;

  // `rank` is a local index in [0, info().ranks).
  virtual sim::Result<StreamId> create_stream(int rank, const std::string& name) = 0;
  virtual sim::Result<EventId> create_event(int rank) = 0;
  // Marks the point in `stream`; elapsed() measures between two completed records.
  virtual sim::Status record(StreamId stream, EventId event) = 0;
  // Later work on `stream` waits for the most recent record() of `event` made before this call.
  virtual sim::Status wait(StreamId stream, EventId event) = 0;

  // Stream-ordered allocation from the rank's pool under a caller-chosen key (a tensor id).
  // Failure (over capacity) is reported with the requested and in-use bytes and `op_name`.
  virtual sim::Status allocate(StreamId stream, std::uint64_t key, std::int64_t size_bytes,
                               std::string_view op_name) = 0;
  virtual sim::Status release(StreamId stream, std::uint64_t key) = 0;
  virtual sim::Result<PoolUsage> pool_usage(int rank) = 0;
  // Starts a new high-water period (after warm-up).
  virtual sim::Status reset_pool_high_water(int rank) = 0;
  // Samples the stream's rank's pool when `stream` reaches this point; take_memory_marks()
  // returns a rank's samples in the order the device took them (device time) and forgets them.
  virtual sim::Status mark_memory(StreamId stream, std::uint64_t tag) {
    (void)stream;
    (void)tag;
    return sim::ok();
  }
  virtual sim::Result<std::vector<MemoryMark>> take_memory_marks(int rank) {
    (void)rank;
    return std::vector<MemoryMark>{};
  }
  // The rank's memory by holder, after synchronize(); the pool part covers the current
  // high-water period.
  virtual sim::Result<MemorySplit> memory_split(int rank) {
    OFFSIM_ASSIGN_OR_RETURN(PoolUsage u, pool_usage(rank));
    MemorySplit m;
    m.plan_used_high = u.used_high_bytes;
    m.plan_reserved_high = u.reserved_high_bytes;
    return m;
  }

  // Scratch operands, allocated now (not stream-ordered) and kept until the device goes away.
  virtual sim::Result<Buffer> scratch(int rank, MemoryKind kind, std::int64_t size_bytes) = 0;

  // Copies `size_bytes` from `src` to `dst`; the direction follows the buffers' kinds.
  virtual sim::Status copy(StreamId stream, Buffer dst, Buffer src, std::int64_t size_bytes) = 0;
  // C = A·B of `shape`; a, b, c hold at least m·k, k·n and m·n elements (times batch).
  virtual sim::Status gemm(StreamId stream, const sim::GemmShape& shape, Buffer a, Buffer b,
                           Buffer c) = 0;
  // Scaled-dot-product attention of `shape` over `qkv` (q, k, v) writing `out` (a backward
  // shape reads `out` as O and dO and writes dQ, dK, dV to the device's own scratch).
  virtual sim::Status attention(StreamId stream, const sim::AttentionShape& shape, Buffer qkv,
                                Buffer out) = 0;
  // Chooses, and prepares outside any measured work, the kernel attention() runs for `shape` on
  // `rank` (builds the fused graphs, allocates their workspaces). The same shape always gets the
  // same answer. An error is returned only for a failure that leaves no kernel at all.
  virtual sim::Result<AttentionKernelChoice> prepare_attention(int rank,
                                                               const sim::AttentionShape& shape) {
    (void)rank;
    (void)shape;
    return AttentionKernelChoice{false, "fallback", "this device has no fused attention kernel"};
  }
  // A memory-bound pass that reads size_bytes/2 from `in` and writes size_bytes/2 to `out`.
  virtual sim::Status elementwise(StreamId stream, std::int64_t size_bytes, Buffer in,
                                  Buffer out) = 0;
  // A host-side pass over `host` (CPU optimizer step), ordered in `stream`.
  virtual sim::Status host_compute(StreamId stream, std::int64_t size_bytes, Buffer host) = 0;

  // Communicators over local ranks; one collective call per member rank, each on its stream.
  virtual sim::Result<CommId> create_communicator(const std::vector<int>& ranks) = 0;
  virtual sim::Status collective(StreamId stream, CommId comm, sim::CollectiveKind kind,
                                 Buffer buffer, std::int64_t size_bytes,
                                 std::string_view op_name) = 0;
  // Point-to-point between two members of `comm` (local ranks): `send` true sends to `peer`.
  virtual sim::Status p2p(StreamId stream, CommId comm, int peer, bool send, Buffer buffer,
                          std::int64_t size_bytes, std::string_view op_name) = 0;

  // Communicators across processes (replay --mpi): one process of a group makes the id
  // (NCCL: ncclGetUniqueId, 128 bytes), every member receives it by MPI and joins as member
  // `my_index` of `members` with local rank `rank`. Collectives on the joined communicator
  // involve every member; p2p peers are member indexes (NCCL ranks), not local ranks.
  using CommUniqueId = std::array<char, 128>;
  virtual sim::Result<CommUniqueId> new_comm_unique_id() {
    return sim::fail(sim::ErrorCode::kUnsupported,
                     "this device cannot make communicators across processes");
  }
  virtual sim::Result<CommId> join_communicator(int rank, int members, int my_index,
                                                const CommUniqueId& id) {
    (void)rank;
    (void)members;
    (void)my_index;
    (void)id;
    return sim::fail(sim::ErrorCode::kUnsupported,
                     "this device cannot join communicators across processes");
  }

  // A host function ordered in `stream` (like cudaLaunchHostFunc), given the host-visible bytes of
  // `buffer` and a query that turns true once the device aborts (a long wait must poll it).
  // The replay's cross-process transport (backends/mpi_device.h) moves data this way on the CPU
  // device. Devices without host-visible scratch return kUnsupported.
  using HostFunction = std::function<sim::Status(void* data, std::int64_t bytes,
                                                 const std::function<bool()>& aborted)>;
  virtual sim::Status host_function(StreamId stream, Buffer buffer, std::string_view label,
                                    const HostFunction& fn);

  // Waits for every stream. Returns the first error any work hit; when the work does not finish
  // within `timeout` the communicators are aborted and a kDevice "watchdog" error returned.
  virtual sim::Status synchronize(std::chrono::milliseconds timeout) = 0;
  // Whether the most recent record() of `event` has completed (a watchdog names the first op
  // whose end has not).
  virtual sim::Result<bool> completed(EventId event) {
    (void)event;
    return sim::fail(sim::ErrorCode::kUnsupported, "this device cannot query events");
  }
  // Time from `from` to `to`; both recorded on the same rank and completed.
  virtual sim::Result<sim::Duration> elapsed(EventId from, EventId to) = 0;
};

}  // namespace offsim::backends
