#include "gui/model/timeline_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <tuple>

#include <fmt/format.h>

#include "sim/trace/analysis.h"

namespace offsim::gui {
namespace {

constexpr std::size_t kCancelStride = 1 << 16;

std::int64_t ns(sim::TimePoint t) { return t.time_since_epoch().count(); }

bool cancelled(const std::atomic<bool>* cancel) {
  return cancel != nullptr && cancel->load(std::memory_order_relaxed);
}

int kind_order(LaneKind kind) {
  switch (kind) {
    case LaneKind::kCompute:
      return 0;
    case LaneKind::kH2D:
      return 1;
    case LaneKind::kD2H:
      return 2;
    case LaneKind::kComm:
      return 3;
    case LaneKind::kOther:
      return 4;
    case LaneKind::kCpu:
      return 5;
  }
  return 6;
}

// 0: a rank's lanes; 1: CPU lanes; 2: anything else.
int group_order(const LaneKey& name) {
  if (name.rank >= 0 && name.kind != LaneKind::kCpu) return 0;
  if (name.kind == LaneKind::kCpu) return 1;
  return 2;
}

bool is_compute_kind(sim::OpKind kind) {
  return kind == sim::OpKind::kGemm || kind == sim::OpKind::kAttention ||
         kind == sim::OpKind::kHostCompute;
}

// Unions windows sorted by start into sorted, disjoint windows.
std::vector<TimeWindow> union_sorted(const std::vector<TimeWindow>& sorted) {
  std::vector<TimeWindow> out;
  for (const TimeWindow& w : sorted) {
    if (w.end_ns <= w.start_ns) continue;
    if (!out.empty() && w.start_ns <= out.back().end_ns) {
      out.back().end_ns = std::max(out.back().end_ns, w.end_ns);
    } else {
      out.push_back(w);
    }
  }
  return out;
}

}  // namespace

const char* to_string(LaneKind kind) {
  switch (kind) {
    case LaneKind::kCompute:
      return "compute";
    case LaneKind::kH2D:
      return "h2d";
    case LaneKind::kD2H:
      return "d2h";
    case LaneKind::kComm:
      return "comm";
    case LaneKind::kCpu:
      return "cpu";
    case LaneKind::kOther:
      return "other";
  }
  return "?";
}

LaneKey lane_of(const sim::Timeline& timeline, std::size_t lane) {
  if (lane >= timeline.lane_identity.size()) return {};
  const sim::LaneIdentity& id = timeline.lane_identity[lane];
  LaneKey out;
  out.rank = id.rank;
  switch (id.role) {
    case sim::LaneRole::kCompute:
      out.kind = LaneKind::kCompute;
      break;
    case sim::LaneRole::kH2D:
      out.kind = LaneKind::kH2D;
      break;
    case sim::LaneRole::kD2H:
      out.kind = LaneKind::kD2H;
      break;
    case sim::LaneRole::kComm:
    case sim::LaneRole::kP2P:
    case sim::LaneRole::kRecv:
      out.kind = LaneKind::kComm;
      break;
    case sim::LaneRole::kCpu:
      out.kind = LaneKind::kCpu;
      break;
    case sim::LaneRole::kOther:
      out.kind = LaneKind::kOther;
      break;
  }
  return out;
}

int pool_rank_of(const sim::PoolTrace& pool) {
  switch (pool.kind) {
    case sim::PoolKind::kHbm:
      return pool.owner;
    case sim::PoolKind::kPinnedHost:
      return -1;
    case sim::PoolKind::kOther:
      break;
  }
  return -1;
}

namespace {

// Checks that the span names a lane and an op of its timeline and does not end before it starts.
sim::Status check_span(const sim::Timeline& t, std::size_t i) {
  const sim::Span& span = t.spans[i];
  if (!span.lane.valid() || span.lane.index() >= t.lanes.size()) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "timeline '{}': span {} names lane {} but the timeline has {} lanes", t.source,
                     i, span.lane.value(), t.lanes.size());
  }
  if (!span.op.valid() || span.op.index() >= t.ops.size()) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "timeline '{}': span {} names op {} but the timeline has {} ops", t.source, i,
                     span.op.value(), t.ops.size());
  }
  if (span.end < span.start) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "timeline '{}': span {} (op '{}') ends before it starts", t.source, i,
                     t.ops[span.op.index()].name);
  }
  return sim::ok();
}

