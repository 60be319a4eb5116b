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
    case cudaErrorSystemDriverMismatch:  // kernel module and user-space driver differ
    case cudaErrorSystemNotReady:        // e.g. fabric manager not running
    case cudaErrorCallRequiresNewerDriver:
      return sim::Error{sim::ErrorCode::kNoDevice,
                        fmt::format("no GPU: {} ({} in {})", text, name, call)};
    case cudaErrorStubLibrary:
      return sim::Error{sim::ErrorCode::kNoDevice,
                        fmt::format("no GPU: the CUDA driver library found is the toolkit's stub "
                                    "(a stubs/ folder on LD_LIBRARY_PATH?) ({} in {})",
                                    name, call)};
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return sim::Error{
          sim::ErrorCode::kDevice,
          fmt::format("offsim's kernels were not built for this GPU (rebuild with its "
                      "architecture in CMAKE_CUDA_ARCHITECTURES): {} ({} in {})",
                      text, name, call)};
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

namespace {

// cublasStatus_t names (cublas_api.h), kept here so that this file needs only cudart.
const char* cublas_status_name(int status) {
  switch (status) {
    case 0:
      return "CUBLAS_STATUS_SUCCESS";
    case 1:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case 8:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case 11:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case 13:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case 14:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case 15:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case 16:
      return "CUBLAS_STATUS_LICENSE_ERROR";
    default:
      return "unknown cuBLAS status";
  }
}

}  // namespace

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
  return sim::Error{sim::ErrorCode::kDevice, fmt::format("cuBLAS status {} ({}) in {}", status,
                                                         cublas_status_name(status), call)};
}

sim::Error nccl_error(int result, const char* text, std::string_view call) {
  return sim::Error{sim::ErrorCode::kDevice,
                    fmt::format("NCCL error {} ({}) in {}", result, text ? text : "?", call)};
}

std::int64_t device_used_bytes() {
  std::size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return static_cast<std::int64_t>(total_b - free_b);
}

}  // namespace offsim::backends::cuda
