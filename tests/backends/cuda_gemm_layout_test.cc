// The cuBLASLt layout of the CUDA device's GEMMs (backends/cuda/gemm_layout.h), checked without
// a GPU: dimensions, leading dimensions, batch strides and the operand bytes the device checks.
#include "backends/cuda/gemm_layout.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace offsim::backends::cuda {
namespace {

// Column-major index of element (row, col) of an LtMatrix, and the row-major index of the same
// element in the replay's own view, to check that the two describe one buffer.
std::int64_t col_major(const LtMatrix& m, std::int64_t row, std::int64_t col) {
  return row + col * m.ld;
}

TEST(CudaGemmLayout, RectangularBf16IsTnWithLeadingDimensionsKAndN) {
  // C[m×n] = A[m×k]·B[k×n] with m = 4096, n = 1024, k = 512, run as C^T = op(B)·op(A):
  //   cuBLAS A (our B): 512 rows × 1024 cols, ld 512, transposed → 1024×512
  //   cuBLAS B (our A): 512 rows × 4096 cols, ld 512, not transposed
  //   cuBLAS C:         1024 rows × 4096 cols, ld 1024
  const GemmLayout l = gemm_layout({.m = 4096, .n = 1024, .k = 512}, sim::DType::kBf16);
  EXPECT_TRUE(l.transa);
  EXPECT_FALSE(l.transb);
  EXPECT_EQ(l.a.rows, 512u);
  EXPECT_EQ(l.a.cols, 1024u);
  EXPECT_EQ(l.a.ld, 512);
  EXPECT_EQ(l.b.rows, 512u);
  EXPECT_EQ(l.b.cols, 4096u);
  EXPECT_EQ(l.b.ld, 512);
  EXPECT_EQ(l.c.rows, 1024u);
  EXPECT_EQ(l.c.cols, 4096u);
  EXPECT_EQ(l.c.ld, 1024);
  EXPECT_EQ(l.batch_count, 1);
  EXPECT_EQ(l.input, sim::DType::kBf16);
  EXPECT_EQ(l.output, sim::DType::kBf16);
  EXPECT_FALSE(l.fast_tf32);
  // Bytes: A 4096·512·2 = 4 MiB, B 512·1024·2 = 1 MiB, C 4096·1024·2 = 8 MiB.
  EXPECT_EQ(l.our_a_bytes, 4096 * 512 * 2);
  EXPECT_EQ(l.our_b_bytes, 512 * 1024 * 2);
  EXPECT_EQ(l.our_c_bytes, 4096 * 1024 * 2);
}

TEST(CudaGemmLayout, ShapesAgreeUnderTheOperations) {
  // op(A) is n×k, op(B) is k×m, C is n×m: the inner dimensions and the output must match.
  const sim::GemmShape g{.m = 96, .n = 40, .k = 24};
  const GemmLayout l = gemm_layout(g, sim::DType::kFp16);
  const std::uint64_t op_a_rows = l.transa ? l.a.cols : l.a.rows;
  const std::uint64_t op_a_cols = l.transa ? l.a.rows : l.a.cols;
  const std::uint64_t op_b_rows = l.transb ? l.b.cols : l.b.rows;
  const std::uint64_t op_b_cols = l.transb ? l.b.rows : l.b.cols;
  EXPECT_EQ(op_a_cols, op_b_rows);  // k
  EXPECT_EQ(op_a_cols, 24u);
  EXPECT_EQ(l.c.rows, op_a_rows);  // n
  EXPECT_EQ(l.c.cols, op_b_cols);  // m
  EXPECT_EQ(l.c.rows, 40u);
  EXPECT_EQ(l.c.cols, 96u);
  // A leading dimension is never smaller than the rows it spans (cuBLASLt refuses that).
  EXPECT_GE(l.a.ld, static_cast<std::int64_t>(l.a.rows));
  EXPECT_GE(l.b.ld, static_cast<std::int64_t>(l.b.rows));
  EXPECT_GE(l.c.ld, static_cast<std::int64_t>(l.c.rows));
}

TEST(CudaGemmLayout, LayoutsAddressTheReplaysRowMajorBuffers) {
  // Our A is row-major [m][k]: element A[i][p] at i·k + p. cuBLAS B (our A) is k×m column-major
  // with ld k: element (p, i) at p + i·k, the same offset. Likewise our C[i][j] at i·n + j is
  // cuBLAS C (j, i) at j + i·n, and our B read as the weight layout [n][k] (W[j][p] at j·k + p)
  // is cuBLAS A (p, j) at p + j·k.
  const sim::GemmShape g{.m = 7, .n = 5, .k = 3};
  const GemmLayout l = gemm_layout(g, sim::DType::kBf16);
  for (std::int64_t i = 0; i < g.m; ++i) {
    for (std::int64_t p = 0; p < g.k; ++p) EXPECT_EQ(col_major(l.b, p, i), i * g.k + p);
    for (std::int64_t j = 0; j < g.n; ++j) EXPECT_EQ(col_major(l.c, j, i), i * g.n + j);
  }
  for (std::int64_t j = 0; j < g.n; ++j) {
    for (std::int64_t p = 0; p < g.k; ++p) EXPECT_EQ(col_major(l.a, p, j), j * g.k + p);
  }
  // The last element of each matrix is the last element of its buffer.
  EXPECT_EQ(col_major(l.b, g.k - 1, g.m - 1) + 1, l.our_a_bytes / 2);
  EXPECT_EQ(col_major(l.a, g.k - 1, g.n - 1) + 1, l.our_b_bytes / 2);
  EXPECT_EQ(col_major(l.c, g.n - 1, g.m - 1) + 1, l.our_c_bytes / 2);
}

TEST(CudaGemmLayout, BatchedStridesAreOneMatrixApart) {
  // batch 6 of 128×256×64: strides in elements are k·n = 16384, k·m = 8192 and n·m = 32768;
  // the buffers hold 6 matrices each.
  const GemmLayout l = gemm_layout({.m = 128, .n = 256, .k = 64, .batch = 6}, sim::DType::kFp32);
  EXPECT_EQ(l.batch_count, 6);
  EXPECT_EQ(l.a.batch_stride, 64 * 256);
  EXPECT_EQ(l.b.batch_stride, 64 * 128);
  EXPECT_EQ(l.c.batch_stride, 256 * 128);
  EXPECT_EQ(l.our_a_bytes, 128 * 64 * 4 * 6);
  EXPECT_EQ(l.our_b_bytes, 64 * 256 * 4 * 6);
  EXPECT_EQ(l.our_c_bytes, 128 * 256 * 4 * 6);
  EXPECT_TRUE(l.fast_tf32);  // fp32 runs on TF32 tensor cores, as the cost model assumes
}

TEST(CudaGemmLayout, Fp8ReadsOneByteAndWritesBf16) {
  // 4096³ fp8: A and B 4096·4096·1 = 16 MiB each, C 4096·4096·2 = 32 MiB.
  const sim::GemmShape g{.m = 4096, .n = 4096, .k = 4096, .dtype = sim::DType::kFp8};
  const GemmLayout l = gemm_layout(g, sim::DType::kFp8);
  EXPECT_EQ(l.input, sim::DType::kFp8);
  EXPECT_EQ(l.output, sim::DType::kBf16);
  EXPECT_TRUE(l.transa);  // cuBLASLt's fp8 kernels take only TN
  EXPECT_FALSE(l.transb);
  EXPECT_EQ(l.our_a_bytes, std::int64_t{16} << 20);
  EXPECT_EQ(l.our_b_bytes, std::int64_t{16} << 20);
  EXPECT_EQ(l.our_c_bytes, std::int64_t{32} << 20);
}

TEST(CudaGemmLayout, Fp8FallbackToBf16NeedsTwiceTheInputBytes) {
  // Run as bf16 (no fp8 kernel), the same shape reads 2 bytes per input element: buffers sized
  // for fp8 (what the replay allocates) are too small, which the device must check before
  // launching. Output bytes do not change (bf16 either way).
  const sim::GemmShape g{.m = 1024, .n = 2048, .k = 512, .dtype = sim::DType::kFp8};
  const GemmLayout fp8 = gemm_layout(g, sim::DType::kFp8);
  const GemmLayout bf16 = gemm_layout(g, sim::DType::kBf16);
  EXPECT_EQ(bf16.our_a_bytes, 2 * fp8.our_a_bytes);
  EXPECT_EQ(bf16.our_b_bytes, 2 * fp8.our_b_bytes);
  EXPECT_EQ(bf16.our_c_bytes, fp8.our_c_bytes);
}

TEST(CudaGemmLayout, Fp8ShapeRules) {
  EXPECT_TRUE(fp8_shape_supported({.m = 1, .n = 8, .k = 16, .dtype = sim::DType::kFp8}));
  EXPECT_FALSE(fp8_shape_supported({.m = 16, .n = 16, .k = 24, .dtype = sim::DType::kFp8}));
  EXPECT_FALSE(fp8_shape_supported({.m = 16, .n = 12, .k = 32, .dtype = sim::DType::kFp8}));
  EXPECT_EQ(gemm_output_dtype(sim::DType::kFp8), sim::DType::kBf16);
  EXPECT_EQ(gemm_output_dtype(sim::DType::kFp16), sim::DType::kFp16);
  EXPECT_EQ(gemm_output_dtype(sim::DType::kFp32), sim::DType::kFp32);
}

}  // namespace
}  // namespace offsim::backends::cuda
