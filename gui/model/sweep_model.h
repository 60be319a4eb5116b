// SweepTable: the rows of a sweep result file written by `offsim sweep` (JSON lines or CSV), the
// Pareto front of step time against peak HBM, and colouring of points by an axis.
//
//   sim::Result<gui::SweepTable> table = gui::read_sweep_file("sweep.jsonl");
//   std::vector<std::size_t> front = gui::pareto_front(*table);     // by peak HBM ascending
//   gui::AxisColouring colours = gui::colour_by_axis(*table, "offload.policy");
//   for (std::size_t i = 0; i < table->rows.size(); ++i) plot(table->rows[i], colours.value[i]);
//
// Rows are the flat records `offsim sweep` writes (README "Results as tables"): `index`,
// `axes.<path>` per axis, report columns (`fits`, `step_time_s`, `tokens_per_s`,
// `hbm_peak_bytes`, ...; null or an empty CSV cell where the report has none) and `error`
// (null/empty unless the point failed). Older files are read too: JSONL lines with nested
// {"axes": {...}, "report": {...}} and CSV whose axis columns lie between `index` and
// `step_time_s`.
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

enum class SweepMetric { kStepTime, kTokensPerS };

// One point of the plane (peak HBM, step time or tokens/s).
struct PlotPoint {
  std::size_t row = 0;  // index into SweepTable::rows
  double hbm_peak_bytes = 0.0;
  double y = 0.0;
  bool fits = true;
};
// The rows to plot: every row with a peak HBM that did not fail. A row that fits sits at its
// figure. A row that does not fit has no step time to compare (its run stopped at the
// out-of-memory, or the figure is null), so it is kept out of the fast end: at 5% beyond the
// slowest fitting row's step time (its own, when nothing fits, or 1 s), or at 0 tokens/s.
std::vector<PlotPoint> plot_points(const SweepTable& table, SweepMetric metric);

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
