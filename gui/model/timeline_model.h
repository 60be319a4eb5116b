// TimelineModel: the lanes of one or more Timelines (predicted, measured) shaped for drawing —
// row order, predicted/measured pairing, visible-span culling, exposed transfers, critical path.
//
//   gui::TimelineModel model = gui::TimelineModel::build({predicted, measured});
//   std::vector<gui::DrawSpan> rects;
//   for (std::size_t row = 0; row < model.rows().size(); ++row) {
//     model.visible_spans(row, {t0_ns, t1_ns}, /*width_px=*/1600.0, rects);  // at most ~1 per px
//     for (const gui::DrawSpan& r : rects) draw(row, r.start_ns, r.end_ns, r.kind, r.count);
//   }
//   std::string tip = gui::span_tooltip(model.timelines()[0], span_index);
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sim/core/result.h"
#include "sim/trace/timeline.h"

namespace offsim::gui {

enum class LaneKind { kCompute, kH2D, kD2H, kComm, kCpu, kOther };
const char* to_string(LaneKind kind);

// A lane's rank and kind for ordering and pairing rows.
struct LaneKey {
  int rank = -1;  // -1 when the lane belongs to no rank (or its timeline carries no identity)
  LaneKind kind = LaneKind::kOther;
};
// A lane's rank and kind from the timeline's typed lane identity; a timeline without one (a file
// written before lanes carried identity, a foreign trace) gives rank -1 and kind kOther: the
// lane's name is shown, never read.
LaneKey lane_of(const sim::Timeline& timeline, std::size_t lane);
// The rank of a pool from its kind and owner (an HBM pool's owner); -1 for any other pool.
int pool_rank_of(const sim::PoolTrace& pool);

// A half-open interval of simulated time in nanoseconds.
struct TimeWindow {
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  bool operator==(const TimeWindow&) const = default;
};

// One drawn row: one lane of one timeline, its spans sorted by start.
struct LaneRow {
  std::string lane_name;  // "rank0.compute"
  std::string label;      // lane name, with " (measured)" etc. when several timelines are loaded
  int source = 0;         // index into TimelineModel::timelines()
  sim::LaneId lane;
  LaneKey key;
  std::vector<std::uint32_t> spans;       // indices into timeline.spans, by start then op id
  std::vector<std::int64_t> start_ns;     // start of spans[i]
  std::vector<std::int64_t> max_end_ns;   // max end over spans[0..i], non-decreasing
  std::vector<std::uint8_t> kinds;        // sim::OpKind of spans[i] (merging reads these in a row)
  std::vector<std::int64_t> duration_ns;  // end - start of spans[i]
  std::vector<TimeWindow> exposed;        // the rank's compute lane waiting on this lane's copies
  std::vector<TimeWindow> critical;       // critical-path spans on this row, by start
};

// One rectangle to draw: a single span (count == 1) or several spans narrower than a pixel merged.
struct DrawSpan {
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  std::uint32_t span = 0;   // the first span's index into timeline.spans
  std::uint32_t count = 1;  // spans this rectangle stands for
  // The op kind with the most busy time in the rectangle (a single span: its kind; ties go to
  // the kind first in sim::OpKind order; only zero-length spans: the first span's kind).
  sim::OpKind kind = sim::OpKind::kMarker;
  // Busy time of its spans / the rectangle's duration, in [0, 1]; 1 for a single span.
  double busy = 1.0;
};

// Progress callback in [0, 1]; loading checks `cancel` between steps and returns kCancelled.
using ProgressFn = std::function<void(double)>;

class TimelineModel {
 public:
  TimelineModel() = default;

  // Orders rows by rank, then compute, h2d, d2h, comm, other lanes of the rank; then CPU lanes;
  // then the rest. A lane present in several timelines gets one row per timeline, adjacent, in
  // the order given (predicted above measured).
  static sim::Result<TimelineModel> build(std::vector<sim::Timeline> timelines,
                                          const std::atomic<bool>* cancel = nullptr,
                                          const ProgressFn& progress = {});

  const std::vector<sim::Timeline>& timelines() const { return timelines_; }
  const std::vector<LaneRow>& rows() const { return rows_; }
  std::size_t span_count() const { return span_count_; }
  // The earliest start and the latest end over all timelines ({0, 0} when empty).
  TimeWindow extent() const { return extent_; }

  // Spans of `row` that intersect `window`, at most about one rectangle per pixel column of a
  // `width_px` wide view: a span narrower than a pixel is merged with every span that starts in
  // the same column (and with the next columns' while they follow within a pixel). A merged
  // rectangle carries its dominant op kind by busy time and its busy fraction. Binary search
  // finds the first visible span; the cost is O(visible rectangles · log n + merged spans).
  // `out` is cleared first.
  void visible_spans(std::size_t row, TimeWindow window, double width_px,
                     std::vector<DrawSpan>& out) const;

  // The span of `row` under time `t_ns` (within `tolerance_ns`), as an index into
  // timeline.spans; the nearest one when several qualify.
  std::optional<std::uint32_t> span_at(std::size_t row, std::int64_t t_ns,
                                       std::int64_t tolerance_ns) const;

  // Span indices (into timelines()[source].spans) of the critical path, first to last.
  const std::vector<std::uint32_t>& critical_path(int source) const {
    return critical_paths_[static_cast<std::size_t>(source)];
  }

 private:
  std::vector<sim::Timeline> timelines_;
  std::vector<LaneRow> rows_;
  std::vector<std::vector<std::uint32_t>> critical_paths_;
  std::size_t span_count_ = 0;
  TimeWindow extent_;
};

// Intervals of a sorted, disjoint list that intersect `window`, merged so that there is at most
// about one per pixel column (a merged interval covers its first start to its last end).
void visible_intervals(const std::vector<TimeWindow>& sorted, TimeWindow window, double width_px,
                       std::vector<TimeWindow>& out);

// The critical path (sim::critical_path_spans, the one implementation compare uses too): span
// indices, first to last; `deps` by op id, or empty for the timeline's own.
std::vector<std::uint32_t> critical_path(const sim::Timeline& timeline,
                                         const std::vector<std::vector<sim::OpId>>& deps = {});

// "fwd.l0.qkv\ngemm · 1.10 TFLOP · 1.571 ms · 700 TFLOP/s": name, kind, size (FLOPs for compute
// kinds, bytes otherwise), duration and the achieved rate.
std::string span_tooltip(const sim::Timeline& timeline, std::uint32_t span);

// Bytes in binary units, as the CLI prints them: "1.50 GiB", "812.0 KiB"; "1.10 TFLOP";
// "1.571 ms", "12.0 µs", "2.000 s".
inline constexpr double kBytesPerGiB = 1024.0 * 1024.0 * 1024.0;
std::string format_bytes(double bytes);
std::string format_flops(double flops);
std::string format_duration_ns(std::int64_t ns);

}  // namespace offsim::gui
