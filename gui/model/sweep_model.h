// SweepTable: the rows of a sweep result file written by `offsim sweep` (JSON lines or CSV), the
// Pareto front of step time against peak HBM, and colouring of points by an axis.
//
//   sim::Result<gui::SweepTable> table = gui::read_sweep_file("sweep.jsonl");
//   std::vector<std::size_t> front = gui::pareto_front(*table);     // by peak HBM ascending
//   gui::AxisColouring colours = gui::colour_by_axis(*table, "offload.policy");
//   for (std::size_t i = 0; i < table->rows.size(); ++i) plot(table->rows[i], colours.value[i]);
//
// JSONL line: {"index": i, "scenario": path, "axes": {...}, "report": {"step_time_s": ..,
// "tokens_per_s": .., "fits": .., "hbm_peak_bytes": .., ...}} or with "error" instead of "report".
// CSV: header `index,<axis paths>,step_time_s,...`; the axis columns are those between `index`
// and `step_time_s`; an `error` column marks failed rows.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gui/model/timeline_model.h"
#include "sim/core/result.h"

namespace offsim::gui {

struct SweepRow {
  int index = -1;
  std::string scenario;
  std::vector<std::string> axis_values;  // by SweepTable::axes; "" when the row lacks the axis
  std::optional<double> step_time_s;
  std::optional<double> tokens_per_s;
  std::optional<std::int64_t> hbm_peak_bytes;
  bool fits = false;
  std::string error;                                    // non-empty: the point failed to evaluate
  std::vector<std::pair<std::string, double>> metrics;  // every numeric report field

  // Evaluated, fits in memory, and has both coordinates of the step-time/peak-HBM plane.
  bool feasible() const {
    return error.empty() && fits && step_time_s.has_value() && hbm_peak_bytes.has_value();
  }
};

struct SweepTable {
  std::string source;             // the file name, for messages
  std::vector<std::string> axes;  // axis paths in first-seen order
  std::vector<SweepRow> rows;     // in file order
  // Problems that did not stop the load: a truncated last line (a sweep still being written).
  std::vector<std::string> warnings;
};

// Parsers; `source` names the input in error messages ("sweep.jsonl:12: ...").
sim::Result<SweepTable> parse_sweep_jsonl(std::string_view text, const std::string& source,
                                          const std::atomic<bool>* cancel = nullptr,
                                          const ProgressFn& progress = {});
sim::Result<SweepTable> parse_sweep_csv(std::string_view text, const std::string& source,
                                        const std::atomic<bool>* cancel = nullptr,
                                        const ProgressFn& progress = {});
// Reads a file: `.csv` as CSV, anything else as JSON lines.
sim::Result<SweepTable> read_sweep_file(const std::string& path,
                                        const std::atomic<bool>* cancel = nullptr,
                                        const ProgressFn& progress = {});

// Rows on the Pareto front of (minimum step time, minimum peak HBM) among feasible rows: no other
// feasible row is at least as good in both and better in one. Sorted by peak HBM ascending (so
// step time descends); duplicates of a front point are all kept.
std::vector<std::size_t> pareto_front(const SweepTable& table);

struct AxisColouring {
  bool numeric = false;                 // every present value parsed as a number
  std::vector<std::string> categories;  // categorical: distinct values in first-seen order
  double min = 0.0;                     // numeric: the range of values
  double max = 0.0;
  // Per row: the category index (categorical) or the value scaled to [0, 1] (numeric; 0.5 when
  // all values are equal); -1 when the row lacks the axis.
  std::vector<double> value;
};
// Colours by the axis with path `axis`; an unknown path is an error listing the axes.
sim::Result<AxisColouring> colour_by_axis(const SweepTable& table, const std::string& axis);

}  // namespace offsim::gui
