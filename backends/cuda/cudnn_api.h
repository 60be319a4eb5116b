// CudnnApi: cuDNN 9's graph (backend) API, loaded with dlopen on demand like NCCL, so that
// liboffsim_gpu.so runs without cuDNN; `cudnn_error` maps a cudnnStatus_t to offsim's errors.
// cudnn_sdpa.h builds the fused attention (SDPA) operation graph on it; the replay's device runs
// its fallback kernel, and says so in its report note, until that graph has been checked
// against the fallback on a GPU.
//
//   OFFSIM_ASSIGN_OR_RETURN(const cuda::CudnnApi* dnn, cuda::cudnn_api());
//   cudnnHandle_t h = nullptr;
//   OFFSIM_RETURN_IF_ERROR(dnn->check(dnn->Create(&h), "cudnnCreate"));
#pragma once

#include <cudnn_graph.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "sim/core/result.h"

namespace offsim::backends::cuda {

// "No GPU" statuses (not initialized, driver too old) are kNoDevice with "no GPU: "; device
// allocation failures kLimitExceeded; the NOT_SUPPORTED family kUnsupported (the caller falls
// back); everything else kDevice. The message names `call`, the status and cuDNN's text.
sim::Error cudnn_error(int status, const char* text, std::string_view call);

struct CudnnApi {
  std::string file;
  std::size_t version = 0;  // cudnnGetVersion: 10000·major + 100·minor + patch (cuDNN 9)

  std::size_t (*GetVersion)() = nullptr;
  const char* (*GetErrorString)(cudnnStatus_t) = nullptr;
  cudnnStatus_t (*Create)(cudnnHandle_t*) = nullptr;
  cudnnStatus_t (*Destroy)(cudnnHandle_t) = nullptr;
  cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t) = nullptr;
  cudnnStatus_t (*BackendCreateDescriptor)(cudnnBackendDescriptorType_t,
                                           cudnnBackendDescriptor_t*) = nullptr;
  cudnnStatus_t (*BackendDestroyDescriptor)(cudnnBackendDescriptor_t) = nullptr;
  cudnnStatus_t (*BackendSetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                       cudnnBackendAttributeType_t, int64_t, const void*) = nullptr;
  cudnnStatus_t (*BackendGetAttribute)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                                       cudnnBackendAttributeType_t, int64_t, int64_t*,
                                       void*) = nullptr;
  cudnnStatus_t (*BackendFinalize)(cudnnBackendDescriptor_t) = nullptr;
  cudnnStatus_t (*BackendExecute)(cudnnHandle_t, cudnnBackendDescriptor_t,
                                  cudnnBackendDescriptor_t) = nullptr;

  sim::Status check(cudnnStatus_t status, std::string_view call) const;
  std::string version_string() const;  // "9.13.0"
};

// The library file: $OFFSIM_CUDNN_LIBRARY when set, else "libcudnn.so.9".
std::string cudnn_library_file();

// Loads cuDNN once per process (thread-safe); versions before 9 are refused.
sim::Result<const CudnnApi*> cudnn_api();

namespace detail {
sim::Result<CudnnApi> load_cudnn(const std::string& file);  // no cache (tests)
}  // namespace detail

}  // namespace offsim::backends::cuda
