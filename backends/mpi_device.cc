#include "backends/mpi_device.h"
#include "backends/device_skeleton.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace offsim::backends {
namespace {

// A communicator of the wrapper: either the inner device's (every member local) or an MPI group.
struct CommEntry {
  bool remote = false;
  bool joined = false;  // remote, but the inner device's communicator (NCCL) carries it
  CommId inner;
  MPI_Comm mpi = MPI_COMM_NULL;
  std::vector<int> members;  // global ranks, sorted (MPI rank = position)
  int me = 0;                // this process's position
  std::uint64_t next_collective = 0;
  std::map<std::tuple<int, int>, std::uint64_t> next_p2p;  // (src, dst) positions
};

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<std::size_t>(len));
}

class MpiDevice final : public Device {
 public:
  MpiDevice(std::unique_ptr<Device> inner, const MpiDeviceOptions& options)
      : inner_(std::move(inner)), options_(options) {
    info_ = inner_->info();
    info_.name += " over MPI";
    int version = 0, subversion = 0;
    MPI_Get_version(&version, &subversion);
    info_.comm_version = fmt::format("MPI {}.{}", version, subversion);
    int flag = 0;
    int* ub = nullptr;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    // MPI guarantees at least 32767; half the space each for collectives and p2p.
    tag_space_ = flag && ub ? static_cast<std::uint64_t>(*ub) / 2 : 16383;
  }

  const DeviceInfo& info() const override { return info_; }
  sim::Result<StreamId> create_stream(int rank, const std::string& name) override {
    return inner_->create_stream(rank, name);
  }
  sim::Result<EventId> create_event(int rank) override { return inner_->create_event(rank); }
  sim::Status record(StreamId stream, EventId event) override {
    return inner_->record(stream, event);
  }
  sim::Status wait(StreamId stream, EventId event) override { return inner_->wait(stream, event); }
  sim::Status allocate(StreamId stream, std::uint64_t key, std::int64_t size_bytes,
                       std::string_view op_name) override {
    return inner_->allocate(stream, key, size_bytes, op_name);
  }
  sim::Status release(StreamId stream, std::uint64_t key) override {
    return inner_->release(stream, key);
  }
  sim::Result<PoolUsage> pool_usage(int rank) override { return inner_->pool_usage(rank); }
  sim::Status reset_pool_high_water(int rank) override {
    return inner_->reset_pool_high_water(rank);
  }
  sim::Result<Buffer> scratch(int rank, MemoryKind kind, std::int64_t size_bytes) override {
    return inner_->scratch(rank, kind, size_bytes);
  }
  sim::Status copy(StreamId stream, Buffer dst, Buffer src, std::int64_t size_bytes) override {
    return inner_->copy(stream, dst, src, size_bytes);
  }
  sim::Status gemm(StreamId stream, const sim::GemmShape& shape, Buffer a, Buffer b,
                   Buffer c) override {
    return inner_->gemm(stream, shape, a, b, c);
  }
  sim::Status attention(StreamId stream, const sim::AttentionShape& shape, Buffer qkv,
                        Buffer out) override {
    return inner_->attention(stream, shape, qkv, out);
  }
  sim::Status elementwise(StreamId stream, std::int64_t size_bytes, Buffer in,
                          Buffer out) override {
    return inner_->elementwise(stream, size_bytes, in, out);
  }
  sim::Status host_compute(StreamId stream, std::int64_t size_bytes, Buffer host) override {
    return inner_->host_compute(stream, size_bytes, host);
  }
  sim::Status host_function(StreamId stream, Buffer buffer, std::string_view label,
                            const HostFunction& fn) override {
    return inner_->host_function(stream, buffer, label, fn);
  }
  sim::Status synchronize(std::chrono::milliseconds timeout) override {
    return inner_->synchronize(timeout);
  }
  sim::Result<bool> completed(EventId event) override { return inner_->completed(event); }
  sim::Status mark_memory(StreamId stream, std::uint64_t tag) override {
    return inner_->mark_memory(stream, tag);
  }
  sim::Result<std::vector<MemoryMark>> take_memory_marks(int rank) override {
    return inner_->take_memory_marks(rank);
  }
  sim::Result<MemorySplit> memory_split(int rank) override { return inner_->memory_split(rank); }
  sim::Result<AttentionKernelChoice> prepare_attention(int rank,
                                                       const sim::AttentionShape& shape) override {
    return inner_->prepare_attention(rank, shape);
  }
  sim::Result<CommUniqueId> new_comm_unique_id() override { return inner_->new_comm_unique_id(); }
  sim::Result<CommId> join_communicator(int rank, int members, int my_index,
                                        const CommUniqueId& id) override {
    return inner_->join_communicator(rank, members, my_index, id);
  }
  sim::Result<sim::Duration> elapsed(EventId from, EventId to) override {
    return inner_->elapsed(from, to);
  }

