#include "gui/model/memory_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "gui/model/timeline_model.h"

namespace offsim::gui {
namespace {

std::int64_t ns(sim::TimePoint t) { return t.time_since_epoch().count(); }

struct Allocation {
  std::int64_t bytes;
  std::string name;
  std::string category;
};

}  // namespace

MemoryModel MemoryModel::build(const sim::Timeline& timeline, int source) {
  MemoryModel model;
  for (const sim::PoolTrace& pool : timeline.pools) {
    PoolSeries series;
    series.name = pool.name;
    series.source = source;
    series.rank = pool_rank_of(pool);
    series.capacity_bytes = pool.capacity_bytes;
    series.peak_bytes = pool.peak_bytes;
    series.peak_time_ns = ns(pool.peak_time);
    PoolData data;
    data.live_at_peak = pool.live_at_peak;
    for (const sim::MemorySample& s : pool.samples) {
      if (!data.samples.empty() && data.samples.back().time == s.time) {
        data.samples.back() = s;
      } else {
        data.samples.push_back(s);
      }
    }
    std::int64_t previous = 0;
    for (const sim::MemorySample& s : data.samples) {
      series.steps.push_back({ns(s.time), previous});
      series.steps.push_back({ns(s.time), s.bytes_in_use});
      previous = s.bytes_in_use;
    }
    // Memory stays in use after the last change: hold the last value to the step's end.
    const std::int64_t step_end = ns(timeline.makespan);
    if (!series.steps.empty() && series.steps.back().time_ns < step_end) {
      series.steps.push_back({step_end, previous});
    }
    // A timeline recorded without samples still has its peak; show it as one point.
    if (series.steps.empty() && pool.peak_bytes > 0) {
      series.steps.push_back({series.peak_time_ns, pool.peak_bytes});
    }
    model.pools_.push_back(std::move(series));
    model.data_.push_back(std::move(data));
  }
  const auto& spans = timeline.spans;
  model.by_start_.resize(spans.size());
  std::iota(model.by_start_.begin(), model.by_start_.end(), 0u);
  std::sort(model.by_start_.begin(), model.by_start_.end(), [&](std::uint32_t a, std::uint32_t b) {
    return std::tie(spans[a].start, spans[a].op) < std::tie(spans[b].start, spans[b].op);
  });
  model.start_ns_.reserve(spans.size());
  for (std::uint32_t i : model.by_start_) model.start_ns_.push_back(ns(spans[i].start));
  model.lane_rank_.reserve(timeline.lanes.size());
  for (std::size_t l = 0; l < timeline.lanes.size(); ++l) {
    model.lane_rank_.push_back(lane_of(timeline, l).rank);
  }
  return model;
}

std::int64_t MemoryModel::bytes_at(std::size_t pool, std::int64_t t_ns) const {
  OFFSIM_CHECK(pool < data_.size());
  const auto& samples = data_[pool].samples;
  auto it =
      std::upper_bound(samples.begin(), samples.end(), t_ns,
                       [](std::int64_t t, const sim::MemorySample& s) { return t < ns(s.time); });
  if (it == samples.begin()) return 0;
  return std::prev(it)->bytes_in_use;
}

LiveSet MemoryModel::live_at(const sim::Timeline& timeline, std::size_t pool,
                             std::int64_t t_ns) const {
  OFFSIM_CHECK(pool < data_.size());
  const PoolSeries& series = pools_[pool];
  const PoolData& data = data_[pool];
  LiveSet out;
  out.time_ns = t_ns;
  out.bytes_in_use = bytes_at(pool, t_ns);
  // Exact at the peak: from the peak sample until the next change.
  auto next =
      std::upper_bound(data.samples.begin(), data.samples.end(), series.peak_time_ns,
                       [](std::int64_t t, const sim::MemorySample& s) { return t < ns(s.time); });
  const std::int64_t peak_until =
      next == data.samples.end() ? std::numeric_limits<std::int64_t>::max() : ns(next->time);
  if (!data.live_at_peak.empty() && t_ns >= series.peak_time_ns && t_ns < peak_until &&
      out.bytes_in_use == series.peak_bytes) {
    out.exact = true;
    for (const sim::LiveTensor& t : data.live_at_peak) {
      out.entries.push_back({t.name, t.category, t.bytes});
    }
    std::stable_sort(out.entries.begin(), out.entries.end(),
                     [](const LiveEntry& a, const LiveEntry& b) { return a.bytes > b.bytes; });
    return out;
  }
  // Inferred: replay the changes up to t_ns.
  std::vector<Allocation> live;
  std::int64_t previous = 0;
  for (const sim::MemorySample& s : data.samples) {
    const std::int64_t t = ns(s.time);
    if (t > t_ns) break;
    const std::int64_t delta = s.bytes_in_use - previous;
    previous = s.bytes_in_use;
    if (delta > 0) {
      // Ops that started at t on the pool's rank (any rank for host pools).
      auto lo = std::lower_bound(start_ns_.begin(), start_ns_.end(), t);
      std::vector<std::uint32_t> starters;
      std::size_t matches = 0;
      for (auto it = lo; it != start_ns_.end() && *it == t; ++it) {
        const std::uint32_t span = by_start_[static_cast<std::size_t>(it - start_ns_.begin())];
        const sim::LaneId lane = timeline.spans[span].lane;
        const int rank = lane.index() < lane_rank_.size() ? lane_rank_[lane.index()] : -1;
        if (series.rank >= 0 && rank != series.rank) continue;
        if (++matches <= 1) starters.push_back(span);
      }
      Allocation a{delta, "(no op started here)", ""};
      if (t == 0 && starters.empty()) a.name = "initial tensors";
      if (!starters.empty()) {
        const sim::OpInfo& op = timeline.ops[timeline.spans[starters[0]].op.index()];
        a.name = matches > 1 ? fmt::format("{} (+{} ops)", op.name, matches - 1) : op.name;
        a.category = op.category;
      }
      live.push_back(std::move(a));
    } else if (delta < 0) {
      std::int64_t to_free = -delta;
      auto exact = std::find_if(live.rbegin(), live.rend(),
                                [&](const Allocation& a) { return a.bytes == to_free; });
      if (exact != live.rend()) {
        live.erase(std::next(exact).base());
        continue;
      }
      while (to_free > 0 && !live.empty()) {
        const std::int64_t take = std::min(to_free, live.back().bytes);
        live.back().bytes -= take;
        to_free -= take;
        if (live.back().bytes == 0) live.pop_back();
      }
    }
  }
  for (Allocation& a : live) {
    out.entries.push_back({std::move(a.name), std::move(a.category), a.bytes});
  }
  std::stable_sort(out.entries.begin(), out.entries.end(),
                   [](const LiveEntry& a, const LiveEntry& b) { return a.bytes > b.bytes; });
  return out;
}

std::vector<StepPoint> decimate_steps(const std::vector<StepPoint>& steps, std::int64_t start_ns,
                                      std::int64_t end_ns, double width_px) {
  std::vector<StepPoint> out;
  if (steps.empty() || end_ns <= start_ns || !(width_px >= 1.0)) return out;
  auto first = std::lower_bound(steps.begin(), steps.end(), start_ns,
                                [](const StepPoint& p, std::int64_t t) { return p.time_ns < t; });
  if (first != steps.begin()) --first;  // the point before the window carries the level in
  auto last = std::upper_bound(steps.begin(), steps.end(), end_ns,
                               [](std::int64_t t, const StepPoint& p) { return t < p.time_ns; });
  if (last != steps.end()) ++last;  // and the one after, so the curve reaches the right edge
  const auto count = static_cast<std::size_t>(last - first);
  if (static_cast<double>(count) <= 4.0 * width_px) return {first, last};
  const double ns_per_px = static_cast<double>(end_ns - start_ns) / width_px;
  auto column = [&](const StepPoint& p) {
    return static_cast<std::int64_t>(
        std::floor(static_cast<double>(p.time_ns - start_ns) / ns_per_px));
  };
  for (auto it = first; it != last;) {
    const std::int64_t c = column(*it);
    auto group_end = it;
    StepPoint lo = *it;
    StepPoint hi = *it;
    StepPoint back = *it;
    while (group_end != last && column(*group_end) == c) {
      if (group_end->bytes < lo.bytes) lo = *group_end;
      if (group_end->bytes > hi.bytes) hi = *group_end;
      back = *group_end;
      ++group_end;
    }
    out.push_back(*it);
    // Minimum and maximum in time order, then the last value of the column.
    if (lo.time_ns <= hi.time_ns) {
      out.push_back(lo);
      out.push_back(hi);
    } else {
      out.push_back(hi);
      out.push_back(lo);
    }
    out.push_back(back);
    it = group_end;
  }
  return out;
}

}  // namespace offsim::gui
