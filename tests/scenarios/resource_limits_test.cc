// Plan-size and memory limits (messages name the estimate, the limit and the flag), the
// watchdog, and a sweep whose points exceed the limit: error rows, not a failed sweep.
#include "scenarios/resource_limits.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "scenarios/scenario_loader.h"
#include "scenarios/sweep_runner.h"

namespace offsim::scenarios {
namespace {

namespace fs = std::filesystem;

constexpr const char* kTiny =
    "name: tiny\n"
    "model: {name: tiny, vocab_size: 1024, hidden: 256, layers: 2, heads: 4, activation: swiglu,"
    " norm: rmsnorm}\n"
    "hardware: {system: h100-1gpu}\n"
    "training: {global_batch: 8, micro_batch: 1, seq_len: 256}\n";

class ResourceLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("offsim_limits_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  models::Scenario tiny() {
    auto file = load_scenario_file(write("tiny.yaml", kTiny));
    EXPECT_TRUE(file) << file.error().message;
    auto s = scenario_from_document(file->base, file->base_dir);
    EXPECT_TRUE(s) << s.error().message;
    return *s;
  }
  fs::path dir_;
};

TEST_F(ResourceLimitsTest, PlanOpsLimitNamesEstimateLimitAndFlag) {
  const models::Scenario s = tiny();
  const double ops = models::estimate_plan_size(s).ops;
  ASSERT_GT(ops, 10);
  EXPECT_TRUE(check_plan_size(s, {.max_plan_ops = static_cast<std::int64_t>(ops)}));
  auto st = check_plan_size(s, {.max_plan_ops = static_cast<std::int64_t>(ops) - 1});
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, sim::ErrorCode::kLimitExceeded);
  const std::string& m = st.error().message;
  EXPECT_NE(m.find(fmt::format("estimated {:.0f} ops", ops)), std::string::npos) << m;
  EXPECT_NE(m.find(fmt::format("over the limit of {} ops", static_cast<std::int64_t>(ops) - 1)),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("--max-plan-ops N"), std::string::npos) << m;
}

TEST_F(ResourceLimitsTest, MemoryLimitUsesTheEstimatedBytes) {
  const models::Scenario s = tiny();
  const double bytes = models::estimate_plan_size(s).bytes;
  EXPECT_TRUE(check_plan_size(s, {.max_memory_bytes = static_cast<std::int64_t>(bytes) + 1}));
  auto st = check_plan_size(s, {.max_memory_bytes = static_cast<std::int64_t>(bytes / 2)});
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("--max-memory BYTES"), std::string::npos) << st.error().message;
  // The default is half of physical memory (when it is known).
  if (physical_memory_bytes() > 0) {
    EXPECT_EQ(default_max_memory_bytes(), physical_memory_bytes() / 2);
  }
}

TEST_F(ResourceLimitsTest, WatchdogFiresOnlyAfterItsTime) {
  std::atomic<bool> flag{false};
  {
    Watchdog never(0.0, flag);
    EXPECT_FALSE(never.fired());
  }
  EXPECT_FALSE(flag.load());
  {
    Watchdog dog(3600.0, flag);  // destroyed long before it is due
  }
  EXPECT_FALSE(flag.load());
  Watchdog soon(0.001, flag);
  while (!flag.load()) std::this_thread::yield();
  EXPECT_TRUE(soon.fired());
}

TEST_F(ResourceLimitsTest, SweepPointsOverTheLimitAreErrorRows) {
  // micro_batch 1 gives 8 micro-batches, 8 gives 1: only the first exceeds a limit set between.
  const std::string path =
      write("sweep.yaml", std::string(kTiny) + "sweep:\n  training.micro_batch: [1, 8]\n");
  auto file = load_scenario_file(path);
  ASSERT_TRUE(file) << file.error().message;
  models::Scenario small = tiny();
  small.training.micro_batch = 8;
  const double small_ops = models::estimate_plan_size(small).ops;
  SweepRunOptions o;
  o.out_path = (dir_ / "out.csv").string();
  o.jobs = 2;
  o.progress = false;
  o.limits.max_plan_ops = static_cast<std::int64_t>(small_ops);
  auto summary = run_sweep(*file, o);
  ASSERT_TRUE(summary) << summary.error().message;
  EXPECT_EQ(summary->evaluated, 2);
  EXPECT_EQ(summary->errors, 1);
  std::ifstream in(o.out_path);
  std::stringstream text;
  text << in.rdbuf();
  std::string header, row0, row1;
  std::getline(text, header);
  std::getline(text, row0);
  std::getline(text, row1);
  EXPECT_NE(row0.find("plan too large"), std::string::npos) << row0;
  EXPECT_EQ(row1.find("plan too large"), std::string::npos) << row1;
  EXPECT_NE(row1.find(",true,"), std::string::npos) << row1;  // fits
}

}  // namespace
}  // namespace offsim::scenarios
