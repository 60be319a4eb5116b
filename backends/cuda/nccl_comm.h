// NcclComm: the NCCL side of one communicator of the CUDA device — an NCCL communicator per
// member GPU of this process, made, used and ended here, so that the device code has no NCCL
// types and no preprocessor branches. nccl_comm.cc implements it over the on-demand NCCL loader
// (nccl_api.h); nccl_none.cc, built when offsim is configured without NCCL, is the stub: every
// call that needs NCCL returns a kUnsupported "offsim was built without NCCL" error.
//
//   std::vector<std::int64_t> added;  // device memory each member's communicator took
//   OFFSIM_ASSIGN_OR_RETURN(std::unique_ptr<cuda::NcclComm> comm,
//                           cuda::NcclComm::create_local({0, 1}, added));
//   // comm == nullptr: NCCL could not be loaded and a one-member group has nothing to exchange
//   OFFSIM_RETURN_IF_ERROR(comm->collective(comm->member(0), 0, 2, sim::CollectiveKind::kAllReduce,
//                                           buffer, bytes, stream, aborted));
//
// Communicators are non-blocking; every wait for one is bounded or ends when `stop()` turns true
// (the device's abort). The destructor aborts any member communicator still held (the device
// ends them earlier: finalize_all() on an orderly teardown, abort() after an error).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sim/core/result.h"
#include "sim/plan/plan.h"

struct ncclComm;  // <nccl.h>: ncclComm_t is ncclComm*

namespace offsim::backends::cuda {

struct NcclApi;

using NcclUniqueId = std::array<char, 128>;  // ncclUniqueId's bytes
using StopQuery = std::function<bool()>;

class NcclComm {
 public:
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm();

  // One NCCL rank per GPU of `gpus` (member i is NCCL rank i), made inside one group and polled
  // (at most 60 s) until every rank is ready. `added_bytes[i]` receives the device memory the
  // communicator took on gpus[i] (-1: unknown). Null without an error when NCCL cannot be loaded
  // and there is one member (nothing to exchange).
  static sim::Result<std::unique_ptr<NcclComm>> create_local(
      const std::vector<int>& gpus, std::vector<std::int64_t>& added_bytes);
  // A new id for a communicator across processes (ncclGetUniqueId).
  static sim::Result<NcclUniqueId> new_unique_id();
  // Joins, on `gpu`, as NCCL rank `my_index` of `members` with the id the first member made;
  // polled (at most 120 s) until ready or `stop()`. `added_bytes` as in create_local.
  static sim::Result<std::unique_ptr<NcclComm>> join(int gpu, int members, int my_index,
                                                     const NcclUniqueId& id, const StopQuery& stop,
                                                     std::int64_t& added_bytes);

  // "2.21.5": the version of the NCCL library that made this communicator.
  std::string version() const;
  // The communicator of member `index` (this process's members, in creation order).
  ncclComm* member(int index) const;

  // `kind` over the members' buffers on `stream`, from member `comm` (NCCL rank `nccl_rank` of
  // `ranks`): all-reduce and reduce-scatter in fp32, all-gather and broadcast in place,
  // all-to-all from the buffer's first half into its second.
  sim::Status collective(ncclComm* comm, int nccl_rank, int ranks, sim::CollectiveKind kind,
                         char* buffer, std::int64_t bytes, cudaStream_t stream,
                         const StopQuery& stop) const;
  // ncclSend (send) or ncclRecv of `bytes` with NCCL rank `peer`.
  sim::Status p2p(ncclComm* comm, int peer, bool send, void* buffer, std::size_t bytes,
                  cudaStream_t stream, const StopQuery& stop) const;
  // The first asynchronous error of a member communicator (ncclCommGetAsyncError), if any.
  std::optional<sim::Error> async_error() const;
  // ncclCommAbort of every member communicator: unblocks kernels and host calls waiting on
  // peers. The communicator is unusable afterwards.
  void abort();
  // The orderly end of healthy communicators: each one's members are finalized together (one
  // thread finalizing them one by one could wait on a peer it has not finalized yet), waited for
  // (at most 10 s), then destroyed; one that does not finish is aborted.
  static void finalize_all(std::vector<NcclComm*>& comms);

 private:
  NcclComm(const NcclApi* api, std::vector<ncclComm*> comms)
      : api_(api), comms_(std::move(comms)) {}

  const NcclApi* api_;
  std::vector<ncclComm*> comms_;  // by member index; null once aborted
};

// What a collective or a p2p does on a communicator without NCCL (create_local returned null):
// with NCCL built, a one-member collective has nothing to exchange (ok) and a p2p is an error;
// without NCCL both are "built without NCCL" errors.
sim::Status collective_without_nccl(std::string_view op_name);
sim::Status p2p_without_nccl(std::string_view op_name);

}  // namespace offsim::backends::cuda
