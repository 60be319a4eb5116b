// Drives the real offsim-gui offscreen: renders the timeline, memory and sweep views of small
// generated inputs to PNG and checks the images and the counts the app reports.
#include <QColor>
#include <QImage>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "sim/core/file_io.h"
#include "sim/engine/simulator.h"
#include "sim/trace/timeline_json.h"
#include "tests/gui/sample_plan.h"

namespace offsim::gui {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string out;
};

RunResult run_gui(const std::string& args) {
  const std::string command =
      fmt::format("QT_QPA_PLATFORM=offscreen '{}' {} 2>&1", OFFSIM_GUI_EXE, args);
  RunResult r;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) r.out += buffer;
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Pixels within a small distance of `colour`.
int count_colour(const QImage& image, QColor colour) {
  int n = 0;
  for (int y = 0; y < image.height(); ++y) {
    for (int x = 0; x < image.width(); ++x) {
      const QColor c = image.pixelColor(x, y);
      if (std::abs(c.red() - colour.red()) + std::abs(c.green() - colour.green()) +
              std::abs(c.blue() - colour.blue()) <=
          12) {
        ++n;
      }
    }
  }
  return n;
}

std::size_t distinct_colours(const QImage& image) {
  std::set<QRgb> colours;
  for (int y = 0; y < image.height(); y += 2) {
    for (int x = 0; x < image.width(); x += 2) colours.insert(image.pixel(x, y));
  }
  return colours.size();
}

class GuiOffscreen : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::path(::testing::TempDir()) / "offsim_gui_offscreen";
    std::filesystem::create_directories(dir_);
    auto result = sim::simulate(testing::sample_offload_plan({.layers = 8}));
    ASSERT_TRUE(result) << result.error().message;
    spans_ = result->timeline.spans.size();
    ASSERT_TRUE(sim::write_text_file_atomic(timeline_path(),
                                            sim::timeline_to_json(result->timeline).dump()));
    ASSERT_TRUE(
        sim::write_text_file_atomic(trace_path(), sim::chrome_trace_json({&result->timeline})));
    // Sweep rows as `offsim sweep` writes them (flat records). (time s, peak GB, fits): the
    // front among the fitting points is 0 (1.0, 60), 1 (0.9, 70) and 3 (0.7, 75); 2 (1.1, 65) is
    // beaten by 1; 4 does not fit (no step time); 5 failed.
    const std::string sweep =
        R"({"index":0,"axes.offload.policy":"none","scenario":"s","fits":true,"step_time_s":1.0,"tokens_per_s":4000,"hbm_peak_bytes":60000000000,"error":null}
{"index":1,"axes.offload.policy":"optimizer","scenario":"s","fits":true,"step_time_s":0.9,"tokens_per_s":4400,"hbm_peak_bytes":70000000000,"error":null}
{"index":2,"axes.offload.policy":"optimizer","scenario":"s","fits":true,"step_time_s":1.1,"tokens_per_s":3600,"hbm_peak_bytes":65000000000,"error":null}
{"index":3,"axes.offload.policy":"activations","scenario":"s","fits":true,"step_time_s":0.7,"tokens_per_s":5700,"hbm_peak_bytes":75000000000,"error":null}
{"index":4,"axes.offload.policy":"none","scenario":"s","fits":false,"step_time_s":null,"tokens_per_s":null,"hbm_peak_bytes":90000000000,"error":null}
{"index":5,"axes.offload.policy":"all","scenario":null,"fits":null,"step_time_s":null,"tokens_per_s":null,"hbm_peak_bytes":null,"error":"does not build"}
)";
    ASSERT_TRUE(sim::write_text_file_atomic(sweep_path(), sweep));
  }
  static std::string timeline_path() { return (dir_ / "timeline.json").string(); }
  static std::string trace_path() { return (dir_ / "step.trace.json").string(); }
  static std::string sweep_path() { return (dir_ / "sweep.jsonl").string(); }
  static std::string png(const std::string& name) { return (dir_ / name).string(); }

  static std::filesystem::path dir_;
  static std::size_t spans_;
};

