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
  // The dependencies to follow: the caller's, else the timeline's own when it has any.
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

// Attributes the compute lane's time of one rank: busy time by the running op's category, idle
// time by the kind of the dependency that ended last before the next op could start.
TimeSplitNs split_time(const Plan& plan, const Timeline& t, LaneId compute_lane,
                       std::optional<StartWindow> window) {
  TimeSplitNs split;
  std::vector<const Span*> by_op(plan.ops.size(), nullptr);
  for (const Span& s : t.spans) {
    if (s.op.index() < by_op.size()) by_op[s.op.index()] = &s;
  }
  if (compute_lane.index() >= plan.lanes.size()) return split;
  const std::optional<LaneId> lane = compute_lane;
  const int rank = plan.lanes[compute_lane.index()].rank;
  const auto idle_bucket = [&](const Op& op) -> std::int64_t& {
    if (op.kind == OpKind::kCopy) return split.exposed_offload;
    if (op.kind == OpKind::kHostCompute) return split.cpu_optimizer;
    if (op.kind == OpKind::kP2P) return split.bubble;
    if (op.kind == OpKind::kCollective) return split.exposed_comm;
    return split.other;
  };
  TimePoint cursor = kTimeZero;
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    const Op& op = plan.ops[i];
    if (op.lane != *lane || by_op[i] == nullptr) continue;
    const Span& s = *by_op[i];
    if (window && !(s.start > window->after && s.start <= window->upto)) {
      cursor = std::max(cursor, s.end);
      continue;
    }
    if (s.start > cursor) {
      const Op* blocker = nullptr;
      TimePoint latest = kTimeZero;
      for (OpId dep : op.deps) {
        const Span* ds = by_op[dep.index()];
        if (ds != nullptr && ds->end >= latest) {
          latest = ds->end;
          blocker = &plan.ops[dep.index()];
        }
      }
      const std::int64_t gap = (s.start - cursor).count();
      if (blocker != nullptr) {
        idle_bucket(*blocker) += gap;
      } else {
        split.other += gap;
      }
    }
    const std::int64_t busy = (s.end - std::max(s.start, cursor)).count();
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
    cursor = std::max(cursor, s.end);
  }
  // The tail after the last compute op: in each piece of it, the most telling op of this rank
  // still running (CPU optimizer, then copies, then collectives); nothing running = waiting on
  // another pipeline stage.
  if (!window && t.makespan > cursor) {
    std::vector<std::size_t> active;
    std::vector<TimePoint> cuts = {cursor, t.makespan};
    for (std::size_t i = 0; i < plan.ops.size(); ++i) {
      if (by_op[i] == nullptr || by_op[i]->end <= cursor) continue;
      if (plan.lanes[plan.ops[i].lane.index()].rank != rank) continue;
      active.push_back(i);
      cuts.push_back(std::max(cursor, by_op[i]->start));
      cuts.push_back(by_op[i]->end);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    const auto rank_of = [](OpKind k) {
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
    };
    for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
      const std::int64_t piece = (cuts[c + 1] - cuts[c]).count();
      const Op* best = nullptr;
      for (std::size_t i : active) {
        const Span& s = *by_op[i];
        if (s.start <= cuts[c] && s.end >= cuts[c + 1] &&
            (best == nullptr || rank_of(plan.ops[i].kind) > rank_of(best->kind))) {
          best = &plan.ops[i];
        }
      }
      if (best != nullptr) {
        idle_bucket(*best) += piece;
      } else {
        split.bubble += piece;
      }
    }
  }
  return split;
}

}  // namespace offsim::sim
