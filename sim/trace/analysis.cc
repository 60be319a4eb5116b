#include "sim/trace/analysis.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <span>
#include <tuple>

namespace offsim::sim {

namespace {

constexpr std::uint32_t kNoSpan = std::numeric_limits<std::uint32_t>::max();

// The previous span on the same lane of each span (lane order = start order), kNoSpan for a
// lane's first.
std::vector<std::uint32_t> previous_on_lane(const std::vector<Span>& spans) {
  const std::size_t n = spans.size();
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return std::tie(spans[a].lane, spans[a].start, spans[a].op) <
           std::tie(spans[b].lane, spans[b].start, spans[b].op);
  });
  std::vector<std::uint32_t> prev_on_lane(n, kNoSpan);
  for (std::size_t k = 1; k < n; ++k) {
    if (spans[order[k]].lane == spans[order[k - 1]].lane) prev_on_lane[order[k]] = order[k - 1];
  }
  return prev_on_lane;
}

// The span of each op of the timeline, kNoSpan for an op that did not run.
std::vector<std::uint32_t> span_index_of_op(const Timeline& timeline) {
  std::vector<std::uint32_t> span_of_op(timeline.ops.size(), kNoSpan);
  const auto& spans = timeline.spans;
  for (std::uint32_t i = 0; i < spans.size(); ++i) {
    if (spans[i].op.index() < span_of_op.size()) span_of_op[spans[i].op.index()] = i;
  }
  return span_of_op;
}

// The backward walk of critical_path_spans: from each span to the predecessor that ended last
// before it started, among its lane predecessor (which wins ties) and its dependencies, or,
// without dependencies, the latest-ending unvisited span (a timing-only guess).
class CriticalPathWalk {
 public:
  CriticalPathWalk(const Timeline& timeline, const std::vector<std::vector<OpId>>& deps)
      : spans_(timeline.spans),
        deps_(deps),
        prev_on_lane_(previous_on_lane(spans_)),
        visited_(spans_.size(), false) {
    if (!deps_.empty()) span_of_op_ = span_index_of_op(timeline);
    // All spans by end, for the timing-only dependency guess.
    end_order_.resize(spans_.size());
    std::iota(end_order_.begin(), end_order_.end(), 0u);
    std::sort(end_order_.begin(), end_order_.end(), [&](std::uint32_t a, std::uint32_t b) {
      return std::tie(spans_[a].end, spans_[a].start, spans_[a].op) <
             std::tie(spans_[b].end, spans_[b].start, spans_[b].op);
    });
  }

  // The path, first span first; the timeline must have a span.
  std::vector<std::uint32_t> walk() {
    std::vector<std::uint32_t> path;
    std::uint32_t current = end_order_.back();
    while (current != kNoSpan && !visited_[current]) {
      visited_[current] = true;
      path.push_back(current);
      current = predecessor(current);
    }
    std::reverse(path.begin(), path.end());
    return path;
  }

 private:
  std::uint32_t predecessor(std::uint32_t current) const {
    const TimePoint start = spans_[current].start;
    std::uint32_t best = kNoSpan;
    auto consider = [&](std::uint32_t c) {
      if (c == kNoSpan || visited_[c] || spans_[c].end > start) return;
      if (best == kNoSpan || spans_[c].end > spans_[best].end) best = c;
    };
    consider(prev_on_lane_[current]);  // first, so that it wins ties
    if (!deps_.empty()) {
      const std::size_t op = spans_[current].op.index();
      if (op >= deps_.size()) return best;
      for (OpId d : deps_[op]) {
        if (d.index() < span_of_op_.size()) consider(span_of_op_[d.index()]);
      }
      return best;
    }
    auto it = std::upper_bound(end_order_.begin(), end_order_.end(), start,
                               [&](TimePoint t, std::uint32_t i) { return t < spans_[i].end; });
    while (it != end_order_.begin()) {
      --it;
      if (!visited_[*it]) {
        consider(*it);
        break;
      }
    }
    return best;
  }

  const std::vector<Span>& spans_;
  const std::vector<std::vector<OpId>>& deps_;
  std::vector<std::uint32_t> prev_on_lane_;
  std::vector<std::uint32_t> span_of_op_;
  std::vector<std::uint32_t> end_order_;
  std::vector<bool> visited_;
};

// The timeline's own dependencies by op, empty when no op has any.
std::vector<std::vector<OpId>> timeline_deps(const Timeline& timeline) {
  std::vector<std::vector<OpId>> own;
  const bool any = std::any_of(timeline.ops.begin(), timeline.ops.end(),
                               [](const OpInfo& op) { return !op.deps.empty(); });
  if (!any) return own;
  own.reserve(timeline.ops.size());
  for (const OpInfo& op : timeline.ops) own.push_back(op.deps);
  return own;
}

}  // namespace

