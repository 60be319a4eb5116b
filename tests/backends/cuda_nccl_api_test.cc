// The on-demand NCCL loader (backends/cuda/nccl_api.h): a missing library or symbol is an error
// naming the file, the library found here loads with every entry point the device calls, and
// ncclInProgress (a non-blocking call under way) is not an error. Needs no GPU.
#include "backends/cuda/nccl_api.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

namespace offsim::backends::cuda {
namespace {

using ::testing::HasSubstr;

TEST(NcclApi, MissingLibraryIsNamedAndUnsupported) {
  auto r = detail::load_nccl("libnccl-offsim-test-missing.so.2");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, sim::ErrorCode::kUnsupported);
  EXPECT_THAT(r.error().message, HasSubstr("NCCL (libnccl-offsim-test-missing.so.2)"));
  EXPECT_THAT(r.error().message, HasSubstr("could not be loaded"));
}

TEST(NcclApi, LibraryWithoutNcclSymbolsIsRefusedNamingTheSymbol) {
  // libm is a real shared object without NCCL's entry points.
  auto r = detail::load_nccl("libm.so.6");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, sim::ErrorCode::kUnsupported);
  EXPECT_THAT(r.error().message, HasSubstr("has no symbol ncclGetVersion"));
}

TEST(NcclApi, LoadsTheLibraryOfThisMachineWhenInstalled) {
  auto r = detail::load_nccl(nccl_library_file());
  if (!r) GTEST_SKIP() << "NCCL is not installed here: " << r.error().message;
  EXPECT_GE(r->version, 21400);
  EXPECT_NE(r->CommInitRankConfig, nullptr);
  EXPECT_NE(r->CommAbort, nullptr);
  EXPECT_NE(r->Send, nullptr);
  EXPECT_NE(r->Recv, nullptr);
  EXPECT_THAT(r->GetErrorString(ncclInvalidArgument), HasSubstr("invalid argument"));
}

TEST(NcclApi, InProgressIsNotAnErrorAndFailuresNameTheCall) {
  NcclApi api;  // check() needs no library: without GetErrorString the text is "?"
  EXPECT_TRUE(api.check(ncclSuccess, "ncclAllReduce"));
  EXPECT_TRUE(api.check(ncclInProgress, "ncclAllReduce"));
  const sim::Status bad = api.check(ncclInvalidUsage, "ncclSend");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, sim::ErrorCode::kDevice);
  EXPECT_THAT(bad.error().message, HasSubstr("ncclSend"));
  EXPECT_THAT(bad.error().message, HasSubstr("NCCL error 5"));
}

TEST(NcclApi, NonBlockingConfig) {
  const ncclConfig_t c = nonblocking_config();
  EXPECT_EQ(c.blocking, 0);
  EXPECT_EQ(c.size, sizeof(ncclConfig_t));
}

TEST(NcclApi, LibraryFileFollowsTheEnvironment) {
  ::setenv("OFFSIM_NCCL_LIBRARY", "/opt/nccl/libnccl.so.2", 1);
  EXPECT_EQ(nccl_library_file(), "/opt/nccl/libnccl.so.2");
  ::unsetenv("OFFSIM_NCCL_LIBRARY");
  EXPECT_EQ(nccl_library_file(), "libnccl.so.2");
}

}  // namespace
}  // namespace offsim::backends::cuda
