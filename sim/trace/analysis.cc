#include "sim/trace/analysis.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <tuple>

namespace offsim::sim {

std::vector<std::uint32_t> critical_path_spans(const Timeline& timeline,
                                               const std::vector<std::vector<OpId>>& deps_given) {
  const auto& spans = timeline.spans;
  const std::size_t n = spans.size();
  std::vector<std::uint32_t> path;
  if (n == 0) return path;
  // The dependencies to follow: the caller's, else the timeline's own when it
  // has any.
  std::vector<std::vector<OpId>> own;
  const std::vector<std::vector<OpId>>* deps = &deps_given;
  if (deps_given.empty()) {
    const bool any = std::any_of(timeline.ops.begin(), timeline.ops.end(),
                                 [](const OpInfo& op) { return !op.deps.empty(); });
    if (any) {
      own.reserve(timeline.ops.size());
      for (const OpInfo& op : timeline.ops) own.push_back(op.deps);
      deps = &own;
    }
  }
  auto by_end = [&](std::uint32_t a, std::uint32_t b) {
    return std::tie(spans[a].end, spans[a].start, spans[a].op) <
           std::tie(spans[b].end, spans[b].start, spans[b].op);
  };
  // Previous span on the same lane (lane order = start order).
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return std::tie(spans[a].lane, spans[a].start, spans[a].op) <
           std::tie(spans[b].lane, spans[b].start, spans[b].op);
  });
  constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();
  std::vector<std::uint32_t> prev_on_lane(n, kNone);
  for (std::size_t k = 1; k < n; ++k) {
    if (spans[order[k]].lane == spans[order[k - 1]].lane) prev_on_lane[order[k]] = order[k - 1];
  }
  std::vector<std::uint32_t> span_of_op;
  if (!deps->empty()) {
    span_of_op.assign(timeline.ops.size(), kNone);
    for (std::uint32_t i = 0; i < n; ++i) {
      if (spans[i].op.index() < span_of_op.size()) span_of_op[spans[i].op.index()] = i;
    }
  }
  // All spans by end, for the timing-only dependency guess.
  std::vector<std::uint32_t> end_order(n);
  std::iota(end_order.begin(), end_order.end(), 0u);
  std::sort(end_order.begin(), end_order.end(), by_end);

  std::vector<bool> visited(n, false);
  std::uint32_t current = end_order.back();
  while (current != kNone && !visited[current]) {
    visited[current] = true;
    path.push_back(current);
    const TimePoint start = spans[current].start;
    std::uint32_t best = kNone;
    auto consider = [&](std::uint32_t c) {
      if (c == kNone || visited[c] || spans[c].end > start) return;
      if (best == kNone || spans[c].end > spans[best].end) best = c;
    };
    consider(prev_on_lane[current]);  // first, so that it wins ties
    if (!deps->empty()) {
      const std::size_t op = spans[current].op.index();
      if (op < deps->size()) {
        for (OpId d : (*deps)[op]) {
          if (d.index() < span_of_op.size()) consider(span_of_op[d.index()]);
        }
      }
    } else {
      auto it = std::upper_bound(end_order.begin(), end_order.end(), start,
                                 [&](TimePoint t, std::uint32_t i) { return t < spans[i].end; });
      while (it != end_order.begin()) {
        --it;
        if (!visited[*it]) {
          consider(*it);
          break;
        }
      }
    }
    current = best;
  }
  std::reverse(path.begin(), path.end());
  return path;
}

IdleCause idle_cause(OpKind waited_on) {
  switch (waited_on) {
    case OpKind::kCopy:
      return IdleCause::kExposedOffload;
    case OpKind::kHostCompute:
      return IdleCause::kCpuOptimizer;
    case OpKind::kP2P:
      return IdleCause::kBubble;
    case OpKind::kCollective:
      return IdleCause::kExposedComm;
    default:
      return IdleCause::kOther;
  }
}