  sim::Result<CommId> create_communicator(const std::vector<int>& ranks) override {
    auto entry = std::make_unique<CommEntry>();
    const bool all_local = std::all_of(ranks.begin(), ranks.end(),
                                       [&](int r) { return r >= 0 && r < options_.local_ranks; });
    if (all_local) {
      OFFSIM_ASSIGN_OR_RETURN(entry->inner, inner_->create_communicator(ranks));
    } else {
      for (int r : ranks) {
        if (r < 0 || r >= static_cast<int>(options_.globals.size())) {
          return sim::fail(sim::ErrorCode::kInvalidInput,
                           "communicator member {} is not in [0, {}) (local and remote ranks)", r,
                           options_.globals.size());
        }
        entry->members.push_back(options_.globals[static_cast<std::size_t>(r)]);
      }
      std::sort(entry->members.begin(), entry->members.end());
      auto it = options_.groups.find(entry->members);
      if (it == options_.groups.end()) {
        return sim::fail(sim::ErrorCode::kInternal,
                         "no MPI communicator was set up for ranks {} (the processes agree on "
                         "the groups before the replay)",
                         fmt::join(entry->members, ","));
      }
      entry->remote = true;
      entry->mpi = it->second;
      const int self = options_.globals[0];
      entry->me = static_cast<int>(std::find(entry->members.begin(), entry->members.end(), self) -
                                   entry->members.begin());
      if (auto j = options_.joined.find(entry->members); j != options_.joined.end()) {
        entry->joined = true;
        entry->inner = j->second;
      }
    }
    return CommId{comms_.add(std::move(entry))};
  }

  sim::Status collective(StreamId stream, CommId comm, sim::CollectiveKind kind, Buffer buffer,
                         std::int64_t size_bytes, std::string_view op_name) override {
    OFFSIM_ASSIGN_OR_RETURN(CommEntry * c, entry(comm));
    if (!c->remote || c->joined) {
      return inner_->collective(stream, c->inner, kind, buffer, size_bytes, op_name);
    }
    const int tag = static_cast<int>(2 * (c->next_collective++ % tag_space_));
    const std::int64_t bytes = std::max<std::int64_t>(size_bytes, 0);
    return inner_->host_function(
        stream, buffer, fmt::format("collective '{}' over MPI", op_name),
        [this, c, kind, bytes, tag, name = std::string(op_name)](
            void* data, std::int64_t real, const std::function<bool()>& aborted) {
          return run_collective(*c, kind, static_cast<float*>(data), std::min(bytes, real), bytes,
                                tag, name, aborted);
        });
  }

