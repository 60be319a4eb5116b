// Plan ⇄ JSON. The format is stable: names for lanes, resources, pools and tensors; ops refer to
// each other by index; enums as lower-case strings.
//
//   std::string text = sim::plan_to_json(plan).dump();
//   sim::Result<sim::Plan> back = sim::plan_from_json_text(text, "plan.json");
//   // back is validated; errors name the file and the JSON path: "plan.json: ops[3].deps[0]: ..."
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "sim/plan/plan.h"

namespace offsim::sim {

inline constexpr int kPlanFormatVersion = 1;

nlohmann::json plan_to_json(const Plan& plan);
// Parses and validates. `source` names the input in error messages.
Result<Plan> plan_from_json(const nlohmann::json& json, const std::string& source);
Result<Plan> plan_from_json_text(const std::string& text, const std::string& source);
Result<Plan> read_plan_file(const std::string& path);

}  // namespace offsim::sim
