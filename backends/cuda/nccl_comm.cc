#include "backends/cuda/nccl_comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/nccl_api.h"

namespace offsim::backends::cuda {
namespace {

std::string version_string(int v) {  // NCCL's 10000·major + 100·minor + patch
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

// Device memory in use on each of `gpus` now (-1 where unknown).
std::vector<std::int64_t> used_on(const std::vector<int>& gpus) {
  std::vector<std::int64_t> used(gpus.size(), -1);
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    if (cudaSetDevice(gpus[i]) == cudaSuccess) used[i] = device_used_bytes();
    cudaGetLastError();
  }
  return used;
}

// ncclCommInitRankConfig for every member inside one group; the first failure is returned.
sim::Status init_in_group(const NcclApi& api, const std::vector<int>& gpus, const ncclUniqueId& id,
                          std::vector<ncclComm_t>& comms) {
  const int n = static_cast<int>(gpus.size());
  ncclConfig_t config = nonblocking_config();
  OFFSIM_RETURN_IF_ERROR(api.check(api.GroupStart(), "ncclGroupStart"));
  ncclResult_t first = ncclSuccess;
  for (int i = 0; i < n; ++i) {
    if (cudaSetDevice(gpus[static_cast<std::size_t>(i)]) != cudaSuccess) {
      cudaGetLastError();
      first = ncclUnhandledCudaError;
      break;
    }
    first = api.CommInitRankConfig(&comms[static_cast<std::size_t>(i)], n, id, i, &config);
    if (first != ncclSuccess && first != ncclInProgress) break;
  }
  const ncclResult_t ended = api.GroupEnd();
  OFFSIM_RETURN_IF_ERROR(api.check(first, "ncclCommInitRankConfig"));
  return api.check(ended, "ncclGroupEnd (communicator creation)");
}

// The all-to-all: sends from the buffer's first half, receives into its second half, inside a
// group that is closed on every path (a thread left inside a group would defer, and so lose,
// every later NCCL call it makes). Returns ncclGroupEnd's result.
sim::Result<ncclResult_t> all_to_all(const NcclApi& api, ncclComm_t nc, int n, char* p,
                                     std::int64_t bytes, cudaStream_t st) {
  const std::size_t part = static_cast<std::size_t>(bytes / 2 / n);
  OFFSIM_RETURN_IF_ERROR(api.check(api.GroupStart(), "ncclGroupStart"));
  ncclResult_t first = ncclSuccess;
  const char* failed = "";
  for (int peer = 0; peer < n; ++peer) {
    first = api.Send(p + peer * part, part, ncclInt8, peer, nc, st);
    if (first != ncclSuccess && first != ncclInProgress) {
      failed = "ncclSend (all-to-all)";
      break;
    }
    first = api.Recv(p + bytes / 2 + peer * part, part, ncclInt8, peer, nc, st);
    if (first != ncclSuccess && first != ncclInProgress) {
      failed = "ncclRecv (all-to-all)";
      break;
    }
  }
  const ncclResult_t ended = api.GroupEnd();
  OFFSIM_RETURN_IF_ERROR(api.check(first, failed));
  return ended;
}

}  // namespace

NcclComm::~NcclComm() { abort(); }

sim::Result<std::unique_ptr<NcclComm>> NcclComm::create_local(
    const std::vector<int>& gpus, std::vector<std::int64_t>& added_bytes) {
  constexpr auto kCommInitTimeout = std::chrono::seconds(60);
  // NCCL is loaded here, by the first communicator: a one-GPU replay never needs it.
  sim::Result<const NcclApi*> loaded = nccl_api();
  if (!loaded) {
    if (gpus.size() > 1) {
      return sim::fail(sim::with_context(
          loaded.error(), fmt::format("collectives between {} GPUs: ", gpus.size())));
    }
    return std::unique_ptr<NcclComm>();  // one member: a collective has nothing to exchange
  }
  const NcclApi& api = **loaded;
  ncclUniqueId id{};
  OFFSIM_RETURN_IF_ERROR(api.check(api.GetUniqueId(&id), "ncclGetUniqueId"));
  // What the communicator takes on each member GPU (NCCL may allocate more at its first
  // collective; memory_split()'s device figure shows that).
  const std::vector<std::int64_t> used_before = used_on(gpus);
  std::unique_ptr<NcclComm> comm(new NcclComm(&api, std::vector<ncclComm_t>(gpus.size(), nullptr)));
  sim::Status status = init_in_group(api, gpus, id, comm->comms_);
  const auto deadline = std::chrono::steady_clock::now() + kCommInitTimeout;
  for (std::size_t i = 0; status && i < comm->comms_.size(); ++i) {
    status = api.settle(comm->comms_[i], "ncclCommInitRankConfig",
                        [&] { return std::chrono::steady_clock::now() >= deadline; });
  }
  if (!status) {
    comm->abort();
    return sim::fail(sim::with_context(
        status.error(),
        fmt::format("NCCL communicator over {} GPU(s) (NCCL {}, {}; timeout {} s): ", gpus.size(),
                    version_string(api.version), api.file, kCommInitTimeout.count())));
  }
  added_bytes.assign(gpus.size(), -1);
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    if (used_before[i] < 0 || cudaSetDevice(gpus[i]) != cudaSuccess) continue;
    added_bytes[i] = std::max<std::int64_t>(device_used_bytes() - used_before[i], 0);
  }
  cudaGetLastError();
  return comm;
}

