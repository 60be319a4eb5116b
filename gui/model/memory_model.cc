#include "gui/model/memory_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "gui/model/timeline_model.h"

namespace offsim::gui {
namespace {

std::int64_t ns(sim::TimePoint t) { return t.time_since_epoch().count(); }

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
  if (!timeline.memory_events.empty()) {
    sim::Result<sim::MemoryLedger> ledger = sim::MemoryLedger::replay(timeline);
    if (ledger) model.ledger_ = std::move(*ledger);  // files were checked when read
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
  if (ledger_ && pool < ledger_->pool_count()) {
    out.exact = true;
    const std::vector<sim::LiveTensor> live = sim::describe_live(
        timeline.tensors, ledger_->live_at(sim::PoolId{pool}, sim::TimePoint{sim::Duration{t_ns}}));
    for (const sim::LiveTensor& t : live) out.entries.push_back({t.name, t.category, t.bytes});
    return out;
  }
  // Without memory events: the recorded live set, from the peak sample until the next change.
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
  }
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
