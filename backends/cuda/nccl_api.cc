#include "backends/cuda/nccl_api.h"

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/dynlib.h"

namespace offsim::backends::cuda {
namespace {

constexpr int kMinVersion = 21400;  // ncclConfig_t.blocking and ncclCommFinalize: NCCL 2.14

}  // namespace

std::string nccl_library_file() {
  const char* env = std::getenv("OFFSIM_NCCL_LIBRARY");
  return env && *env ? std::string(env) : std::string("libnccl.so.2");
}

namespace detail {

sim::Result<NcclApi> load_nccl(const std::string& file) {
  // The handle stays open for the life of the process: communicators may outlive any owner.
  static std::mutex mu;
  static std::vector<DynamicLibrary>* kept = new std::vector<DynamicLibrary>();
  OFFSIM_ASSIGN_OR_RETURN(DynamicLibrary lib, DynamicLibrary::open(file, "NCCL"));
  NcclApi api;
  api.file = file;
  OFFSIM_RETURN_IF_ERROR(lib.bind("ncclGetVersion", api.GetVersion));
  OFFSIM_RETURN_IF_ERROR(lib.bind("ncclGetErrorString", api.GetErrorString));
  OFFSIM_RETURN_IF_ERROR(lib.bind("ncclGetUniqueId", api.GetUniqueId));
  OFFSIM_RETURN_IF_ERROR(lib.bind("ncclCommInitRankConfig", api.CommInitRankConfig));
  OFFSIM_RETURN_IF_ERROR(lib.bind("ncclCommGetAsyncError", api.CommGetAsyncError));
  OFFSIM_RETURN_IF_ERROR(lib.bind("ncclCommFinalize", api.CommFinalize));
  OFFSIM_RETURN_IF_ERROR(lib.bind("ncclCommDestroy", api.CommDestroy));
  OFFSIM_RETURN_IF_ERROR(lib.bind("ncclCommAbort", api.CommAbort));
  OFFSIM_RETURN_IF_ERROR(lib.bind("ncclGroupStart", api.GroupStart));
  OFFSIM_RETURN_IF_ERROR(lib.bind("ncclGroupEnd", api.GroupEnd));
  OFFSIM_RETURN_IF_ERROR(lib.bind("ncclAllReduce", api.AllReduce));
  OFFSIM_RETURN_IF_ERROR(lib.bind("ncclAllGather", api.AllGather));
  OFFSIM_RETURN_IF_ERROR(lib.bind("ncclReduceScatter", api.ReduceScatter));
  OFFSIM_RETURN_IF_ERROR(lib.bind("ncclBroadcast", api.Broadcast));
  OFFSIM_RETURN_IF_ERROR(lib.bind("ncclSend", api.Send));
  OFFSIM_RETURN_IF_ERROR(lib.bind("ncclRecv", api.Recv));
  if (api.GetVersion(&api.version) != ncclSuccess) {
    return sim::fail(sim::ErrorCode::kUnsupported, "NCCL ({}): ncclGetVersion failed", file);
  }
  if (api.version < kMinVersion) {
    return sim::fail(sim::ErrorCode::kUnsupported,
                     "NCCL ({}) is version {}; the replay needs 2.14 or newer (non-blocking "
                     "communicators)",
                     file, api.version);
  }
  std::lock_guard lock(mu);
  kept->push_back(std::move(lib));
  return api;
}

}  // namespace detail

sim::Result<const NcclApi*> nccl_api() {
  static std::once_flag once;
  static std::optional<sim::Result<NcclApi>> loaded;
  std::call_once(once, [] { loaded.emplace(detail::load_nccl(nccl_library_file())); });
  if (!*loaded) return sim::fail(loaded->error());
  return &**loaded;
}

sim::Status NcclApi::check(ncclResult_t result, std::string_view call) const {
  if (result == ncclSuccess || result == ncclInProgress) return sim::ok();
  return sim::fail(nccl_error(static_cast<int>(result),
                              GetErrorString ? GetErrorString(result) : nullptr, call));
}

sim::Status NcclApi::settle(ncclComm_t comm, std::string_view call,
                            const std::function<bool()>& stop) const {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t got = CommGetAsyncError(comm, &state);
    if (got != ncclSuccess) return check(got, "ncclCommGetAsyncError");
    if (state == ncclSuccess) return sim::ok();
    if (state != ncclInProgress) {
      return check(state, fmt::format("{} (asynchronous error)", call));
    }
    if (stop && stop()) {
      return sim::fail(sim::ErrorCode::kCancelled, "{}: stopped while in progress", call);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

}  // namespace offsim::backends::cuda
