// CudnnSdpaForward: causal scaled-dot-product attention forward (bf16, fp32 softmax) as one
// cuDNN 9 operation graph — Q·Kᵀ, scale, causal mask, softmax, ·V — for the fused
// flash-attention engine, built through the backend (graph) C API of cudnn_api.h.
//
// Not yet used by the replay: until `CudaReplayTest.CudnnSdpaMatchesTheFallbackKernel` has
// passed on a GPU (it compares this graph's output with the fallback kernel's), the device runs
// the fallback kernel and says so. A graph cuDNN cannot run returns kUnsupported at build().
//
//   OFFSIM_ASSIGN_OR_RETURN(const cuda::CudnnApi* dnn, cuda::cudnn_api());
//   cuda::SdpaShape s{.batch = 1, .q_heads = 32, .kv_heads = 8, .seq_q = 4096,
//                     .seq_kv = 4096, .head_dim = 128};
//   OFFSIM_ASSIGN_OR_RETURN(auto sdpa, cuda::CudnnSdpaForward::build(*dnn, handle, s));
//   OFFSIM_RETURN_IF_ERROR(sdpa->run(handle, q, k, v, out, workspace));  // workspace_bytes()
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backends/cuda/cudnn_api.h"
#include "sim/core/result.h"

namespace offsim::backends::cuda {

// q and out: [batch][q_heads][seq_q][head_dim]; k, v: [batch][kv_heads][seq_kv][head_dim];
// bf16, densely packed. Causal (query i sees keys 0..i).
struct SdpaShape {
  std::int64_t batch = 1;
  std::int64_t q_heads = 1;
  std::int64_t kv_heads = 1;  // divides q_heads (GQA)
  std::int64_t seq_q = 0;
  std::int64_t seq_kv = 0;
  std::int64_t head_dim = 0;
};

class CudnnSdpaForward {
 public:
  static sim::Result<std::unique_ptr<CudnnSdpaForward>> build(const CudnnApi& api,
                                                              cudnnHandle_t handle,
                                                              const SdpaShape& shape);
  ~CudnnSdpaForward();
  CudnnSdpaForward(const CudnnSdpaForward&) = delete;
  CudnnSdpaForward& operator=(const CudnnSdpaForward&) = delete;

  std::int64_t workspace_bytes() const { return workspace_bytes_; }
  // Enqueues on the handle's stream (cudnnSetStream).
  sim::Status run(cudnnHandle_t handle, const void* q, const void* k, const void* v, void* out,
                  void* workspace) const;

 private:
  explicit CudnnSdpaForward(const CudnnApi& api) : api_(api) {}
  const CudnnApi& api_;
  std::vector<cudnnBackendDescriptor_t> owned_;  // destroyed in reverse order
  cudnnBackendDescriptor_t plan_ = nullptr;
  std::int64_t workspace_bytes_ = 0;
  float scale_ = 1.0f;
  float masked_ = 0.0f;  // -inf
};

}  // namespace offsim::backends::cuda