void append_lane_rows(const sim::Timeline& t, std::size_t s, std::size_t sources,
                      std::vector<LaneRow>& rows) {
  for (std::size_t l = 0; l < t.lanes.size(); ++l) {
    LaneRow row;
    row.lane_name = t.lanes[l];
    row.label = sources > 1 ? fmt::format("{} ({})", t.lanes[l], t.source) : t.lanes[l];
    row.source = static_cast<int>(s);
    row.lane = sim::LaneId(l);
    row.key = lane_of(t, l);
    rows.push_back(std::move(row));
  }
}

// A row's spans by start (then op id), with the prefix maximum of ends for binary search.
void index_row(const sim::Timeline& t, LaneRow& row) {
  std::sort(row.spans.begin(), row.spans.end(), [&](std::uint32_t a, std::uint32_t b) {
    return std::tie(t.spans[a].start, t.spans[a].op) < std::tie(t.spans[b].start, t.spans[b].op);
  });
  row.start_ns.reserve(row.spans.size());
  row.max_end_ns.reserve(row.spans.size());
  row.kinds.reserve(row.spans.size());
  row.duration_ns.reserve(row.spans.size());
  std::int64_t max_end = std::numeric_limits<std::int64_t>::min();
  for (std::uint32_t i : row.spans) {
    row.start_ns.push_back(ns(t.spans[i].start));
    max_end = std::max(max_end, ns(t.spans[i].end));
    row.max_end_ns.push_back(max_end);
    row.kinds.push_back(static_cast<std::uint8_t>(t.ops[t.spans[i].op.index()].kind));
    row.duration_ns.push_back(ns(t.spans[i].end) - ns(t.spans[i].start));
  }
}

// Row order: rank, lane kind, lane name, then source (predicted above measured).
void order_rows(std::vector<LaneRow>& rows) {
  std::vector<std::size_t> order(rows.size());
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](std::size_t i) {
    const LaneRow& r = rows[i];
    const int rank = group_order(r.key) == 0 ? r.key.rank : 0;
    return std::make_tuple(group_order(r.key), rank, kind_order(r.key.kind),
                           std::string_view(r.lane_name), r.source);
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
  std::vector<LaneRow> ordered;
  ordered.reserve(order.size());
  for (std::size_t i : order) ordered.push_back(std::move(rows[i]));
  rows = std::move(ordered);
}

// Exposed transfers (sim::idle_intervals, the definition the report's exposed offload time
// sums): the time each compute lane of timeline `source` waited on a copy, marked on the row of
// that copy's lane. Ranks come from the rows (typed lane identity, else the lane name).
void mark_exposed(const sim::Timeline& t, int source, std::vector<LaneRow>& rows) {
  std::vector<int> lane_rank(t.lanes.size(), -1);
  std::vector<LaneRow*> row_of_lane(t.lanes.size(), nullptr);
  for (LaneRow& row : rows) {
    if (row.source != source || row.lane.index() >= t.lanes.size()) continue;
    lane_rank[row.lane.index()] = row.key.rank;
    row_of_lane[row.lane.index()] = &row;
  }
  std::vector<sim::LaneId> lane_of_op(t.ops.size());
  for (const sim::Span& s : t.spans) lane_of_op[s.op.index()] = s.lane;
  for (std::size_t l = 0; l < row_of_lane.size(); ++l) {
    if (row_of_lane[l] == nullptr || row_of_lane[l]->key.kind != LaneKind::kCompute) continue;
    for (const sim::IdleInterval& w : sim::idle_intervals(t, sim::LaneId(l), lane_rank)) {
      if (w.cause != sim::IdleCause::kExposedOffload) continue;
      const sim::LaneId copy_lane = lane_of_op[w.blocker.index()];
      LaneRow* row = row_of_lane[copy_lane.index()];
      if (row != nullptr) row->exposed.push_back({ns(w.start), ns(w.end)});
    }
  }
  for (LaneRow* row : row_of_lane) {
    if (row == nullptr) continue;
    std::sort(row->exposed.begin(), row->exposed.end(),
              [](const TimeWindow& a, const TimeWindow& b) { return a.start_ns < b.start_ns; });
    row->exposed = union_sorted(row->exposed);
  }
}

}  // namespace

