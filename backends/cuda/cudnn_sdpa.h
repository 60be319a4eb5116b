// CudnnSdpaForward / CudnnSdpaBackward: causal scaled-dot-product attention (bf16, fp32 softmax)
// as cuDNN 9 operation graphs for the fused flash-attention engines, built through the backend
// (graph) C API of cudnn_api.h.
//
// Forward: Q·Kᵀ, scale, causal mask, softmax, ·V; with `with_stats` it also writes the softmax
// statistics a training forward keeps for the backward (Stats = rowmax + log(rowsum), fp32
// [batch][q_heads][seq_q][1]), as flash attention does.
// Backward: from Q, K, V, O, dO and Stats — softmax_sum = rowsum(dO∘O); P = exp(mask(scale·QKᵀ) −
// Stats); dV = Pᵀ·dO; dS = scale·P∘(dO·Vᵀ − softmax_sum); dQ = dS·K (accumulated in fp32);
// dK = dSᵀ·Q. The backward graph takes query and key/value heads equal (callers run a GQA
// backward with K and V expanded to the query heads: the same FLOPs).
//
// The CUDA device runs these for the replay's attention ops and falls back to its scalar kernel,
// naming the reason, whenever build() fails. A graph cuDNN cannot run returns kUnsupported there.
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
                                                              const SdpaShape& shape,
                                                              bool with_stats = false);
  ~CudnnSdpaForward();
  CudnnSdpaForward(const CudnnSdpaForward&) = delete;
  CudnnSdpaForward& operator=(const CudnnSdpaForward&) = delete;

  std::int64_t workspace_bytes() const { return workspace_bytes_; }
  bool with_stats() const { return with_stats_; }
  // Enqueues on the handle's stream (cudnnSetStream). `stats` (fp32, batch·q_heads·seq_q) is
  // written when built with_stats, and ignored otherwise.
  sim::Status run(cudnnHandle_t handle, const void* q, const void* k, const void* v, void* out,
                  void* workspace, void* stats = nullptr) const;

 private:
  explicit CudnnSdpaForward(const CudnnApi& api) : api_(api) {}
  const CudnnApi& api_;
  std::vector<cudnnBackendDescriptor_t> owned_;  // destroyed in reverse order
  cudnnBackendDescriptor_t plan_ = nullptr;
  std::int64_t workspace_bytes_ = 0;
  bool with_stats_ = false;
  float scale_ = 1.0f;
  float masked_ = 0.0f;  // -inf
};

// The operands of one backward run: inputs q, k, v, o, d_o (bf16) and stats (fp32, from a
// forward with stats); outputs dq, dk, dv (bf16, shaped like q, k, v).
struct SdpaBackwardOperands {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;
  const void* d_o = nullptr;
  const void* stats = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
};

class CudnnSdpaBackward {
 public:
  // shape.kv_heads must equal shape.q_heads (see above); else kUnsupported.
  static sim::Result<std::unique_ptr<CudnnSdpaBackward>> build(const CudnnApi& api,
                                                               cudnnHandle_t handle,
                                                               const SdpaShape& shape);
  ~CudnnSdpaBackward();
  CudnnSdpaBackward(const CudnnSdpaBackward&) = delete;
  CudnnSdpaBackward& operator=(const CudnnSdpaBackward&) = delete;

  // The plan's workspace plus the graph's own fp32 buffers (softmax_sum and the dQ
  // accumulator), each 256-byte aligned.
  std::int64_t workspace_bytes() const { return workspace_bytes_ + sum_bytes_ + accum_bytes_; }
  // Where in the workspace the graph writes rowsum(dO ∘ O), fp32 [batch, heads, seq_q].
  std::int64_t softmax_sum_offset() const { return workspace_bytes_; }
  // Enqueues on `stream`, which must be the handle's stream: zeroes the dQ accumulator, then
  // executes the graph.
  sim::Status run(cudnnHandle_t handle, cudaStream_t stream, const SdpaBackwardOperands& x,
                  void* workspace) const;

 private:
  explicit CudnnSdpaBackward(const CudnnApi& api) : api_(api) {}
  const CudnnApi& api_;
  std::vector<cudnnBackendDescriptor_t> owned_;
  cudnnBackendDescriptor_t plan_ = nullptr;
  std::int64_t workspace_bytes_ = 0;  // the plan's
  std::int64_t sum_bytes_ = 0;
  std::int64_t accum_bytes_ = 0;
  float scale_ = 1.0f;
  float masked_ = 0.0f;
  float one_ = 1.0f;
};

}  // namespace offsim::backends::cuda
