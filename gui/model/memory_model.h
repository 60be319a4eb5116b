// MemoryModel: bytes in use over time per pool as step curves, the capacity and peak, and the
// live set at any time, shaped for the GUI's memory view. The live sets come from the memory
// ledger (sim/trace/memory_ledger.h) replaying the timeline's memory events, the same account the
// engine, the replay and `compare` keep.
//
//   gui::MemoryModel memory = gui::MemoryModel::build(timeline, /*source=*/0);
//   for (const gui::PoolSeries& pool : memory.pools()) {
//     draw_steps(pool.steps);                 // (time, bytes) corners of the step curve
//     draw_capacity(pool.capacity_bytes);     // peak at (pool.peak_time_ns, pool.peak_bytes)
//   }
//   gui::LiveSet live = memory.live_at(timeline, 0, clicked_ns);  // from the memory events
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sim/trace/memory_ledger.h"
#include "sim/trace/timeline.h"

namespace offsim::gui {

struct StepPoint {
  std::int64_t time_ns = 0;
  std::int64_t bytes = 0;
  bool operator==(const StepPoint&) const = default;
};

struct PoolSeries {
  std::string name;  // "rank0.hbm"
  int source = 0;    // which loaded timeline
  int rank = -1;     // from a "rank<N>." prefix; -1 for host pools
  std::int64_t capacity_bytes = 0;
  std::int64_t peak_bytes = 0;
  std::int64_t peak_time_ns = 0;
  // Corners of the step curve: each change at time t adds (t, old) then (t, new); samples at the
  // same time collapse to the last one. Starts at (first sample time, 0); the last value is held
  // to the timeline's makespan (a final corner there when the last change is earlier).
  std::vector<StepPoint> steps;
};

struct LiveEntry {
  std::string name;  // tensor name
  sim::TensorCategory category = sim::TensorCategory::kNone;
  std::int64_t bytes = 0;
  bool operator==(const LiveEntry&) const = default;
};

struct LiveSet {
  std::int64_t time_ns = 0;
  std::int64_t bytes_in_use = 0;
  // true: the tensors live then (from the timeline's memory events, or its recorded live set at
  // the peak). false: the timeline has neither for this time (entries empty).
  bool exact = false;
  std::vector<LiveEntry> entries;  // largest first
};

class MemoryModel {
 public:
  MemoryModel() = default;
  static MemoryModel build(const sim::Timeline& timeline, int source);

  const std::vector<PoolSeries>& pools() const { return pools_; }

  // Bytes in use in pool `pool` at `t_ns` (the last sample at or before it; 0 before the first).
  std::int64_t bytes_at(std::size_t pool, std::int64_t t_ns) const;

  // The live set of `pool` at `t_ns` (after every memory event at or before it), replayed by the
  // memory ledger from the timeline's memory events. A timeline without memory events (recorded
  // without them, or imported) has only its recorded live set at the peak: that one from the
  // peak sample until the next change, none elsewhere. `timeline` is the one the model was built
  // from (it supplies the tensor names).
  LiveSet live_at(const sim::Timeline& timeline, std::size_t pool, std::int64_t t_ns) const;

  // Whether the live set is known at every time (the timeline carries memory events).
  bool has_memory_events() const { return ledger_.has_value(); }

 private:
  struct PoolData {
    std::vector<sim::MemorySample> samples;  // collapsed: one per distinct time
    std::vector<sim::LiveTensor> live_at_peak;
  };
  std::vector<PoolSeries> pools_;
  std::vector<PoolData> data_;
  std::optional<sim::MemoryLedger> ledger_;  // with the timeline's memory events
};

// Reduces a step curve to what a `width_px` wide plot of `window` can show: per pixel column the
// first, minimum, maximum and last values, so peaks survive. Keeps the points just outside the
// window so the curve reaches the edges.
std::vector<StepPoint> decimate_steps(const std::vector<StepPoint>& steps, std::int64_t start_ns,
                                      std::int64_t end_ns, double width_px);

}  // namespace offsim::gui
