// Report formatting for the CLI: a readable table (one scenario, or several side by side), the
// JSON object of `run --format json`, and CSV rows.
//
//   std::vector<scenarios::NamedReport> runs = {{"offload", r1}, {"no offload", r2}};
//   fmt::print("{}", scenarios::format_table(runs));      // metrics down, scenarios across
//   fmt::print("{}\n", scenarios::format_json(runs).dump(2));
//   fmt::print("{}", scenarios::format_csv(runs));
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/report.h"

namespace offsim::scenarios {

struct NamedReport {
  std::string name;  // column title: the scenario's name
  models::Report report;
};

// Bytes as "12.34 GiB" (binary units, two decimals).
std::string format_bytes(std::int64_t bytes);

std::string format_table(const std::vector<NamedReport>& reports);
// One object for one report; an array of objects for several.
nlohmann::json format_json(const std::vector<NamedReport>& reports);
// A header and one row per report: scenario, then csv_report_columns().
std::string format_csv(const std::vector<NamedReport>& reports);

// What limits a configuration: "capacity (HBM 79.1 of 80.0 GiB)", "exposed transfer 1.20 s",
// "CPU update 3.40 s", "communication 0.8 s", "pipeline bubble 0.5 s" or "compute".
std::string limiting_factor(const models::Report& report);

}  // namespace offsim::scenarios
