// MemoryModel: bytes in use over time per pool as step curves, the capacity and peak, and the
// live set at any time, shaped for the GUI's memory view.
//
//   gui::MemoryModel memory = gui::MemoryModel::build(timeline, /*source=*/0);
//   for (const gui::PoolSeries& pool : memory.pools()) {
//     draw_steps(pool.steps);                 // (time, bytes) corners of the step curve
//     draw_capacity(pool.capacity_bytes);     // peak at (pool.peak_time_ns, pool.peak_bytes)
//   }
//   gui::LiveSet live = memory.live_at(timeline, 0, clicked_ns);  // exact at the peak
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
  std::string name;      // tensor name, or the op that allocated it when inferred
  std::string category;  // "params", "activations", ... or the op's category when inferred
  std::int64_t bytes = 0;
  bool operator==(const LiveEntry&) const = default;
};

struct LiveSet {
  std::int64_t time_ns = 0;
  std::int64_t bytes_in_use = 0;
  // true: the timeline's recorded live set at the peak. false: reconstructed from the memory
  // samples, naming each increase after the op(s) that started then (see live_at).
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

  // The live set of `pool` at `t_ns`. At the peak (any time from the peak sample until the next
  // change) this is the timeline's recorded live set. Elsewhere it is inferred: every increase is
  // an allocation named after the op(s) that started at that instant on the pool's rank (any lane
  // for host pools); every decrease frees the most recent allocation of exactly that size, or
  // else takes bytes back from the most recent allocations first.
  // `timeline` is the one the model was built from (it supplies op names).
  LiveSet live_at(const sim::Timeline& timeline, std::size_t pool, std::int64_t t_ns) const;

 private:
  struct PoolData {
    std::vector<sim::MemorySample> samples;  // collapsed: one per distinct time
    std::vector<sim::LiveTensor> live_at_peak;
  };
  std::vector<PoolSeries> pools_;
  std::vector<PoolData> data_;
  // Span indices sorted by start, for naming allocations.
  std::vector<std::uint32_t> by_start_;
  std::vector<std::int64_t> start_ns_;
  std::vector<int> lane_rank_;  // by lane id
};

// Reduces a step curve to what a `width_px` wide plot of `window` can show: per pixel column the
// first, minimum, maximum and last values, so peaks survive. Keeps the points just outside the
// window so the curve reaches the edges.
std::vector<StepPoint> decimate_steps(const std::vector<StepPoint>& steps, std::int64_t start_ns,
                                      std::int64_t end_ns, double width_px);

}  // namespace offsim::gui
