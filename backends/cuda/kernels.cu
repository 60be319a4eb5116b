// The replay's own kernels and their thin launch wrappers (see kernels.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels.h"

namespace offsim::backends::cuda {
namespace {

constexpr int kThreads = 256;

__device__ std::uint32_t hash32(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

__global__ void fill_kernel(unsigned char* data, std::int64_t bytes, std::uint32_t seed) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < bytes;
       i += stride) {
    // Random sign and low three bits over 0x38: every byte is a finite, non-zero number read
    // as fp8 e4m3/e5m2 and every 16/32-bit word one as bf16/fp16/fp32, with about four random
    // bits per byte, so tensor cores switch as on real data (near-constant data draws less power).
    const std::uint32_t h = hash32(static_cast<std::uint64_t>(i) ^ seed);
    data[i] = static_cast<unsigned char>(((h & 8u) << 4) | 0x38u | (h & 7u));
  }
}

__global__ void elementwise_kernel(const float4* in, float4* out, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    float4 v = in[i];
    v.x = v.x * 0.5f + 0.25f;
    v.y = v.y * 0.5f + 0.25f;
    v.z = v.z * 0.5f + 0.25f;
    v.w = v.w * 0.5f + 0.25f;
    out[i] = v;
  }
}

constexpr int kAttnWarps = 8;   // query rows per block, one warp each
constexpr int kAttnTile = 32;   // keys per shared-memory tile
constexpr int kMaxPerLane = 8;  // head_dim <= 32 * 8 = kMaxAttentionHeadDim
static_assert(32 * kMaxPerLane == kMaxAttentionHeadDim);

__global__ void attention_kernel(const __nv_bfloat16* q, const __nv_bfloat16* k,
                                 const __nv_bfloat16* v, __nv_bfloat16* out, AttentionLaunch a,
                                 std::int64_t bh_first) {
  extern __shared__ __nv_bfloat16 smem[];
  const int hd = static_cast<int>(a.head_dim);
  __nv_bfloat16* ks = smem;
  __nv_bfloat16* vs = smem + kAttnTile * hd;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const std::int64_t bh = bh_first + blockIdx.y;  // grid.y is at most 65535: launched in chunks
  const std::int64_t kvh = bh / a.kv_group;
  const std::int64_t qi = static_cast<std::int64_t>(blockIdx.x) * kAttnWarps + warp;
  const bool active = qi < a.seq_q;
  const std::int64_t offset = a.seq_kv - a.seq_q;  // causal: query i sees keys <= i + offset
  float qv[kMaxPerLane];
  float acc[kMaxPerLane];
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) {
    const int d = lane + 32 * t;
    qv[t] = (active && d < hd) ? __bfloat162float(q[(bh * a.seq_q + qi) * hd + d]) : 0.0f;
    acc[t] = 0.0f;
  }
  float m = -INFINITY;
  float l = 0.0f;
  const float scale = rsqrtf(static_cast<float>(hd));
  std::int64_t kv_end = a.seq_kv;
  if (a.causal) {
    const std::int64_t last_q =
        min(a.seq_q - 1, static_cast<std::int64_t>(blockIdx.x) * kAttnWarps + kAttnWarps - 1);
    kv_end = min(kv_end, last_q + offset + 1);
  }
  for (std::int64_t j0 = 0; j0 < kv_end; j0 += kAttnTile) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < kAttnTile * hd; idx += blockDim.x) {
      const std::int64_t j = j0 + idx / hd;
      const int d = idx % hd;
      const bool in_range = j < a.seq_kv;
      ks[idx] = in_range ? k[(kvh * a.seq_kv + j) * hd + d] : __float2bfloat16(0.0f);
      vs[idx] = in_range ? v[(kvh * a.seq_kv + j) * hd + d] : __float2bfloat16(0.0f);
    }
    __syncthreads();
    if (!active) continue;  // uniform per warp
    for (int jj = 0; jj < kAttnTile; ++jj) {
      const std::int64_t j = j0 + jj;
      if (j >= a.seq_kv || (a.causal && j > qi + offset)) break;  // uniform per warp
      float s = 0.0f;
#pragma unroll
      for (int t = 0; t < kMaxPerLane; ++t) {
        const int d = lane + 32 * t;
        if (d < hd) s += qv[t] * __bfloat162float(ks[jj * hd + d]);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      s *= scale;
      const float m_new = fmaxf(m, s);
      const float corr = __expf(m - m_new);
      const float p = __expf(s - m_new);
      l = l * corr + p;
#pragma unroll
      for (int t = 0; t < kMaxPerLane; ++t) {
        const int d = lane + 32 * t;
        if (d < hd) acc[t] = acc[t] * corr + p * __bfloat162float(vs[jj * hd + d]);
      }
      m = m_new;
    }
  }
  if (!active) return;
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) {
    const int d = lane + 32 * t;
    if (d < hd) out[(bh * a.seq_q + qi) * hd + d] = __float2bfloat16(l > 0.0f ? acc[t] / l : 0.0f);
  }
}

