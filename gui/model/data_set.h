// DataSet: everything the GUI shows, loaded from files — timelines (predicted and/or measured)
// shaped into a TimelineModel and MemoryModels, and a sweep table. Qt-free, so it runs in a
// worker thread and in tests.
//
//   std::atomic<bool> cancel{false};
//   sim::Result<gui::DataSet> data = gui::load_data_set({"pred.json", "meas.json", "s.jsonl"},
//                                                        &cancel, [](double f) { ... });
//   if (data && data->timeline) draw(*data->timeline);
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "gui/model/memory_model.h"
#include "gui/model/sweep_model.h"
#include "gui/model/timeline_model.h"
#include "sim/core/result.h"

namespace offsim::gui {

enum class FileKind { kTimeline, kSweep, kScenario };

// By extension: .jsonl/.csv are sweeps, .yaml/.yml scenarios, anything else a Timeline JSON.
FileKind file_kind(const std::string& path);

struct DataSet {
  std::shared_ptr<const TimelineModel> timeline;  // null when no timeline was given
  std::vector<MemoryModel> memory;                // one per timeline, same order
  std::shared_ptr<const SweepTable> sweep;        // null when no sweep file was given
  std::vector<std::string> warnings;
};

// Loads timelines (all of them into one TimelineModel, in the order given, so a predicted file
// before a measured one puts predicted rows above measured ones) and at most one sweep file.
sim::Result<DataSet> load_data_set(const std::vector<std::string>& paths,
                                   const std::atomic<bool>* cancel = nullptr,
                                   const ProgressFn& progress = {});

// Builds a DataSet from timelines already in memory (e.g. a scenario just simulated).
sim::Result<DataSet> data_set_from_timelines(std::vector<sim::Timeline> timelines,
                                             const std::atomic<bool>* cancel = nullptr,
                                             const ProgressFn& progress = {});

}  // namespace offsim::gui
