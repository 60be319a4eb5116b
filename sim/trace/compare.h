// compare_timelines(): how far a predicted Timeline was from a measured one of the same Plan.
//
// The two are joined on op id (both come from one Plan; names must agree). Reported: step time
// error, busy time error per lane, exposed transfer time per compute lane (the time it waited on
// a copy, sim::idle_intervals), the ops with the largest absolute duration error, the
// critical paths of both (walked back from the last span) and where they differ, and the peak
// error per memory pool with its time and, by tensor category, what was live at each peak (from
// the memory ledger). Relative errors are (predicted - measured) / measured.
//
//   sim::Result<sim::TimelineComparison> c = sim::compare_timelines(predicted, measured);
//   if (!c) return fail(c.error());
//   fmt::print("{}", sim::comparison_to_text(*c));
//   sim::write_text_file_atomic("cmp.json", sim::comparison_to_json(*c).dump(2));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/core/result.h"
#include "sim/core/time.h"
#include "sim/trace/timeline.h"

namespace offsim::sim {

struct CompareOptions {
  int top_ops = 10;  // how many ops with the largest error to list
};

struct OpError {
  OpId op;
  std::string name;
  std::string lane;
  Duration predicted{0};
  Duration measured{0};
  Duration error{0};          // predicted - measured
  double relative_error = 0;  // error / measured (0 when measured is 0)
};

struct LaneError {
  std::string lane;
  Duration predicted_busy{0};
  Duration measured_busy{0};
  double relative_error = 0;
};

// Bytes of one tensor category live at each timeline's peak.
struct CategoryAtPeak {
  TensorCategory category = TensorCategory::kNone;
  std::int64_t predicted_bytes = 0;
  std::int64_t measured_bytes = 0;
};

struct PoolError {
  std::string pool;
  std::int64_t predicted_peak_bytes = 0;
  std::int64_t measured_peak_bytes = 0;  // the timeline's: on a device, the allocator's high-water
  double relative_error = 0;
  TimePoint predicted_peak_time;
  TimePoint measured_peak_time;
  // With memory events in both timelines: the peak the measured alloc/free order gives through
  // the memory ledger (without the allocator's rounding), else -1.
  std::int64_t measured_ledger_peak_bytes = -1;
  std::vector<CategoryAtPeak> categories;  // the live sets at the two peaks, by category
};

// Exposed transfer time of one compute lane in each timeline: the time it waited on a copy
// (sim::idle_intervals, the definition of the report's exposed offload time and the GUI's marks).
struct ExposedError {
  std::string lane;
  Duration predicted{0};
  Duration measured{0};
  double relative_error = 0;
};

// A chain of spans, each starting when (or after) the previous one ended, that ends at the
// makespan: the ops whose durations the step time is made of.
struct CriticalPath {
  std::vector<OpId> ops;  // first to last
  Duration busy{0};       // sum of the chain's span durations
};

struct TimelineComparison {
  Duration predicted_step{0};
  Duration measured_step{0};
  double step_relative_error = 0;
  std::int64_t matched_ops = 0;         // ops with a span in both
  std::int64_t only_predicted_ops = 0;  // e.g. ops of ranks the replay skipped
  std::int64_t only_measured_ops = 0;
  std::vector<LaneError> lanes;  // lanes with spans in both, in lane order
  // Compute lanes (by typed lane identity) with spans in both, in lane order; empty when the
  // timelines carry no lane identity or different lane tables.
  std::vector<ExposedError> exposed;
  std::vector<OpError> top_ops;  // largest |error| first
  CriticalPath predicted_path;
  CriticalPath measured_path;
  std::vector<std::string> only_on_predicted_path;  // op names, path order
  std::vector<std::string> only_on_measured_path;
  std::vector<PoolError> pools;  // pools with a peak in both
  double max_abs_pool_relative_error = 0;
};

Result<TimelineComparison> compare_timelines(const Timeline& predicted, const Timeline& measured,
                                             const CompareOptions& options = {});

// The critical path of one timeline as ops and busy time: sim::critical_path_spans()
// (sim/trace/analysis.h), following the timeline's dependencies when it carries them.
CriticalPath critical_path(const Timeline& timeline);

std::string comparison_to_text(const TimelineComparison& comparison);
nlohmann::json comparison_to_json(const TimelineComparison& comparison);

}  // namespace offsim::sim