__global__ void empty_kernel() {}

// Blocks for a grid-stride loop over n > 0 items: enough to fill any GPU (65536 blocks of 256
// threads), never 0; the loops index in 64 bits, so n may exceed 2^31.
int grid_for(std::int64_t n) {
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 65536 ? 65536 : blocks));
}

constexpr std::int64_t kMaxGridY = 65535;

}  // namespace

cudaError_t launch_fill(void* data, std::int64_t bytes, std::uint32_t seed, cudaStream_t stream) {
  if (bytes <= 0) return cudaSuccess;
  fill_kernel<<<grid_for(bytes), kThreads, 0, stream>>>(static_cast<unsigned char*>(data), bytes,
                                                        seed);
  return cudaGetLastError();
}

cudaError_t launch_elementwise(const void* in, void* out, std::int64_t bytes_each,
                               cudaStream_t stream) {
  const std::int64_t n = bytes_each / static_cast<std::int64_t>(sizeof(float4));
  if (n <= 0) return cudaSuccess;
  elementwise_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<const float4*>(in),
                                                           static_cast<float4*>(out), n);
  return cudaGetLastError();
}

cudaError_t launch_attention(const void* qkv, void* out, const AttentionLaunch& a,
                             cudaStream_t stream) {
  if (a.batch_heads <= 0 || a.seq_q <= 0 || a.seq_kv <= 0 || a.head_dim <= 0) return cudaSuccess;
  if (a.head_dim > 32 * kMaxPerLane || a.kv_group < 1 || a.batch_heads % a.kv_group != 0) {
    return cudaErrorInvalidValue;  // the device checks these first and names the shape
  }
  const auto* q = static_cast<const __nv_bfloat16*>(qkv);
  const std::int64_t kv_heads = a.batch_heads / a.kv_group;
  const __nv_bfloat16* k = q + a.batch_heads * a.seq_q * a.head_dim;
  const __nv_bfloat16* v = k + kv_heads * a.seq_kv * a.head_dim;
  const std::int64_t row_blocks = (a.seq_q + kAttnWarps - 1) / kAttnWarps;
  if (row_blocks > 0x7fffffff) return cudaErrorInvalidValue;  // grid.x limit
  // K and V tiles: 2 · 32 · head_dim · 2 bytes, at most 32 KiB (head_dim 256), under the 48 KiB
  // every GPU gives without opting in.
  const std::size_t smem =
      2 * kAttnTile * static_cast<std::size_t>(a.head_dim) * sizeof(__nv_bfloat16);
  for (std::int64_t first = 0; first < a.batch_heads; first += kMaxGridY) {
    const std::int64_t count =
        a.batch_heads - first < kMaxGridY ? a.batch_heads - first : kMaxGridY;
    const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(count));
    attention_kernel<<<grid, kAttnWarps * 32, smem, stream>>>(
        q, k, v, static_cast<__nv_bfloat16*>(out), a, first);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t launch_empty(cudaStream_t stream) {
  empty_kernel<<<1, 1, 0, stream>>>();
  return cudaGetLastError();
}

}  // namespace offsim::backends::cuda