std::filesystem::path GuiOffscreen::dir_;
std::size_t GuiOffscreen::spans_ = 0;

TEST_F(GuiOffscreen, TimelineDrawsEveryLaneAndSpan) {
  // 2 ranks x (compute, h2d, d2h) + host0.cpu = 7 lanes; 2 x 3 x 8 + 1 = 49 spans.
  ASSERT_EQ(spans_, 49u);
  const RunResult r =
      run_gui(fmt::format("--screenshot '{}' --view timeline '{}'", png("t.png"), timeline_path()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("timeline: lanes=7 spans=49 "), std::string::npos) << r.out;
  QImage image(QString::fromStdString(png("t.png")));
  ASSERT_FALSE(image.isNull());
  EXPECT_GT(image.width(), 1000);  // the tab inside a 1400 px wide window
  EXPECT_GT(distinct_colours(image), 20u);
  EXPECT_GT(count_colour(image, QColor(31, 119, 180)), 500);  // gemm spans
  EXPECT_GT(count_colour(image, QColor(44, 160, 44)), 500);   // copy spans
}

TEST_F(GuiOffscreen, OpensTheChromeTraceOfRunTrace) {
  // The file of `offsim run --trace` shows the same lanes and spans as the Timeline JSON, and
  // the app says what a trace lacks.
  const RunResult r =
      run_gui(fmt::format("--screenshot '{}' --view timeline '{}'", png("tt.png"), trace_path()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("timeline: lanes=7 spans=49 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--timeline-out"), std::string::npos) << r.out;
  const RunResult m =
      run_gui(fmt::format("--screenshot '{}' --view memory '{}'", png("tm.png"), trace_path()));
  ASSERT_EQ(m.exit_code, 0) << m.out;
  EXPECT_NE(m.out.find("memory: pools=3 "), std::string::npos) << m.out;
}

TEST_F(GuiOffscreen, MemoryDrawsEveryPool) {
  const RunResult r =
      run_gui(fmt::format("--screenshot '{}' --view memory '{}'", png("m.png"), timeline_path()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // rank0.hbm, rank1.hbm and host0.pinned.
  EXPECT_NE(r.out.find("memory: pools=3 "), std::string::npos) << r.out;
  QImage image(QString::fromStdString(png("m.png")));
  ASSERT_FALSE(image.isNull());
  EXPECT_GT(distinct_colours(image), 20u);
  EXPECT_GT(count_colour(image, QColor(0x4e, 0x79, 0xa7)), 100);  // the first pool's curve
}

TEST_F(GuiOffscreen, SweepDrawsPointsAndParetoFront) {
  const RunResult r =
      run_gui(fmt::format("--screenshot '{}' --view sweep '{}'", png("s.png"), sweep_path()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // Five evaluated points (the failed one has no coordinates); the front is 0, 1 and 3.
  EXPECT_NE(r.out.find("sweep: points=5 pareto=3"), std::string::npos) << r.out;
  QImage image(QString::fromStdString(png("s.png")));
  ASSERT_FALSE(image.isNull());
  EXPECT_GT(distinct_colours(image), 10u);
}

TEST_F(GuiOffscreen, BadInputExitsWithTwo) {
  RunResult missing = run_gui(
      fmt::format("--screenshot '{}' '{}'", png("x.png"), (dir_ / "no_such_file.json").string()));
  EXPECT_EQ(missing.exit_code, 2) << missing.out;
  EXPECT_NE(missing.out.find("no_such_file.json"), std::string::npos) << missing.out;
  RunResult wrong_view =
      run_gui(fmt::format("--screenshot '{}' --view sweep '{}'", png("x.png"), timeline_path()));
  EXPECT_EQ(wrong_view.exit_code, 2) << wrong_view.out;
  EXPECT_FALSE(std::filesystem::exists(png("x.png")));
}

}  // namespace
}  // namespace offsim::gui
