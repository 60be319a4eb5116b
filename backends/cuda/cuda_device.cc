#include "backends/cuda/cuda_device.h"
#include "backends/device_tables.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#if OFFSIM_HAVE_NCCL
#include "backends/cuda/nccl_api.h"
#endif

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cudnn_api.h"
#include "backends/cuda/cudnn_sdpa.h"
#include "backends/cuda/gemm_layout.h"
#include "backends/cuda/kernels.h"

namespace offsim::backends {
namespace {

using cuda::cublas_error;
using cuda::cuda_error;

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
using UniqueStream = std::unique_ptr<CUstream_st, StreamDestroy>;
using UniqueEvent = std::unique_ptr<CUevent_st, EventDestroy>;

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

struct Task {
  std::string label;
  std::function<sim::Status()> run;
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
  std::uint64_t requested = 0;  // records asked for (caller thread), guarded by mu_
  std::uint64_t enqueued = 0;   // records made on the GPU's stream (worker), guarded by mu_
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

struct RankState {
  int gpu = 0;
  cudaMemPool_t pool = nullptr;
  cublasLtHandle_t lt = nullptr;
  // Touched only by this rank's worker thread.
  std::unordered_map<std::uint64_t, PoolAllocation> allocations;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, int>,
           std::unique_ptr<GemmPlan>>
      gemms;
  cudnnHandle_t dnn = nullptr;  // made with the first attention shape (guarded by attention_mu_)
  std::map<AttentionKey, std::unique_ptr<AttentionPlan>> attention;  // guarded by attention_mu_
  // Device memory in use (cudaMemGetInfo) by the context alone, and what cuBLASLt's handle and
  // NCCL's communicators added when they were made.
  std::int64_t context_bytes = 0;
  std::int64_t blas_handle_bytes = 0;
  std::int64_t comm_bytes = 0;
  std::vector<MemoryMark> marks;  // guarded by CudaDevice::marks_mu_
  // Worker queue, guarded by CudaDevice::mu_.
  std::deque<Task> queue;
  bool busy = false;
  std::string current;
  std::thread thread;
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

// Device memory in use on the current GPU (total − free), -1 when unknown.
std::int64_t device_used_bytes() {
  std::size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return static_cast<std::int64_t>(total_b - free_b);
}

struct CommState {
  std::vector<int> ranks;  // local ranks, member index = position
  // A communicator joined across processes (join_communicator): its `members` NCCL ranks live in
  // several processes and ranks[0] is NCCL rank `first_member`. 0 members: every member is local.
  int first_member = 0;
  int members = 0;
#if OFFSIM_HAVE_NCCL
  const cuda::NcclApi* nccl = nullptr;  // null: one member and no NCCL, nothing to exchange
  std::vector<ncclComm_t> comms;        // by member index
#endif
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

// NCCL's version once it is loaded (by the first communicator); "" before.
std::string nccl_version_string(int v) {
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

  ~CudaDevice() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      aborted_ = true;
    }
    cv_.notify_all();
    for (auto& r : ranks_) {
      if (r->thread.joinable()) r->thread.join();
    }
    abort_comms(/*destroy=*/!hung_);
    if (hung_) {
      // cudaFree and cudaFreeHost synchronize the device; behind a kernel that never ends they
      // would never return. The process is about to report the watchdog error: leave the
      // memory to the driver, which reclaims it when the process exits.
      for (auto& b : buffers_) b->memory->leak();
      for (auto& s : streams_) static_cast<void>(s->workspace.release());
    } else {
      for (auto& r : ranks_) {
        cudaSetDevice(r->gpu);
        cudaDeviceSynchronize();
      }
    }
    // Pool allocations still live go back before the pools.
    for (auto& s : streams_) {
      RankState& r = *ranks_[static_cast<std::size_t>(s->rank)];
      for (auto& [key, a] : r.allocations) {
        if (a.ptr) cudaFreeAsync(a.ptr, s->stream.get());
      }
      r.allocations.clear();
    }
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
      if (r->dnn && !hung_) {
        if (auto dnn = cuda::cudnn_api()) (*dnn)->Destroy(r->dnn);
      }
    }
    buffers_.clear();
    events_.clear();
    streams_.clear();
    for (auto& r : ranks_) {
      if (r->lt) cublasLtDestroy(r->lt);
      if (r->pool) cudaMemPoolDestroy(r->pool);
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
      OFFSIM_CUDA_CHECK(cudaMemPoolCreate(&r.pool, &props));
      std::uint64_t keep = ~std::uint64_t{0};  // never shrink between steps
      OFFSIM_CUDA_CHECK(cudaMemPoolSetAttribute(r.pool, cudaMemPoolAttrReleaseThreshold, &keep));
      int no = 0;  // reuse must not add hidden cross-stream dependencies
      OFFSIM_CUDA_CHECK(
          cudaMemPoolSetAttribute(r.pool, cudaMemPoolReuseAllowInternalDependencies, &no));
      const std::int64_t before_lt = device_used_bytes();
      OFFSIM_CUBLAS_CHECK(cublasLtCreate(&r.lt));
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
    for (std::size_t i = 0; i < ranks_.size(); ++i) {
      RankState* r = ranks_[i].get();
      r->thread = std::thread([this, r] { run_worker(*r); });
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
    std::lock_guard lock(mu_);
    streams_.push_back(std::move(s));
    return StreamId{static_cast<std::uint32_t>(streams_.size() - 1)};
  }

  sim::Result<EventId> create_event(int rank) override {
    OFFSIM_ASSIGN_OR_RETURN(RankState * r, rank_state(rank));
    OFFSIM_CUDA_CHECK(cudaSetDevice(r->gpu));
    auto e = std::make_unique<EventState>();
    e->rank = rank;
    cudaEvent_t raw = nullptr;
    OFFSIM_CUDA_CHECK(cudaEventCreate(&raw));
    e->event.reset(raw);
    std::lock_guard lock(mu_);
    events_.push_back(std::move(e));
    return EventId{static_cast<std::uint32_t>(events_.size() - 1)};
  }

  sim::Status record(StreamId stream, EventId event) override {
    std::lock_guard lock(mu_);
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
      std::lock_guard l(mu_);
      e->enqueued = std::max(e->enqueued, target);
      cv_.notify_all();
      return sim::ok();
    });
    return sim::ok();
  }

