// The cuBLASLt view of one replay GEMM, as plain numbers (no CUDA types), so that the layout
// rules are unit-tested on machines without a GPU (tests/backends/cuda_gemm_layout_test.cc).
//
// The replay's GEMM is row-major C[m×n] = A[m×k]·B[k×n]. cuBLASLt is column-major, so the
// device computes the transposed product C^T[n×m] = op(B')·op(A') in the "TN" form that
// cuBLASLt requires for fp8 on Hopper and Ada (transa = T, transb = N):
//   cuBLAS A = our B, stored k×n column-major (ld k), transposed  → n×k
//   cuBLAS B = our A, stored k×m column-major (ld k), not transposed → k×m
//   cuBLAS C = our C, stored n×m column-major (ld n)
// i.e. A is read as row-major [m][k], B as the weight layout [n][k] (a Linear layer's [out][in]),
// C as row-major [m][n]. Operands are random fill, so only the shapes and bytes matter for time.
//
//   GemmLayout l = gemm_layout({.m = 4096, .n = 1024, .k = 512}, sim::DType::kBf16);
//   // l.a = {.rows = 512, .cols = 1024, .ld = 512}; l.a_bytes = 512·1024·2 (our B)
#pragma once

#include <cstdint>

#include "sim/plan/plan.h"
#include "sim/plan/shape_math.h"

namespace offsim::backends::cuda {

struct LtMatrix {
  std::uint64_t rows = 0;
  std::uint64_t cols = 0;
  std::int64_t ld = 0;            // elements between columns
  std::int64_t batch_stride = 0;  // elements between consecutive matrices of a batch
};

struct GemmLayout {
  bool transa = true;   // cuBLAS A (our B) is transposed
  bool transb = false;  // cuBLAS B (our A) is not
  LtMatrix a, b, c;     // cuBLAS A, B and C/D
  std::int32_t batch_count = 1;
  sim::DType input = sim::DType::kBf16;   // A and B element type
  sim::DType output = sim::DType::kBf16;  // C and D element type: bf16 for fp8 inputs
  // fp32 GEMMs use TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32), as the cost model assumes
  // (sim/platform: fp32 dense rate = half the bf16 rate); plain fp32 would run ~8x slower than
  // forecast. Every other type accumulates in fp32 (CUBLAS_COMPUTE_32F).
  bool fast_tf32 = false;
  // Bytes the caller's buffers must hold, batches included (our A, B and C).
  std::int64_t our_a_bytes = 0;
  std::int64_t our_b_bytes = 0;
  std::int64_t our_c_bytes = 0;
};

// Output element type of a GEMM whose inputs are `input` (sim/plan: fp8 products as bf16).
using sim::gemm_output_dtype;

// The layout of `shape` run with inputs of type `run_as` (the shape's own dtype, or bf16 when
// an fp8 GEMM falls back). Dimensions must be positive (the device checks before calling).
inline GemmLayout gemm_layout(const sim::GemmShape& shape, sim::DType run_as) {
  GemmLayout l;
  const auto u = [](std::int64_t x) { return static_cast<std::uint64_t>(x); };
  const std::int64_t batch = shape.batch > 1 ? shape.batch : 1;
  l.input = run_as;
  l.output = gemm_output_dtype(run_as);
  l.fast_tf32 = run_as == sim::DType::kFp32;
  l.a = LtMatrix{u(shape.k), u(shape.n), shape.k, shape.k * shape.n};
  l.b = LtMatrix{u(shape.k), u(shape.m), shape.k, shape.k * shape.m};
  l.c = LtMatrix{u(shape.n), u(shape.m), shape.n, shape.n * shape.m};
  l.batch_count = static_cast<std::int32_t>(batch);
  const std::int64_t in_e = sim::dtype_bytes(run_as);
  const std::int64_t out_e = sim::dtype_bytes(l.output);
  l.our_a_bytes = shape.m * shape.k * in_e * batch;
  l.our_b_bytes = shape.k * shape.n * in_e * batch;
  l.our_c_bytes = shape.m * shape.n * out_e * batch;
  return l;
}

// cuBLASLt's fp8 rules (cuBLASLt docs, "cublasLtMatmul" FP8 notes): TN only, and every leading
// dimension and batch stride a multiple of 16 bytes, which for 1-byte inputs means k % 16 == 0;
// the bf16 output needs n % 8 == 0. Shapes outside them have no fp8 kernel; asking is still
// harmless (the heuristic returns none), this only lets the device say why.
inline bool fp8_shape_supported(const sim::GemmShape& shape) {
  return shape.k % 16 == 0 && shape.n % 8 == 0;
}

}  // namespace offsim::backends::cuda
