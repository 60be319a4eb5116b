// The on-demand cuDNN loader and its error mapping (backends/cuda/cudnn_api.h). Needs no GPU.
#include "backends/cuda/cudnn_api.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace offsim::backends::cuda {
namespace {

using ::testing::HasSubstr;

TEST(CudnnApi, NoGpuStatusesAreNoDevice) {
  for (int status :
       {CUDNN_STATUS_NOT_INITIALIZED, CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER}) {
    const sim::Error e = cudnn_error(status, "text", "cudnnCreate");
    EXPECT_EQ(e.code, sim::ErrorCode::kNoDevice) << e.message;
    EXPECT_THAT(e.message, HasSubstr("no GPU: "));
    EXPECT_THAT(e.message, HasSubstr("cudnnCreate"));
  }
}

TEST(CudnnApi, NotSupportedFamilyIsUnsupportedSoTheCallerFallsBack) {
  for (int status : {CUDNN_STATUS_NOT_SUPPORTED, CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN,
                     CUDNN_STATUS_NOT_SUPPORTED_SHAPE, CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH}) {
    const sim::Error e = cudnn_error(status, nullptr, "cudnnBackendFinalize(plan)");
    EXPECT_EQ(e.code, sim::ErrorCode::kUnsupported) << e.message;
    EXPECT_THAT(e.message, HasSubstr("cudnnBackendFinalize(plan)"));
    EXPECT_THAT(e.message, HasSubstr(std::to_string(status)));
  }
}

TEST(CudnnApi, DeviceAllocationIsLimitExceededAndTheRestDevice) {
  EXPECT_EQ(cudnn_error(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, "", "x").code,
            sim::ErrorCode::kLimitExceeded);
  EXPECT_EQ(cudnn_error(CUDNN_STATUS_EXECUTION_FAILED, "", "x").code, sim::ErrorCode::kDevice);
  EXPECT_EQ(cudnn_error(CUDNN_STATUS_BAD_PARAM, "", "x").code, sim::ErrorCode::kDevice);
}

TEST(CudnnApi, MissingLibraryIsNamed) {
  auto r = detail::load_cudnn("libcudnn-offsim-test-missing.so.9");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, sim::ErrorCode::kUnsupported);
  EXPECT_THAT(r.error().message, HasSubstr("cuDNN (libcudnn-offsim-test-missing.so.9)"));
}

TEST(CudnnApi, LoadsTheLibraryOfThisMachineWhenInstalled) {
  auto r = detail::load_cudnn(cudnn_library_file());
  if (!r) GTEST_SKIP() << "cuDNN is not installed here: " << r.error().message;
  EXPECT_GE(r->version, 90000u);
  EXPECT_NE(r->BackendExecute, nullptr);
  EXPECT_TRUE(r->check(CUDNN_STATUS_SUCCESS, "x"));
  const sim::Status bad = r->check(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute");
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message, HasSubstr("cudnnBackendSetAttribute"));
  EXPECT_THAT(bad.error().message, HasSubstr("2000"));
}

}  // namespace
}  // namespace offsim::backends::cuda