std::vector<std::uint32_t> critical_path_spans(const Timeline& timeline,
                                               const std::vector<std::vector<OpId>>& deps_given) {
  if (timeline.spans.empty()) return {};
  // The dependencies to follow: the caller's, else the timeline's own when it has any.
  if (!deps_given.empty()) return CriticalPathWalk(timeline, deps_given).walk();
  const std::vector<std::vector<OpId>> own = timeline_deps(timeline);
  return CriticalPathWalk(timeline, own).walk();
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
  std::span<const OpId> deps(std::size_t i) const { return plan.ops[i].deps; }
  int rank(LaneId l) const { return plan.lanes[l.index()].rank; }
  LaneRole role(LaneId l) const { return plan.lanes[l.index()].role; }
};

// The same from a Timeline: lanes from the spans, ranks given by lane.
struct TimelineOps {
  const Timeline& t;
  const std::vector<int>& lane_rank;
  std::size_t size() const { return t.ops.size(); }
  LaneId lane(std::size_t /*i*/, const Span& span) const { return span.lane; }
  OpKind kind(std::size_t i) const { return t.ops[i].kind; }
  std::span<const OpId> deps(std::size_t i) const { return t.ops[i].deps; }
  int rank(LaneId l) const { return l.index() < lane_rank.size() ? lane_rank[l.index()] : -1; }
  // Files written before lanes had a role: every point-to-point lane taken as the pipeline's.
  LaneRole role(LaneId l) const {
    return l.index() < t.lane_identity.size() ? t.lane_identity[l.index()].role : LaneRole::kP2P;
  }
};

// Why a lane waited on op i: idle_cause of its kind, except that a point-to-point transfer on a
// communication stream (context parallelism's K,V ring, tensor parallelism's ring exchange) is
// exposed communication, not a pipeline bubble (the pipeline's sends and receives run on their
// own lanes or on the compute stream).
template <class Ops>
IdleCause cause_of(const Ops& ops, const std::vector<const Span*>& by_op, std::size_t i) {
  const OpKind kind = ops.kind(i);
  const Span* s = i < by_op.size() ? by_op[i] : nullptr;
  if (kind == OpKind::kP2P && s != nullptr && ops.role(ops.lane(i, *s)) == LaneRole::kComm) {
    return IdleCause::kExposedComm;
  }
  return idle_cause(kind);
}

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
  if (w.blocker.valid()) w.cause = cause_of(ops, by_op, w.blocker.index());
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
    if (best) w = {cuts[c], cuts[c + 1], cause_of(ops, by_op, *best), OpId{*best}};
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
// gap and tail piece, in time order. The rank's other compute-role lanes (a
// combined 1F1B step's backward stream) are walked with it as one stream, in
// start order: the time either runs is busy, once.
template <class Ops, class Busy, class Idle>
void walk_compute_lane(const Ops& ops, const std::vector<const Span*>& by_op, LaneId lane,
                       TimePoint makespan, std::optional<StartWindow> window, Busy&& busy,
                       Idle&& idle) {
  std::vector<std::size_t> order;
  bool several = false;
  const bool compute = ops.role(lane) == LaneRole::kCompute;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Span* s = by_op[i];
    if (s == nullptr) continue;
    const LaneId l = ops.lane(i, *s);
    if (l == lane) {
      order.push_back(i);
    } else if (compute && ops.role(l) == LaneRole::kCompute && ops.rank(l) == ops.rank(lane)) {
      order.push_back(i);
      several = true;
    }
  }
  if (several) {
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return by_op[a]->start < by_op[b]->start;
    });
  }
  TimePoint cursor = kTimeZero;
  for (const std::size_t i : order) {
    const Span* s = by_op[i];
    if (window && !(s->start > window->after && s->start <= window->upto)) {
      cursor = std::max(cursor, s->end);
      continue;
    }
    if (s->start > cursor) idle(gap_before(ops, by_op, i, cursor, s->start));
    if (s->end > cursor || s->start >= cursor) busy(i, *s, std::max(s->start, cursor));
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
      [&](const IdleInterval& w) {
        idle_bucket(split, w.cause) += (w.end - w.start).count();
        // Waiting for an all-to-all on its own stream (a combined 1F1B step) is MoE all-to-all
        // time too.
        if (w.blocker.valid() && w.blocker.index() < plan.ops.size()) {
          const Op& b = plan.ops[w.blocker.index()];
          if (b.kind == OpKind::kCollective &&
              b.sizes.collective.kind == CollectiveKind::kAllToAll) {
            split.moe_alltoall += (w.end - w.start).count();
          }
        }
      });
  return split;
}

}  // namespace offsim::sim