sim::Result<NcclUniqueId> NcclComm::new_unique_id() {
  auto api = nccl_api();
  if (!api) return sim::fail(sim::with_context(api.error(), "communicator across processes: "));
  ncclUniqueId nid{};
  OFFSIM_RETURN_IF_ERROR((*api)->check((*api)->GetUniqueId(&nid), "ncclGetUniqueId"));
  static_assert(sizeof nid == sizeof(NcclUniqueId), "NCCL's unique id is 128 bytes");
  NcclUniqueId id{};
  std::memcpy(id.data(), &nid, sizeof nid);
  return id;
}

sim::Result<std::unique_ptr<NcclComm>> NcclComm::join(int gpu, int members, int my_index,
                                                      const NcclUniqueId& id, const StopQuery& stop,
                                                      std::int64_t& added_bytes) {
  constexpr auto kJoinTimeout = std::chrono::seconds(120);
  OFFSIM_ASSIGN_OR_RETURN(const NcclApi* api, nccl_api());
  ncclUniqueId nid{};
  std::memcpy(&nid, id.data(), sizeof nid);
  if (cudaSetDevice(gpu) != cudaSuccess) {
    return sim::fail(cuda_error(cudaGetLastError(), "cudaSetDevice (communicator join)"));
  }
  const std::int64_t used_before = device_used_bytes();
  ncclConfig_t config = nonblocking_config();
  std::unique_ptr<NcclComm> comm(new NcclComm(api, std::vector<ncclComm_t>(1, nullptr)));
  sim::Status status =
      api->check(api->CommInitRankConfig(&comm->comms_[0], members, nid, my_index, &config),
                 "ncclCommInitRankConfig");
  const auto deadline = std::chrono::steady_clock::now() + kJoinTimeout;
  if (status) {
    status = api->settle(comm->comms_[0], "ncclCommInitRankConfig",
                         [&] { return stop() || std::chrono::steady_clock::now() >= deadline; });
  }
  if (!status) {
    comm->abort();
    return sim::fail(sim::with_context(
        status.error(),
        fmt::format("NCCL communicator across processes, member {} of {} on GPU {} (NCCL {}, "
                    "{}; timeout {} s): ",
                    my_index, members, gpu, version_string(api->version), api->file,
                    kJoinTimeout.count())));
  }
  added_bytes = -1;
  if (used_before >= 0) {
    added_bytes = std::max<std::int64_t>(device_used_bytes() - used_before, 0);
  }
  cudaGetLastError();
  return comm;
}

std::string NcclComm::version() const { return version_string(api_->version); }

ncclComm* NcclComm::member(int index) const { return comms_[static_cast<std::size_t>(index)]; }