namespace {

// What the compute-lane walk reads of each op, from a Plan.
struct PlanOps {
  const Plan& plan;
  std::size_t size() const { return plan.ops.size(); }
  LaneId lane(std::size_t i, const Span& /*span*/) const { return plan.ops[i].lane; }
  OpKind kind(std::size_t i) const { return plan.ops[i].kind; }
  const std::vector<OpId>& deps(std::size_t i) const { return plan.ops[i].deps; }
  int rank(LaneId l) const { return plan.lanes[l.index()].rank; }
};

// The same from a Timeline: lanes from the spans, ranks given by lane.
struct TimelineOps {
  const Timeline& t;
  const std::vector<int>& lane_rank;
  std::size_t size() const { return t.ops.size(); }
  LaneId lane(std::size_t /*i*/, const Span& span) const { return span.lane; }
  OpKind kind(std::size_t i) const { return t.ops[i].kind; }
  const std::vector<OpId>& deps(std::size_t i) const { return t.ops[i].deps; }
  int rank(LaneId l) const { return l.index() < lane_rank.size() ? lane_rank[l.index()] : -1; }
};

std::vector<const Span*> spans_by_op(const Timeline& t, std::size_t ops) {
  std::vector<const Span*> by_op(ops, nullptr);
  for (const Span& s : t.spans) {
    if (s.op.index() < by_op.size()) by_op[s.op.index()] = &s;
  }
  return by_op;
}

// The gap [from, to) before op `i` starts: its dependency that ended last
// (ties: the later in its deps) is what the lane waited on.
template <class Ops>
IdleInterval gap_before(const Ops& ops, const std::vector<const Span*>& by_op, std::size_t i,
                        TimePoint from, TimePoint to) {
  IdleInterval w{from, to, IdleCause::kOther, OpId{}};
  TimePoint latest = kTimeZero;
  for (OpId dep : ops.deps(i)) {
    const Span* ds = dep.index() < by_op.size() ? by_op[dep.index()] : nullptr;
    if (ds != nullptr && ds->end >= latest) {
      latest = ds->end;
      w.blocker = dep;
    }
  }
  if (w.blocker.valid()) w.cause = idle_cause(ops.kind(w.blocker.index()));
  return w;
}

// How telling a running op is for the tail after the compute lane's last op.
int tail_priority(OpKind k) {
  switch (k) {
    case OpKind::kHostCompute:
      return 4;
    case OpKind::kCopy:
      return 3;
    case OpKind::kCollective:
      return 2;
    case OpKind::kP2P:
      return 1;
    default:
      return 0;
  }
}

// The tail [from, to) after the compute lane's last op, cut at every start and
// end of the rank's ops still running; each piece goes to the most telling op
// running through all of it (the first in op order on ties), else it is a
// bubble. Adjacent pieces with the same op merge.
template <class Ops, class Idle>
void walk_tail(const Ops& ops, const std::vector<const Span*>& by_op, int rank, TimePoint from,
               TimePoint to, Idle&& idle) {
  std::vector<std::size_t> active;
  std::vector<TimePoint> cuts = {from, to};
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Span* s = by_op[i];
    if (s == nullptr || s->end <= from || ops.rank(ops.lane(i, *s)) != rank) continue;
    active.push_back(i);
    cuts.push_back(std::max(from, s->start));
    cuts.push_back(s->end);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::optional<IdleInterval> open;
  for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
    std::optional<std::size_t> best;
    for (std::size_t i : active) {
      const Span& s = *by_op[i];
      if (s.start <= cuts[c] && s.end >= cuts[c + 1] &&
          (!best || tail_priority(ops.kind(i)) > tail_priority(ops.kind(*best)))) {
        best = i;
      }
    }
    IdleInterval w{cuts[c], cuts[c + 1], IdleCause::kBubble, OpId{}};
    if (best) w = {cuts[c], cuts[c + 1], idle_cause(ops.kind(*best)), OpId{*best}};
    if (open && open->end == w.start && open->blocker == w.blocker && open->cause == w.cause) {
      open->end = w.end;
      continue;
    }
    if (open) idle(*open);
    open = w;
  }
  if (open) idle(*open);
}

