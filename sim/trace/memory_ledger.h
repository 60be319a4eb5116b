// MemoryLedger: the one account of memory pools. Allocs and frees are applied to it in order; it
// keeps each pool's bytes in use, its usage over time (samples), its peak — the first event that
// reaches the highest usage, and its time — and answers the live set at the peak or at any time.
// The engine applies its allocs and frees to a ledger as they happen; the replay applies the
// device's measured order; the report, `compare` and the GUI replay a timeline's memory events
// through one (MemoryLedger::replay), so predicted and measured memory follow one rule.
//
//   sim::Result<sim::MemoryLedger> ledger = sim::MemoryLedger::replay(timeline);
//   if (!ledger) return fail(ledger.error());
//   const sim::PoolLedger& hbm = ledger->pool(sim::PoolId{0});  // peak_bytes, peak_time, samples
//   std::vector<sim::LiveTensor> live =
//       sim::describe_live(timeline.tensors, ledger->live_at(sim::PoolId{0}, clicked));
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sim/core/check.h"
#include "sim/core/ids.h"
#include "sim/core/result.h"
#include "sim/core/time.h"
#include "sim/trace/timeline.h"

namespace offsim::sim {

struct PoolLedger {
  std::int64_t in_use = 0;
  std::int64_t peak_bytes = 0;  // the highest in_use after any event (0: never above zero)
  TimePoint peak_time;          // the time of the first event that reached it
  std::size_t peak_event = 0;   // events applied (over all pools) when the peak was reached
  // With LedgerOptions::record_samples: (0, 0) first, then one per change, time-ordered; several
  // changes at one instant leave the last value, and a value equal to the previous one is dropped.
  std::vector<MemorySample> samples;
};

struct LedgerOptions {
  bool record_samples = false;  // PoolLedger::samples
  bool record_events = false;   // MemoryLedger::events(); needed by live_at()
};

class MemoryLedger {
 public:
  MemoryLedger() = default;
  MemoryLedger(std::size_t pools, LedgerOptions options);

  // Replays a timeline's memory events (Timeline::memory_events, over Timeline::tensors and
  // pools) with samples and events recorded. Fails on the first event check_memory_events()
  // refuses, naming its index.
  static Result<MemoryLedger> replay(const Timeline& timeline);

  // Applies one event. The caller checks that the tensor is not live (alloc) or live (free).
  void alloc(TimePoint time, TensorId tensor, PoolId pool, std::int64_t bytes) {
    apply(time, tensor, pool, bytes, 0);
  }
  void free(TimePoint time, TensorId tensor, PoolId pool, std::int64_t bytes) {
    apply(time, tensor, pool, -bytes, 1);
  }

  std::size_t pool_count() const { return pools_.size(); }
  const PoolLedger& pool(PoolId pool) const { return pools_[pool.index()]; }
  std::int64_t in_use(PoolId pool) const { return pools_[pool.index()].in_use; }
  std::size_t event_count() const { return effects_.size(); }
  const std::vector<MemoryEvent>& events() const { return events_; }
  std::vector<MemoryEvent> take_events() { return std::move(events_); }
  std::vector<MemorySample> take_samples(PoolId pool) {
    return std::move(pools_[pool.index()].samples);
  }

  // The tensors live in each pool right after its peak was reached, in tensor id order (empty for
  // a pool that never rose above zero). One pass over the events.
  std::vector<std::vector<TensorId>> live_at_peaks() const;
  // The tensors live in `pool` after the first `events` events, in tensor id order.
  std::vector<TensorId> live_after(PoolId pool, std::size_t events) const;
  // The tensors live in `pool` at `time`: after every event at or before it. Needs recorded
  // events (LedgerOptions::record_events).
  std::vector<TensorId> live_at(PoolId pool, TimePoint time) const;
  // Bytes in use in `pool` at `time` (after every event at or before it). Needs recorded samples.
  std::int64_t bytes_at(PoolId pool, TimePoint time) const;

 private:
  struct Effect {
    std::uint32_t tensor;
    std::uint32_t pool_free;  // pool << 1 | is_free
  };

  void apply(TimePoint time, TensorId tensor, PoolId pool, std::int64_t delta, std::uint32_t free) {
    PoolLedger& p = pools_[pool.index()];
    p.in_use += delta;
    effects_.push_back(Effect{tensor.value(), pool.value() << 1 | free});
    if (p.in_use > p.peak_bytes) {
      p.peak_bytes = p.in_use;
      p.peak_time = time;
      p.peak_event = effects_.size();
    }
    if (options_.record_events) events_.push_back(MemoryEvent{time, tensor, delta, pool});
    if (options_.record_samples) sample(p, time);
  }
  static void sample(PoolLedger& p, TimePoint time);

  LedgerOptions options_;
  std::vector<PoolLedger> pools_;
  std::vector<Effect> effects_;  // every event, applied order
  std::vector<MemoryEvent> events_;
};

// The first memory event of a timeline that cannot be replayed, and why: a tensor or pool out of
// range, a size other than the tensor's, a time before the previous event's, an alloc of a live
// tensor or a free of one that is not live.
struct MemoryEventProblem {
  std::size_t index = 0;  // into Timeline::memory_events
  std::string message;
};
std::optional<MemoryEventProblem> check_memory_events(const Timeline& timeline);

// The named live set of tensor ids (from a ledger), largest first (ties in id order). `tensors`
// is Timeline::tensors or Plan::tensors: anything indexed by TensorId with name, category, bytes.
template <class TensorTable>
std::vector<LiveTensor> describe_live(const TensorTable& tensors,
                                      const std::vector<TensorId>& ids) {
  std::vector<LiveTensor> live;
  live.reserve(ids.size());
  for (TensorId id : ids) {
    const auto& t = tensors[id.index()];
    live.push_back(LiveTensor{t.name, t.category, t.bytes});
  }
  std::stable_sort(live.begin(), live.end(),
                   [](const LiveTensor& a, const LiveTensor& b) { return a.bytes > b.bytes; });
  return live;
}

// Fills each pool's samples, peak_bytes, peak_time and live_at_peak from a ledger.
void fill_pool_traces(const MemoryLedger& ledger, const std::vector<TensorInfo>& tensors,
                      std::vector<PoolTrace>& pools);

}  // namespace offsim::sim
