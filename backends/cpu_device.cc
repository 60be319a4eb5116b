#include "backends/cpu_device.h"
#include "backends/device_skeleton.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <tuple>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

namespace offsim::backends {
namespace {

using Clock = std::chrono::steady_clock;

// A stream is a worker queue of the skeleton (device_skeleton.h): its own thread, in order.
struct Stream {
  int rank = 0;
  std::string name;
  std::size_t queue = 0;
};

struct Event {
  int rank = 0;
  std::uint64_t requested = 0;  // records made (host side)
  std::uint64_t completed = 0;  // records executed
  Clock::time_point time;       // of the latest executed record
};

// Scratch memory: at most max_buffer_bytes real bytes, as floats so kernels can use it.
struct Storage {
  MemoryKind kind = MemoryKind::kDevice;
  int rank = 0;
  std::int64_t requested_bytes = 0;
  std::vector<float> data;
  std::int64_t real_bytes() const { return static_cast<std::int64_t>(data.size() * sizeof(float)); }
};

// One meeting of the members of a communicator (a collective) or of two ranks (a p2p).
struct Round {
  int arrived = 0;
  int departed = 0;
  bool done = false;
  std::string name;
  std::vector<std::pair<int, Storage*>> parts;  // (member index, buffer)
};

struct Comm {
  std::vector<int> ranks;
  std::vector<std::uint64_t> next_seq;  // per member, host side
  std::map<std::uint64_t, Round> rounds;
  std::map<std::tuple<int, int>, std::uint64_t> next_send, next_recv;  // (src, dst) member idx
  std::map<std::tuple<int, int, std::uint64_t>, Round> p2p_rounds;
};

struct Allocation {
  int rank = 0;
  std::int64_t bytes = 0;
};

struct RankPool {
  std::int64_t in_use = 0;
  std::int64_t high = 0;
  std::vector<MemoryMark> marks;  // in the order the streams reached them
};

void fill_nonzero(std::vector<float>& data, std::uint32_t seed) {
  std::uint32_t x = seed * 2654435761u + 1u;
  for (float& v : data) {
    x = x * 1664525u + 1013904223u;
    v = 0.5f + static_cast<float>(x >> 8) * (1.0f / 16777216.0f);  // in [0.5, 1.5)
  }
}

void gemm_f32(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n,
              std::int64_t k) {
  constexpr std::int64_t kBlock = 16;
  std::fill(c, c + m * n, 0.0f);
  for (std::int64_t i0 = 0; i0 < m; i0 += kBlock) {
    for (std::int64_t p0 = 0; p0 < k; p0 += kBlock) {
      const std::int64_t i1 = std::min(m, i0 + kBlock);
      const std::int64_t p1 = std::min(k, p0 + kBlock);
      for (std::int64_t i = i0; i < i1; ++i) {
        for (std::int64_t p = p0; p < p1; ++p) {
          const float av = a[i * k + p];
          for (std::int64_t j = 0; j < n; ++j) c[i * n + j] += av * b[p * n + j];
        }
      }
    }
  }
}

// Largest d <= cap with d*d*count floats fitting in `floats` (at least 1).
std::int64_t fit_dim(std::int64_t want, std::int64_t cap, std::int64_t floats, std::int64_t count) {
  std::int64_t d = std::max<std::int64_t>(1, std::min(want, cap));
  while (d > 1 && d * d * count > floats) --d;
  return d;
}

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(const CpuDeviceOptions& options) : options_(options) {
    OFFSIM_CHECK(options_.ranks >= 1);
    OFFSIM_CHECK(options_.max_buffer_bytes >= 64);
    pools_.resize(static_cast<std::size_t>(options_.ranks));
    info_.kind = DeviceKind::kCpu;
    info_.name = "cpu (simulated ranks)";
    info_.ranks = options_.ranks;
    info_.memory_bytes = options_.pool_capacity_bytes;
    info_.note = fmt::format(
        "scaled down: buffers <= {} bytes, GEMM dims <= {} (fp32, one batch), attention dims <= "
        "{} (one head); timings measure the replay, not a GPU",
        options_.max_buffer_bytes, options_.max_gemm_dim, options_.max_attention_dim);
  }

