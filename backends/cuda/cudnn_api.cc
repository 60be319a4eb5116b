#include "backends/cuda/cudnn_api.h"

#include <cstdlib>
#include <mutex>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "backends/cuda/dynlib.h"

namespace offsim::backends::cuda {

sim::Error cudnn_error(int status, const char* text, std::string_view call) {
  const std::string what =
      fmt::format("cuDNN status {} ({}) in {}", status, text ? text : "?", call);
  switch (status) {
    case CUDNN_STATUS_NOT_INITIALIZED:
    case CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER:
      return sim::Error{sim::ErrorCode::kNoDevice, "no GPU: " + what};
    case CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED:
      return sim::Error{sim::ErrorCode::kLimitExceeded, "out of device memory: " + what};
    default:
      break;
  }
  if (status / 1000 == CUDNN_STATUS_NOT_SUPPORTED / 1000) {
    return sim::Error{sim::ErrorCode::kUnsupported, what};
  }
  return sim::Error{sim::ErrorCode::kDevice, what};
}

sim::Status CudnnApi::check(cudnnStatus_t status, std::string_view call) const {
  if (status == CUDNN_STATUS_SUCCESS) return sim::ok();
  return sim::fail(cudnn_error(static_cast<int>(status),
                               GetErrorString ? GetErrorString(status) : nullptr, call));
}

std::string CudnnApi::version_string() const {
  return fmt::format("{}.{}.{}", version / 10000, (version / 100) % 100, version % 100);
}

std::string cudnn_library_file() {
  const char* env = std::getenv("OFFSIM_CUDNN_LIBRARY");
  return env && *env ? std::string(env) : std::string("libcudnn.so.9");
}

namespace detail {

sim::Result<CudnnApi> load_cudnn(const std::string& file) {
  static std::mutex mu;
  static auto* kept = new std::vector<DynamicLibrary>();  // open for the process's life
  OFFSIM_ASSIGN_OR_RETURN(DynamicLibrary lib, DynamicLibrary::open(file, "cuDNN"));
  CudnnApi api;
  api.file = file;
  OFFSIM_RETURN_IF_ERROR(lib.bind("cudnnGetVersion", api.GetVersion));
  OFFSIM_RETURN_IF_ERROR(lib.bind("cudnnGetErrorString", api.GetErrorString));
  OFFSIM_RETURN_IF_ERROR(lib.bind("cudnnCreate", api.Create));
  OFFSIM_RETURN_IF_ERROR(lib.bind("cudnnDestroy", api.Destroy));
  OFFSIM_RETURN_IF_ERROR(lib.bind("cudnnSetStream", api.SetStream));
  OFFSIM_RETURN_IF_ERROR(lib.bind("cudnnBackendCreateDescriptor", api.BackendCreateDescriptor));
  OFFSIM_RETURN_IF_ERROR(lib.bind("cudnnBackendDestroyDescriptor", api.BackendDestroyDescriptor));
  OFFSIM_RETURN_IF_ERROR(lib.bind("cudnnBackendSetAttribute", api.BackendSetAttribute));
  OFFSIM_RETURN_IF_ERROR(lib.bind("cudnnBackendGetAttribute", api.BackendGetAttribute));
  OFFSIM_RETURN_IF_ERROR(lib.bind("cudnnBackendFinalize", api.BackendFinalize));
  OFFSIM_RETURN_IF_ERROR(lib.bind("cudnnBackendExecute", api.BackendExecute));
  api.version = api.GetVersion();
  if (api.version < 90000) {
    return sim::fail(sim::ErrorCode::kUnsupported,
                     "cuDNN ({}) is version {}; the replay needs cuDNN 9 (graph API)", file,
                     api.version_string());
  }
  std::lock_guard lock(mu);
  kept->push_back(std::move(lib));
  return api;
}

}  // namespace detail

sim::Result<const CudnnApi*> cudnn_api() {
  static std::once_flag once;
  static auto* loaded = new std::optional<sim::Result<CudnnApi>>();
  std::call_once(once, [] { loaded->emplace(detail::load_cudnn(cudnn_library_file())); });
  if (!**loaded) return sim::fail((*loaded)->error());
  return &***loaded;
}

}  // namespace offsim::backends::cuda