sim::Result<TimelineModel> TimelineModel::build(std::vector<sim::Timeline> timelines,
                                                const std::atomic<bool>* cancel,
                                                const ProgressFn& progress) {
  TimelineModel model;
  model.timelines_ = std::move(timelines);
  const std::size_t sources = model.timelines_.size();
  std::size_t total_spans = 0;
  for (const sim::Timeline& t : model.timelines_) total_spans += t.spans.size();
  std::size_t done = 0;
  auto report = [&](double fraction) {
    if (progress) progress(std::clamp(fraction, 0.0, 1.0));
  };

  bool any_span = false;
  for (std::size_t s = 0; s < sources; ++s) {
    const sim::Timeline& t = model.timelines_[s];
    const std::size_t first_row = model.rows_.size();
    append_lane_rows(t, s, sources, model.rows_);
    for (std::size_t i = 0; i < t.spans.size(); ++i) {
      OFFSIM_RETURN_IF_ERROR(check_span(t, i));
      const sim::Span& span = t.spans[i];
      model.rows_[first_row + span.lane.index()].spans.push_back(static_cast<std::uint32_t>(i));
      const TimeWindow w{ns(span.start), ns(span.end)};
      model.extent_ = any_span ? TimeWindow{std::min(model.extent_.start_ns, w.start_ns),
                                            std::max(model.extent_.end_ns, w.end_ns)}
                               : w;
      any_span = true;
      if (++done % kCancelStride == 0) {
        if (cancelled(cancel)) return sim::fail(sim::ErrorCode::kCancelled, "loading cancelled");
        report(0.5 * static_cast<double>(done) / static_cast<double>(total_spans));
      }
    }
  }
  model.span_count_ = total_spans;

  std::size_t sorted = 0;
  for (LaneRow& row : model.rows_) {
    index_row(model.timelines_[static_cast<std::size_t>(row.source)], row);
    sorted += row.spans.size();
    if (cancelled(cancel)) return sim::fail(sim::ErrorCode::kCancelled, "loading cancelled");
    if (total_spans > 0) {
      report(0.5 + 0.3 * static_cast<double>(sorted) / static_cast<double>(total_spans));
    }
  }
  order_rows(model.rows_);

  for (std::size_t s = 0; s < sources; ++s) {
    mark_exposed(model.timelines_[s], static_cast<int>(s), model.rows_);
  }
  if (cancelled(cancel)) return sim::fail(sim::ErrorCode::kCancelled, "loading cancelled");
  report(0.85);

  // Critical path per timeline, then its spans per row.
  model.critical_paths_.resize(sources);
  for (std::size_t s = 0; s < sources; ++s) {
    model.critical_paths_[s] = gui::critical_path(model.timelines_[s]);
  }
  for (LaneRow& row : model.rows_) {
    const sim::Timeline& t = model.timelines_[static_cast<std::size_t>(row.source)];
    for (std::uint32_t i : model.critical_paths_[static_cast<std::size_t>(row.source)]) {
      if (t.spans[i].lane == row.lane)
        row.critical.push_back({ns(t.spans[i].start), ns(t.spans[i].end)});
    }
    std::sort(row.critical.begin(), row.critical.end(),
              [](const TimeWindow& a, const TimeWindow& b) { return a.start_ns < b.start_ns; });
  }
  report(1.0);
  return model;
}

