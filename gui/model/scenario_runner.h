// Running a scenario from the GUI: load the YAML with overrides, pick one sweep point if asked,
// simulate it and return the report and the predicted timeline. Qt-free (in offsim_gui_model,
// so it runs in a BackgroundTask and under the sanitizers). Needs the scenarios library
// (offsim_scenarios); without it every call returns kUnsupported. `cancel` stops the
// simulation (kCancelled); plans over the default limits of scenarios/resource_limits.h are
// refused before they are built.
//
//   if (gui::scenarios_available()) {
//     sim::Result<gui::ScenarioRun> run = gui::run_scenario("ex.yaml", {"training.micro_batch=2"});
//     if (run) show(run->report_json, *run->timeline);
//   }
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gui/model/timeline_model.h"
#include "sim/core/result.h"
#include "sim/trace/timeline.h"

namespace offsim::gui {

struct ScenarioRun {
  std::string report_json;  // the report, pretty-printed JSON
  std::optional<sim::Timeline> timeline;
};

bool scenarios_available();

// `sweep_point`: evaluate that point of the file's sweep instead of the base scenario.
sim::Result<ScenarioRun> run_scenario(const std::string& path,
                                      const std::vector<std::string>& overrides,
                                      std::optional<std::int64_t> sweep_point = std::nullopt,
                                      const std::atomic<bool>* cancel = nullptr,
                                      const ProgressFn& progress = {});

}  // namespace offsim::gui
