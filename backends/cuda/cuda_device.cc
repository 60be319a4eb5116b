#include "backends/cuda/cuda_device.h"
#include "backends/device_skeleton.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cudnn_api.h"
#include "backends/cuda/cudnn_sdpa.h"
#include "backends/cuda/gemm_layout.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/nccl_comm.h"

namespace offsim::backends {
namespace {

using cuda::cublas_error;
using cuda::cuda_error;
using cuda::device_used_bytes;

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;  // cuBLASLt, per stream
constexpr std::int64_t kMinScratchBytes = 256;

// --- RAII owners ------------------------------------------------------------------------------

struct StreamDestroy {
  void operator()(CUstream_st* s) const { cudaStreamDestroy(s); }
};
struct EventDestroy {
  void operator()(CUevent_st* e) const { cudaEventDestroy(e); }
};
struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
struct PinnedFree {
  void operator()(void* p) const { cudaFreeHost(p); }
};
struct PageableFree {
  void operator()(void* p) const { std::free(p); }
};
struct PoolDestroy {
  void operator()(cudaMemPool_t p) const { cudaMemPoolDestroy(p); }
};
struct LtDestroy {
  void operator()(cublasLtHandle_t h) const { cublasLtDestroy(h); }
};
struct DnnDestroy {
  void operator()(cudnnHandle_t h) const {
    if (auto dnn = cuda::cudnn_api()) (*dnn)->Destroy(h);
  }
};
using UniqueStream = std::unique_ptr<CUstream_st, StreamDestroy>;
using UniqueEvent = std::unique_ptr<CUevent_st, EventDestroy>;
using UniquePool = std::unique_ptr<std::remove_pointer_t<cudaMemPool_t>, PoolDestroy>;
using UniqueLt = std::unique_ptr<std::remove_pointer_t<cublasLtHandle_t>, LtDestroy>;
using UniqueDnn = std::unique_ptr<std::remove_pointer_t<cudnnHandle_t>, DnnDestroy>;

// A buffer with the deleter of its memory kind.
class OwnedBuffer {
 public:
  OwnedBuffer(MemoryKind kind, void* ptr, std::int64_t bytes)
      : kind_(kind), ptr_(ptr), bytes_(bytes) {}
  OwnedBuffer(const OwnedBuffer&) = delete;
  OwnedBuffer& operator=(const OwnedBuffer&) = delete;
  ~OwnedBuffer() {
    if (!ptr_) return;
    switch (kind_) {
      case MemoryKind::kDevice:
        DeviceFree{}(ptr_);
        break;
      case MemoryKind::kHostPinned:
        PinnedFree{}(ptr_);
        break;
      case MemoryKind::kHostPageable:
        PageableFree{}(ptr_);
        break;
    }
  }
  void* get() const { return ptr_; }
  std::int64_t bytes() const { return bytes_; }
  // Forgets the memory without freeing it: cudaFree and cudaFreeHost synchronize the device,
  // which would block forever behind a hung kernel. Only the teardown after a watchdog uses it.
  void leak() { ptr_ = nullptr; }

 private:
  MemoryKind kind_;
  void* ptr_;
  std::int64_t bytes_;
};

// cuBLASLt descriptors of one GEMM shape, destroyed with it.
class GemmPlan {
 public:
  GemmPlan() = default;
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;
  ~GemmPlan() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulAlgo_t algo{};
  sim::DType ran_as = sim::DType::kBf16;  // fp8 falls back to bf16 when no algorithm exists
};

struct StreamState {
  int rank = 0;
  std::string name;
  UniqueStream stream;
  std::unique_ptr<void, DeviceFree> workspace;
};

struct EventState {
  int rank = 0;
  UniqueEvent event;
  std::uint64_t requested = 0;  // records asked for (caller thread), guarded by work_.mutex()
  std::uint64_t enqueued = 0;   // records made on the GPU's stream (worker), ditto
};

struct BufferState {
  int rank = 0;
  MemoryKind kind = MemoryKind::kDevice;
  std::unique_ptr<OwnedBuffer> memory;
};

struct PoolAllocation {
  void* ptr = nullptr;
  std::int64_t bytes = 0;
};

// The kernel of one attention shape on one GPU: cuDNN's SDPA graphs with their workspace, the
// forward's softmax statistics and (backward) K and V expanded to the query heads and the
// gradients; or the fallback kernel, with the reason.
struct AttentionPlan {
  AttentionKernelChoice choice;
  std::unique_ptr<cuda::CudnnSdpaForward> fwd;
  std::unique_ptr<cuda::CudnnSdpaBackward> bwd;
  std::unique_ptr<OwnedBuffer> workspace;  // library workspace
  std::unique_ptr<OwnedBuffer> stats;      // replay scratch
  std::unique_ptr<OwnedBuffer> grads;      // replay scratch: [K][V][dQ][dK][dV] (backward)
  std::int64_t kv_bytes = 0;               // one of K, V, dK, dV in `grads`
  std::int64_t q_bytes = 0;                // dQ in `grads`
};

using AttentionKey = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                std::int64_t, std::int64_t, bool, bool>;

AttentionKey attention_key(const sim::AttentionShape& a) {
  return {a.batch, a.heads, a.kv_heads, a.seq_q, a.seq_kv, a.head_dim, a.causal, a.backward};
}

struct MarkArg;

// One GPU: its pool and library handles (owned; the device releases them last, in its
// teardown order), the plans made for it, its memory accounting, and the index of its worker
// queue in the skeleton (device_skeleton.h): every call for this GPU runs on that queue.
struct RankState {
  int gpu = 0;
  std::size_t queue = 0;
  UniquePool pool;
  UniqueLt lt;
  // Touched only by this rank's worker thread.
  std::unordered_map<std::uint64_t, PoolAllocation> allocations;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, int>,
           std::unique_ptr<GemmPlan>>
      gemms;
  UniqueDnn dnn;  // made with the first attention shape (guarded by attention_mu_)
  std::map<AttentionKey, std::unique_ptr<AttentionPlan>> attention;  // guarded by attention_mu_
  // Device memory in use (cudaMemGetInfo) by the context alone, and what cuBLASLt's handle and
  // NCCL's communicators added when they were made.
  std::int64_t context_bytes = 0;
  std::int64_t blas_handle_bytes = 0;
  std::int64_t comm_bytes = 0;
  std::atomic<std::int64_t> allocator_retries{0};  // see MemorySplit::allocator_retries
  std::vector<MemoryMark> marks;                   // guarded by CudaDevice::marks_mu_
};

// A memory mark's host function: runs when the stream reaches it (device order).
struct MarkArg {
  std::mutex* mu;
  std::vector<MemoryMark>* marks;
  MemoryMark mark;
};

void CUDART_CB run_mark(void* arg) {
  std::unique_ptr<MarkArg> m(static_cast<MarkArg*>(arg));
  std::lock_guard lock(*m->mu);
  m->marks->push_back(m->mark);
}

struct CommState {
  std::vector<int> ranks;  // local ranks, member index = position
  // A communicator joined across processes (join_communicator): its `members` NCCL ranks live in
  // several processes and ranks[0] is NCCL rank `first_member`. 0 members: every member is local.
  int first_member = 0;
  int members = 0;
  std::unique_ptr<cuda::NcclComm> nccl;  // null: one member and no NCCL, nothing to exchange
};

struct HostPass {
  float* data;
  std::size_t count;
  unsigned threads;
};

// The host pass stands for a CPU optimizer step (DeepSpeed's CPU Adam streams the optimizer
// state with one thread per core). It moves the bytes the forecast charges (models/cost_model:
// host_compute charges `dram_bytes` of DRAM traffic; each float here is read and written, so
// size_bytes / 8 floats) on the cores the forecast gives one rank: the host's physical cores
// divided among the GPUs this device drives (the forecast divides a socket's cores among the
// GPUs on it). Threads without CUDA calls may be started from a host function; each element is
// updated once, so the result is the same for any thread count.
constexpr std::size_t kMinFloatsPerHostThread = std::size_t{1} << 20;
constexpr unsigned kMaxHostThreads = 64;

void host_pass_range(float* data, std::size_t begin, std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) data[i] = data[i] * 0.999f + 0.001f;
}

void CUDART_CB run_host_pass(void* arg) {
  std::unique_ptr<HostPass> pass(static_cast<HostPass*>(arg));
  const std::size_t threads = std::min<std::size_t>(
      pass->threads, std::max<std::size_t>(1, pass->count / kMinFloatsPerHostThread));
  const std::size_t chunk = (pass->count + threads - 1) / threads;
  std::vector<std::thread> helpers;
  for (std::size_t t = 1; t < threads; ++t) {
    const std::size_t begin = std::min(pass->count, t * chunk);
    const std::size_t end = std::min(pass->count, begin + chunk);
    try {
      helpers.emplace_back(host_pass_range, pass->data, begin, end);
    } catch (const std::system_error&) {
      host_pass_range(pass->data, begin, end);  // no thread to be had: do this part here
    }
  }
  host_pass_range(pass->data, 0, std::min(pass->count, chunk));
  for (std::thread& h : helpers) h.join();
}

// A host-to-host copy, ordered in its stream. cudaMemcpyAsync between two host buffers is fully
// synchronous for the calling thread (CUDA runtime API, "API synchronization behavior"): made
// on a rank's submission thread it would hold back every other stream of that rank until the
// stream's earlier work had finished. A host function keeps the order without the wait.
struct HostCopy {
  void* dst;
  const void* src;
  std::size_t bytes;
};

void CUDART_CB run_host_copy(void* arg) {
  auto* copy = static_cast<HostCopy*>(arg);
  std::memcpy(copy->dst, copy->src, copy->bytes);
  delete copy;
}

// Physical cores this process may run on: distinct (package, core) pairs of the CPUs in its
// affinity mask, from sysfs; the logical CPU count when the topology cannot be read.
unsigned physical_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const bool have_mask = sched_getaffinity(0, sizeof set, &set) == 0;
  std::set<std::pair<long, long>> cores;
  unsigned logical = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (have_mask && !CPU_ISSET(cpu, &set)) continue;
    const std::string dir = fmt::format("/sys/devices/system/cpu/cpu{}/topology/", cpu);
    long package = -1, core = -1;
    std::FILE* f = std::fopen((dir + "physical_package_id").c_str(), "r");
    if (!f) continue;
    const bool a = std::fscanf(f, "%ld", &package) == 1;
    std::fclose(f);
    f = std::fopen((dir + "core_id").c_str(), "r");
    if (!f) continue;
    const bool b = std::fscanf(f, "%ld", &core) == 1;
    std::fclose(f);
    if (a && b) cores.emplace(package, core);
    ++logical;
  }
  if (!cores.empty()) return static_cast<unsigned>(cores.size());
  return std::max(1u, logical ? logical : std::thread::hardware_concurrency());
}

