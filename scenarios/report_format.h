// Report formatting for the CLI: a readable table (one scenario, or several side by side) and
// flat records — one per report, dotted column names, the same columns in JSON, JSON lines and
// CSV — that load directly into pandas (`pd.read_json`, `pd.read_csv`).
//
//   std::vector<scenarios::NamedReport> runs = {{"offload", r1}, {"no offload", r2}};
//   fmt::print("{}", scenarios::format_table(runs));      // metrics down, scenarios across
//   fmt::print("{}\n", scenarios::format_json(runs).dump(2));  // always a list of records
//   fmt::print("{}", scenarios::format_jsonl(runs));      // one record per line
//   fmt::print("{}", scenarios::format_csv(runs));        // header, one row per report
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

// The columns of a flat report record, in order. They are derived from models::report_to_json —
// flattened with flat_columns() along the JSON of a report whose optional parts are all present —
// so a field added to the report becomes a column without a change here. `limited_by`
// (limiting_factor()) is added; a few leading columns (scenario, outcome, fits, limited_by, gpus,
// step time, throughput) come first, the rest in the JSON's order. Lists (`ranks`,
// `live_at_peak`, `flags`, `oom.live`) and the `metadata` map are one cell each, holding JSON text.
const std::vector<std::string>& report_columns();
// The flat record of one report: exactly report_columns(), in order; JSON null where the report
// has null (e.g. the `oom.*` columns of a step that fits).
nlohmann::ordered_json flat_report(const models::Report& report);

// Always a JSON array with one flat record per report (one report: an array of one).
nlohmann::ordered_json format_json(const std::vector<NamedReport>& reports);
// The same records, one JSON object per line.
std::string format_jsonl(const std::vector<NamedReport>& reports);
// A header (report_columns()) and one row per report; null is an empty cell.
std::string format_csv(const std::vector<NamedReport>& reports);

// What limits a configuration: "capacity (HBM 79.1 of 80.0 GiB)", "exposed transfer 1.20 s",
// "CPU update 3.40 s", "communication 0.8 s", "pipeline bubble 0.5 s" or "compute".
std::string limiting_factor(const models::Report& report);

}  // namespace offsim::scenarios
