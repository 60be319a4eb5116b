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

}  // namespace offsim::sim
