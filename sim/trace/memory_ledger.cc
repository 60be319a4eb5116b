#include "sim/trace/memory_ledger.h"

#include <fmt/format.h>

namespace offsim::sim {

MemoryLedger::MemoryLedger(std::size_t pools, LedgerOptions options)
    : options_(options), pools_(pools) {
  if (options_.record_samples) {
    for (PoolLedger& p : pools_) p.samples.push_back(MemorySample{kTimeZero, 0});
  }
}

void MemoryLedger::sample(PoolLedger& p, TimePoint time) {
  std::vector<MemorySample>& s = p.samples;
  if (!s.empty() && s.back().time == time) {
    s.back().bytes_in_use = p.in_use;
    if (s.size() >= 2 && s[s.size() - 2].bytes_in_use == p.in_use) s.pop_back();
  } else if (s.empty() || s.back().bytes_in_use != p.in_use) {
    s.push_back(MemorySample{time, p.in_use});
  }
}

std::optional<MemoryEventProblem> check_memory_events(const Timeline& timeline) {
  std::vector<std::uint8_t> live(timeline.tensors.size(), 0);
  const auto& events = timeline.memory_events;
  for (std::size_t k = 0; k < events.size(); ++k) {
    const MemoryEvent& e = events[k];
    const auto problem = [&](std::string message) {
      return MemoryEventProblem{k, std::move(message)};
    };
    if (e.tensor.index() >= timeline.tensors.size()) {
      return problem(fmt::format("tensor index {} is out of range (the timeline has {} tensors)",
                                 e.tensor.value(), timeline.tensors.size()));
    }
    const TensorInfo& t = timeline.tensors[e.tensor.index()];
    if (e.pool.index() >= timeline.pools.size() || t.pool != e.pool) {
      return problem(fmt::format("pool {} is not the pool of tensor '{}'", e.pool.value(), t.name));
    }
    if (k > 0 && e.time < events[k - 1].time) {
      return problem(fmt::format("time {} ns is before the previous event's {} ns",
                                 e.time.time_since_epoch().count(),
                                 events[k - 1].time.time_since_epoch().count()));
    }
    const bool is_alloc = !live[e.tensor.index()];
    if (e.delta_bytes != (is_alloc ? t.bytes : -t.bytes)) {
      return problem(fmt::format("expected {} bytes ({} of tensor '{}', {} bytes), got {}",
                                 is_alloc ? t.bytes : -t.bytes,
                                 is_alloc ? "an alloc, as it is not live" : "a free, as it is live",
                                 t.name, t.bytes, e.delta_bytes));
    }
    live[e.tensor.index()] = is_alloc ? 1 : 0;
  }
  return std::nullopt;
}

Result<MemoryLedger> MemoryLedger::replay(const Timeline& timeline) {
  if (std::optional<MemoryEventProblem> bad = check_memory_events(timeline)) {
    return fail(ErrorCode::kInvalidInput, "memory_events[{}]: {}", bad->index, bad->message);
  }
  MemoryLedger ledger(timeline.pools.size(), {.record_samples = true, .record_events = true});
  ledger.effects_.reserve(timeline.memory_events.size());
  ledger.events_.reserve(timeline.memory_events.size());
  std::vector<std::uint8_t> live(timeline.tensors.size(), 0);  // tells a 0-byte alloc from a free
  for (const MemoryEvent& e : timeline.memory_events) {
    const std::int64_t bytes = timeline.tensors[e.tensor.index()].bytes;
    std::uint8_t& is_live = live[e.tensor.index()];
    if (!is_live) {
      ledger.alloc(e.time, e.tensor, e.pool, bytes);
    } else {
      ledger.free(e.time, e.tensor, e.pool, bytes);
    }
    is_live = !is_live;
  }
  return ledger;
}

namespace {

// Live tensors of one pool: ids with their position, so that a free removes in O(1).
class LiveSet {
 public:
  void add(std::uint32_t tensor) {
    if (tensor >= where_.size()) where_.resize(tensor + 1, kAbsent);
    where_[tensor] = static_cast<std::uint32_t>(ids_.size());
    ids_.push_back(tensor);
  }
  void remove(std::uint32_t tensor) {
    if (tensor >= where_.size() || where_[tensor] == kAbsent) return;
    const std::uint32_t at = where_[tensor];
    ids_[at] = ids_.back();
    where_[ids_[at]] = at;
    ids_.pop_back();
    where_[tensor] = kAbsent;
  }
  std::vector<TensorId> sorted() const {
    std::vector<std::uint32_t> ids = ids_;
    std::sort(ids.begin(), ids.end());
    std::vector<TensorId> out;
    out.reserve(ids.size());
    for (std::uint32_t id : ids) out.push_back(TensorId{id});
    return out;
  }

