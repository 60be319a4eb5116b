// Launch wrappers for the replay's own kernels (kernels.cu): buffer fill, a memory-bound
// elementwise pass, an attention kernel and an empty kernel. Host code includes this header;
// the kernels themselves stay in the .cu file. Each wrapper returns the launch's cudaError_t.
//
//   OFFSIM_CUDA_CHECK(cuda::launch_fill(ptr, bytes, /*seed=*/7, stream));
//   OFFSIM_CUDA_CHECK(cuda::launch_elementwise(in, out, bytes_each, stream));
//   cuda::AttentionLaunch a{.batch_heads = 32, .kv_group = 4, .seq_q = 4096, .seq_kv = 4096,
//                           .head_dim = 128, .causal = true};
//   OFFSIM_CUDA_CHECK(cuda::launch_attention(qkv, out, a, stream));
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace offsim::backends::cuda {

// Fills `bytes` with pseudo-random byte values 0x38..0x3F and 0xB8..0xBF (random sign): finite,
// non-zero numbers read as fp32, bf16, fp16 or fp8 (e4m3 and e5m2), so no kernel runs on zeros,
// NaN, denormals or near-constant data.
cudaError_t launch_fill(void* data, std::int64_t bytes, std::uint32_t seed, cudaStream_t stream);

// Reads `bytes_each` bytes from `in` and writes as many to `out` (16-byte accesses).
cudaError_t launch_elementwise(const void* in, void* out, std::int64_t bytes_each,
                               cudaStream_t stream);

// bf16 attention: q is [batch_heads][seq_q][head_dim], k and v are
// [batch_heads / kv_group][seq_kv][head_dim], packed one after the other in `qkv`; out is laid
// out like q. fp32 accumulation with an online softmax; head_dim <= 256.
constexpr std::int64_t kMaxAttentionHeadDim = 256;
struct AttentionLaunch {
  std::int64_t batch_heads = 0;  // batch × query heads
  std::int64_t kv_group = 1;     // query heads per key/value head (GQA)
  std::int64_t seq_q = 0;
  std::int64_t seq_kv = 0;
  std::int64_t head_dim = 0;
  bool causal = true;
};
cudaError_t launch_attention(const void* qkv, void* out, const AttentionLaunch& a,
                             cudaStream_t stream);

// An empty kernel, for launch-overhead measurements.
cudaError_t launch_empty(cudaStream_t stream);

}  // namespace offsim::backends::cuda
