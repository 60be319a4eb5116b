// OFFSIM_CUDA_CHECK / OFFSIM_CUBLAS_CHECK / OFFSIM_NCCL_CHECK: turn a failed CUDA, cuBLAS or
// NCCL call into a returned sim::Error (never an abort), naming the call.
//
// "No GPU here" (no device, a driver older than the runtime, cuBLAS not initialized) maps to
// ErrorCode::kNoDevice with a message starting "no GPU: "; a busy or unavailable GPU says so;
// everything else is kDevice. Out of memory is kLimitExceeded.
//
//   sim::Status f() {
//     OFFSIM_CUDA_CHECK(cudaSetDevice(0));
//     OFFSIM_CUBLAS_CHECK(cublasLtCreate(&handle));
//     return sim::ok();
//   }
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string_view>

#include "sim/core/result.h"

namespace offsim::backends::cuda {

sim::Error cuda_error(cudaError_t code, std::string_view call);
sim::Error cublas_error(int status, std::string_view call);                  // cublasStatus_t
sim::Error nccl_error(int result, const char* text, std::string_view call);  // ncclResult_t

// Device memory in use on the current GPU (total − free, from cudaMemGetInfo), -1 when unknown.
std::int64_t device_used_bytes();

}  // namespace offsim::backends::cuda

#define OFFSIM_CUDA_CHECK(expr)                                                                  \
  do {                                                                                           \
    const cudaError_t offsim_cuda_err_ = (expr);                                                 \
    if (offsim_cuda_err_ != cudaSuccess) {                                                       \
      return ::offsim::sim::fail(::offsim::backends::cuda::cuda_error(offsim_cuda_err_, #expr)); \
    }                                                                                            \
  } while (false)

#define OFFSIM_CUBLAS_CHECK(expr)                                                              \
  do {                                                                                         \
    const auto offsim_cublas_st_ = (expr);                                                     \
    if (offsim_cublas_st_ != 0) {                                                              \
      return ::offsim::sim::fail(                                                              \
          ::offsim::backends::cuda::cublas_error(static_cast<int>(offsim_cublas_st_), #expr)); \
    }                                                                                          \
  } while (false)

// Needs <nccl.h> where used.
#define OFFSIM_NCCL_CHECK(expr)                                                              \
  do {                                                                                       \
    const ncclResult_t offsim_nccl_res_ = (expr);                                            \
    if (offsim_nccl_res_ != ncclSuccess) {                                                   \
      return ::offsim::sim::fail(::offsim::backends::cuda::nccl_error(                       \
          static_cast<int>(offsim_nccl_res_), ncclGetErrorString(offsim_nccl_res_), #expr)); \
    }                                                                                        \
  } while (false)