sim::Status NcclComm::collective(ncclComm* comm, int nccl_rank, int ranks, sim::CollectiveKind kind,
                                 char* p, std::int64_t bytes, cudaStream_t st,
                                 const StopQuery& stop) const {
  const NcclApi& api = *api_;
  const int n = ranks;
  const std::size_t floats = static_cast<std::size_t>(bytes / 4);
  const std::size_t chunk = static_cast<std::size_t>(bytes / n);
  const char* call = "";
  ncclResult_t res = ncclSuccess;
  switch (kind) {
    case sim::CollectiveKind::kAllReduce:
      call = "ncclAllReduce";
      res = api.AllReduce(p, p, floats, ncclFloat, ncclSum, comm, st);
      break;
    case sim::CollectiveKind::kAllGather:  // in place: our chunk at our offset
      call = "ncclAllGather";
      res = api.AllGather(p + nccl_rank * chunk, p, chunk, ncclInt8, comm, st);
      break;
    case sim::CollectiveKind::kReduceScatter:
      call = "ncclReduceScatter";
      res = api.ReduceScatter(p, p + nccl_rank * (floats / n) * 4, floats / n, ncclFloat, ncclSum,
                              comm, st);
      break;
    case sim::CollectiveKind::kBroadcast:
      call = "ncclBroadcast";
      res = api.Broadcast(p, p, static_cast<std::size_t>(bytes), ncclInt8, 0, comm, st);
      break;
    case sim::CollectiveKind::kAllToAll: {
      OFFSIM_ASSIGN_OR_RETURN(res, all_to_all(api, comm, n, p, bytes, st));
      call = "ncclGroupEnd (all-to-all)";
      break;
    }
  }
  OFFSIM_RETURN_IF_ERROR(api.check(res, call));
  if (res == ncclInProgress) return api.settle(comm, call, stop);
  return sim::ok();
}

sim::Status NcclComm::p2p(ncclComm* comm, int peer, bool send, void* p, std::size_t bytes,
                          cudaStream_t st, const StopQuery& stop) const {
  const NcclApi& api = *api_;
  const char* call = send ? "ncclSend" : "ncclRecv";
  const ncclResult_t res = send ? api.Send(p, bytes, ncclInt8, peer, comm, st)
                                : api.Recv(p, bytes, ncclInt8, peer, comm, st);
  OFFSIM_RETURN_IF_ERROR(api.check(res, call));
  if (res == ncclInProgress) return api.settle(comm, call, stop);
  return sim::ok();
}

std::optional<sim::Error> NcclComm::async_error() const {
  for (ncclComm_t nc : comms_) {
    if (!nc) continue;  // aborted
    ncclResult_t async = ncclSuccess;
    if (api_->CommGetAsyncError(nc, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      return nccl_error(static_cast<int>(async), api_->GetErrorString(async),
                        "a collective (ncclCommGetAsyncError)");
    }
  }
  return std::nullopt;
}

void NcclComm::abort() {
  for (ncclComm_t& nc : comms_) {
    if (nc) api_->CommAbort(nc);
    nc = nullptr;
  }
}

void NcclComm::finalize_all(std::vector<NcclComm*>& comms) {
  for (NcclComm* c : comms) {
    const NcclApi& api = *c->api_;
    api.GroupStart();
    for (ncclComm_t nc : c->comms_) {
      if (nc) api.CommFinalize(nc);
    }
    api.GroupEnd();
    // Non-blocking communicators finalize in the background: wait (bounded) for each to
    // finish before destroying it, and abort one that does not.
    bool finished = true;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (ncclComm_t nc : c->comms_) {
      if (!nc) continue;
      const sim::Status done = api.settle(
          nc, "ncclCommFinalize", [&] { return std::chrono::steady_clock::now() >= deadline; });
      if (!done) finished = false;
    }
    for (ncclComm_t& nc : c->comms_) {
      if (nc) finished ? api.CommDestroy(nc) : api.CommAbort(nc);
      nc = nullptr;
    }
  }
}

sim::Status collective_without_nccl(std::string_view op_name) {
  (void)op_name;
  return sim::ok();  // one member without NCCL: nothing to exchange
}

sim::Status p2p_without_nccl(std::string_view op_name) {
  return sim::fail(sim::ErrorCode::kUnsupported,
                   "p2p '{}' inside a one-member communicator (NCCL not loaded)", op_name);
}

}  // namespace offsim::backends::cuda
