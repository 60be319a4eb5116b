#include "calibrate/timing.h"

#include <gtest/gtest.h>

namespace offsim::calibrate {
namespace {

TEST(TimingTest, SteadySamplesStopAtTheMinimum) {
  int calls = 0;
  StableTiming t = measure_stable(
      [&] {
        ++calls;
        return 1e-3;
      },
      StopRule{.warmup = 3, .min_samples = 5, .max_samples = 50});
  EXPECT_TRUE(t.stable);
  EXPECT_EQ(t.samples, 5);
  EXPECT_EQ(calls, 8);  // 3 warm-up + 5
  EXPECT_DOUBLE_EQ(t.median_s, 1e-3);
  EXPECT_DOUBLE_EQ(t.noise, 0.0);
}

TEST(TimingTest, NoisySamplesRunToTheSampleBudget) {
  // 1 ms and 2 ms alternating: median 1.5 ms, quartiles 1 and 2 ms → noise 2/3, never stable.
  int i = 0;
  StableTiming t =
      measure_stable([&] { return (i++ % 2) ? 2e-3 : 1e-3; }, StopRule{.warmup = 0,
                                                                       .min_samples = 4,
                                                                       .max_samples = 20,
                                                                       .max_noise = 0.01,
                                                                       .max_total_s = 100.0});
  EXPECT_FALSE(t.stable);
  EXPECT_EQ(t.samples, 20);
  EXPECT_NEAR(t.median_s, 1.5e-3, 1e-12);
  EXPECT_DOUBLE_EQ(t.min_s, 1e-3);
}

TEST(TimingTest, TimeBudgetStopsEarly) {
  int i = 0;
  // Noisy 1 s / 1.5 s samples with a 3 s budget: the budget is checked only once the minimum of
  // 5 samples is reached, so it stops at the 5th (6.0 s summed).
  StableTiming t =
      measure_stable([&] { return (i++ % 2) ? 1.5 : 1.0; }, StopRule{.warmup = 0,
                                                                     .min_samples = 5,
                                                                     .max_samples = 100,
                                                                     .max_noise = 0.001,
                                                                     .max_total_s = 3.0});
  EXPECT_FALSE(t.stable);
  EXPECT_EQ(t.samples, 5);
}

TEST(TimingTest, BadSamplesAreDropped) {
  int i = 0;
  StableTiming t = measure_stable([&] { return (i++ % 2) ? -1.0 : 2e-3; },
                                  StopRule{.warmup = 0, .min_samples = 3, .max_samples = 10});
  EXPECT_EQ(t.samples, 3);
  EXPECT_DOUBLE_EQ(t.median_s, 2e-3);
  StableTiming none = measure_stable([] { return 0.0; }, StopRule{.max_samples = 5});
  EXPECT_EQ(none.samples, 0);
  EXPECT_FALSE(none.stable);
}

}  // namespace
}  // namespace offsim::calibrate
