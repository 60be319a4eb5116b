// Running a scenario from the GUI: load the YAML with overrides, pick one sweep point if asked,
// simulate it and return the report and the predicted timeline. Needs the scenarios library
// (offsim_scenarios); without it every call returns kUnsupported.
//
//   if (gui::scenarios_available()) {
//     sim::Result<gui::ScenarioRun> run = gui::run_scenario("ex.yaml", {"training.micro_batch=2"});
//     if (run) show(run->report_json, *run->timeline);
//   }
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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
                                      std::optional<std::int64_t> sweep_point = std::nullopt);

}  // namespace offsim::gui
