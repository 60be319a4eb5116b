#include "backends/cuda/cuda_check.h"

#include <fmt/format.h>

namespace offsim::backends::cuda {

sim::Error cuda_error(cudaError_t code, std::string_view call) {
  const char* name = cudaGetErrorName(code);
  const char* text = cudaGetErrorString(code);
  switch (code) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorCompatNotSupportedOnDevice:
      return sim::Error{sim::ErrorCode::kNoDevice,
                        fmt::format("no GPU: {} ({} in {})", text, name, call)};
    case cudaErrorDevicesUnavailable:
      return sim::Error{sim::ErrorCode::kNoDevice,
                        fmt::format("GPU busy or unavailable: {} ({} in {})", text, name, call)};
    case cudaErrorMemoryAllocation:
      return sim::Error{sim::ErrorCode::kLimitExceeded,
                        fmt::format("out of device memory: {} in {}", text, call)};
    default:
      return sim::Error{sim::ErrorCode::kDevice,
                        fmt::format("CUDA error {} ({}) in {}", name, text, call)};
  }
}

sim::Error cublas_error(int status, std::string_view call) {
  // CUBLAS_STATUS_NOT_INITIALIZED (1): no driver or no GPU behind the runtime.
  if (status == 1) {
    return sim::Error{sim::ErrorCode::kNoDevice,
                      fmt::format("no GPU: cuBLAS could not initialize (status 1) in {}", call)};
  }
  if (status == 3) {  // CUBLAS_STATUS_ALLOC_FAILED
    return sim::Error{sim::ErrorCode::kLimitExceeded,
                      fmt::format("out of device memory: cuBLAS allocation failed in {}", call)};
  }
  return sim::Error{sim::ErrorCode::kDevice, fmt::format("cuBLAS status {} in {}", status, call)};
}

sim::Error nccl_error(int result, const char* text, std::string_view call) {
  return sim::Error{sim::ErrorCode::kDevice,
                    fmt::format("NCCL error {} ({}) in {}", result, text ? text : "?", call)};
}

}  // namespace offsim::backends::cuda
