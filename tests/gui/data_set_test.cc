#include "gui/model/data_set.h"

#include <filesystem>

#include <gtest/gtest.h>

#include "sim/core/file_io.h"
#include "sim/trace/timeline_json.h"
#include "tests/gui/test_timelines.h"

namespace offsim::gui {
namespace {

using testing::TimelineBuilder;

class DataSetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) / "offsim_gui_data_set";
    std::filesystem::create_directories(dir_);
  }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    EXPECT_TRUE(sim::write_text_file_atomic(path, text));
    return path;
  }
  std::string write_timeline(const std::string& name, const std::string& source) {
    auto t = TimelineBuilder({{"rank0.compute", 0, sim::LaneRole::kCompute},
                              {"rank0.h2d", 0, sim::LaneRole::kH2D}},
                             source)
                 .span("a", 0, sim::OpKind::kGemm, 0, 10)
                 .span("b", 1, sim::OpKind::kCopy, 0, 20)
                 .build();
    return write(name, sim::timeline_to_json(t).dump());
  }
  std::filesystem::path dir_;
};

TEST(FileKind, ByExtension) {
  EXPECT_EQ(file_kind("a/s.jsonl"), FileKind::kSweep);
  EXPECT_EQ(file_kind("s.csv"), FileKind::kSweep);
  EXPECT_EQ(file_kind("x.yaml"), FileKind::kScenario);
  EXPECT_EQ(file_kind("x.yml"), FileKind::kScenario);
  EXPECT_EQ(file_kind("t.json"), FileKind::kTimeline);
}

TEST_F(DataSetTest, LoadsPredictedMeasuredAndSweepTogether) {
  const std::string predicted = write_timeline("p.json", "predicted");
  const std::string measured = write_timeline("m.json", "measured");
  const std::string sweep = write(
      "s.jsonl",
      R"({"index": 0, "axes": {"a": 1}, "report": {"step_time_s": 1.0, "fits": true, "hbm_peak_bytes": 5}})"
      "\n");
  std::vector<double> progress;
  auto data = load_data_set({predicted, measured, sweep}, nullptr,
                            [&](double f) { progress.push_back(f); });
  ASSERT_TRUE(data) << data.error().message;
  ASSERT_TRUE(data->timeline);
  // Two lanes in each timeline, paired: compute (p), compute (m), h2d (p), h2d (m).
  ASSERT_EQ(data->timeline->rows().size(), 4u);
  EXPECT_EQ(data->timeline->rows()[1].label, "rank0.compute (measured)");
  EXPECT_EQ(data->timeline->span_count(), 4u);
  EXPECT_EQ(data->memory.size(), 2u);
  ASSERT_TRUE(data->sweep);
  EXPECT_EQ(data->sweep->rows.size(), 1u);
  ASSERT_FALSE(progress.empty());
  EXPECT_DOUBLE_EQ(progress.back(), 1.0);
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
}

TEST_F(DataSetTest, OpensTheChromeTraceOfRunTrace) {
  auto t = TimelineBuilder({{"rank0.compute", 0, sim::LaneRole::kCompute},
                            {"rank0.h2d", 0, sim::LaneRole::kH2D}})
               .span("a", 0, sim::OpKind::kGemm, 0, 10'000)
               .span("b", 1, sim::OpKind::kCopy, 0, 20'000)
               .build();
  const std::string trace = write("step.trace.json", sim::chrome_trace_json({&t}));
  auto data = load_data_set({trace});
  ASSERT_TRUE(data) << data.error().message;
  ASSERT_TRUE(data->timeline);
  EXPECT_EQ(data->timeline->rows().size(), 2u);
  EXPECT_EQ(data->timeline->span_count(), 2u);
  ASSERT_EQ(data->warnings.size(), 1u);  // says what a trace lacks and what to pass instead
  EXPECT_NE(data->warnings[0].find("--timeline-out"), std::string::npos) << data->warnings[0];
}

TEST_F(DataSetTest, ErrorsNameTheFile) {
  auto missing = load_data_set({(dir_ / "nope.json").string()});
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("nope.json"), std::string::npos);
  const std::string s1 = write("a.jsonl", "");
  const std::string s2 = write("b.jsonl", "");
  auto two_sweeps = load_data_set({s1, s2});
  ASSERT_FALSE(two_sweeps);
  EXPECT_NE(two_sweeps.error().message.find("only one sweep"), std::string::npos);
  auto scenario = load_data_set({(dir_ / "x.yaml").string()});
  ASSERT_FALSE(scenario);
  EXPECT_NE(scenario.error().message.find("Scenario view"), std::string::npos);
}

TEST_F(DataSetTest, CancelledLoadReturnsCancelled) {
  const std::string predicted = write_timeline("p.json", "predicted");
  std::atomic<bool> cancel{true};
  auto data = load_data_set({predicted}, &cancel);
  ASSERT_FALSE(data);
  EXPECT_EQ(data.error().code, sim::ErrorCode::kCancelled);
}

}  // namespace
}  // namespace offsim::gui