 private:
  static constexpr std::uint32_t kAbsent = 0xffffffffu;
  std::vector<std::uint32_t> ids_;
  std::vector<std::uint32_t> where_;
};

}  // namespace

std::vector<std::vector<TensorId>> MemoryLedger::live_at_peaks() const {
  std::vector<std::vector<TensorId>> out(pools_.size());
  std::vector<std::uint32_t> order;
  for (std::uint32_t p = 0; p < pools_.size(); ++p) {
    if (pools_[p].peak_bytes > 0) order.push_back(p);
  }
  if (order.empty()) return out;
  std::stable_sort(order.begin(), order.end(), [this](std::uint32_t a, std::uint32_t b) {
    return pools_[a].peak_event < pools_[b].peak_event;
  });
  std::vector<LiveSet> live(pools_.size());
  std::size_t applied = 0;
  for (std::uint32_t p : order) {
    for (; applied < pools_[p].peak_event; ++applied) {
      const Effect& e = effects_[applied];
      LiveSet& set = live[e.pool_free >> 1];
      if (e.pool_free & 1u) {
        set.remove(e.tensor);
      } else {
        set.add(e.tensor);
      }
    }
    out[p] = live[p].sorted();
  }
  return out;
}

std::vector<TensorId> MemoryLedger::live_after(PoolId pool, std::size_t events) const {
  LiveSet set;
  const std::size_t n = std::min(events, effects_.size());
  for (std::size_t k = 0; k < n; ++k) {
    const Effect& e = effects_[k];
    if ((e.pool_free >> 1) != pool.value()) continue;
    if (e.pool_free & 1u) {
      set.remove(e.tensor);
    } else {
      set.add(e.tensor);
    }
  }
  return set.sorted();
}

std::vector<TensorId> MemoryLedger::live_at(PoolId pool, TimePoint time) const {
  OFFSIM_CHECK(options_.record_events);
  auto it = std::upper_bound(events_.begin(), events_.end(), time,
                             [](TimePoint t, const MemoryEvent& e) { return t < e.time; });
  return live_after(pool, static_cast<std::size_t>(it - events_.begin()));
}

std::int64_t MemoryLedger::bytes_at(PoolId pool, TimePoint time) const {
  OFFSIM_CHECK(options_.record_samples);
  const std::vector<MemorySample>& s = pools_[pool.index()].samples;
  auto it = std::upper_bound(s.begin(), s.end(), time,
                             [](TimePoint t, const MemorySample& m) { return t < m.time; });
  return it == s.begin() ? 0 : std::prev(it)->bytes_in_use;
}

void fill_pool_traces(const MemoryLedger& ledger, const std::vector<TensorInfo>& tensors,
                      std::vector<PoolTrace>& pools) {
  const std::vector<std::vector<TensorId>> at_peak = ledger.live_at_peaks();
  for (std::size_t p = 0; p < pools.size() && p < ledger.pool_count(); ++p) {
    const PoolLedger& l = ledger.pool(PoolId{p});
    pools[p].samples = l.samples;
    pools[p].peak_bytes = l.peak_bytes;
    pools[p].peak_time = l.peak_time;
    pools[p].live_at_peak = describe_live(tensors, at_peak[p]);
  }
}

}  // namespace offsim::sim