  // Teardown (device_skeleton.h): the streams stop first; the tables go with the device.
  ~CpuDevice() override { work_.stop(); }

  const DeviceInfo& info() const override { return info_; }

  sim::Result<StreamId> create_stream(int rank, const std::string& name) override {
    OFFSIM_RETURN_IF_ERROR(check_rank(rank));
    auto stream = std::make_unique<Stream>();
    stream->rank = rank;
    stream->name = name;
    stream->queue = work_.add_queue(name);
    std::lock_guard lock(work_.mutex());
    return StreamId{streams_.add(std::move(stream))};
  }

  sim::Result<EventId> create_event(int rank) override {
    OFFSIM_RETURN_IF_ERROR(check_rank(rank));
    std::lock_guard lock(work_.mutex());
    auto event = std::make_unique<Event>();
    event->rank = rank;
    return EventId{events_.add(std::move(event))};
  }

  sim::Status record(StreamId stream, EventId event) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(Stream * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(Event * e, event_locked(event));
    const std::uint64_t target = ++e->requested;
    push_locked(*s, "record", [this, e, target] {
      std::lock_guard l(work_.mutex());
      e->time = Clock::now();
      e->completed = std::max(e->completed, target);
      work_.notify_all();
      return sim::ok();
    });
    return sim::ok();
  }

  sim::Status wait(StreamId stream, EventId event) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(Stream * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(Event * e, event_locked(event));
    const std::uint64_t target = e->requested;  // CUDA: the most recent record at call time
    push_locked(*s, "wait for an event", [this, e, target]() -> sim::Status {
      WorkQueues::Lock l(work_.mutex());
      return work_.wait_locked(l, [&] { return e->completed >= target; });
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
    OFFSIM_ASSIGN_OR_RETURN(Stream * s, stream_locked(stream));
    const bool inject = alloc_calls_++ == options_.fail_alloc_at;
    const int rank = s->rank;
    push_locked(
        *s, fmt::format("allocate for '{}'", op_name),
        [this, rank, key, size_bytes, inject, name = std::string(op_name)]() -> sim::Status {
          std::lock_guard l(work_.mutex());
          RankPool& pool = pools_[static_cast<std::size_t>(rank)];
          if (inject || size_bytes > options_.pool_capacity_bytes - pool.in_use) {
            return sim::fail(sim::ErrorCode::kLimitExceeded,
                             "out of memory on rank {}: op '{}' requested {} bytes with {} "
                             "bytes in use of {} bytes{}",
                             rank, name, size_bytes, pool.in_use, options_.pool_capacity_bytes,
                             inject ? " (injected fault)" : "");
          }
          if (!allocations_.emplace(key, Allocation{rank, size_bytes}).second) {
            return sim::fail(sim::ErrorCode::kInternal,
                             "op '{}': allocation key {} is already in use", name, key);
          }
          pool.in_use += size_bytes;
          pool.high = std::max(pool.high, pool.in_use);
          return sim::ok();
        });
    return sim::ok();
  }

  sim::Status release(StreamId stream, std::uint64_t key) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(Stream * s, stream_locked(stream));
    push_locked(*s, "release", [this, key]() -> sim::Status {
      std::lock_guard l(work_.mutex());
      auto it = allocations_.find(key);
      if (it == allocations_.end()) {
        return sim::fail(sim::ErrorCode::kInternal, "release of allocation key {}, not allocated",
                         key);
      }
      pools_[static_cast<std::size_t>(it->second.rank)].in_use -= it->second.bytes;
      allocations_.erase(it);
      return sim::ok();
    });
    return sim::ok();
  }

  sim::Result<PoolUsage> pool_usage(int rank) override {
    OFFSIM_RETURN_IF_ERROR(check_rank(rank));
    std::lock_guard lock(work_.mutex());
    const RankPool& p = pools_[static_cast<std::size_t>(rank)];
    return PoolUsage{p.in_use, p.high, p.high};
  }

  sim::Status reset_pool_high_water(int rank) override {
    OFFSIM_RETURN_IF_ERROR(check_rank(rank));
    std::lock_guard lock(work_.mutex());
    RankPool& p = pools_[static_cast<std::size_t>(rank)];
    p.high = p.in_use;
    return sim::ok();
  }

  sim::Status mark_memory(StreamId stream, std::uint64_t tag) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(Stream * s, stream_locked(stream));
    const int rank = s->rank;
    push_locked(*s, "memory mark", [this, rank, tag] {
      std::lock_guard l(work_.mutex());
      RankPool& p = pools_[static_cast<std::size_t>(rank)];
      p.marks.push_back(MemoryMark{tag, p.in_use, p.in_use});  // no granularity: reserved = used
      return sim::ok();
    });
    return sim::ok();
  }

