// NcclApi: the NCCL entry points the CUDA device uses, loaded with dlopen when the first
// communicator is created. liboffsim_gpu.so does not link libnccl.so.2, so a one-GPU replay (and
// calibration without collectives) runs where NCCL is not installed; only creating a
// communicator then fails, with an error naming the library. <nccl.h> is used for its types only.
//
// Communicators are non-blocking (ncclConfig_t.blocking = 0): every call may return
// ncclInProgress, and `settle` polls ncclCommGetAsyncError until the call has finished, failed,
// or the caller's stop condition (a watchdog abort) holds; ncclCommAbort then ends it.
//
//   OFFSIM_ASSIGN_OR_RETURN(const cuda::NcclApi* nccl, cuda::nccl_api());
//   ncclComm_t comm = nullptr;
//   ncclConfig_t config = cuda::nonblocking_config();
//   OFFSIM_RETURN_IF_ERROR(nccl->check(nccl->CommInitRankConfig(&comm, 1, id, 0, &config),
//                                      "ncclCommInitRankConfig"));
#pragma once

#include <nccl.h>

#include <functional>
#include <string>
#include <string_view>

#include "sim/core/result.h"

namespace offsim::backends::cuda {

struct NcclApi {
  std::string file;  // the library loaded
  int version = 0;   // ncclGetVersion: 10000·major + 100·minor + patch

  ncclResult_t (*GetVersion)(int*) = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*CommFinalize)(ncclComm_t) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                cudaStream_t) = nullptr;
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t,
                       cudaStream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;

  // ncclSuccess and ncclInProgress (a non-blocking call under way) are fine; anything else is
  // an error naming `call` and NCCL's text for the result.
  sim::Status check(ncclResult_t result, std::string_view call) const;

  // Waits until `comm` has no call in progress: polls ncclCommGetAsyncError every 50 µs.
  // Returns the asynchronous error, if any; kCancelled when `stop()` becomes true first.
  sim::Status settle(ncclComm_t comm, std::string_view call,
                     const std::function<bool()>& stop) const;
};

// The library file: $OFFSIM_NCCL_LIBRARY when set, else "libnccl.so.2".
std::string nccl_library_file();

// Loads NCCL once per process (thread-safe) and returns its table, or the load error (kept, so
// that every later caller gets the same answer). NCCL older than 2.14 (no non-blocking
// communicators) is refused.
sim::Result<const NcclApi*> nccl_api();

namespace detail {
// Loads `file` without the process-wide cache (tests).
sim::Result<NcclApi> load_nccl(const std::string& file);
}  // namespace detail

// ncclConfig_t with blocking = 0 (NCCL_CONFIG_INITIALIZER for everything else).
ncclConfig_t nonblocking_config();

}  // namespace offsim::backends::cuda
