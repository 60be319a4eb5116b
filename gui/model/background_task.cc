#include "gui/model/background_task.h"

#include <algorithm>

namespace offsim::gui {

BackgroundTask::BackgroundTask(Work work, ProgressFn progress, Finished finished) {
  thread_ = std::thread([this, work = std::move(work), progress = std::move(progress),
                         finished = std::move(finished)] {
    const ProgressFn report = [this, &progress](double f) {
      progress_.store(std::clamp(f, 0.0, 1.0));
      if (progress) progress(f);
    };
    work(&cancel_, report);
    if (finished) finished(cancel_.load());
    done_.store(true);
  });
}

BackgroundTask::~BackgroundTask() {
  cancel();
  wait();
}

void BackgroundTask::wait() {
  std::call_once(joined_, [this] {
    if (thread_.joinable()) thread_.join();
  });
}

}  // namespace offsim::gui
