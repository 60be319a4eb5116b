// The CUDA/cuBLAS/NCCL error mapping (backends/cuda/cuda_check.h). Needs the CUDA runtime
// library for error names, but no GPU or driver: it runs wherever the CUDA code is built.
#include "backends/cuda/cuda_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace offsim::backends::cuda {
namespace {

using ::testing::HasSubstr;

TEST(CudaCheck, NoGpuCodesAreNoDeviceAndSayNoGpu) {
  for (cudaError_t code : {cudaErrorNoDevice, cudaErrorInsufficientDriver,
                           cudaErrorSystemDriverMismatch, cudaErrorStubLibrary}) {
    const sim::Error e = cuda_error(code, "cudaGetDeviceCount");
    EXPECT_EQ(e.code, sim::ErrorCode::kNoDevice) << e.message;
    EXPECT_THAT(e.message, HasSubstr("no GPU: "));
    EXPECT_THAT(e.message, HasSubstr("cudaGetDeviceCount"));
  }
  EXPECT_THAT(cuda_error(cudaErrorStubLibrary, "x").message, HasSubstr("stub"));
}

TEST(CudaCheck, OutOfMemoryIsLimitExceededAndNamesTheCall) {
  const sim::Error e = cuda_error(cudaErrorMemoryAllocation, "cudaMalloc(&ws, kWorkspaceBytes)");
  EXPECT_EQ(e.code, sim::ErrorCode::kLimitExceeded);
  EXPECT_THAT(e.message, HasSubstr("cudaMalloc(&ws, kWorkspaceBytes)"));
}

TEST(CudaCheck, MissingKernelImageSaysWhatToRebuild) {
  const sim::Error e = cuda_error(cudaErrorNoKernelImageForDevice, "cuda::launch_fill");
  EXPECT_EQ(e.code, sim::ErrorCode::kDevice);
  EXPECT_THAT(e.message, HasSubstr("CMAKE_CUDA_ARCHITECTURES"));
  EXPECT_THAT(e.message, HasSubstr("cudaErrorNoKernelImageForDevice"));
}

TEST(CudaCheck, OtherCudaErrorsAreDeviceErrorsWithTheirName) {
  const sim::Error e = cuda_error(cudaErrorIllegalAddress, "stream 'rank0.compute'");
  EXPECT_EQ(e.code, sim::ErrorCode::kDevice);
  EXPECT_THAT(e.message, HasSubstr("cudaErrorIllegalAddress"));
  EXPECT_THAT(e.message, HasSubstr("stream 'rank0.compute'"));
}

TEST(CudaCheck, CublasStatusesAreNamed) {
  // CUBLAS_STATUS_NOT_INITIALIZED (1): no GPU; ALLOC_FAILED (3): out of memory; others named.
  EXPECT_EQ(cublas_error(1, "cublasLtCreate").code, sim::ErrorCode::kNoDevice);
  EXPECT_EQ(cublas_error(3, "cublasLtMatmul").code, sim::ErrorCode::kLimitExceeded);
  const sim::Error e = cublas_error(15, "cublasLtMatmulAlgoGetHeuristic");
  EXPECT_EQ(e.code, sim::ErrorCode::kDevice);
  EXPECT_THAT(e.message, HasSubstr("CUBLAS_STATUS_NOT_SUPPORTED"));
  EXPECT_THAT(e.message, HasSubstr("cublasLtMatmulAlgoGetHeuristic"));
  EXPECT_THAT(cublas_error(99, "x").message, HasSubstr("unknown cuBLAS status"));
}

TEST(CudaCheck, NcclErrorsCarryTheirText) {
  const sim::Error e = nccl_error(6, "remote process exited or there was a network error",
                                  "ncclAllReduce(p, p, floats, ncclFloat, ncclSum, nc, st)");
  EXPECT_EQ(e.code, sim::ErrorCode::kDevice);
  EXPECT_THAT(e.message, HasSubstr("remote process exited"));
  EXPECT_THAT(e.message, HasSubstr("ncclAllReduce"));
  EXPECT_THAT(nccl_error(2, nullptr, "x").message, HasSubstr("(?)"));
}

}  // namespace
}  // namespace offsim::backends::cuda