void TimelineModel::visible_spans(std::size_t row_index, TimeWindow window, double width_px,
                                  std::vector<DrawSpan>& out) const {
  out.clear();
  OFFSIM_CHECK(row_index < rows_.size());
  if (window.end_ns <= window.start_ns || !(width_px > 0.0)) return;
  const LaneRow& row = rows_[row_index];
  const sim::Timeline& t = timelines_[static_cast<std::size_t>(row.source)];
  const double ns_per_px = static_cast<double>(window.end_ns - window.start_ns) / width_px;
  const std::size_t n = row.spans.size();
  // First span whose prefix-max end lies inside the window: nothing before it can be visible.
  std::size_t i = static_cast<std::size_t>(
      std::upper_bound(row.max_end_ns.begin(), row.max_end_ns.end(), window.start_ns) -
      row.max_end_ns.begin());
  bool last_merged = false;
  // Busy time per op kind and in all of the merged rectangle being built (out.back()).
  constexpr std::size_t kKinds = static_cast<std::size_t>(sim::OpKind::kMarker) + 1;
  std::array<std::int64_t, kKinds> tally{};
  std::int64_t busy_ns = 0;
  auto finish_merged = [&] {
    DrawSpan& r = out.back();
    const auto top = std::max_element(tally.begin(), tally.end());
    if (*top > 0) r.kind = static_cast<sim::OpKind>(top - tally.begin());
    const std::int64_t length = r.end_ns - r.start_ns;
    r.busy = length > 0 ? std::min(1.0, static_cast<double>(busy_ns) / static_cast<double>(length))
                        : 1.0;
  };
  while (i < n && row.start_ns[i] < window.end_ns) {
    const sim::Span& span = t.spans[row.spans[i]];
    const std::int64_t start = row.start_ns[i];
    const std::int64_t end = ns(span.end);
    const bool visible = end > window.start_ns || (end == start && start >= window.start_ns);
    if (!visible) {
      ++i;
      continue;
    }
    const sim::OpKind kind = t.ops[span.op.index()].kind;
    if (static_cast<double>(end - start) >= ns_per_px) {
      out.push_back({start, end, row.spans[i], 1, kind, 1.0});
      last_merged = false;
      ++i;
      continue;
    }
    // Narrow: take every span that starts in the same pixel column.
    const double column = std::floor(
        static_cast<double>(std::max(start, window.start_ns) - window.start_ns) / ns_per_px);
    const auto column_end =
        window.start_ns + static_cast<std::int64_t>(std::ceil((column + 1.0) * ns_per_px));
    std::size_t j = static_cast<std::size_t>(
        std::lower_bound(row.start_ns.begin() + static_cast<std::ptrdiff_t>(i + 1),
                         row.start_ns.end(), column_end) -
        row.start_ns.begin());
    // Only the group's last span can be wide (spans on a lane do not overlap); draw it alone.
    if (j > i + 1) {
      const sim::Span& last = t.spans[row.spans[j - 1]];
      if (static_cast<double>(ns(last.end) - ns(last.start)) >= ns_per_px) --j;
    }
    const std::int64_t group_end = row.max_end_ns[j - 1];
    const auto count = static_cast<std::uint32_t>(j - i);
    // Dense runs: extend the previous merged rectangle when this group starts within a pixel.
    if (last_merged && !out.empty() && static_cast<double>(start - out.back().end_ns) < ns_per_px) {
      out.back().end_ns = std::max(out.back().end_ns, group_end);
      out.back().count += count;
    } else {
      out.push_back({start, group_end, row.spans[i], count, kind, 1.0});
      tally.fill(0);
      busy_ns = 0;
    }
    for (std::size_t k = i; k < j; ++k) {
      tally[row.kinds[k]] += row.duration_ns[k];
      busy_ns += row.duration_ns[k];
    }
    finish_merged();
    last_merged = true;
    i = j;
  }
}

std::optional<std::uint32_t> TimelineModel::span_at(std::size_t row_index, std::int64_t t_ns,
                                                    std::int64_t tolerance_ns) const {
  OFFSIM_CHECK(row_index < rows_.size());
  const LaneRow& row = rows_[row_index];
  const sim::Timeline& t = timelines_[static_cast<std::size_t>(row.source)];
  auto it = std::upper_bound(row.start_ns.begin(), row.start_ns.end(), t_ns + tolerance_ns);
  std::optional<std::uint32_t> best;
  std::int64_t best_distance = std::numeric_limits<std::int64_t>::max();
  // Walk back over the spans that could still reach t_ns (bounded for overlapping lanes).
  for (int steps = 0; it != row.start_ns.begin() && steps < 64; ++steps) {
    --it;
    const auto k = static_cast<std::size_t>(it - row.start_ns.begin());
    if (row.max_end_ns[k] < t_ns - tolerance_ns) break;
    const sim::Span& span = t.spans[row.spans[k]];
    const std::int64_t s = ns(span.start);
    const std::int64_t e = ns(span.end);
    std::int64_t distance = 0;
    if (t_ns < s) distance = s - t_ns;
    if (t_ns > e) distance = t_ns - e;
    if (distance <= tolerance_ns && distance < best_distance) {
      best_distance = distance;
      best = row.spans[k];
    }
  }
  return best;
}