  sim::Status p2p(StreamId stream, CommId comm, int peer, bool send, Buffer buffer,
                  std::int64_t size_bytes, std::string_view op_name) override {
    OFFSIM_ASSIGN_OR_RETURN(CommEntry * c, entry(comm));
    if (!c->remote) return inner_->p2p(stream, c->inner, peer, send, buffer, size_bytes, op_name);
    if (peer < 0 || peer >= static_cast<int>(options_.globals.size())) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "op '{}': peer {} is not a known rank",
                       op_name, peer);
    }
    const int global = options_.globals[static_cast<std::size_t>(peer)];
    auto it = std::find(c->members.begin(), c->members.end(), global);
    if (it == c->members.end() || static_cast<int>(it - c->members.begin()) == c->me) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "op '{}': rank {} is not a peer in the communicator of ranks {}", op_name,
                       global, fmt::join(c->members, ","));
    }
    const int other = static_cast<int>(it - c->members.begin());
    if (c->joined) return inner_->p2p(stream, c->inner, other, send, buffer, size_bytes, op_name);
    const int src = send ? c->me : other;
    const int dst = send ? other : c->me;
    const int tag = static_cast<int>(2 * (c->next_p2p[{src, dst}]++ % tag_space_) + 1);
    const std::int64_t bytes = std::max<std::int64_t>(size_bytes, 0);
    return inner_->host_function(
        stream, buffer,
        fmt::format("p2p '{}' {} rank {} over MPI", op_name, send ? "to" : "from", global),
        [this, c, other, send, bytes, tag, name = std::string(op_name)](
            void* data, std::int64_t real, const std::function<bool()>& aborted) {
          return run_p2p(*c, other, send, static_cast<float*>(data), std::min(bytes, real), bytes,
                         tag, name, aborted);
        });
  }

 private:
  sim::Result<CommEntry*> entry(CommId id) { return comms_.get(id.index); }

  // Floats one message may carry: what the op asks for, within the per-message bound.
  std::size_t message_floats(std::int64_t bytes) const {
    return static_cast<std::size_t>(std::min(bytes, options_.max_message_bytes) / 4);
  }

  // Polls `requests` until all are done, the device aborts or the watchdog runs out.
  sim::Status wait_all(std::vector<MPI_Request>& requests, std::vector<MPI_Status>& statuses,
                       const CommEntry& c, const std::string& name,
                       const std::function<bool()>& aborted) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      int done = 0;
      const int rc =
          MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, statuses.data());
      if (rc != MPI_SUCCESS) {
        return sim::fail(sim::ErrorCode::kDevice, "op '{}' over MPI (ranks {}): {}", name,
                         fmt::join(c.members, ","), mpi_error_text(rc));
      }
      if (done) return sim::ok();
      if (aborted()) {
        return sim::fail(sim::ErrorCode::kCancelled,
                         "op '{}' over MPI: aborted after an earlier "
                         "error",
                         name);
      }
      if (std::chrono::steady_clock::now() - start > options_.timeout) {
        return sim::fail(sim::ErrorCode::kDevice,
                         "watchdog: op '{}' waited {} ms for the messages of ranks {} (rank {} "
                         "here); a peer did not arrive",
                         name, options_.timeout.count(), fmt::join(c.members, ","),
                         c.members[static_cast<std::size_t>(c.me)]);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // Buffers a failed wait leaves with MPI (pending receives) are kept until the device goes.
  void abandon(std::shared_ptr<std::vector<std::vector<float>>> parts) {
    std::lock_guard lock(mu_);
    abandoned_.push_back(std::move(parts));
  }

  sim::Status run_collective(const CommEntry& c, sim::CollectiveKind kind, float* data,
                             std::int64_t mine_bytes, std::int64_t bytes, int tag,
                             const std::string& name, const std::function<bool()>& aborted) {
    const std::size_t size = c.members.size();
    const std::size_t me = static_cast<std::size_t>(c.me);
    const std::size_t cap = message_floats(bytes);
    const std::size_t mine = std::min(cap, static_cast<std::size_t>(mine_bytes / 4));
    auto parts = std::make_shared<std::vector<std::vector<float>>>(size);
    std::vector<MPI_Request> requests;
    for (std::size_t p = 0; p < size; ++p) {
      if (p == me) continue;
      (*parts)[p].resize(cap);
      requests.emplace_back();
      MPI_Irecv((*parts)[p].data(), static_cast<int>(cap), MPI_FLOAT, static_cast<int>(p), tag,
                c.mpi, &requests.back());
    }
    const std::size_t receives = requests.size();
    for (std::size_t p = 0; p < size; ++p) {
      if (p == me) continue;
      requests.emplace_back();
      MPI_Isend(data, static_cast<int>(mine), MPI_FLOAT, static_cast<int>(p), tag, c.mpi,
                &requests.back());
    }
    std::vector<MPI_Status> statuses(requests.size());
    if (sim::Status st = wait_all(requests, statuses, c, name, aborted); !st) {
      abandon(parts);
      return st;
    }
    // The bytes every member has: the least any member sent.
    std::size_t n = mine;
    for (std::size_t i = 0; i < receives; ++i) {
      int count = 0;
      MPI_Get_count(&statuses[i], MPI_FLOAT, &count);
      n = std::min(n, static_cast<std::size_t>(std::max(count, 0)));
    }
    (*parts)[me].assign(data, data + mine);
    const std::vector<std::vector<float>>& part = *parts;
    const std::size_t chunk = n / size;
    switch (kind) {
      case sim::CollectiveKind::kAllReduce:
      case sim::CollectiveKind::kReduceScatter:
        for (std::size_t i = 0; i < n; ++i) {
          float sum = 0.0f;
          for (std::size_t p = 0; p < size; ++p) sum += part[p][i];
          data[i] = sum;
        }
        break;
      case sim::CollectiveKind::kAllGather:
        for (std::size_t p = 0; p < size; ++p) {
          if (p != me) std::copy_n(part[p].data() + p * chunk, chunk, data + p * chunk);
        }
        break;
      case sim::CollectiveKind::kBroadcast:
        if (me != 0) std::copy_n(part[0].data(), n, data);
        break;
      case sim::CollectiveKind::kAllToAll:
        for (std::size_t p = 0; p < size; ++p) {
          if (p != me) std::copy_n(part[p].data() + me * chunk, chunk, data + p * chunk);
        }
        break;
    }
    return sim::ok();
  }

  sim::Status run_p2p(const CommEntry& c, int other, bool send, float* data,
                      std::int64_t mine_bytes, std::int64_t bytes, int tag, const std::string& name,
                      const std::function<bool()>& aborted) {
    const std::size_t cap = message_floats(bytes);
    const std::size_t mine = std::min(cap, static_cast<std::size_t>(mine_bytes / 4));
    auto parts = std::make_shared<std::vector<std::vector<float>>>(1);
    std::vector<MPI_Request> requests(1);
    if (send) {
      MPI_Isend(data, static_cast<int>(mine), MPI_FLOAT, other, tag, c.mpi, &requests[0]);
    } else {
      (*parts)[0].resize(cap);
      MPI_Irecv((*parts)[0].data(), static_cast<int>(cap), MPI_FLOAT, other, tag, c.mpi,
                &requests[0]);
    }
    std::vector<MPI_Status> statuses(1);
    if (sim::Status st = wait_all(requests, statuses, c, name, aborted); !st) {
      abandon(parts);
      return st;
    }
    if (!send) {
      int count = 0;
      MPI_Get_count(&statuses[0], MPI_FLOAT, &count);
      const std::size_t n = std::min(mine, static_cast<std::size_t>(std::max(count, 0)));
      std::copy_n((*parts)[0].data(), n, data);
    }
    return sim::ok();
  }

  std::unique_ptr<Device> inner_;
  MpiDeviceOptions options_;
  DeviceInfo info_;
  std::uint64_t tag_space_ = 16383;
  // Its own communicators (the skeleton's handle table); streams, events, buffers, the worker
  // queues, the error latch and the watchdog are the inner device's.
  HandleTable<CommEntry> comms_{"communicator"};
  std::mutex mu_;
  std::vector<std::shared_ptr<std::vector<std::vector<float>>>> abandoned_;
};

}  // namespace

std::unique_ptr<Device> make_mpi_device(std::unique_ptr<Device> inner,
                                        const MpiDeviceOptions& options) {
  return std::make_unique<MpiDevice>(std::move(inner), options);
}

}  // namespace offsim::backends