  sim::Result<std::vector<MemoryMark>> take_memory_marks(int rank) override {
    OFFSIM_RETURN_IF_ERROR(check_rank(rank));
    std::lock_guard lock(work_.mutex());
    return std::exchange(pools_[static_cast<std::size_t>(rank)].marks, {});
  }

  sim::Result<MemorySplit> memory_split(int rank) override {
    OFFSIM_RETURN_IF_ERROR(check_rank(rank));
    std::lock_guard lock(work_.mutex());
    MemorySplit m;
    m.plan_used_high = m.plan_reserved_high = pools_[static_cast<std::size_t>(rank)].high;
    for (const auto& st : storages_) {
      if (st->rank == rank && st->kind == MemoryKind::kDevice)
        m.replay_scratch += st->requested_bytes;
    }
    return m;
  }

  sim::Result<Buffer> scratch(int rank, MemoryKind kind, std::int64_t size_bytes) override {
    OFFSIM_RETURN_IF_ERROR(check_rank(rank));
    if (size_bytes < 0) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "scratch buffer of negative size {} bytes",
                       size_bytes);
    }
    auto storage = std::make_unique<Storage>();
    storage->kind = kind;
    storage->rank = rank;
    storage->requested_bytes = size_bytes;
    const std::int64_t real = std::clamp<std::int64_t>(size_bytes, 4, options_.max_buffer_bytes);
    storage->data.resize(static_cast<std::size_t>(real / 4));
    std::lock_guard lock(work_.mutex());
    fill_nonzero(storage->data, static_cast<std::uint32_t>(storages_.size()));
    return Buffer{storages_.add(std::move(storage)), kind, rank, size_bytes};
  }

  sim::Status copy(StreamId stream, Buffer dst, Buffer src, std::int64_t size_bytes) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(Stream * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(Storage * d, storage_locked(dst));
    OFFSIM_ASSIGN_OR_RETURN(Storage * from, storage_locked(src));
    const std::int64_t n = std::min({size_bytes, d->real_bytes(), from->real_bytes()});
    push_locked(*s, "copy", [d, from, n] {
      if (n > 0) std::memcpy(d->data.data(), from->data.data(), static_cast<std::size_t>(n));
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
    OFFSIM_ASSIGN_OR_RETURN(Stream * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(Storage * sa, storage_locked(a));
    OFFSIM_ASSIGN_OR_RETURN(Storage * sb, storage_locked(b));
    OFFSIM_ASSIGN_OR_RETURN(Storage * sc, storage_locked(c));
    const std::int64_t cap = options_.max_gemm_dim;
    const auto floats = [](const Storage* st) {
      return static_cast<std::int64_t>(st->data.size());
    };
    // Shrink each dimension to the cap, then until every operand fits its buffer.
    std::int64_t m = std::min(shape.m, cap), n = std::min(shape.n, cap), k = std::min(shape.k, cap);
    while (m * k > floats(sa) || k * n > floats(sb) || m * n > floats(sc)) {
      if (m >= n && m >= k && m > 1) {
        --m;
      } else if (n >= k && n > 1) {
        --n;
      } else if (k > 1) {
        --k;
      } else {
        break;
      }
    }
    push_locked(*s, "gemm", [sa, sb, sc, m, n, k] {
      gemm_f32(sa->data.data(), sb->data.data(), sc->data.data(), m, n, k);
      return sim::ok();
    });
    return sim::ok();
  }

  sim::Status attention(StreamId stream, const sim::AttentionShape& shape, Buffer qkv,
                        Buffer out) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(Stream * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(Storage * in, storage_locked(qkv));
    OFFSIM_ASSIGN_OR_RETURN(Storage * o, storage_locked(out));
    const std::int64_t cap = options_.max_attention_dim;
    const std::int64_t in_floats = static_cast<std::int64_t>(in->data.size());
    const std::int64_t out_floats = static_cast<std::int64_t>(o->data.size());
    // q, k, v each seq×dim in `in`; the output seq×dim in `out`.
    const std::int64_t seq =
        fit_dim(std::max(shape.seq_q, shape.seq_kv), cap, std::min(in_floats / 3, out_floats), 1);
    const std::int64_t dim =
        std::max<std::int64_t>(1, std::min({std::max<std::int64_t>(shape.head_dim, 1), cap,
                                            std::min(in_floats / 3, out_floats) / seq}));
    const bool causal = shape.causal;
    if (attention_calls_++ == options_.stall_attention_at) {
      push_locked(*s, "attention (injected hang)", [this]() -> sim::Status {
        WorkQueues::Lock l(work_.mutex());
        return work_.wait_locked(l, [] { return false; });
      });
      return sim::ok();
    }
    push_locked(*s, "attention", [in, o, seq, dim, causal] {
      const float* q = in->data.data();
      const float* kk = q + seq * dim;
      const float* v = kk + seq * dim;
      std::vector<float> p(static_cast<std::size_t>(seq));
      const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
      for (std::int64_t i = 0; i < seq; ++i) {
        const std::int64_t last = causal ? i : seq - 1;
        float mx = -INFINITY;
        for (std::int64_t j = 0; j <= last; ++j) {
          float dot = 0.0f;
          for (std::int64_t d = 0; d < dim; ++d) dot += q[i * dim + d] * kk[j * dim + d];
          p[static_cast<std::size_t>(j)] = dot * scale;
          mx = std::max(mx, dot * scale);
        }
        float sum = 0.0f;
        for (std::int64_t j = 0; j <= last; ++j) {
          float& pj = p[static_cast<std::size_t>(j)];
          pj = std::exp(pj - mx);
          sum += pj;
        }
        for (std::int64_t d = 0; d < dim; ++d) {
          float acc = 0.0f;
          for (std::int64_t j = 0; j <= last; ++j)
            acc += p[static_cast<std::size_t>(j)] * v[j * dim + d];
          o->data[static_cast<std::size_t>(i * dim + d)] = acc / sum;
        }
      }
      return sim::ok();
    });
    return sim::ok();
  }

  sim::Result<AttentionKernelChoice> prepare_attention(int rank,
                                                       const sim::AttentionShape& shape) override {
    OFFSIM_RETURN_IF_ERROR(check_rank(rank));
    if (!options_.attention_fallback) {
      return AttentionKernelChoice{false, "cpu reference",
                                   "the CPU device runs a scaled-down reference kernel"};
    }
    std::string reason = options_.attention_fallback(shape);
    if (reason.empty()) return AttentionKernelChoice{true, "cpu reference (as fused)", ""};
    return AttentionKernelChoice{false, "cpu reference (as fallback)", std::move(reason)};
  }

  sim::Status elementwise(StreamId stream, std::int64_t size_bytes, Buffer in,
                          Buffer out) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(Stream * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(Storage * src, storage_locked(in));
    OFFSIM_ASSIGN_OR_RETURN(Storage * dst, storage_locked(out));
    const std::size_t n =
        static_cast<std::size_t>(std::min({std::max<std::int64_t>(size_bytes, 0) / 2,
                                           src->real_bytes(), dst->real_bytes()}) /
                                 4);
    push_locked(*s, "elementwise", [src, dst, n] {
      for (std::size_t i = 0; i < n; ++i) dst->data[i] = src->data[i] * 0.5f + 0.25f;
      return sim::ok();
    });
    return sim::ok();
  }

  sim::Status host_compute(StreamId stream, std::int64_t size_bytes, Buffer host) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(Stream * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(Storage * h, storage_locked(host));
    const std::size_t n = static_cast<std::size_t>(
        std::min(std::max<std::int64_t>(size_bytes, 0), h->real_bytes()) / 4);
    push_locked(*s, "host compute", [h, n] {
      for (std::size_t i = 0; i < n; ++i) h->data[i] = h->data[i] * 0.999f + 0.001f;
      return sim::ok();
    });
    return sim::ok();
  }

  sim::Result<CommId> create_communicator(const std::vector<int>& ranks) override {
    if (ranks.empty()) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "communicator with no ranks");
    }
    for (int r : ranks) OFFSIM_RETURN_IF_ERROR(check_rank(r));
    std::lock_guard lock(work_.mutex());
    auto comm = std::make_unique<Comm>();
    comm->ranks = ranks;
    comm->next_seq.assign(ranks.size(), 0);
    return CommId{comms_.add(std::move(comm))};
  }

  sim::Status collective(StreamId stream, CommId comm, sim::CollectiveKind kind, Buffer buffer,
                         std::int64_t size_bytes, std::string_view op_name) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(Stream * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(Comm * c, comm_locked(comm));
    OFFSIM_ASSIGN_OR_RETURN(Storage * buf, storage_locked(buffer));
    OFFSIM_ASSIGN_OR_RETURN(int member, member_locked(*c, s->rank, op_name));
    const std::uint64_t seq = c->next_seq[static_cast<std::size_t>(member)]++;
    const bool stall = collective_calls_++ == options_.stall_collective_at;
    const std::int64_t bytes = std::max<std::int64_t>(size_bytes, 0);
    std::string label = fmt::format("collective '{}'", op_name);
    if (stall) {
      // The injected hang: this rank never arrives; only an abort ends the wait.
      push_locked(*s, label + " (injected hang)", [this]() -> sim::Status {
        WorkQueues::Lock l(work_.mutex());
        return work_.wait_locked(l, [] { return false; });
      });
      return sim::ok();
    }
    const int size = static_cast<int>(c->ranks.size());
    push_locked(*s, std::move(label),
                [this, c, seq, member, buf, kind, bytes, size, name = std::string(op_name)] {
                  return meet(
                      c->rounds, seq, size, member, buf, name,
                      [kind, bytes](Round& r) { reduce(r, kind, bytes); },
                      [c, seq] { c->rounds.erase(seq); });
                });
    return sim::ok();
  }

  sim::Status p2p(StreamId stream, CommId comm, int peer, bool send, Buffer buffer,
                  std::int64_t size_bytes, std::string_view op_name) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(Stream * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(Comm * c, comm_locked(comm));
    OFFSIM_ASSIGN_OR_RETURN(Storage * buf, storage_locked(buffer));
    OFFSIM_ASSIGN_OR_RETURN(int member, member_locked(*c, s->rank, op_name));
    OFFSIM_ASSIGN_OR_RETURN(int other, member_locked(*c, peer, op_name));
    const int src = send ? member : other;
    const int dst = send ? other : member;
    auto& counter = send ? c->next_send[{src, dst}] : c->next_recv[{src, dst}];
    const auto key = std::make_tuple(src, dst, counter++);
    const std::int64_t bytes = std::max<std::int64_t>(size_bytes, 0);
    // Part 0 is the sender's buffer: the last of the two to arrive copies it to the receiver.
    push_locked(
        *s, fmt::format("p2p '{}'", op_name),
        [this, c, key, send, buf, bytes, name = std::string(op_name)] {
          return meet(
              c->p2p_rounds, key, 2, send ? 0 : 1, buf, name,
              [bytes](Round& r) {
                const Storage* from = r.parts[0].first == 0 ? r.parts[0].second : r.parts[1].second;
                Storage* to = r.parts[0].first == 0 ? r.parts[1].second : r.parts[0].second;
                const std::int64_t n = std::min({bytes, from->real_bytes(), to->real_bytes()});
                if (n > 0)
                  std::memcpy(to->data.data(), from->data.data(), static_cast<std::size_t>(n));
              },
              [c, key] { c->p2p_rounds.erase(key); });
        });
    return sim::ok();
  }

  // Across processes the CPU device moves bytes through MpiDevice's MPI transport; the id and the
  // join exist so that replay --mpi agrees on communicators the way it does on GPUs (the id is
  // random, as NCCL's is, so only a broadcast makes the members agree).
  sim::Result<CommUniqueId> new_comm_unique_id() override {
    std::random_device entropy;
    CommUniqueId id{};
    for (char& c : id) c = static_cast<char>(entropy() & 0xffu);
    return id;
  }
  sim::Result<CommId> join_communicator(int rank, int members, int my_index,
                                        const CommUniqueId& id) override {
    (void)id;
    if (members < 1 || my_index < 0 || my_index >= members) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "joining a communicator as member {} of {}: not a member index", my_index,
                       members);
    }
    return create_communicator({rank});  // this process's member only
  }

  sim::Status host_function(StreamId stream, Buffer buffer, std::string_view label,
                            const HostFunction& fn) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(Stream * s, stream_locked(stream));
    OFFSIM_ASSIGN_OR_RETURN(Storage * st, storage_locked(buffer));
    push_locked(*s, std::string(label), [this, st, fn] {
      const std::function<bool()> aborted = [this] { return work_.aborted(); };
      return fn(st->data.data(), st->real_bytes(), aborted);
    });
    return sim::ok();
  }

  // The watchdog (device_skeleton.h): work still pending at the deadline is reported and
  // aborted; every stream then finishes (its blocked work gives up, the rest is skipped).
  sim::Status synchronize(std::chrono::milliseconds timeout) override {
    WorkQueues::Lock lock(work_.mutex());
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    if (!work_.wait_idle(lock, deadline, /*stop_on_error=*/false)) {
      work_.fire_watchdog_locked(timeout, "communicators", "");
      work_.wait_all_idle(lock);
    }
    return work_.status_locked();
  }

  sim::Result<bool> completed(EventId event) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(Event * e, event_locked(event));
    return e->completed >= e->requested;
  }

  sim::Result<sim::Duration> elapsed(EventId from, EventId to) override {
    std::lock_guard lock(work_.mutex());
    OFFSIM_ASSIGN_OR_RETURN(Event * a, event_locked(from));
    OFFSIM_ASSIGN_OR_RETURN(Event * b, event_locked(to));
    if (a->completed == 0 || b->completed == 0 || a->completed < a->requested ||
        b->completed < b->requested) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "elapsed(): event {} or {} has not completed its latest record", from.index,
                       to.index);
    }
    return std::chrono::duration_cast<sim::Duration>(b->time - a->time);
  }

 private:
  sim::Status check_rank(int rank) const {
    if (rank < 0 || rank >= options_.ranks) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "rank {} is not in [0, {})", rank,
                       options_.ranks);
    }
    return sim::ok();
  }

  sim::Result<Stream*> stream_locked(StreamId id) { return streams_.get(id.index); }
  sim::Result<Event*> event_locked(EventId id) { return events_.get(id.index); }
  sim::Result<Storage*> storage_locked(Buffer b) { return storages_.get(b.index); }
  sim::Result<Comm*> comm_locked(CommId id) { return comms_.get(id.index); }
  static sim::Result<int> member_locked(const Comm& c, int rank, std::string_view op_name) {
    return comm_member(c.ranks, rank, op_name);
  }

  void push_locked(Stream& s, std::string label, std::function<sim::Status()> run) {
    work_.push_locked(s.queue, std::move(label), std::move(run));
  }

  // Arrive at the meeting `key` of `size` parties; the last to arrive runs `work` (outside the
  // lock: every other party is parked until done) and the last to leave runs `erase`.
  template <class Map, class Key, class Work, class Erase>
  sim::Status meet(Map& rounds, const Key& key, int size, int member, Storage* buf,
                   const std::string& name, Work work, Erase erase) {
    WorkQueues::Lock l(work_.mutex());
    Round& r = rounds[key];
    r.name = name;
    r.parts.emplace_back(member, buf);
    if (++r.arrived == size) {
      l.unlock();
      work(r);
      l.lock();
      r.done = true;
      work_.notify_all();
    } else {
      OFFSIM_RETURN_IF_ERROR(work_.wait_locked(l, [&] { return r.done; }));
    }
    if (++r.departed == size) erase();
    return sim::ok();
  }

  // In-process data movement of a collective over at most max_buffer_bytes per part.
  static void reduce(Round& r, sim::CollectiveKind kind, std::int64_t bytes) {
    std::sort(r.parts.begin(), r.parts.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    std::size_t n = static_cast<std::size_t>(bytes / 4);
    for (const auto& [m, st] : r.parts) n = std::min(n, st->data.size());
    const std::size_t parts = r.parts.size();
    if (n == 0 || parts < 2) return;
    const std::size_t chunk = n / parts;
    switch (kind) {
      case sim::CollectiveKind::kAllReduce:
      case sim::CollectiveKind::kReduceScatter:
        for (std::size_t i = 0; i < n; ++i) {
          float sum = 0.0f;
          for (const auto& p : r.parts) sum += p.second->data[i];
          for (const auto& p : r.parts) p.second->data[i] = sum;
        }
        break;
      case sim::CollectiveKind::kAllGather:
        for (std::size_t src = 0; src < parts; ++src) {
          const float* from = r.parts[src].second->data.data() + src * chunk;
          for (std::size_t dst = 0; dst < parts; ++dst) {
            if (dst != src)
              std::copy(from, from + chunk, r.parts[dst].second->data.data() + src * chunk);
          }
        }
        break;
      case sim::CollectiveKind::kBroadcast:
        for (std::size_t dst = 1; dst < parts; ++dst) {
          std::copy(r.parts[0].second->data.begin(),
                    r.parts[0].second->data.begin() + static_cast<std::ptrdiff_t>(n),
                    r.parts[dst].second->data.begin());
        }
        break;
      case sim::CollectiveKind::kAllToAll:
        for (std::size_t a = 0; a < parts; ++a) {
          for (std::size_t b = a + 1; b < parts; ++b) {
            std::swap_ranges(r.parts[a].second->data.data() + b * chunk,
                             r.parts[a].second->data.data() + (b + 1) * chunk,
                             r.parts[b].second->data.data() + a * chunk);
          }
        }
        break;
    }
  }

  CpuDeviceOptions options_;
  DeviceInfo info_;

  // The skeleton: one worker queue per stream, the first-error latch, the watchdog. Its mutex
  // also guards the tables below, the pools, the rounds and the fault counters.
  WorkQueues work_;
  HandleTable<Stream> streams_{"stream"};
  HandleTable<Event> events_{"event"};
  HandleTable<Storage> storages_{"buffer"};
  HandleTable<Comm> comms_{"communicator"};
  std::unordered_map<std::uint64_t, Allocation> allocations_;
  std::vector<RankPool> pools_;
  std::int64_t alloc_calls_ = 0;
  std::int64_t collective_calls_ = 0;
  std::int64_t attention_calls_ = 0;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(const CpuDeviceOptions& options) {
  return std::make_unique<CpuDevice>(options);
}

}  // namespace offsim::backends