  sim::Status wait(StreamId stream, EventId event) override {
    std::lock_guard lock(mu_);
    OFFSIM_ASSIGN_OR_RETURN(StreamState * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(EventState * e, event_locked(event));
    const std::uint64_t target = e->requested;
    if (target == 0) return sim::ok();  // never recorded: nothing to wait for
    push_locked(s->rank, "wait for an event", [this, s, e, target]() -> sim::Status {
      {
        // The record may belong to another GPU's worker: wait until it has been made.
        std::unique_lock l(mu_);
        cv_.wait(l, [&] { return aborted_ || e->enqueued >= target; });
        if (e->enqueued < target) return aborted_error();
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
    std::lock_guard lock(mu_);
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
                    const cudaError_t err = cudaMallocFromPoolAsync(
                        &p, static_cast<std::size_t>(size_bytes), r->pool, s->stream.get());
                    if (err != cudaSuccess) {
                      cudaGetLastError();
                      std::uint64_t used = 0;
                      cudaMemPoolGetAttribute(r->pool, cudaMemPoolAttrUsedMemCurrent, &used);
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
    std::lock_guard lock(mu_);
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
    OFFSIM_CUDA_CHECK(cudaMemPoolGetAttribute(r->pool, cudaMemPoolAttrUsedMemCurrent, &cur));
    OFFSIM_CUDA_CHECK(cudaMemPoolGetAttribute(r->pool, cudaMemPoolAttrUsedMemHigh, &high));
    OFFSIM_CUDA_CHECK(
        cudaMemPoolGetAttribute(r->pool, cudaMemPoolAttrReservedMemHigh, &reserved_high));
    return PoolUsage{static_cast<std::int64_t>(cur), static_cast<std::int64_t>(high),
                     static_cast<std::int64_t>(reserved_high)};
  }

  sim::Status reset_pool_high_water(int rank) override {
    OFFSIM_ASSIGN_OR_RETURN(RankState * r, rank_state(rank));
    // The pool's counters move when the worker makes its cudaMallocFromPoolAsync calls, so the
    // reset goes through the same queue: allocations queued before it (warm-up) stay out of
    // the new period even when the worker is behind the caller.
    std::lock_guard lock(mu_);
    push_locked(rank, "reset the pool's high-water marks", [r]() -> sim::Status {
      std::uint64_t zero = 0;  // the only value allowed: resets each mark to the current value
      OFFSIM_CUDA_CHECK(cudaMemPoolSetAttribute(r->pool, cudaMemPoolAttrUsedMemHigh, &zero));
      OFFSIM_CUDA_CHECK(cudaMemPoolSetAttribute(r->pool, cudaMemPoolAttrReservedMemHigh, &zero));
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
      std::lock_guard lock(mu_);
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
    std::lock_guard lock(mu_);
    buffers_.push_back(std::move(b));
    return Buffer{static_cast<std::uint32_t>(buffers_.size() - 1), kind, rank, size_bytes};
  }

  sim::Status copy(StreamId stream, Buffer dst, Buffer src, std::int64_t size_bytes) override {
    std::lock_guard lock(mu_);
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
    std::lock_guard lock(mu_);
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
      OFFSIM_CUBLAS_CHECK(cublasLtMatmul(r->lt, plan->op, &alpha, pb, plan->a, pa, plan->b, &beta,
                                         pc, plan->c, pc, plan->c, &plan->algo, s->workspace.get(),
                                         kWorkspaceBytes, s->stream.get()));
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
      std::lock_guard lock(mu_);
      OFFSIM_ASSIGN_OR_RETURN(StreamState * s, stream_locked(stream));
      rank = s->rank;
    }
    // Prepared before the replay's steps; a caller that did not gets it prepared here.
    OFFSIM_ASSIGN_OR_RETURN(AttentionPlan * plan, attention_plan(rank, shape));
    std::lock_guard lock(mu_);
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
                      OFFSIM_RETURN_IF_ERROR(
                          api->check(api->SetStream(r->dnn, s->stream.get()), "cudnnSetStream"));
                      return plan->fwd->run(r->dnn, pin, pin + q_bytes, pin + q_bytes + kv_bytes,
                                            pout, plan->workspace->get(), plan->stats->get());
                    });
        return sim::ok();
      }
      // Backward: Q from the operands, K and V expanded to the query heads, O and dO both the
      // output buffer (read only), the gradients into the plan's scratch.
      push_locked(s->rank, "attention (cuDNN SDPA backward)",
                  [api, r, s, plan, pin, pout]() -> sim::Status {
                    OFFSIM_RETURN_IF_ERROR(
                        api->check(api->SetStream(r->dnn, s->stream.get()), "cudnnSetStream"));
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
                    return plan->bwd->run(r->dnn, s->stream.get(), x, plan->workspace->get());
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
    std::lock_guard lock(mu_);
    OFFSIM_ASSIGN_OR_RETURN(StreamState * s, stream_locked(stream));
    RankState* r = ranks_[static_cast<std::size_t>(s->rank)].get();
    push_locked(s->rank, "memory mark", [this, r, s, tag]() -> sim::Status {
      // The stream-ordered allocator reserves when cudaMallocFromPoolAsync is called, so the
      // reserved bytes are read now, on the worker, in issue order; the used bytes at the mark
      // come from the plan's allocations in the marks' device order (a host function may not
      // call CUDA).
      std::uint64_t reserved = 0;
      OFFSIM_CUDA_CHECK(
          cudaMemPoolGetAttribute(r->pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
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
    {
      std::lock_guard lock(mu_);
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
    std::lock_guard lock(mu_);
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
    std::lock_guard lock(mu_);
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

  sim::Result<CommId> create_communicator(const std::vector<int>& ranks) override {
    if (ranks.empty())
      return sim::fail(sim::ErrorCode::kInvalidInput, "communicator with no ranks");
    for (int r : ranks) {
      auto known = rank_state(r);
      if (!known) return sim::fail(known.error());
    }
    auto c = std::make_unique<CommState>();
    c->ranks = ranks;
#if OFFSIM_HAVE_NCCL
    // NCCL is loaded here, by the first communicator: a one-GPU replay never needs it.
    auto api = cuda::nccl_api();
    if (!api) {
      if (ranks.size() > 1) {
        return sim::fail(sim::with_context(
            api.error(), fmt::format("collectives between {} GPUs: ", ranks.size())));
      }
      // One member: a collective has nothing to exchange and runs as nothing.
    } else {
      OFFSIM_RETURN_IF_ERROR(init_nccl_comm(*c, **api));
    }
#else
    if (ranks.size() > 1) {
      return sim::fail(sim::ErrorCode::kUnsupported,
                       "collectives between {} GPUs: offsim was built without NCCL", ranks.size());
    }
#endif
    std::lock_guard lock(mu_);
    comms_.push_back(std::move(c));
    return CommId{static_cast<std::uint32_t>(comms_.size() - 1)};
  }

  sim::Result<CommUniqueId> new_comm_unique_id() override {
#if OFFSIM_HAVE_NCCL
    auto api = cuda::nccl_api();
    if (!api) return sim::fail(sim::with_context(api.error(), "communicator across processes: "));
    ncclUniqueId nid{};
    OFFSIM_RETURN_IF_ERROR((*api)->check((*api)->GetUniqueId(&nid), "ncclGetUniqueId"));
    static_assert(sizeof nid == sizeof(CommUniqueId), "NCCL's unique id is 128 bytes");
    CommUniqueId id{};
    std::memcpy(id.data(), &nid, sizeof nid);
    return id;
#else
    return sim::fail(sim::ErrorCode::kUnsupported,
                     "communicators across processes: offsim was built without NCCL");
#endif
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
#if OFFSIM_HAVE_NCCL
    constexpr auto kJoinTimeout = std::chrono::seconds(120);
    OFFSIM_ASSIGN_OR_RETURN(const cuda::NcclApi* api, cuda::nccl_api());
    ncclUniqueId nid{};
    std::memcpy(&nid, id.data(), sizeof nid);
    if (cudaSetDevice(r->gpu) != cudaSuccess) {
      return sim::fail(cuda_error(cudaGetLastError(), "cudaSetDevice (communicator join)"));
    }
    const std::int64_t used_before = device_used_bytes();
    ncclConfig_t config = cuda::nonblocking_config();
    c->comms.assign(1, nullptr);
    sim::Status status =
        api->check(api->CommInitRankConfig(&c->comms[0], members, nid, my_index, &config),
                   "ncclCommInitRankConfig");
    const auto deadline = std::chrono::steady_clock::now() + kJoinTimeout;
    if (status) {
      status = api->settle(c->comms[0], "ncclCommInitRankConfig", [&] {
        std::lock_guard lock(mu_);
        return aborted_ || std::chrono::steady_clock::now() >= deadline;
      });
    }
    if (!status) {
      if (c->comms[0]) api->CommAbort(c->comms[0]);
      return sim::fail(sim::with_context(
          status.error(),
          fmt::format("NCCL communicator across processes, member {} of {} on GPU {} (NCCL {}, "
                      "{}; timeout {} s): ",
                      my_index, members, r->gpu, nccl_version_string(api->version), api->file,
                      kJoinTimeout.count())));
    }
    c->nccl = api;
    if (used_before >= 0) {
      r->comm_bytes += std::max<std::int64_t>(device_used_bytes() - used_before, 0);
    }
    cudaGetLastError();
    std::lock_guard lock(mu_);
    info_.comm_version = nccl_version_string(api->version);
    comms_.push_back(std::move(c));
    return CommId{static_cast<std::uint32_t>(comms_.size() - 1)};
#else
    (void)r;
    (void)id;
    return sim::fail(sim::ErrorCode::kUnsupported,
                     "communicators across processes: offsim was built without NCCL");
#endif
  }

  sim::Status collective(StreamId stream, CommId comm, sim::CollectiveKind kind, Buffer buffer,
                         std::int64_t size_bytes, std::string_view op_name) override {
    std::lock_guard lock(mu_);
    OFFSIM_ASSIGN_OR_RETURN(StreamState * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(CommState * c, comm_locked(comm));
    OFFSIM_ASSIGN_OR_RETURN(BufferState * b, buffer_locked(buffer));
    OFFSIM_ASSIGN_OR_RETURN(int member, member_of(*c, s->rank, op_name));
    const std::int64_t bytes = std::min(std::max<std::int64_t>(size_bytes, 0), b->memory->bytes());
    char* p = static_cast<char*>(b->memory->get());
#if OFFSIM_HAVE_NCCL
    if (!c->nccl) {  // one member without NCCL: nothing to exchange
      (void)member;
      (void)kind;
      (void)bytes;
      (void)p;
      return sim::ok();
    }
    const cuda::NcclApi* api = c->nccl;
    ncclComm_t nc = c->comms[static_cast<std::size_t>(member)];
    const int n = c->members > 0 ? c->members : static_cast<int>(c->ranks.size());
    member += c->first_member;  // the NCCL rank
    push_locked(
        s->rank, fmt::format("collective '{}'", op_name),
        [this, api, s, nc, n, member, kind, bytes, p]() -> sim::Status {
          cudaStream_t st = s->stream.get();
          const std::size_t floats = static_cast<std::size_t>(bytes / 4);
          const std::size_t chunk = static_cast<std::size_t>(bytes / n);
          const char* call = "";
          ncclResult_t res = ncclSuccess;
          switch (kind) {
            case sim::CollectiveKind::kAllReduce:
              call = "ncclAllReduce";
              res = api->AllReduce(p, p, floats, ncclFloat, ncclSum, nc, st);
              break;
            case sim::CollectiveKind::kAllGather:  // in place: our chunk at our offset
              call = "ncclAllGather";
              res = api->AllGather(p + member * chunk, p, chunk, ncclInt8, nc, st);
              break;
            case sim::CollectiveKind::kReduceScatter:
              call = "ncclReduceScatter";
              res = api->ReduceScatter(p, p + member * (floats / n) * 4, floats / n, ncclFloat,
                                       ncclSum, nc, st);
              break;
            case sim::CollectiveKind::kBroadcast:
              call = "ncclBroadcast";
              res = api->Broadcast(p, p, static_cast<std::size_t>(bytes), ncclInt8, 0, nc, st);
              break;
            case sim::CollectiveKind::kAllToAll: {
              // Sends from the buffer's first half, receives into its second half.
              const std::size_t part = static_cast<std::size_t>(bytes / 2 / n);
              OFFSIM_RETURN_IF_ERROR(api->check(api->GroupStart(), "ncclGroupStart"));
              // The group is closed on every path: a thread left inside a group would defer
              // (and so lose) every later NCCL call it makes.
              ncclResult_t first = ncclSuccess;
              const char* failed = "";
              for (int peer = 0; peer < n; ++peer) {
                first = api->Send(p + peer * part, part, ncclInt8, peer, nc, st);
                if (first != ncclSuccess && first != ncclInProgress) {
                  failed = "ncclSend (all-to-all)";
                  break;
                }
                first = api->Recv(p + bytes / 2 + peer * part, part, ncclInt8, peer, nc, st);
                if (first != ncclSuccess && first != ncclInProgress) {
                  failed = "ncclRecv (all-to-all)";
                  break;
                }
              }
              const ncclResult_t ended = api->GroupEnd();
              OFFSIM_RETURN_IF_ERROR(api->check(first, failed));
              call = "ncclGroupEnd (all-to-all)";
              res = ended;
              break;
            }
          }
          OFFSIM_RETURN_IF_ERROR(api->check(res, call));
          if (res == ncclInProgress) return settle(*api, nc, call);
          return sim::ok();
        });
    return sim::ok();
#else
    (void)kind;
    (void)p;
    (void)bytes;
    return sim::fail(sim::ErrorCode::kUnsupported, "collective '{}': offsim was built without NCCL",
                     op_name);
#endif
  }

  sim::Status p2p(StreamId stream, CommId comm, int peer, bool send, Buffer buffer,
                  std::int64_t size_bytes, std::string_view op_name) override {
    std::lock_guard lock(mu_);
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
#if OFFSIM_HAVE_NCCL
    if (!c->nccl) {
      return sim::fail(sim::ErrorCode::kUnsupported,
                       "p2p '{}' inside a one-member communicator (NCCL not loaded)", op_name);
    }
    const cuda::NcclApi* api = c->nccl;
    ncclComm_t nc = c->comms[static_cast<std::size_t>(member)];
    push_locked(s->rank, fmt::format("p2p '{}'", op_name),
                [this, api, s, nc, other, send, bytes, p]() -> sim::Status {
                  const char* call = send ? "ncclSend" : "ncclRecv";
                  const ncclResult_t res =
                      send ? api->Send(p, bytes, ncclInt8, other, nc, s->stream.get())
                           : api->Recv(p, bytes, ncclInt8, other, nc, s->stream.get());
                  OFFSIM_RETURN_IF_ERROR(api->check(res, call));
                  if (res == ncclInProgress) return settle(*api, nc, call);
                  return sim::ok();
                });
    return sim::ok();
#else
    (void)member;
    (void)other;
    (void)send;
    (void)bytes;
    (void)p;
    return sim::fail(sim::ErrorCode::kUnsupported, "p2p '{}': offsim was built without NCCL",
                     op_name);
#endif
  }

  sim::Status synchronize(std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    bool timed_out = false;
    {
      std::unique_lock lock(mu_);
      // Every call made on the workers (or a failure that makes waiting pointless).
      timed_out =
          !cv_.wait_until(lock, deadline, [&] { return all_idle_locked() || first_error_; });
    }
    // Then the GPUs, polled so that a hang cannot outlast the deadline.
    while (!timed_out) {
      bool all_done = true;
      {
        std::lock_guard lock(mu_);
        if (first_error_) break;
        for (const auto& s : streams_) {
          const cudaError_t q = cudaStreamQuery(s->stream.get());
          if (q == cudaErrorNotReady) {
            all_done = false;
          } else if (q != cudaSuccess) {
            set_error_locked(cuda_error(q, fmt::format("stream '{}'", s->name)));
            break;
          }
        }
        if (first_error_) break;
      }
      if (std::optional<sim::Error> e = nccl_async_error()) {
        std::lock_guard lock(mu_);
        set_error_locked(*e);
        break;
      }
      if (all_done) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    std::unique_lock lock(mu_);
    if (timed_out || first_error_) {
      if (timed_out) {
        std::string pending;
        for (const auto& r : ranks_) {
          if (!r->busy && r->queue.empty()) continue;
          pending += fmt::format("{}GPU {}: {} ({} more queued)", pending.empty() ? "" : "; ",
                                 r->gpu, r->busy ? r->current : "not started", r->queue.size());
        }
        set_error_locked(sim::Error{
            sim::ErrorCode::kDevice,
            fmt::format("watchdog: work did not finish within {} ms; NCCL communicators "
                        "aborted. Pending: {}",
                        timeout.count(), pending.empty() ? "kernels on the GPU" : pending)});
        hung_ = true;
      }
      aborted_ = true;
      cv_.notify_all();
      // Workers polling a non-blocking NCCL call stop at aborted_; let them leave the
      // communicators before ncclCommAbort frees them (bounded: a stuck CUDA call must not
      // hold the watchdog).
      cv_.wait_for(lock, std::chrono::seconds(2), [&] { return all_idle_locked(); });
      lock.unlock();
      abort_comms(/*destroy=*/false);
      lock.lock();
      cv_.wait_for(lock, std::chrono::seconds(10), [&] { return all_idle_locked(); });
    }
    if (first_error_) return sim::fail(*first_error_);
    return sim::ok();
  }

  sim::Result<bool> completed(EventId event) override {
    std::lock_guard lock(mu_);
    OFFSIM_ASSIGN_OR_RETURN(EventState * e, event_locked(event));
    if (e->requested == 0) return true;
    if (e->enqueued < e->requested) return false;  // the record itself was never made
    const cudaError_t q = cudaEventQuery(e->event.get());
    if (q == cudaSuccess) return true;
    cudaGetLastError();
    return false;
  }

  sim::Result<sim::Duration> elapsed(EventId from, EventId to) override {
    std::lock_guard lock(mu_);
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
  static sim::Status aborted_error() {
    return sim::fail(sim::ErrorCode::kCancelled, "aborted after an earlier error");
  }

  sim::Result<RankState*> rank_state(int rank) {
    if (rank < 0 || static_cast<std::size_t>(rank) >= ranks_.size()) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "rank {} is not in [0, {})", rank,
                       ranks_.size());
    }
    return ranks_[static_cast<std::size_t>(rank)].get();
  }
  sim::Result<StreamState*> stream_locked(StreamId id) {
    return table_entry(streams_, id.index, "stream");
  }
  sim::Result<EventState*> event_locked(EventId id) {
    return table_entry(events_, id.index, "event");
  }
  sim::Result<BufferState*> buffer_locked(Buffer b) {
    return table_entry(buffers_, b.index, "buffer");
  }
  sim::Result<CommState*> comm_locked(CommId id) {
    return table_entry(comms_, id.index, "communicator");
  }
  static sim::Result<int> member_of(const CommState& c, int rank, std::string_view op_name) {
    return comm_member(c.ranks, rank, op_name);
  }

  void push_locked(int rank, std::string label, std::function<sim::Status()> run) {
    ranks_[static_cast<std::size_t>(rank)]->queue.push_back(Task{std::move(label), std::move(run)});
    cv_.notify_all();
  }

  bool all_idle_locked() const {
    return std::all_of(ranks_.begin(), ranks_.end(),
                       [](const auto& r) { return !r->busy && r->queue.empty(); });
  }

  void set_error_locked(sim::Error error) {
    if (!first_error_) first_error_ = std::move(error);
  }

  std::optional<sim::Error> nccl_async_error() {
#if OFFSIM_HAVE_NCCL
    std::lock_guard lock(mu_);
    for (const auto& c : comms_) {
      if (!c->nccl) continue;
      for (ncclComm_t nc : c->comms) {
        if (!nc) continue;  // aborted
        ncclResult_t async = ncclSuccess;
        if (c->nccl->CommGetAsyncError(nc, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress) {
          return cuda::nccl_error(static_cast<int>(async), c->nccl->GetErrorString(async),
                                  "a collective (ncclCommGetAsyncError)");
        }
      }
    }
#endif
    return std::nullopt;
  }

#if OFFSIM_HAVE_NCCL
  // Waits for a non-blocking NCCL call on `comm` to finish; stops when the device aborts.
  sim::Status settle(const cuda::NcclApi& api, ncclComm_t comm, std::string_view call) {
    return api.settle(comm, call, [this] {
      std::lock_guard lock(mu_);
      return aborted_;
    });
  }

  // One NCCL rank per member GPU: ncclCommInitRankConfig (non-blocking) for each member inside
  // one group, then bounded polling until every rank is ready. A communicator that does not come
  // up within kCommInitTimeout is aborted and reported.
  sim::Status init_nccl_comm(CommState& c, const cuda::NcclApi& api) {
    constexpr auto kCommInitTimeout = std::chrono::seconds(60);
    const int n = static_cast<int>(c.ranks.size());
    ncclUniqueId id{};
    OFFSIM_RETURN_IF_ERROR(api.check(api.GetUniqueId(&id), "ncclGetUniqueId"));
    c.comms.assign(c.ranks.size(), nullptr);
    // What the communicator takes on each member GPU (NCCL may allocate more at its first
    // collective; memory_split()'s device figure shows that).
    std::vector<std::int64_t> used_before(c.ranks.size(), -1);
    for (std::size_t i = 0; i < c.ranks.size(); ++i) {
      if (cudaSetDevice(ranks_[static_cast<std::size_t>(c.ranks[i])]->gpu) == cudaSuccess) {
        used_before[i] = device_used_bytes();
      }
      cudaGetLastError();
    }
    ncclConfig_t config = cuda::nonblocking_config();
    OFFSIM_RETURN_IF_ERROR(api.check(api.GroupStart(), "ncclGroupStart"));
    ncclResult_t first = ncclSuccess;
    for (int i = 0; i < n; ++i) {
      const int gpu = ranks_[static_cast<std::size_t>(c.ranks[static_cast<std::size_t>(i)])]->gpu;
      if (cudaSetDevice(gpu) != cudaSuccess) {
        cudaGetLastError();
        first = ncclUnhandledCudaError;
        break;
      }
      first = api.CommInitRankConfig(&c.comms[static_cast<std::size_t>(i)], n, id, i, &config);
      if (first != ncclSuccess && first != ncclInProgress) break;
    }
    const ncclResult_t ended = api.GroupEnd();
    auto abort_all = [&] {
      for (ncclComm_t& nc : c.comms) {
        if (nc) api.CommAbort(nc);
        nc = nullptr;
      }
    };
    sim::Status status = api.check(first, "ncclCommInitRankConfig");
    if (status) status = api.check(ended, "ncclGroupEnd (communicator creation)");
    const auto deadline = std::chrono::steady_clock::now() + kCommInitTimeout;
    for (std::size_t i = 0; status && i < c.comms.size(); ++i) {
      status = api.settle(c.comms[i], "ncclCommInitRankConfig",
                          [&] { return std::chrono::steady_clock::now() >= deadline; });
    }
    if (!status) {
      abort_all();
      return sim::fail(sim::with_context(
          status.error(),
          fmt::format("NCCL communicator over {} GPU(s) (NCCL {}, {}; timeout {} s): ", n,
                      nccl_version_string(api.version), api.file, kCommInitTimeout.count())));
    }
    c.nccl = &api;
    for (std::size_t i = 0; i < c.ranks.size(); ++i) {
      RankState& member = *ranks_[static_cast<std::size_t>(c.ranks[i])];
      if (used_before[i] < 0 || cudaSetDevice(member.gpu) != cudaSuccess) continue;
      member.comm_bytes += std::max<std::int64_t>(device_used_bytes() - used_before[i], 0);
    }
    cudaGetLastError();
    std::lock_guard lock(mu_);
    info_.comm_version = nccl_version_string(api.version);
    return sim::ok();
  }
#endif

  // ncclCommAbort unblocks kernels and host calls waiting on peers; destroy=true is the orderly
  // end of a healthy device.
  void abort_comms(bool destroy) {
#if OFFSIM_HAVE_NCCL
    std::vector<std::unique_ptr<CommState>> comms;
    {
      std::lock_guard lock(mu_);
      if (destroy) {
        comms = std::move(comms_);
        comms_.clear();
      }
    }
    if (destroy) {
      // All members of a communicator live in this process and are finalized together: one
      // thread finalizing them one by one could wait on a peer it has not finalized yet.
      for (auto& c : comms) {
        if (!c->nccl) continue;
        const cuda::NcclApi& api = *c->nccl;
        api.GroupStart();
        for (ncclComm_t nc : c->comms) {
          if (nc) api.CommFinalize(nc);
        }
        api.GroupEnd();
        // Non-blocking communicators finalize in the background: wait (bounded) for each to
        // finish before destroying it, and abort one that does not.
        bool finished = true;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        for (ncclComm_t nc : c->comms) {
          if (!nc) continue;
          const sim::Status done = api.settle(
              nc, "ncclCommFinalize", [&] { return std::chrono::steady_clock::now() >= deadline; });
          if (!done) finished = false;
        }
        for (ncclComm_t nc : c->comms) {
          if (nc) finished ? api.CommDestroy(nc) : api.CommAbort(nc);
        }
      }
      return;
    }
    std::lock_guard lock(mu_);
    for (auto& c : comms_) {
      if (!c->nccl) continue;
      for (ncclComm_t& nc : c->comms) {
        if (nc) c->nccl->CommAbort(nc);
        nc = nullptr;
      }
    }
#else
    (void)destroy;
#endif
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
    sim::Status built = build_cudnn_attention(*r, shape, *plan);
    if (!built) {
      const sim::Error& e = built.error();
      bool falls_back = false;
      for (const char* prefix :
           {"cuDNN missing", "cuDNN error", "shape unsupported", "CUDA: out of memory"}) {
        falls_back = falls_back || e.message.rfind(prefix, 0) == 0;
      }
      if (!falls_back) return sim::fail(e);  // the GPU itself failed: no kernel would run
      fallback(e.message);
    }
    AttentionPlan* raw = plan.get();
    r->attention.emplace(key, std::move(plan));
    return raw;
  }

  // Builds the cuDNN graphs of `shape` into `plan` and runs each once (a graph that builds but
  // does not run falls back here, not in a measured step). Errors name what was missing.
  sim::Status build_cudnn_attention(RankState& r, const sim::AttentionShape& shape,
                                    AttentionPlan& plan) {
    sim::Result<const cuda::CudnnApi*> loaded = cuda::cudnn_api();
    if (!loaded) {
      return sim::fail(sim::ErrorCode::kUnsupported, "cuDNN missing: {}", loaded.error().message);
    }
    const cuda::CudnnApi& api = **loaded;
    if (!shape.causal) {
      return sim::fail(sim::ErrorCode::kUnsupported,
                       "shape unsupported: non-causal attention (offsim's cuDNN graphs are "
                       "causal)");
    }
    const std::int64_t kv_heads =
        shape.kv_heads > 0 && shape.heads % shape.kv_heads == 0 ? shape.kv_heads : shape.heads;
    OFFSIM_CUDA_CHECK(cudaSetDevice(r.gpu));
    if (!r.dnn) {
      sim::Status made = api.check(api.Create(&r.dnn), "cudnnCreate");
      if (!made) {
        r.dnn = nullptr;
        return sim::fail(made.error().code, "cuDNN error: {}", made.error().message);
      }
    }
    auto dnn_failed = [](const sim::Error& e) {
      return sim::fail(
          e.code, "{}{}",
          e.code == sim::ErrorCode::kUnsupported ? "shape unsupported: " : "cuDNN error: ",
          e.message);
    };
    // Forward: the op's own heads (GQA by broadcast). Backward: heads equal, K and V expanded.
    cuda::SdpaShape fs{shape.batch, shape.heads,  shape.backward ? shape.heads : kv_heads,
                       shape.seq_q, shape.seq_kv, shape.head_dim};
    sim::Result<std::unique_ptr<cuda::CudnnSdpaForward>> fwd =
        cuda::CudnnSdpaForward::build(api, r.dnn, fs, /*with_stats=*/true);
    if (!fwd) return dnn_failed(fwd.error());
    plan.fwd = std::move(*fwd);
    std::int64_t ws = plan.fwd->workspace_bytes();
    if (shape.backward) {
      sim::Result<std::unique_ptr<cuda::CudnnSdpaBackward>> bwd =
          cuda::CudnnSdpaBackward::build(api, r.dnn, fs);
      if (!bwd) return dnn_failed(bwd.error());
      plan.bwd = std::move(*bwd);
      ws = std::max(ws, plan.bwd->workspace_bytes());
    }
    auto device_buffer = [&](std::int64_t bytes,
                             const char* what) -> sim::Result<std::unique_ptr<OwnedBuffer>> {
      void* p = nullptr;
      const std::int64_t n = std::max<std::int64_t>(bytes, kMinScratchBytes);
      const cudaError_t err = cudaMalloc(&p, static_cast<std::size_t>(n));
      if (err != cudaSuccess) {
        cudaGetLastError();
        return sim::fail(sim::ErrorCode::kLimitExceeded,
                         "CUDA: out of memory on GPU {} for the cuDNN attention {} ({} bytes): {}",
                         r.gpu, what, n, cuda_error(err, "cudaMalloc").message);
      }
      return std::make_unique<OwnedBuffer>(MemoryKind::kDevice, p, n);
    };
    OFFSIM_ASSIGN_OR_RETURN(plan.workspace, device_buffer(ws, "workspace"));
    OFFSIM_ASSIGN_OR_RETURN(
        plan.stats, device_buffer(shape.batch * shape.heads * shape.seq_q * 4, "statistics"));
    plan.q_bytes = shape.batch * shape.heads * shape.seq_q * shape.head_dim * 2;
    plan.kv_bytes = shape.batch * fs.kv_heads * shape.seq_kv * shape.head_dim * 2;
    if (plan.bwd) {
      // Backward operands kept for the steps: [K][V] (query heads) [dQ][dK][dV].
      OFFSIM_ASSIGN_OR_RETURN(plan.grads,
                              device_buffer(4 * plan.kv_bytes + plan.q_bytes, "operands"));
      OFFSIM_CUDA_CHECK(cuda::launch_fill(plan.grads->get(), plan.grads->bytes(), 17, nullptr));
    }
    // A try-out on [Q][O][K][V] of random data, which also fills the statistics.
    OFFSIM_ASSIGN_OR_RETURN(std::unique_ptr<OwnedBuffer> trial,
                            device_buffer(2 * plan.q_bytes + 2 * plan.kv_bytes, "try-out"));
    char* q = static_cast<char*>(trial->get());
    char* o = q + plan.q_bytes;
    char* k = o + plan.q_bytes;
    char* v = k + plan.kv_bytes;
    OFFSIM_CUDA_CHECK(cuda::launch_fill(q, trial->bytes(), 19, nullptr));
    OFFSIM_CUDA_CHECK(cudaDeviceSynchronize());
    sim::Status tried = api.check(api.SetStream(r.dnn, nullptr), "cudnnSetStream");
    if (tried) {
      tried = plan.fwd->run(r.dnn, q, k, v, o, plan.workspace->get(), plan.stats->get());
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
      tried = plan.bwd->run(r.dnn, nullptr, x, plan.workspace->get());
    }
    const cudaError_t synced = cudaDeviceSynchronize();
    if (synced != cudaSuccess) {
      return sim::fail(cuda_error(synced, "cudaDeviceSynchronize (cuDNN SDPA try-out)"));
    }
    if (!tried) return sim::fail(tried.error().code, "cuDNN error: {}", tried.error().message);
    return sim::ok();
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
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(r.lt, p.op, p.a, p.b, p.c, p.c, p.pref, 1, &result, &found);
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

  void run_worker(RankState& r) {
    cudaSetDevice(r.gpu);
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !r.queue.empty(); });
      if (r.queue.empty()) return;
      Task task = std::move(r.queue.front());
      r.queue.pop_front();
      r.busy = true;
      r.current = task.label;
      const bool skip = aborted_ || first_error_.has_value();
      lock.unlock();
      sim::Status status = skip ? sim::ok() : task.run();
      lock.lock();
      if (!status) {
        set_error_locked(sim::Error{status.error().code,
                                    fmt::format("GPU {}: {}", r.gpu, status.error().message)});
        aborted_ = true;
      }
      r.busy = false;
      r.current.clear();
      cv_.notify_all();
    }
  }

  int first_gpu_;
  unsigned host_threads_ = 1;  // per host-compute pass (see HostPass)
  DeviceInfo info_;
  std::vector<std::unique_ptr<RankState>> ranks_;
  std::mutex mu_;
  std::mutex attention_mu_;  // RankState::dnn and ::attention (never taken inside mu_)
  std::mutex marks_mu_;      // RankState::marks (host functions of the marks)
  std::condition_variable cv_;
  bool stop_ = false;
  bool aborted_ = false;
  bool hung_ = false;  // a watchdog fired: skip calls that could block on the GPU at teardown
  std::optional<sim::Error> first_error_;
  std::vector<std::unique_ptr<StreamState>> streams_;
  std::vector<std::unique_ptr<EventState>> events_;
  std::vector<std::unique_ptr<BufferState>> buffers_;
  std::vector<std::unique_ptr<CommState>> comms_;
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
