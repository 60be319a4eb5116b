// The GUI's worker (gui/model/background_task.h) with the real loading and scenario work:
// progress arrives, a cancel from another thread stops the work with kCancelled, and a task
// left running is cancelled and joined by its destructor. Runs under TSan in CI (the tsan preset
// builds no Qt, and this is the threaded part of the GUI).
//
// Cancels are made deterministic by a handshake: the work's first progress report blocks until
// another thread has called cancel(), so the cancel always lands while the work is running.
#include "gui/model/background_task.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "gui/model/data_set.h"
#include "gui/model/scenario_runner.h"
#include "sim/core/file_io.h"
#include "sim/trace/timeline_json.h"
#include "test_timelines.h"

namespace offsim::gui {
namespace {

namespace fs = std::filesystem;

// One-shot latch: the worker's first progress report waits until the canceller released it.
class Handshake {
 public:
  // In the worker (progress callback): signal "started", then wait for "cancelled".
  void worker_started() {
    std::unique_lock lock(mu_);
    if (started_) return;
    started_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_; });
  }
  // In the canceller: wait for "started", run `cancel`, release the worker.
  void cancel_when_started(const std::function<void()>& cancel) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return started_; });
    cancel();
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  bool released_ = false;
};

std::string write_timeline_file(const std::string& name, int spans) {
  testing::TimelineBuilder b({"rank0.compute", "rank0.h2d", "rank0.d2h"});
  for (int i = 0; i < spans; ++i) {
    b.span(fmt::format("op{}", i), i % 3, sim::OpKind::kGemm, 10 * i, 10 * i + 8, 1e9);
  }
  const fs::path path =
      fs::temp_directory_path() / fmt::format("offsim_bg_{}_{}", ::getpid(), name);
  EXPECT_TRUE(sim::write_text_file_atomic(path.string(), sim::timeline_to_json(b.build()).dump()));
  return path.string();
}

TEST(BackgroundTask, LoadsWithProgressAndFinishes) {
  const std::string file = write_timeline_file("ok.json", 300);
  std::optional<sim::Result<DataSet>> result;
  std::atomic<int> reports{0};
  std::atomic<bool> finished_cancelled{true};
  BackgroundTask task(
      [&](const std::atomic<bool>* cancel, const ProgressFn& progress) {
        result = load_data_set({file}, cancel, progress);
      },
      [&](double) { reports.fetch_add(1); },
      [&](bool cancelled) { finished_cancelled.store(cancelled); });
  task.wait();
  EXPECT_TRUE(task.done());
  EXPECT_FALSE(finished_cancelled.load());
  ASSERT_TRUE(result.has_value());
  ASSERT_TRUE(*result) << (*result).error().message;
  ASSERT_NE((*result)->timeline, nullptr);
  EXPECT_EQ((*result)->timeline->span_count(), 300u);
  EXPECT_GE(reports.load(), 2);
  EXPECT_DOUBLE_EQ(task.progress(), 1.0);
  fs::remove(file);
}

TEST(BackgroundTask, CancelFromAnotherThreadStopsLoading) {
  const std::string file = write_timeline_file("cancel.json", 3000);
  Handshake handshake;
  std::optional<sim::Result<DataSet>> result;
  std::atomic<bool> finished_cancelled{false};
  BackgroundTask task(
      [&](const std::atomic<bool>* cancel, const ProgressFn& progress) {
        result = load_data_set({file}, cancel, progress);
      },
      [&](double) { handshake.worker_started(); },
      [&](bool cancelled) { finished_cancelled.store(cancelled); });
  std::thread canceller([&] { handshake.cancel_when_started([&] { task.cancel(); }); });
  canceller.join();
  task.wait();
  EXPECT_TRUE(task.cancel_requested());
  EXPECT_TRUE(finished_cancelled.load());
  ASSERT_TRUE(result.has_value());
  ASSERT_FALSE(*result);
  EXPECT_EQ((*result).error().code, sim::ErrorCode::kCancelled) << (*result).error().message;
  fs::remove(file);
}

TEST(BackgroundTask, CancelStopsAScenarioSimulation) {
  if (!scenarios_available()) GTEST_SKIP() << "built without the scenarios library";
  // 80 layers × 16 micro-batches × about 30 ops per layer pass: some 40 000 ops, so the engine
  // polls the flag (every 4096 events) many times before it could finish.
  const std::string path =
      (fs::path(OFFSIM_SOURCE_DIR) / "scenarios/examples/llama70b-8xh100-offload.yaml").string();
  Handshake handshake;
  std::optional<sim::Result<ScenarioRun>> result;
  BackgroundTask task(
      [&](const std::atomic<bool>* cancel, const ProgressFn& progress) {
        result = run_scenario(path, {}, std::nullopt, cancel, progress);
      },
      [&](double f) {
        if (f > 0.0) handshake.worker_started();  // loaded and checked, about to simulate
      });
  std::thread canceller([&] { handshake.cancel_when_started([&] { task.cancel(); }); });
  canceller.join();
  task.wait();
  ASSERT_TRUE(result.has_value());
  ASSERT_FALSE(*result) << "the simulation finished despite the cancel";
  EXPECT_EQ((*result).error().code, sim::ErrorCode::kCancelled) << (*result).error().message;
}

TEST(BackgroundTask, ScenarioRunGivesReportAndTimeline) {
  if (!scenarios_available()) GTEST_SKIP() << "built without the scenarios library";
  const std::string path =
      (fs::path(OFFSIM_SOURCE_DIR) / "scenarios/examples/2b-1xa100-offload.yaml").string();
  std::optional<sim::Result<ScenarioRun>> result;
  BackgroundTask task([&](const std::atomic<bool>* cancel, const ProgressFn& progress) {
    result = run_scenario(path, {"model.layers=2"}, std::nullopt, cancel, progress);
  });
  task.wait();
  ASSERT_TRUE(result.has_value());
  ASSERT_TRUE(*result) << (*result).error().message;
  EXPECT_NE((*result)->report_json.find("step_time_s"), std::string::npos);
  ASSERT_TRUE((*result)->timeline.has_value());
  EXPECT_FALSE((*result)->timeline->spans.empty());
  EXPECT_DOUBLE_EQ(task.progress(), 1.0);
}

TEST(BackgroundTask, DestructorCancelsAndJoinsRunningWork) {
  std::atomic<bool> saw_cancel{false};
  std::atomic<bool> running{false};
  {
    BackgroundTask task([&](const std::atomic<bool>* cancel, const ProgressFn&) {
      running.store(true);
      while (!cancel->load()) std::this_thread::yield();
      saw_cancel.store(true);
    });
    while (!running.load()) std::this_thread::yield();
  }
  EXPECT_TRUE(saw_cancel.load());
}

}  // namespace
}  // namespace offsim::gui
