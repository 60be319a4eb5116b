// Timeline: what happened when a Plan ran — spans per op, memory samples per pool and, when
// recorded, every memory event (alloc or free) in the order it was applied.
//
// The simulator (sim/engine) and the replay (backends/) both produce this type, so `compare`
// joins a predicted and a measured timeline on op id. A Timeline stands alone: it carries the op
// names, kinds and sizes it needs for reports and the GUI, without the Plan.
//
//   const sim::Timeline& t = result.timeline;
//   for (const sim::Span& s : t.spans) fmt::print("{} {}\n", t.ops[s.op.index()].name,
//                                                 sim::to_seconds(s.end - s.start));
//   if (t.outcome.kind == sim::OutcomeKind::kOutOfMemory) { ... t.outcome.oom->live ... }
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sim/core/ids.h"
#include "sim/core/time.h"
#include "sim/plan/plan.h"

namespace offsim::sim {

struct Span {
  OpId op;
  LaneId lane;
  TimePoint start;  // the op became runnable and began its latency term
  TimePoint end;
  bool operator==(const Span&) const = default;
};

// What a Timeline keeps of each op of its Plan.
struct OpInfo {
  std::string name;
  OpKind kind = OpKind::kMarker;
  OpCategory category = OpCategory::kNone;
  int layer = -1;
  double flops = 0.0;
  std::int64_t bytes = 0;
  std::vector<OpId> deps;  // the plan's dependencies: ops that had to end before this one
  bool operator==(const OpInfo&) const = default;
};

struct MemorySample {
  TimePoint time;
  std::int64_t bytes_in_use = 0;
  bool operator==(const MemorySample&) const = default;
};

struct LiveTensor {
  std::string name;
  TensorCategory category = TensorCategory::kNone;
  std::int64_t bytes = 0;
  bool operator==(const LiveTensor&) const = default;
};

// What a Timeline keeps of each tensor of its Plan, so that memory events name what was live.
struct TensorInfo {
  std::string name;
  TensorCategory category = TensorCategory::kNone;
  std::int64_t bytes = 0;
  PoolId pool;
  bool operator==(const TensorInfo&) const = default;
};

// One change of a pool's bytes in use: a tensor allocated (+bytes) or freed (-bytes). Events
// are kept in the order they were applied (time-ordered; at one instant, in the order the
// engine or the device applied them), so replaying them gives every pool's usage, peak and live
// set (sim/trace/memory_ledger.h).
struct MemoryEvent {
  TimePoint time;
  TensorId tensor;
  std::int64_t delta_bytes = 0;  // +bytes for an alloc, -bytes for a free
  PoolId pool;
  bool operator==(const MemoryEvent&) const = default;
};

struct PoolTrace {
  std::string name;  // for display
  PoolKind kind = PoolKind::kOther;
  int owner = -1;  // the rank of an HBM pool, the node of a host pool
  std::int64_t capacity_bytes = 0;
  std::vector<MemorySample> samples;  // one per change, time-ordered; the last at a time wins
  std::int64_t peak_bytes = 0;
  TimePoint peak_time;
  std::vector<LiveTensor> live_at_peak;  // largest first
  bool operator==(const PoolTrace&) const = default;
};

enum class OutcomeKind { kCompleted, kOutOfMemory, kDeadlock, kLimitExceeded };
const char* to_string(OutcomeKind kind);

struct OutOfMemory {
  OpId op;  // the op whose alloc did not fit
  std::string op_name;
  std::string pool;
  TimePoint time;
  std::int64_t requested_bytes = 0;
  std::int64_t in_use_bytes = 0;
  std::int64_t capacity_bytes = 0;
  std::vector<LiveTensor> live;           // largest first
  PoolKind pool_kind = PoolKind::kOther;  // what memory ran out (the pool's typed kind)
  PoolId pool_id;                         // the pool, by id (Timeline::pools)
  bool operator==(const OutOfMemory&) const = default;
};

struct Deadlock {
  TimePoint time;
  std::vector<std::string> stuck_ops;  // the head op of each blocked lane, with what it waits on
  bool operator==(const Deadlock&) const = default;
};

struct Outcome {
  OutcomeKind kind = OutcomeKind::kCompleted;
  std::optional<OutOfMemory> oom;
  std::optional<Deadlock> deadlock;
  // With SimOptions::run_past_capacity: the first failing allocation of each pool that went
  // over its capacity, in the order they happened (the pool's PoolTrace::peak_bytes is then
  // its demand: what the step needs there).
  std::vector<OutOfMemory> over_capacity;
  std::string message;  // one line for humans
  bool operator==(const Outcome&) const = default;
};

struct Timeline {
  std::string source = "predicted";  // "predicted" or "measured"
  std::vector<std::string> lanes;    // by LaneId, for display
  // By LaneId: rank, stage and role of each lane (empty for files written before lanes had one).
  std::vector<LaneIdentity> lane_identity;
  std::vector<OpInfo> ops;       // by OpId
  std::vector<Span> spans;       // at most one per op, in order of end time then op id
  std::vector<PoolTrace> pools;  // by PoolId
  // By TensorId, and the memory events in applied order; both empty when memory events were not
  // recorded (SimOptions::record_memory off, or a file written before timelines had them).
  std::vector<TensorInfo> tensors;
  std::vector<MemoryEvent> memory_events;
  TimePoint makespan;  // end of the last span
  Outcome outcome;
  std::vector<std::pair<std::string, std::string>> metadata;
  bool operator==(const Timeline&) const = default;
};

// Copies op names, kinds, sizes and deps, lanes with their identity, and pools with their kind and
// owner from a plan into an empty timeline (without the ops' infos when !with_op_infos).
Timeline timeline_skeleton(const Plan& plan, bool with_op_infos = true);

// Name, category, bytes and pool of each of the plan's tensors (Timeline::tensors), by TensorId.
std::vector<TensorInfo> tensor_infos(const Plan& plan);

}  // namespace offsim::sim