std::string version_string(int v) {  // CUDA's 1000·major + 10·minor
  return fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
}

std::string cublas_version() {
  const std::size_t v = cublasLtGetVersion();
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

DeviceInfo gpu_info(int gpu, int ranks) {
  DeviceInfo info;
  info.kind = DeviceKind::kCuda;
  info.ranks = ranks;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, gpu) == cudaSuccess) {
    info.name = prop.name;
    info.memory_bytes = static_cast<std::int64_t>(prop.totalGlobalMem);
    info.compute_capability_major = prop.major;
    info.compute_capability_minor = prop.minor;
  }
  int v = 0;
  if (cudaDriverGetVersion(&v) == cudaSuccess) info.driver_version = version_string(v);
  if (cudaRuntimeGetVersion(&v) == cudaSuccess) info.runtime_version = version_string(v);
  info.blas_version = cublas_version();
  return info;
}

cudaDataType_t cuda_type(sim::DType d) {
  switch (d) {
    case sim::DType::kFp32:
      return CUDA_R_32F;
    case sim::DType::kBf16:
      return CUDA_R_16BF;
    case sim::DType::kFp16:
      return CUDA_R_16F;
    case sim::DType::kFp8:
      return CUDA_R_8F_E4M3;
  }
  return CUDA_R_16BF;
}

struct OperandBytes {
  std::int64_t a = 0, b = 0, c = 0;
};

// The buffers behind a GEMM hold its operands when run with `run_as` inputs.
sim::Status check_gemm_operands(const sim::GemmShape& g, sim::DType run_as,
                                const OperandBytes& have) {
  const cuda::GemmLayout l = cuda::gemm_layout(g, run_as);
  if (have.a < l.our_a_bytes || have.b < l.our_b_bytes || have.c < l.our_c_bytes) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "GEMM {}x{}x{} (batch {}) run as {}: operand buffers of {}, {} and {} bytes, "
                     "expected at least {}, {} and {}",
                     g.m, g.n, g.k, g.batch, sim::to_string(run_as), have.a, have.b, have.c,
                     l.our_a_bytes, l.our_b_bytes, l.our_c_bytes);
  }
  return sim::ok();
}

class CudaDevice final : public Device {
 public:
  CudaDevice(int first_gpu, int ranks) : first_gpu_(first_gpu) {
    ranks_.resize(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r)
      ranks_[static_cast<std::size_t>(r)] = std::make_unique<RankState>();
  }

  // Teardown, in the skeleton's order (device_skeleton.h): the workers stop; the communicators
  // end (finalized, or aborted after a watchdog); the GPUs finish their work (not after a
  // watchdog: the memory is left to the driver); then pool allocations, plans and library
  // handles, the tables, and last each GPU's cuBLASLt handle and pool.
  ~CudaDevice() override {
    work_.stop();
    abort_comms(/*destroy=*/!hung_);
    if (hung_) {
      leak_device_memory();
    } else {
      synchronize_gpus();
    }
    free_pool_allocations();
    release_rank_plans();
    buffers_.clear();
    events_.clear();
    streams_.clear();
    for (auto& r : ranks_) {
      r->lt.reset();
      r->pool.reset();
    }
  }

