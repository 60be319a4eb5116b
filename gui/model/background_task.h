// BackgroundTask: runs one piece of work (loading files, simulating a scenario) on its own
// thread with a cancel flag and progress, Qt-free so the threading is tested under TSan. The GUI
// forwards progress and the result to its event loop; anything else can poll or wait.
//
//   gui::BackgroundTask task(
//       [&](const std::atomic<bool>* cancel, const gui::ProgressFn& progress) {
//         result = gui::load_data_set(files, cancel, progress);
//       },
//       [](double f) { /* worker thread */ }, [](bool cancelled) { /* worker thread */ });
//   task.cancel();  // from any thread; the work sees it at its next check
//   task.wait();
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

#include "gui/model/timeline_model.h"

namespace offsim::gui {

class BackgroundTask {
 public:
  using Work = std::function<void(const std::atomic<bool>* cancel, const ProgressFn& progress)>;
  // Called on the worker thread once the work returned; `cancelled` tells whether cancel() was
  // called before it returned (its result should then be dropped).
  using Finished = std::function<void(bool cancelled)>;

  // Starts the work at once.
  explicit BackgroundTask(Work work, ProgressFn progress = {}, Finished finished = {});
  // Cancels and waits for the work.
  ~BackgroundTask();
  BackgroundTask(const BackgroundTask&) = delete;
  BackgroundTask& operator=(const BackgroundTask&) = delete;

  void cancel() { cancel_.store(true); }
  bool cancel_requested() const { return cancel_.load(); }
  // Waits until the work and the finished callback returned; from any thread but the worker.
  void wait();
  bool done() const { return done_.load(); }
  // The last fraction the work reported, in [0, 1].
  double progress() const { return progress_.load(); }

 private:
  std::atomic<bool> cancel_{false};
  std::atomic<bool> done_{false};
  std::atomic<double> progress_{0.0};
  std::once_flag joined_;
  std::thread thread_;
};

}  // namespace offsim::gui