// Walks a rank's compute lane in issue order: busy(i, span, from) for each of
// its ops (busy from `from` to the span's end) and idle(IdleInterval) for each
// gap and tail piece, in time order.
template <class Ops, class Busy, class Idle>
void walk_compute_lane(const Ops& ops, const std::vector<const Span*>& by_op, LaneId lane,
                       TimePoint makespan, std::optional<StartWindow> window, Busy&& busy,
                       Idle&& idle) {
  TimePoint cursor = kTimeZero;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Span* s = by_op[i];
    if (s == nullptr || ops.lane(i, *s) != lane) continue;
    if (window && !(s->start > window->after && s->start <= window->upto)) {
      cursor = std::max(cursor, s->end);
      continue;
    }
    if (s->start > cursor) idle(gap_before(ops, by_op, i, cursor, s->start));
    busy(i, *s, std::max(s->start, cursor));
    cursor = std::max(cursor, s->end);
  }
  if (!window && makespan > cursor) walk_tail(ops, by_op, ops.rank(lane), cursor, makespan, idle);
}

std::int64_t& idle_bucket(TimeSplitNs& split, IdleCause cause) {
  switch (cause) {
    case IdleCause::kExposedOffload:
      return split.exposed_offload;
    case IdleCause::kCpuOptimizer:
      return split.cpu_optimizer;
    case IdleCause::kBubble:
      return split.bubble;
    case IdleCause::kExposedComm:
      return split.exposed_comm;
    case IdleCause::kOther:
      break;
  }
  return split.other;
}

void add_busy(TimeSplitNs& split, const Op& op, std::int64_t busy) {
  if (op.category == OpCategory::kRecompute) {
    split.recompute += busy;
  } else if (op.category == OpCategory::kComm) {
    split.exposed_comm += busy;
  } else {
    split.compute += busy;
  }
  if (op.kind == OpKind::kCollective && op.sizes.collective.kind == CollectiveKind::kAllToAll) {
    split.moe_alltoall += busy;
  }
  if (op.kind == OpKind::kGemm && op.sizes.gemm.grouped) split.grouped_gemm += busy;
}

}  // namespace

std::vector<IdleInterval> idle_intervals(const Plan& plan, const Timeline& t, LaneId compute_lane,
                                         std::optional<StartWindow> window) {
  std::vector<IdleInterval> out;
  if (compute_lane.index() >= plan.lanes.size()) return out;
  walk_compute_lane(
      PlanOps{plan}, spans_by_op(t, plan.ops.size()), compute_lane, t.makespan, window,
      [](std::size_t /*op*/, const Span& /*span*/, TimePoint /*from*/) {},
      [&](const IdleInterval& w) { out.push_back(w); });
  return out;
}

std::vector<IdleInterval> idle_intervals(const Timeline& t, LaneId compute_lane,
                                         const std::vector<int>& lane_rank) {
  std::vector<IdleInterval> out;
  walk_compute_lane(
      TimelineOps{t, lane_rank}, spans_by_op(t, t.ops.size()), compute_lane, t.makespan,
      std::nullopt, [](std::size_t /*op*/, const Span& /*span*/, TimePoint /*from*/) {},
      [&](const IdleInterval& w) { out.push_back(w); });
  return out;
}

TimeSplitNs split_time(const Plan& plan, const Timeline& t, LaneId compute_lane,
                       std::optional<StartWindow> window) {
  TimeSplitNs split;
  if (compute_lane.index() >= plan.lanes.size()) return split;
  walk_compute_lane(
      PlanOps{plan}, spans_by_op(t, plan.ops.size()), compute_lane, t.makespan, window,
      [&](std::size_t i, const Span& s, TimePoint from) {
        add_busy(split, plan.ops[i], (s.end - from).count());
      },
      [&](const IdleInterval& w) { idle_bucket(split, w.cause) += (w.end - w.start).count(); });
  return split;
}

}  // namespace offsim::sim