  sim::Status init() {
    for (std::size_t i = 0; i < ranks_.size(); ++i) {
      RankState& r = *ranks_[i];
      r.gpu = first_gpu_ + static_cast<int>(i);
      OFFSIM_CUDA_CHECK(cudaSetDevice(r.gpu));
      OFFSIM_CUDA_CHECK(cudaFree(nullptr));  // creates the context; a busy GPU fails here
      // Everything in use now is the context's (and other processes' on a shared GPU).
      r.context_bytes = std::max<std::int64_t>(device_used_bytes(), 0);
      int pools = 0;  // some virtualized GPUs have no stream-ordered allocator
      OFFSIM_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, r.gpu));
      if (!pools) {
        return sim::fail(
            sim::ErrorCode::kUnsupported,
            "GPU {} has no stream-ordered memory pools "
            "(cudaDevAttrMemoryPoolsSupported is 0); the replay allocates through them",
            r.gpu);
      }
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.handleTypes = cudaMemHandleTypeNone;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = r.gpu;
      cudaMemPool_t pool = nullptr;
      OFFSIM_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
      r.pool.reset(pool);
      std::uint64_t keep = ~std::uint64_t{0};  // never shrink between steps
      OFFSIM_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
      int no = 0;  // reuse must not add hidden cross-stream dependencies
      OFFSIM_CUDA_CHECK(
          cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &no));
      const std::int64_t before_lt = device_used_bytes();
      cublasLtHandle_t lt = nullptr;
      OFFSIM_CUBLAS_CHECK(cublasLtCreate(&lt));
      r.lt.reset(lt);
      r.blas_handle_bytes = std::max<std::int64_t>(device_used_bytes() - before_lt, 0);
    }
    info_ = gpu_info(first_gpu_, static_cast<int>(ranks_.size()));
    host_threads_ =
        std::clamp(physical_cores() / static_cast<unsigned>(ranks_.size()), 1u, kMaxHostThreads);
    info_.note = fmt::format(
        "GPUs {}..{}; attention: cuDNN's fused SDPA graphs (forward with softmax statistics, "
        "backward from them; a GQA backward runs with K and V expanded to the query heads) where "
        "cuDNN builds them, else offsim's scalar bf16 fallback kernel (far slower; backward = "
        "two forward passes), named per op in the report; host compute: {} thread(s) per GPU "
        "({} physical cores / {} GPUs), moving the bytes the forecast charges; NCCL loaded on "
        "the first communicator",
        first_gpu_, first_gpu_ + static_cast<int>(ranks_.size()) - 1, host_threads_,
        physical_cores(), ranks_.size());
    // One worker queue per GPU (device_skeleton.h); its thread makes the GPU current first.
    for (auto& r : ranks_) {
      r->queue =
          work_.add_queue(fmt::format("GPU {}", r->gpu), [gpu = r->gpu] { cudaSetDevice(gpu); });
    }
    return sim::ok();
  }

  const DeviceInfo& info() const override { return info_; }

  sim::Result<StreamId> create_stream(int rank, const std::string& name) override {
    OFFSIM_ASSIGN_OR_RETURN(RankState * r, rank_state(rank));
    OFFSIM_CUDA_CHECK(cudaSetDevice(r->gpu));
    auto s = std::make_unique<StreamState>();
    s->rank = rank;
    s->name = name;
    cudaStream_t raw = nullptr;
    OFFSIM_CUDA_CHECK(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
    s->stream.reset(raw);
    void* ws = nullptr;
    OFFSIM_CUDA_CHECK(cudaMalloc(&ws, kWorkspaceBytes));
    s->workspace.reset(ws);
    std::lock_guard lock(work_.mutex());
    return StreamId{streams_.add(std::move(s))};
  }

  sim::Result<EventId> create_event(int rank) override {
    OFFSIM_ASSIGN_OR_RETURN(RankState * r, rank_state(rank));
    OFFSIM_CUDA_CHECK(cudaSetDevice(r->gpu));
    auto e = std::make_unique<EventState>();
    e->rank = rank;
    cudaEvent_t raw = nullptr;
    OFFSIM_CUDA_CHECK(cudaEventCreate(&raw));
    e->event.reset(raw);
    std::lock_guard lock(work_.mutex());
    return EventId{events_.add(std::move(e))};
  }

  sim::Status record(StreamId stream, EventId event) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(StreamState * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(EventState * e, event_locked(event));
    if (e->rank != s->rank) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "record: event of rank {} on stream '{}' of rank {}", e->rank, s->name,
                       s->rank);
    }
    const std::uint64_t target = ++e->requested;
    push_locked(s->rank, "record", [this, s, e, target]() -> sim::Status {
      OFFSIM_CUDA_CHECK(cudaEventRecord(e->event.get(), s->stream.get()));
      std::lock_guard l(work_.mutex());
      e->enqueued = std::max(e->enqueued, target);
      work_.notify_all();
      return sim::ok();
    });
    return sim::ok();
  }

  sim::Status wait(StreamId stream, EventId event) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(StreamState * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(EventState * e, event_locked(event));
    const std::uint64_t target = e->requested;
    if (target == 0) return sim::ok();  // never recorded: nothing to wait for
    push_locked(s->rank, "wait for an event", [this, s, e, target]() -> sim::Status {
      {
        // The record may belong to another GPU's worker: wait until it has been made.
        WorkQueues::Lock l(work_.mutex());
        OFFSIM_RETURN_IF_ERROR(work_.wait_locked(l, [&] { return e->enqueued >= target; }));
      }
      OFFSIM_CUDA_CHECK(cudaStreamWaitEvent(s->stream.get(), e->event.get(), 0));
      return sim::ok();
    });
    return sim::ok();
  }

  sim::Status allocate(StreamId stream, std::uint64_t key, std::int64_t size_bytes,
                       std::string_view op_name) override {
    if (size_bytes < 0) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "op '{}': negative allocation {} bytes",
                       op_name, size_bytes);
    }
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(StreamState * s, stream_locked(stream));
    RankState* r = ranks_[static_cast<std::size_t>(s->rank)].get();
    push_locked(s->rank, fmt::format("allocate for '{}'", op_name),
                [r, s, key, size_bytes, name = std::string(op_name)]() -> sim::Status {
                  if (r->allocations.count(key)) {
                    return sim::fail(sim::ErrorCode::kInternal,
                                     "op '{}': allocation key {} is already in use", name, key);
                  }
                  void* p = nullptr;
                  if (size_bytes > 0) {
                    cudaError_t err = cudaMallocFromPoolAsync(
                        &p, static_cast<std::size_t>(size_bytes), r->pool.get(), s->stream.get());
                    if (err == cudaErrorMemoryAllocation) {
                      // The pool keeps what it reserved (release threshold: never), and a block
                      // freed on another stream is not reused before that free is known to have
                      // run; the worker enqueues ahead of the GPU, so reservations pile up where
                      // copy streams free what compute allocated (activation offload). As
                      // PyTorch's caching allocator does on OOM: wait for the rank's work,
                      // release the unused reservations, try once more.
                      cudaGetLastError();
                      const cudaError_t synced = cudaDeviceSynchronize();
                      if (synced == cudaSuccess) {
                        cudaMemPoolTrimTo(r->pool.get(), 0);
                        err = cudaMallocFromPoolAsync(&p, static_cast<std::size_t>(size_bytes),
                                                      r->pool.get(), s->stream.get());
                        if (err == cudaSuccess) ++r->allocator_retries;
                      } else {
                        err = synced;
                      }
                    }
                    if (err != cudaSuccess) {
                      cudaGetLastError();
                      std::uint64_t used = 0;
                      cudaMemPoolGetAttribute(r->pool.get(), cudaMemPoolAttrUsedMemCurrent, &used);
                      std::size_t free_b = 0, total_b = 0;
                      cudaMemGetInfo(&free_b, &total_b);
                      sim::Error e = cuda_error(err, "cudaMallocFromPoolAsync");
                      return sim::fail(
                          e.code,
                          "out of memory on GPU {}: op '{}' requested {} bytes with {} bytes in "
                          "use in the replay pool ({} of {} bytes free on the device): {}",
                          r->gpu, name, size_bytes, used, free_b, total_b, e.message);
                    }
                  }
                  r->allocations[key] = PoolAllocation{p, size_bytes};
                  return sim::ok();
                });
    return sim::ok();
  }

  sim::Status release(StreamId stream, std::uint64_t key) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(StreamState * s, stream_locked(stream));
    RankState* r = ranks_[static_cast<std::size_t>(s->rank)].get();
    push_locked(s->rank, "release", [r, s, key]() -> sim::Status {
      auto it = r->allocations.find(key);
      if (it == r->allocations.end()) {
        return sim::fail(sim::ErrorCode::kInternal, "release of allocation key {}, not allocated",
                         key);
      }
      if (it->second.ptr) OFFSIM_CUDA_CHECK(cudaFreeAsync(it->second.ptr, s->stream.get()));
      r->allocations.erase(it);
      return sim::ok();
    });
    return sim::ok();
  }

  sim::Result<PoolUsage> pool_usage(int rank) override {
    OFFSIM_ASSIGN_OR_RETURN(RankState * r, rank_state(rank));
    std::uint64_t cur = 0, high = 0, reserved_high = 0;
    cudaMemPool_t pool = r->pool.get();
    OFFSIM_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &cur));
    OFFSIM_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
    OFFSIM_CUDA_CHECK(
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &reserved_high));
    return PoolUsage{static_cast<std::int64_t>(cur), static_cast<std::int64_t>(high),
                     static_cast<std::int64_t>(reserved_high)};
  }

  sim::Status reset_pool_high_water(int rank) override {
    OFFSIM_ASSIGN_OR_RETURN(RankState * r, rank_state(rank));
    // The pool's counters move when the worker makes its cudaMallocFromPoolAsync calls, so the
    // reset goes through the same queue: allocations queued before it (warm-up) stay out of
    // the new period even when the worker is behind the caller.
    std::lock_guard lock(work_.mutex());
    push_locked(rank, "reset the pool's high-water marks", [r]() -> sim::Status {
      std::uint64_t zero = 0;  // the only value allowed: resets each mark to the current value
      OFFSIM_CUDA_CHECK(cudaMemPoolSetAttribute(r->pool.get(), cudaMemPoolAttrUsedMemHigh, &zero));
      OFFSIM_CUDA_CHECK(
          cudaMemPoolSetAttribute(r->pool.get(), cudaMemPoolAttrReservedMemHigh, &zero));
      return sim::ok();
    });
    return sim::ok();
  }

  sim::Result<Buffer> scratch(int rank, MemoryKind kind, std::int64_t size_bytes) override {
    OFFSIM_ASSIGN_OR_RETURN(RankState * r, rank_state(rank));
    if (size_bytes < 0) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "scratch buffer of negative size {} bytes",
                       size_bytes);
    }
    const std::int64_t bytes = std::max(size_bytes, kMinScratchBytes);
    const std::size_t n = static_cast<std::size_t>(bytes);
    OFFSIM_CUDA_CHECK(cudaSetDevice(r->gpu));
    std::int64_t in_use = 0;  // scratch bytes of this kind already held, for the messages
    std::uint32_t seed = 0;
    {
      std::lock_guard lock(work_.mutex());
      seed = static_cast<std::uint32_t>(buffers_.size());
      for (const auto& b : buffers_) {
        if (b->kind == kind && (kind != MemoryKind::kDevice || b->rank == rank)) {
          in_use += b->memory->bytes();
        }
      }
    }
    auto b = std::make_unique<BufferState>();
    b->rank = rank;
    b->kind = kind;
    void* p = nullptr;
    switch (kind) {
      case MemoryKind::kDevice: {
        const cudaError_t err = cudaMalloc(&p, n);
        if (err != cudaSuccess) {
          cudaGetLastError();
          std::size_t free_b = 0, total_b = 0;
          cudaMemGetInfo(&free_b, &total_b);
          return sim::fail(
              sim::ErrorCode::kLimitExceeded,
              "out of memory on GPU {}: replay scratch operand requested {} bytes with "
              "{} bytes of scratch in use ({} of {} bytes free on the device): {}",
              r->gpu, bytes, in_use, free_b, total_b, cuda_error(err, "cudaMalloc").message);
        }
        b->memory = std::make_unique<OwnedBuffer>(kind, p, bytes);  // freed on any error below
        OFFSIM_CUDA_CHECK(cuda::launch_fill(p, bytes, seed, nullptr));
        OFFSIM_CUDA_CHECK(cudaDeviceSynchronize());
        break;
      }
      case MemoryKind::kHostPinned: {
        const cudaError_t err = cudaHostAlloc(&p, n, cudaHostAllocPortable);
        if (err != cudaSuccess) {
          cudaGetLastError();
          return sim::fail(sim::ErrorCode::kLimitExceeded,
                           "out of pinned host memory: replay scratch buffer requested {} bytes "
                           "with {} bytes pinned already: {}",
                           bytes, in_use, cuda_error(err, "cudaHostAlloc").message);
        }
        b->memory = std::make_unique<OwnedBuffer>(kind, p, bytes);
        std::memset(p, 0x3C, n);  // touch every page now, not during a measured step
        break;
      }
      case MemoryKind::kHostPageable:
        p = std::malloc(n);
        if (!p) {
          return sim::fail(sim::ErrorCode::kLimitExceeded,
                           "out of host memory: pageable replay scratch buffer requested {} bytes "
                           "with {} bytes of pageable scratch in use",
                           bytes, in_use);
        }
        b->memory = std::make_unique<OwnedBuffer>(kind, p, bytes);
        std::memset(p, 0x3C, n);  // touch every page now, not during a measured step
        break;
    }
    std::lock_guard lock(work_.mutex());
    return Buffer{buffers_.add(std::move(b)), kind, rank, size_bytes};
  }

  sim::Status copy(StreamId stream, Buffer dst, Buffer src, std::int64_t size_bytes) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(StreamState * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(BufferState * d, buffer_locked(dst));
    OFFSIM_ASSIGN_OR_RETURN(BufferState * f, buffer_locked(src));
    const std::int64_t n =
        std::min({std::max<std::int64_t>(size_bytes, 0), d->memory->bytes(), f->memory->bytes()});
    void* dp = d->memory->get();
    const void* sp = f->memory->get();
    if (d->kind != MemoryKind::kDevice && f->kind != MemoryKind::kDevice) {
      push_locked(s->rank, "host-to-host copy", [s, dp, sp, n]() -> sim::Status {
        if (n <= 0) return sim::ok();
        auto* copy = new HostCopy{dp, sp, static_cast<std::size_t>(n)};
        const cudaError_t err = cudaLaunchHostFunc(s->stream.get(), run_host_copy, copy);
        if (err != cudaSuccess) {
          delete copy;
          return sim::fail(cuda_error(err, "cudaLaunchHostFunc (host-to-host copy)"));
        }
        return sim::ok();
      });
      return sim::ok();
    }
    push_locked(s->rank, "copy", [s, dp, sp, n]() -> sim::Status {
      if (n > 0) {
        OFFSIM_CUDA_CHECK(cudaMemcpyAsync(dp, sp, static_cast<std::size_t>(n), cudaMemcpyDefault,
                                          s->stream.get()));
      }
      return sim::ok();
    });
    return sim::ok();
  }

  sim::Status gemm(StreamId stream, const sim::GemmShape& shape, Buffer a, Buffer b,
                   Buffer c) override {
    if (shape.m <= 0 || shape.n <= 0 || shape.k <= 0 || shape.batch <= 0) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "GEMM shape {}x{}x{} (batch {}) not positive",
                       shape.m, shape.n, shape.k, shape.batch);
    }
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(StreamState * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(BufferState * ba, buffer_locked(a));
    OFFSIM_ASSIGN_OR_RETURN(BufferState * bb, buffer_locked(b));
    OFFSIM_ASSIGN_OR_RETURN(BufferState * bc, buffer_locked(c));
    const OperandBytes have{ba->memory->bytes(), bb->memory->bytes(), bc->memory->bytes()};
    OFFSIM_RETURN_IF_ERROR(check_gemm_operands(shape, shape.dtype, have));
    RankState* r = ranks_[static_cast<std::size_t>(s->rank)].get();
    const void* pa = ba->memory->get();
    const void* pb = bb->memory->get();
    void* pc = bc->memory->get();
    push_locked(s->rank, "gemm", [this, r, s, shape, pa, pb, pc, have]() -> sim::Status {
      OFFSIM_ASSIGN_OR_RETURN(GemmPlan * plan, gemm_plan(*r, shape));
      // An fp8 GEMM without an fp8 kernel runs as bf16: twice the input bytes, so the buffers
      // sized for fp8 must be checked again (else cuBLASLt would read past them).
      if (plan->ran_as != shape.dtype)
        OFFSIM_RETURN_IF_ERROR(check_gemm_operands(shape, plan->ran_as, have));
      const float alpha = 1.0f, beta = 0.0f;
      // Row-major C[m×n] = A[m×k]·B[k×n] is column-major C^T = B^T·A^T: cuBLAS's "A" is our B
      // (transposed, TN layout) and its "B" is our A.
      OFFSIM_CUBLAS_CHECK(cublasLtMatmul(r->lt.get(), plan->op, &alpha, pb, plan->a, pa, plan->b,
                                         &beta, pc, plan->c, pc, plan->c, &plan->algo,
                                         s->workspace.get(), kWorkspaceBytes, s->stream.get()));
      return sim::ok();
    });
    return sim::ok();
  }

  sim::Status attention(StreamId stream, const sim::AttentionShape& shape, Buffer qkv,
                        Buffer out) override {
    if (shape.batch < 0 || shape.heads < 0 || shape.seq_q < 0 || shape.seq_kv < 0 ||
        shape.head_dim < 0 || shape.head_dim > cuda::kMaxAttentionHeadDim) {
      return sim::fail(sim::ErrorCode::kUnsupported,
                       "attention batch {} heads {} seq {}x{} head_dim {}: the backend's kernel "
                       "takes head_dim 1..{} and no negative size",
                       shape.batch, shape.heads, shape.seq_q, shape.seq_kv, shape.head_dim,
                       cuda::kMaxAttentionHeadDim);
    }
    int rank = 0;
    {
      std::lock_guard lock(work_.mutex());
      OFFSIM_ASSIGN_OR_RETURN(StreamState * s, stream_locked(stream));
      rank = s->rank;
    }
    // Prepared before the replay's steps; a caller that did not gets it prepared here.
    OFFSIM_ASSIGN_OR_RETURN(AttentionPlan * plan, attention_plan(rank, shape));
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(StreamState * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(BufferState * in, buffer_locked(qkv));
    OFFSIM_ASSIGN_OR_RETURN(BufferState * o, buffer_locked(out));
    const std::int64_t kv_heads =
        shape.kv_heads > 0 && shape.heads % shape.kv_heads == 0 ? shape.kv_heads : shape.heads;
    const std::int64_t q_bytes = shape.batch * shape.heads * shape.seq_q * shape.head_dim * 2;
    const std::int64_t kv_bytes = shape.batch * kv_heads * shape.seq_kv * shape.head_dim * 2;
    if (in->memory->bytes() < q_bytes + 2 * kv_bytes || o->memory->bytes() < q_bytes) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "attention: operand buffers too small");
    }
    char* pin = static_cast<char*>(in->memory->get());
    void* pout = o->memory->get();
    RankState* r = ranks_[static_cast<std::size_t>(s->rank)].get();
    if (plan->choice.fused) {
      const cuda::CudnnApi* api = *cuda::cudnn_api();  // loaded: the plan was built with it
      if (!shape.backward) {
        push_locked(s->rank, "attention (cuDNN SDPA forward)",
                    [api, r, s, plan, pin, pout, q_bytes, kv_bytes]() -> sim::Status {
                      OFFSIM_RETURN_IF_ERROR(api->check(
                          api->SetStream(r->dnn.get(), s->stream.get()), "cudnnSetStream"));
                      return plan->fwd->run(r->dnn.get(), pin, pin + q_bytes,
                                            pin + q_bytes + kv_bytes, pout, plan->workspace->get(),
                                            plan->stats->get());
                    });
        return sim::ok();
      }
      // Backward: Q from the operands, K and V expanded to the query heads, O and dO both the
      // output buffer (read only), the gradients into the plan's scratch.
      push_locked(s->rank, "attention (cuDNN SDPA backward)",
                  [api, r, s, plan, pin, pout]() -> sim::Status {
                    OFFSIM_RETURN_IF_ERROR(api->check(api->SetStream(r->dnn.get(), s->stream.get()),
                                                      "cudnnSetStream"));
                    char* g = static_cast<char*>(plan->grads->get());
                    cuda::SdpaBackwardOperands x;
                    x.q = pin;
                    x.k = g;
                    x.v = g + plan->kv_bytes;
                    x.o = pout;
                    x.d_o = pout;
                    x.stats = plan->stats->get();
                    x.dq = g + 2 * plan->kv_bytes;
                    x.dk = g + 2 * plan->kv_bytes + plan->q_bytes;
                    x.dv = g + 3 * plan->kv_bytes + plan->q_bytes;
                    return plan->bwd->run(r->dnn.get(), s->stream.get(), x, plan->workspace->get());
                  });
      return sim::ok();
    }
    cuda::AttentionLaunch l{shape.batch * shape.heads,
                            shape.heads / std::max<std::int64_t>(kv_heads, 1),
                            shape.seq_q,
                            shape.seq_kv,
                            shape.head_dim,
                            shape.causal};
    const int passes = shape.backward ? 2 : 1;
    push_locked(s->rank, "attention (fallback kernel)", [s, l, pin, pout, passes]() -> sim::Status {
      for (int i = 0; i < passes; ++i) {
        OFFSIM_CUDA_CHECK(cuda::launch_attention(pin, pout, l, s->stream.get()));
      }
      return sim::ok();
    });
    return sim::ok();
  }

  sim::Result<AttentionKernelChoice> prepare_attention(int rank,
                                                       const sim::AttentionShape& shape) override {
    OFFSIM_ASSIGN_OR_RETURN(AttentionPlan * plan, attention_plan(rank, shape));
    return plan->choice;
  }

  sim::Status mark_memory(StreamId stream, std::uint64_t tag) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(StreamState * s, stream_locked(stream));
    RankState* r = ranks_[static_cast<std::size_t>(s->rank)].get();
    push_locked(s->rank, "memory mark", [this, r, s, tag]() -> sim::Status {
      // The stream-ordered allocator reserves when cudaMallocFromPoolAsync is called, so the
      // reserved bytes are read now, on the worker, in issue order; the used bytes at the mark
      // come from the plan's allocations in the marks' device order (a host function may not
      // call CUDA).
      std::uint64_t reserved = 0;
      OFFSIM_CUDA_CHECK(
          cudaMemPoolGetAttribute(r->pool.get(), cudaMemPoolAttrReservedMemCurrent, &reserved));
      auto* arg = new MarkArg{&marks_mu_, &r->marks,
                              MemoryMark{tag, -1, static_cast<std::int64_t>(reserved)}};
      const cudaError_t err = cudaLaunchHostFunc(s->stream.get(), run_mark, arg);
      if (err != cudaSuccess) {
        delete arg;
        return sim::fail(cuda_error(err, "cudaLaunchHostFunc (memory mark)"));
      }
      return sim::ok();
    });
    return sim::ok();
  }

  sim::Result<std::vector<MemoryMark>> take_memory_marks(int rank) override {
    OFFSIM_ASSIGN_OR_RETURN(RankState * r, rank_state(rank));
    std::lock_guard lock(marks_mu_);
    return std::exchange(r->marks, {});
  }

  sim::Result<MemorySplit> memory_split(int rank) override {
    OFFSIM_ASSIGN_OR_RETURN(RankState * r, rank_state(rank));
    OFFSIM_ASSIGN_OR_RETURN(PoolUsage u, pool_usage(rank));
    MemorySplit m;
    m.plan_used_high = u.used_high_bytes;
    m.plan_reserved_high = u.reserved_high_bytes;
    m.context = r->context_bytes;
    m.comm_buffers = r->comm_bytes;
    m.library_workspaces = r->blas_handle_bytes;
    m.allocator_retries = r->allocator_retries.load();
    {
      std::lock_guard lock(work_.mutex());
      for (const auto& st : streams_) {
        if (st->rank == rank) m.library_workspaces += static_cast<std::int64_t>(kWorkspaceBytes);
      }
      for (const auto& b : buffers_) {
        if (b->rank == rank && b->kind == MemoryKind::kDevice)
          m.replay_scratch += b->memory->bytes();
      }
    }
    {
      std::lock_guard lock(attention_mu_);
      for (const auto& [key, plan] : r->attention) {
        if (plan->workspace) m.library_workspaces += plan->workspace->bytes();
        if (plan->stats) m.replay_scratch += plan->stats->bytes();
        if (plan->grads) m.replay_scratch += plan->grads->bytes();
      }
    }
    OFFSIM_CUDA_CHECK(cudaSetDevice(r->gpu));
    m.device_used = device_used_bytes();
    return m;
  }

  sim::Status elementwise(StreamId stream, std::int64_t size_bytes, Buffer in,
                          Buffer out) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(StreamState * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(BufferState * bi, buffer_locked(in));
    OFFSIM_ASSIGN_OR_RETURN(BufferState * bo, buffer_locked(out));
    const std::int64_t each = std::min(
        {std::max<std::int64_t>(size_bytes, 0) / 2, bi->memory->bytes(), bo->memory->bytes()});
    const void* pi = bi->memory->get();
    void* po = bo->memory->get();
    push_locked(s->rank, "elementwise", [s, pi, po, each]() -> sim::Status {
      OFFSIM_CUDA_CHECK(cuda::launch_elementwise(pi, po, each, s->stream.get()));
      return sim::ok();
    });
    return sim::ok();
  }

  sim::Status host_compute(StreamId stream, std::int64_t size_bytes, Buffer host) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(StreamState * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(BufferState * h, buffer_locked(host));
    if (h->kind == MemoryKind::kDevice) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "host compute on a device buffer");
    }
    // size_bytes of traffic: each float is read and written (8 bytes).
    const std::size_t count = static_cast<std::size_t>(
        std::min(std::max<std::int64_t>(size_bytes, 0) / 8, h->memory->bytes() / 4));
    float* data = static_cast<float*>(h->memory->get());
    const unsigned threads = host_threads_;
    push_locked(s->rank, "host compute", [s, data, count, threads]() -> sim::Status {
      auto* pass = new HostPass{data, count, threads};
      const cudaError_t err = cudaLaunchHostFunc(s->stream.get(), run_host_pass, pass);
      if (err != cudaSuccess) {
        delete pass;
        return sim::fail(cuda_error(err, "cudaLaunchHostFunc"));
      }
      return sim::ok();
    });
    return sim::ok();
  }

  // NCCL is loaded by the first communicator (cuda/nccl_comm.h): a one-GPU replay never needs it.
  sim::Result<CommId> create_communicator(const std::vector<int>& ranks) override {
    if (ranks.empty())
      return sim::fail(sim::ErrorCode::kInvalidInput, "communicator with no ranks");
    std::vector<int> gpus;
    for (int r : ranks) {
      auto known = rank_state(r);
      if (!known) return sim::fail(known.error());
      gpus.push_back((*known)->gpu);
    }
    auto c = std::make_unique<CommState>();
    c->ranks = ranks;
    std::vector<std::int64_t> added;  // what the communicator took on each member GPU
    OFFSIM_ASSIGN_OR_RETURN(c->nccl, cuda::NcclComm::create_local(gpus, added));
    if (c->nccl) {
      for (std::size_t i = 0; i < ranks.size() && i < added.size(); ++i) {
        if (added[i] >= 0) ranks_[static_cast<std::size_t>(ranks[i])]->comm_bytes += added[i];
      }
    }
    std::lock_guard lock(work_.mutex());
    if (c->nccl) info_.comm_version = c->nccl->version();
    return CommId{comms_.add(std::move(c))};
  }

  sim::Result<CommUniqueId> new_comm_unique_id() override {
    return cuda::NcclComm::new_unique_id();
  }

  // ncclCommInitRankConfig (non-blocking) for local `rank` as NCCL rank `my_index` of `members`,
  // polled until it is ready; the other members call it in their processes with the same id.
  // A communicator that does not come up within the timeout (a peer that never joins) is
  // aborted and reported.
  sim::Result<CommId> join_communicator(int rank, int members, int my_index,
                                        const CommUniqueId& id) override {
    OFFSIM_ASSIGN_OR_RETURN(RankState * r, rank_state(rank));
    if (members < 1 || my_index < 0 || my_index >= members) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "joining a communicator as member {} of {}: not a member index", my_index,
                       members);
    }
    auto c = std::make_unique<CommState>();
    c->ranks = {rank};
    c->first_member = my_index;
    c->members = members;
    std::int64_t added = -1;
    OFFSIM_ASSIGN_OR_RETURN(
        c->nccl, cuda::NcclComm::join(r->gpu, members, my_index, id, aborted_query(), added));
    if (added >= 0) r->comm_bytes += added;
    std::lock_guard lock(work_.mutex());
    info_.comm_version = c->nccl->version();
    return CommId{comms_.add(std::move(c))};
  }

  sim::Status collective(StreamId stream, CommId comm, sim::CollectiveKind kind, Buffer buffer,
                         std::int64_t size_bytes, std::string_view op_name) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(StreamState * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(CommState * c, comm_locked(comm));
    OFFSIM_ASSIGN_OR_RETURN(BufferState * b, buffer_locked(buffer));
    OFFSIM_ASSIGN_OR_RETURN(int member, member_of(*c, s->rank, op_name));
    const std::int64_t bytes = std::min(std::max<std::int64_t>(size_bytes, 0), b->memory->bytes());
    char* p = static_cast<char*>(b->memory->get());
    if (!c->nccl) return cuda::collective_without_nccl(op_name);
    const cuda::NcclComm* nccl = c->nccl.get();
    ncclComm* nc = nccl->member(member);
    const int n = c->members > 0 ? c->members : static_cast<int>(c->ranks.size());
    const int nccl_rank = member + c->first_member;
    push_locked(s->rank, fmt::format("collective '{}'", op_name),
                [this, nccl, s, nc, n, nccl_rank, kind, bytes, p]() -> sim::Status {
                  return nccl->collective(nc, nccl_rank, n, kind, p, bytes, s->stream.get(),
                                          aborted_query());
                });
    return sim::ok();
  }

  sim::Status p2p(StreamId stream, CommId comm, int peer, bool send, Buffer buffer,
                  std::int64_t size_bytes, std::string_view op_name) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(StreamState * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(CommState * c, comm_locked(comm));
    OFFSIM_ASSIGN_OR_RETURN(BufferState * b, buffer_locked(buffer));
    OFFSIM_ASSIGN_OR_RETURN(int member, member_of(*c, s->rank, op_name));
    int other = peer;  // joined across processes: the peer is its NCCL rank
    if (c->members == 0) {
      OFFSIM_ASSIGN_OR_RETURN(other, member_of(*c, peer, op_name));
    } else if (peer < 0 || peer >= c->members || peer == c->first_member + member) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "p2p '{}': peer {} is not another member of a {}-member communicator",
                       op_name, peer, c->members);
    }
    const std::size_t bytes = static_cast<std::size_t>(
        std::min(std::max<std::int64_t>(size_bytes, 0), b->memory->bytes()));
    void* p = b->memory->get();
    if (!c->nccl) return cuda::p2p_without_nccl(op_name);
    const cuda::NcclComm* nccl = c->nccl.get();
    ncclComm* nc = nccl->member(member);
    push_locked(s->rank, fmt::format("p2p '{}'", op_name),
                [this, nccl, s, nc, other, send, bytes, p]() -> sim::Status {
                  return nccl->p2p(nc, other, send, p, bytes, s->stream.get(), aborted_query());
                });
    return sim::ok();
  }

  // The watchdog (device_skeleton.h): the workers' calls, then the GPUs' streams, each until
  // `timeout`; a failure or a timeout aborts the device and its NCCL communicators.
  sim::Status synchronize(std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    bool timed_out = false;
    {
      WorkQueues::Lock lock(work_.mutex());
      // Every call made on the workers (or a failure that makes waiting pointless).
      timed_out = !work_.wait_idle(lock, deadline, /*stop_on_error=*/true);
    }
    // Then the GPUs, polled so that a hang cannot outlast the deadline.
    if (!timed_out) timed_out = !poll_gpus(deadline);
    return end_synchronize(timed_out, timeout);
  }

  sim::Result<bool> completed(EventId event) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(EventState * e, event_locked(event));
    if (e->requested == 0) return true;
    if (e->enqueued < e->requested) return false;  // the record itself was never made
    const cudaError_t q = cudaEventQuery(e->event.get());
    if (q == cudaSuccess) return true;
    cudaGetLastError();
    return false;
  }

  sim::Result<sim::Duration> elapsed(EventId from, EventId to) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(EventState * a, event_locked(from));
    OFFSIM_ASSIGN_OR_RETURN(EventState * b, event_locked(to));
    if (a->rank != b->rank) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "elapsed(): events of ranks {} and {} (different GPUs)", a->rank, b->rank);
    }
    float ms = 0.0f;
    OFFSIM_CUDA_CHECK(cudaEventElapsedTime(&ms, a->event.get(), b->event.get()));
    return sim::Duration{static_cast<std::int64_t>(std::llround(static_cast<double>(ms) * 1e6))};
  }

 private:
  sim::Result<RankState*> rank_state(int rank) {
    if (rank < 0 || static_cast<std::size_t>(rank) >= ranks_.size()) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "rank {} is not in [0, {})", rank,
                       ranks_.size());
    }
    return ranks_[static_cast<std::size_t>(rank)].get();
  }
  sim::Result<StreamState*> stream_locked(StreamId id) { return streams_.get(id.index); }
  sim::Result<EventState*> event_locked(EventId id) { return events_.get(id.index); }
  sim::Result<BufferState*> buffer_locked(Buffer b) { return buffers_.get(b.index); }
  sim::Result<CommState*> comm_locked(CommId id) { return comms_.get(id.index); }
  static sim::Result<int> member_of(const CommState& c, int rank, std::string_view op_name) {
    return comm_member(c.ranks, rank, op_name);
  }

  // Work for local `rank`'s GPU, on its worker queue.
  void push_locked(int rank, std::string label, std::function<sim::Status()> run) {
    work_.push_locked(ranks_[static_cast<std::size_t>(rank)]->queue, std::move(label),
                      std::move(run));
  }

  // Turns true once the device aborts: a non-blocking NCCL call polled on a worker stops then.
  cuda::StopQuery aborted_query() {
    return [this] { return work_.aborted(); };
  }

  enum class GpuPoll { kDone, kBusy, kFailed };

  // One look at every stream and at NCCL's asynchronous errors; a failure is latched.
  GpuPoll poll_gpus_once() {
    bool all_done = true;
    {
      std::lock_guard lock(work_.mutex());
      if (work_.failed_locked()) return GpuPoll::kFailed;
      for (const auto& s : streams_) {
        const cudaError_t q = cudaStreamQuery(s->stream.get());
        if (q == cudaErrorNotReady) {
          all_done = false;
        } else if (q != cudaSuccess) {
          work_.fail_locked(cuda_error(q, fmt::format("stream '{}'", s->name)));
          return GpuPoll::kFailed;
        }
      }
    }
    if (std::optional<sim::Error> e = nccl_async_error()) {
      std::lock_guard lock(work_.mutex());
      work_.fail_locked(*e);
      return GpuPoll::kFailed;
    }
    return all_done ? GpuPoll::kDone : GpuPoll::kBusy;
  }

  // Polls the GPUs every 50 µs until they are done or failed (true) or `deadline` (false).
  bool poll_gpus(std::chrono::steady_clock::time_point deadline) {
    for (;;) {
      if (poll_gpus_once() != GpuPoll::kBusy) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // After a timeout (the watchdog fires: hung_) or a failure, the device aborts: the workers
  // give up, then the NCCL communicators are aborted. Returns the first error.
  sim::Status end_synchronize(bool timed_out, std::chrono::milliseconds timeout) {
    WorkQueues::Lock lock(work_.mutex());
    if (timed_out || work_.failed_locked()) {
      if (timed_out) {
        work_.fire_watchdog_locked(timeout, "NCCL communicators", "kernels on the GPU");
        hung_ = true;
      }
      work_.abort_locked();
      // Workers polling a non-blocking NCCL call stop at the abort; let them leave the
      // communicators before ncclCommAbort frees them (bounded: a stuck CUDA call must not
      // hold the watchdog).
      work_.wait_idle(lock, std::chrono::steady_clock::now() + std::chrono::seconds(2), false);
      lock.unlock();
      abort_comms(/*destroy=*/false);
      lock.lock();
      work_.wait_idle(lock, std::chrono::steady_clock::now() + std::chrono::seconds(10), false);
    }
    return work_.status_locked();
  }

  std::optional<sim::Error> nccl_async_error() {
    std::lock_guard lock(work_.mutex());
    for (const auto& c : comms_) {
      if (!c->nccl) continue;
      if (std::optional<sim::Error> e = c->nccl->async_error()) return e;
    }
    return std::nullopt;
  }

  // ncclCommAbort unblocks kernels and host calls waiting on peers; destroy=true is the orderly
  // end of a healthy device (every communicator finalized, then destroyed).
  void abort_comms(bool destroy) {
    if (destroy) {
      std::vector<std::unique_ptr<CommState>> comms;
      {
        std::lock_guard lock(work_.mutex());
        comms = comms_.take();
      }
      std::vector<cuda::NcclComm*> nccl;
      for (auto& c : comms) {
        if (c->nccl) nccl.push_back(c->nccl.get());
      }
      cuda::NcclComm::finalize_all(nccl);
      return;
    }
    std::lock_guard lock(work_.mutex());
    for (auto& c : comms_) {
      if (c->nccl) c->nccl->abort();
    }
  }

  // Teardown steps (see ~CudaDevice).
  // After a watchdog: cudaFree and cudaFreeHost synchronize the device; behind a kernel that
  // never ends they would never return. The process is about to report the watchdog error:
  // leave the memory to the driver, which reclaims it when the process exits.
  void leak_device_memory() {
    for (auto& b : buffers_) b->memory->leak();
    for (auto& s : streams_) static_cast<void>(s->workspace.release());
  }

  void synchronize_gpus() {
    for (auto& r : ranks_) {
      cudaSetDevice(r->gpu);
      cudaDeviceSynchronize();
    }
  }

  // Pool allocations still live go back before the pools.
  void free_pool_allocations() {
    for (auto& s : streams_) {
      RankState& r = *ranks_[static_cast<std::size_t>(s->rank)];
      for (auto& [key, a] : r.allocations) {
        if (a.ptr) cudaFreeAsync(a.ptr, s->stream.get());
      }
      r.allocations.clear();
    }
  }

  // GEMM and attention plans and the cuDNN handle of every GPU (after a watchdog, the attention
  // buffers and the cuDNN handle are left to the driver, as above).
  void release_rank_plans() {
    for (auto& r : ranks_) {
      cudaSetDevice(r->gpu);
      if (!hung_) cudaDeviceSynchronize();
      r->gemms.clear();
      for (auto& [key, plan] : r->attention) {
        if (!hung_) continue;
        for (auto* b : {plan->workspace.get(), plan->stats.get(), plan->grads.get()}) {
          if (b) b->leak();
        }
      }
      r->attention.clear();
      if (hung_) {
        static_cast<void>(r->dnn.release());
      } else {
        r->dnn.reset();
      }
    }
  }

  // The attention plan of `shape` on `rank`, made on first use (see AttentionPlan). cuDNN that
  // cannot be loaded, a shape its graphs do not take, or a cuDNN error while building or trying
  // the graphs all leave the fallback kernel, with the reason; only a CUDA failure is an error.
  sim::Result<AttentionPlan*> attention_plan(int rank, const sim::AttentionShape& shape) {
    OFFSIM_ASSIGN_OR_RETURN(RankState * r, rank_state(rank));
    std::lock_guard lock(attention_mu_);
    const AttentionKey key = attention_key(shape);
    auto it = r->attention.find(key);
    if (it != r->attention.end()) return it->second.get();
    auto plan = std::make_unique<AttentionPlan>();
    auto fallback = [&](std::string reason) {
      plan->fwd.reset();
      plan->bwd.reset();
      plan->workspace.reset();
      plan->stats.reset();
      plan->grads.reset();
      plan->choice = AttentionKernelChoice{false, "fallback", std::move(reason)};
    };
    plan->choice = AttentionKernelChoice{true, "cudnn_sdpa", ""};
    // An error: the GPU itself failed and no kernel would run.
    OFFSIM_ASSIGN_OR_RETURN(const std::string reason, build_cudnn_attention(*r, shape, *plan));
    if (!reason.empty()) fallback(reason);
    AttentionPlan* raw = plan.get();
    r->attention.emplace(key, std::move(plan));
    return raw;
  }

  // Builds the cuDNN graphs of `shape` into `plan` and runs each once (a graph that builds but
  // does not run falls back here, not in a measured step). Returns "" when built, else why the
  // fallback kernel runs instead (cuDNN missing, a shape its graphs do not take, a cuDNN error,
  // no device memory for its buffers); an error only when CUDA itself fails.
  sim::Result<std::string> build_cudnn_attention(RankState& r, const sim::AttentionShape& shape,
                                                 AttentionPlan& plan) {
    sim::Result<const cuda::CudnnApi*> loaded = cuda::cudnn_api();
    if (!loaded) return fmt::format("cuDNN missing: {}", loaded.error().message);
    const cuda::CudnnApi& api = **loaded;
    if (!shape.causal) {
      return std::string(
          "shape unsupported: non-causal attention (offsim's cuDNN graphs are causal)");
    }
    const std::int64_t kv_heads =
        shape.kv_heads > 0 && shape.heads % shape.kv_heads == 0 ? shape.kv_heads : shape.heads;
    OFFSIM_CUDA_CHECK(cudaSetDevice(r.gpu));
    if (!r.dnn) {
      cudnnHandle_t made_handle = nullptr;
      sim::Status made = api.check(api.Create(&made_handle), "cudnnCreate");
      if (!made) return fmt::format("cuDNN error: {}", made.error().message);
      r.dnn.reset(made_handle);
    }
    cudnnHandle_t dnn = r.dnn.get();
    auto dnn_failed = [](const sim::Error& e) {
      return fmt::format(
          "{}{}", e.code == sim::ErrorCode::kUnsupported ? "shape unsupported: " : "cuDNN error: ",
          e.message);
    };
    // Forward: the op's own heads (GQA by broadcast). Backward: heads equal, K and V expanded.
    cuda::SdpaShape fs{shape.batch, shape.heads,  shape.backward ? shape.heads : kv_heads,
                       shape.seq_q, shape.seq_kv, shape.head_dim};
    sim::Result<std::unique_ptr<cuda::CudnnSdpaForward>> fwd =
        cuda::CudnnSdpaForward::build(api, dnn, fs, /*with_stats=*/true);
    if (!fwd) return dnn_failed(fwd.error());
    plan.fwd = std::move(*fwd);
    std::int64_t ws = plan.fwd->workspace_bytes();
    if (shape.backward) {
      sim::Result<std::unique_ptr<cuda::CudnnSdpaBackward>> bwd =
          cuda::CudnnSdpaBackward::build(api, dnn, fs);
      if (!bwd) return dnn_failed(bwd.error());
      plan.bwd = std::move(*bwd);
      ws = std::max(ws, plan.bwd->workspace_bytes());
    }
    std::string out_of_memory;  // why the last device_buffer() gave nothing
    auto device_buffer = [&](std::int64_t bytes, const char* what) {
      void* p = nullptr;
      const std::int64_t n = std::max<std::int64_t>(bytes, kMinScratchBytes);
      const cudaError_t err = cudaMalloc(&p, static_cast<std::size_t>(n));
      if (err != cudaSuccess) {
        cudaGetLastError();
        out_of_memory =
            fmt::format("CUDA: out of memory on GPU {} for the cuDNN attention {} ({} bytes): {}",
                        r.gpu, what, n, cuda_error(err, "cudaMalloc").message);
        return std::unique_ptr<OwnedBuffer>();
      }
      return std::make_unique<OwnedBuffer>(MemoryKind::kDevice, p, n);
    };
    plan.workspace = device_buffer(ws, "workspace");
    if (!plan.workspace) return out_of_memory;
    plan.stats = device_buffer(shape.batch * shape.heads * shape.seq_q * 4, "statistics");
    if (!plan.stats) return out_of_memory;
    plan.q_bytes = shape.batch * shape.heads * shape.seq_q * shape.head_dim * 2;
    plan.kv_bytes = shape.batch * fs.kv_heads * shape.seq_kv * shape.head_dim * 2;
    if (plan.bwd) {
      // Backward operands kept for the steps: [K][V] (query heads) [dQ][dK][dV].
      plan.grads = device_buffer(4 * plan.kv_bytes + plan.q_bytes, "operands");
      if (!plan.grads) return out_of_memory;
      OFFSIM_CUDA_CHECK(cuda::launch_fill(plan.grads->get(), plan.grads->bytes(), 17, nullptr));
    }
    // A try-out on [Q][O][K][V] of random data, which also fills the statistics.
    std::unique_ptr<OwnedBuffer> trial =
        device_buffer(2 * plan.q_bytes + 2 * plan.kv_bytes, "try-out");
    if (!trial) return out_of_memory;
    char* q = static_cast<char*>(trial->get());
    char* o = q + plan.q_bytes;
    char* k = o + plan.q_bytes;
    char* v = k + plan.kv_bytes;
    OFFSIM_CUDA_CHECK(cuda::launch_fill(q, trial->bytes(), 19, nullptr));
    OFFSIM_CUDA_CHECK(cudaDeviceSynchronize());
    sim::Status tried = api.check(api.SetStream(dnn, nullptr), "cudnnSetStream");
    if (tried) {
      tried = plan.fwd->run(dnn, q, k, v, o, plan.workspace->get(), plan.stats->get());
    }
    if (tried && plan.bwd) {
      char* g = static_cast<char*>(plan.grads->get());
      const cuda::SdpaBackwardOperands x{q,
                                         k,
                                         v,
                                         o,
                                         o,
                                         plan.stats->get(),
                                         g + 2 * plan.kv_bytes,
                                         g + 2 * plan.kv_bytes + plan.q_bytes,
                                         g + 3 * plan.kv_bytes + plan.q_bytes};
      tried = plan.bwd->run(dnn, nullptr, x, plan.workspace->get());
    }
    const cudaError_t synced = cudaDeviceSynchronize();
    if (synced != cudaSuccess) {
      return sim::fail(cuda_error(synced, "cudaDeviceSynchronize (cuDNN SDPA try-out)"));
    }
    if (!tried) return fmt::format("cuDNN error: {}", tried.error().message);
    return std::string();
  }

  sim::Result<GemmPlan*> gemm_plan(RankState& r, const sim::GemmShape& g) {
    const auto key = std::make_tuple(g.m, g.n, g.k, g.batch, static_cast<int>(g.dtype));
    auto it = r.gemms.find(key);
    if (it != r.gemms.end()) return it->second.get();
    auto plan = std::make_unique<GemmPlan>();
    sim::Status made = make_gemm_plan(r, g, g.dtype, *plan);
    if (!made && g.dtype == sim::DType::kFp8) {
      plan = std::make_unique<GemmPlan>();  // no fp8 kernel on this GPU: run it as bf16
      made = make_gemm_plan(r, g, sim::DType::kBf16, *plan);
    }
    if (!made) return sim::fail(made.error());
    GemmPlan* raw = plan.get();
    r.gemms.emplace(key, std::move(plan));
    return raw;
  }

  static sim::Status make_gemm_plan(RankState& r, const sim::GemmShape& g, sim::DType dtype,
                                    GemmPlan& p) {
    p.ran_as = dtype;
    const cuda::GemmLayout l = cuda::gemm_layout(g, dtype);
    const cudaDataType_t in_t = cuda_type(l.input);
    const cudaDataType_t out_t = cuda_type(l.output);
    // fp32 accumulation and fp32 alpha/beta for every input type (the only scale type cuBLASLt
    // accepts with fp8 inputs, and the one training frameworks use for bf16/fp16); fp32 inputs
    // on TF32 tensor cores (see gemm_layout.h).
    const cublasComputeType_t compute =
        l.fast_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    OFFSIM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, compute, CUDA_R_32F));
    const cublasOperation_t ta = l.transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = l.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    OFFSIM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    OFFSIM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    // See gemm_layout.h: cuBLAS A = our B (k×n, ld k), B = our A (k×m, ld k), C = n×m (ld n).
    OFFSIM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, in_t, l.a.rows, l.a.cols, l.a.ld));
    OFFSIM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, in_t, l.b.rows, l.b.cols, l.b.ld));
    OFFSIM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, out_t, l.c.rows, l.c.cols, l.c.ld));
    if (l.batch_count > 1) {
      // BATCH_COUNT is int32_t, STRIDED_BATCH_OFFSET int64_t (elements), per cublasLt.h.
      const std::int32_t count = l.batch_count;
      for (auto [layout, stride] :
           {std::pair{p.a, l.a.batch_stride}, std::pair{p.b, l.b.batch_stride},
            std::pair{p.c, l.c.batch_stride}}) {
        OFFSIM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
            layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
        OFFSIM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
            layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
      }
    }
    OFFSIM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&p.pref));
    const std::uint64_t ws = kWorkspaceBytes;
    OFFSIM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        p.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    // No algorithm is reported either as found == 0 or as CUBLAS_STATUS_NOT_SUPPORTED.
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(r.lt.get(), p.op, p.a, p.b, p.c, p.c,
                                                             p.pref, 1, &result, &found);
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) {
      return sim::fail(cublas_error(static_cast<int>(st), "cublasLtMatmulAlgoGetHeuristic"));
    }
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || found == 0) {
      return sim::fail(sim::ErrorCode::kUnsupported,
                       "cuBLASLt has no algorithm for a {} GEMM {}x{}x{} (batch {}) on GPU {}{}",
                       sim::to_string(dtype), g.m, g.n, g.k, g.batch, r.gpu,
                       dtype == sim::DType::kFp8 && !cuda::fp8_shape_supported(g)
                           ? " (fp8 needs k % 16 == 0 and n % 8 == 0)"
                           : "");
    }
    p.algo = result.algo;
    return sim::ok();
  }

  int first_gpu_;
  unsigned host_threads_ = 1;  // per host-compute pass (see HostPass)
  DeviceInfo info_;
  std::vector<std::unique_ptr<RankState>> ranks_;
  // The skeleton: a worker queue per GPU, the first-error latch, the watchdog. Its mutex also
  // guards the tables below, the events' counters and hung_.
  WorkQueues work_;
  std::mutex attention_mu_;  // RankState::dnn and ::attention (never taken inside work_'s)
  std::mutex marks_mu_;      // RankState::marks (host functions of the marks)
  bool hung_ = false;        // a watchdog fired: skip calls that could block on the GPU at teardown
  HandleTable<StreamState> streams_{"stream"};
  HandleTable<EventState> events_{"event"};
  HandleTable<BufferState> buffers_{"buffer"};
  HandleTable<CommState> comms_{"communicator"};
};

}  // namespace

sim::Result<std::unique_ptr<Device>> make_cuda_device(int first_gpu, int ranks) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return sim::fail(cuda_error(err, "cudaGetDeviceCount"));
  }
  if (count == 0) {
    return sim::fail(sim::ErrorCode::kNoDevice, "no GPU: the CUDA driver sees no device");
  }
  if (first_gpu < 0 || ranks < 1 || first_gpu + ranks > count) {
    return sim::fail(sim::ErrorCode::kNoDevice,
                     "no GPU: {} GPU(s) needed from GPU {} on, but {} visible", ranks, first_gpu,
                     count);
  }
  auto device = std::make_unique<CudaDevice>(first_gpu, ranks);
  OFFSIM_RETURN_IF_ERROR(device->init());
  return std::unique_ptr<Device>(std::move(device));
}

std::vector<DeviceInfo> list_cuda_devices() {
  std::vector<DeviceInfo> out;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return out;
  }
  for (int i = 0; i < count; ++i) {
    DeviceInfo info = gpu_info(i, 1);
    info.note = fmt::format("GPU {}", i);
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace offsim::backends