void visible_intervals(const std::vector<TimeWindow>& sorted, TimeWindow window, double width_px,
                       std::vector<TimeWindow>& out) {
  out.clear();
  if (window.end_ns <= window.start_ns || !(width_px > 0.0)) return;
  const double ns_per_px = static_cast<double>(window.end_ns - window.start_ns) / width_px;
  auto it = std::upper_bound(sorted.begin(), sorted.end(), window.start_ns,
                             [](std::int64_t t, const TimeWindow& w) { return t < w.end_ns; });
  for (; it != sorted.end() && it->start_ns < window.end_ns; ++it) {
    if (!out.empty() && static_cast<double>(it->start_ns - out.back().end_ns) < ns_per_px) {
      out.back().end_ns = std::max(out.back().end_ns, it->end_ns);
    } else {
      out.push_back(*it);
    }
  }
}

std::vector<std::uint32_t> critical_path(const sim::Timeline& timeline,
                                         const std::vector<std::vector<sim::OpId>>& deps) {
  return sim::critical_path_spans(timeline, deps);
}

std::string format_bytes(double bytes) {
  const double a = std::fabs(bytes);
  constexpr double kKiB = 1024.0;
  if (a >= kKiB * kBytesPerGiB) return fmt::format("{:.2f} TiB", bytes / (kKiB * kBytesPerGiB));
  if (a >= kBytesPerGiB) return fmt::format("{:.2f} GiB", bytes / kBytesPerGiB);
  if (a >= kKiB * kKiB) return fmt::format("{:.2f} MiB", bytes / (kKiB * kKiB));
  if (a >= kKiB) return fmt::format("{:.1f} KiB", bytes / kKiB);
  return fmt::format("{:.0f} B", bytes);
}

std::string format_flops(double flops) {
  const double a = std::fabs(flops);
  if (a >= 1e15) return fmt::format("{:.2f} PFLOP", flops / 1e15);
  if (a >= 1e12) return fmt::format("{:.2f} TFLOP", flops / 1e12);
  if (a >= 1e9) return fmt::format("{:.2f} GFLOP", flops / 1e9);
  if (a >= 1e6) return fmt::format("{:.2f} MFLOP", flops / 1e6);
  return fmt::format("{:.0f} FLOP", flops);
}

std::string format_duration_ns(std::int64_t ns_value) {
  const double v = static_cast<double>(ns_value);
  const double a = std::fabs(v);
  if (a >= 1e9) return fmt::format("{:.3f} s", v / 1e9);
  if (a >= 1e6) return fmt::format("{:.3f} ms", v / 1e6);
  if (a >= 1e3) return fmt::format("{:.1f} µs", v / 1e3);
  return fmt::format("{} ns", ns_value);
}

std::string span_tooltip(const sim::Timeline& timeline, std::uint32_t span_index) {
  OFFSIM_CHECK(span_index < timeline.spans.size());
  const sim::Span& span = timeline.spans[span_index];
  const sim::OpInfo& op = timeline.ops[span.op.index()];
  const std::int64_t duration = ns(span.end) - ns(span.start);
  const double seconds = static_cast<double>(duration) * 1e-9;
  std::string size;
  std::string rate = "-";
  const bool by_flops = op.flops > 0.0 && (is_compute_kind(op.kind) || op.bytes == 0);
  if (by_flops) {
    size = format_flops(op.flops);
    if (seconds > 0.0) rate = format_flops(op.flops / seconds) + "/s";
  } else if (op.bytes > 0) {
    size = format_bytes(static_cast<double>(op.bytes));
    if (seconds > 0.0) rate = format_bytes(static_cast<double>(op.bytes) / seconds) + "/s";
  } else {
    size = "-";
  }
  std::string detail = sim::to_string(op.kind);
  if (op.category != sim::OpCategory::kNone) {
    detail += fmt::format(", {}", sim::to_string(op.category));
  }
  if (op.layer >= 0) detail += fmt::format(", layer {}", op.layer);
  const std::string lane =
      span.lane.index() < timeline.lanes.size() ? timeline.lanes[span.lane.index()] : "?";
  return fmt::format("{}\n{} on {} ({})\nsize {} · duration {} · rate {}\n{} → {}", op.name, detail,
                     lane, timeline.source, size, format_duration_ns(duration), rate,
                     format_duration_ns(ns(span.start)), format_duration_ns(ns(span.end)));
}

}  // namespace offsim::gui
