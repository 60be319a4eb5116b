// run_calibration on a real GPU (ctest label "gpu"); skips cleanly without one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "calibrate/calibrate.h"
#include "calibrate/microbench.h"

namespace offsim::calibrate {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

TEST(GpuCalibrateTest, NoGpuIsAClearError) {
  auto bench = MicroBench::open(0, 1);
  if (bench) GTEST_SKIP() << "a GPU is present";
  EXPECT_EQ(bench.error().code, sim::ErrorCode::kNoDevice);
  EXPECT_THAT(bench.error().message, HasSubstr("no GPU"));
  CalibrateOptions o;
  o.quick = true;
  auto run = run_calibration(o);
  ASSERT_FALSE(run);
  EXPECT_EQ(run.error().code, sim::ErrorCode::kNoDevice);
}

TEST(GpuCalibrateTest, CopyTimesGrowWithSize) {
  auto bench = MicroBench::open(0, 1);
  if (!bench) GTEST_SKIP() << bench.error().message;
  auto small = bench->copy(CopyLink::kH2D, true, 1 << 20);
  auto large = bench->copy(CopyLink::kH2D, true, 1 << 28);
  ASSERT_TRUE(small) << small.error().message;
  ASSERT_TRUE(large) << large.error().message;
  EXPECT_GT(*large, *small);
  // 256 MiB over any PCIe or C2C link: between 0.1 ms (2.7 TB/s) and 1 s (0.27 GB/s).
  EXPECT_GT(*large, 1e-4);
  EXPECT_LT(*large, 1.0);
}

TEST(GpuCalibrateTest, QuickCalibrationFitsAProfile) {
  auto bench = MicroBench::open(0, 1);
  if (!bench) GTEST_SKIP() << bench.error().message;
  bench = sim::fail(sim::ErrorCode::kCancelled, "released");  // free the GPU for the run
  CalibrateOptions o;
  o.quick = true;
  o.gpus = 1;
  o.command_line = "calibrate_gpu_test";
  auto run = run_calibration(o);
  if (!run && run.error().code == sim::ErrorCode::kNotFound) GTEST_SKIP() << run.error().message;
  ASSERT_TRUE(run) << run.error().message;
  EXPECT_THAT(run->profile.provenance.measured, Contains("host_link.h2d_bytes_per_s"));
  EXPECT_THAT(run->profile.provenance.measured, Contains("gemm.points"));
  EXPECT_GT(run->profile.host_link.h2d_bytes_per_s.value, 1e9);
}

}  // namespace
}  // namespace offsim::calibrate
