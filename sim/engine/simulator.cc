#include "sim/engine/simulator.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "sim/core/check.h"
#include "sim/core/huge_page_allocator.h"
#include "sim/engine/engine_probe.h"
#include "sim/engine/flow_solver.h"
#include "sim/trace/memory_ledger.h"

namespace offsim::sim {

namespace {

// The engine's arrays of one or two entries per op, in huge pages (huge_page_allocator.h).
template <class T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

constexpr std::uint32_t kNone = TaggedId<void>::kInvalidValue;
constexpr std::int64_t kNeverNs = std::numeric_limits<std::int64_t>::max();
// Durations saturate here so that `now + duration` never overflows.
constexpr double kMaxDurationNs = 4.0e18;
// How often (in events) the cancel flag is polled.
constexpr std::int64_t kCancelPollEvents = 4096;

// Nanoseconds to deliver `work` at `rate`, rounded up so that a flow never ends before its work
// is done. Floating-point noise (relative 1e-12) is not rounded up into an extra nanosecond:
// 1e9 bytes at 12.5e9 bytes/s is 80,000,000 ns, not 80,000,001.
std::int64_t flow_duration_ns(double work, double rate) {
  if (!(work > 0.0) || rate == kNoBound) return 0;
  const double ns = work * 1e9 / rate;
  if (!(ns < kMaxDurationNs)) return static_cast<std::int64_t>(kMaxDurationNs);
  const double nearest = std::nearbyint(ns);
  if (std::fabs(ns - nearest) <= 1e-12 * nearest + 1e-6) return static_cast<std::int64_t>(nearest);
  return static_cast<std::int64_t>(std::ceil(ns));
}

std::string format_ms(std::int64_t ns) {
  return fmt::format("{:.3f} ms", static_cast<double>(ns) * 1e-6);
}

bool finite_nonneg(double x) { return std::isfinite(x) && x >= 0.0; }

// The checks the engine needs to run safely when validate() is skipped (ids in range, sane
// numbers); cycles are not checked, so such runs can deadlock.
Status check_runnable(const Plan& plan) {
  for (std::size_t r = 0; r < plan.resources.size(); ++r) {
    const double c = plan.resources[r].capacity;
    if (!(std::isfinite(c) && c > 0.0)) {
      return fail(ErrorCode::kInvalidInput, "resources[{}] '{}': capacity {} is not positive", r,
                  plan.resources[r].name, c);
    }
  }
  for (std::size_t t = 0; t < plan.tensors.size(); ++t) {
    if (plan.tensors[t].pool.index() >= plan.pools.size()) {
      return fail(ErrorCode::kInvalidInput, "tensors[{}] '{}': unknown pool id {}", t,
                  plan.tensors[t].name, plan.tensors[t].pool.value());
    }
  }
  for (TensorId t : plan.initial_tensors) {
    if (t.index() >= plan.tensors.size()) {
      return fail(ErrorCode::kInvalidInput, "initial_tensors: unknown tensor id {}", t.value());
    }
  }
  if (plan.tensors.size() >= (std::size_t{1} << 31)) {
    return fail(ErrorCode::kLimitExceeded, "plan has {} tensors; at most 2^31 are supported",
                plan.tensors.size());
  }
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    const Op& op = plan.ops[i];
    if (op.lane.index() >= plan.lanes.size()) {
      return fail(ErrorCode::kInvalidInput, "ops[{}] '{}': unknown lane id {}", i, op.name,
                  op.lane.value());
    }
    for (OpId d : op.deps) {
      if (d.index() >= plan.ops.size()) {
        return fail(ErrorCode::kInvalidInput, "ops[{}] '{}': unknown dependency op id {}", i,
                    op.name, d.value());
      }
    }
    const OpCost& c = op.cost;
    if (!finite_nonneg(c.work) || !(c.max_rate > 0.0) || c.latency.count() < 0 ||
        c.multiplicity < 1) {
      return fail(ErrorCode::kInvalidInput,
                  "ops[{}] '{}': cost needs finite work >= 0, max_rate > 0, latency >= 0 and "
                  "multiplicity >= 1",
                  i, op.name);
    }
    for (const ResourceUse& u : c.uses) {
      if (u.resource.index() >= plan.resources.size() || !finite_nonneg(u.per_unit)) {
        return fail(ErrorCode::kInvalidInput,
                    "ops[{}] '{}': resource use needs a known resource and a finite per_unit >= 0",
                    i, op.name);
      }
    }
    for (const auto* list : {&op.allocs, &op.frees}) {
      for (TensorId t : *list) {
        if (t.index() >= plan.tensors.size()) {
          return fail(ErrorCode::kInvalidInput, "ops[{}] '{}': unknown tensor id {}", i, op.name,
                      t.value());
        }
      }
    }
  }
  return ok();
}

enum class Phase : std::uint8_t { kWaiting, kLatency, kFlowing, kDone };
enum class EventKind : std::uint8_t { kOpTimer, kGroup };

struct Event {
  std::int64_t time;
  std::uint64_t seq;
  std::uint32_t index;  // op (kOpTimer) or group (kGroup)
  std::uint32_t generation;
  EventKind kind;
};

// Min-heap order on (time, seq): ties go to the event scheduled first.
struct EventLater {
  bool operator()(const Event& a, const Event& b) const {
    return a.time > b.time || (a.time == b.time && a.seq > b.seq);
  }
};

struct OpState {
  double work;
  double max_rate;
  std::int64_t latency_ns;
  std::int64_t start_ns;
  std::int64_t end_ns;
  std::uint32_t lane;
  std::uint32_t pending_deps;
  std::uint32_t use_begin;  // the op's resource uses: Engine::uses_[use_begin, next op's)
  std::int32_t multiplicity;
  Phase phase;
  bool uses_resources;  // some use has a positive per_unit
  bool has_allocs;
  bool has_frees;
};

// A flow in the solver, and how far it got.
struct FlowState {
  std::uint32_t op = kNone;      // kNone once the op ended (the slot may still be taken over)
  std::uint32_t sig_op = kNone;  // the op whose bound, multiplicity and uses the solver holds
  std::uint32_t group = kNone;
  double remaining = 0.0;  // work units
  double rate = 0.0;       // work units per second, as of last_ns
  std::int64_t last_ns = 0;
  std::int64_t completion_ns = kNeverNs;
};

// The flows of one solved component. Its single event fires at the earliest completion among
// them; any later solve touching one of them re-solves all of them and supersedes the group.
struct Group {
  std::vector<std::uint32_t> members;
  std::uint32_t generation = 0;
  std::uint32_t live = 0;  // members still attached
};

// Bytes in use, peaks and live sets are the MemoryLedger's (sim/trace/memory_ledger.h).
struct PoolState {
  std::int64_t capacity = 0;
  bool over_capacity = false;  // an alloc went past capacity (run_past_capacity)
};

// The words that open a snapshot's parts (a lane's carries its index in the low bits).
constexpr std::uint64_t kLaneMark = 0xA1A1000000000000u;
constexpr std::uint64_t kFlowsMark = 0xA2A2000000000000u;
constexpr std::uint64_t kGroupsMark = 0xA3A3000000000000u;
constexpr std::uint64_t kEventsMark = 0xA4A4000000000000u;
constexpr std::uint64_t kMemoryMark = 0xA5A5000000000000u;

// Writes a snapshot's words (Engine::take_snapshot): ids relative to the boundary's segment or
// period, and the quiet/window facts gathered while writing the lanes.
class SnapshotWriter {
 public:
  using Segment = detail::PeriodProbe::Segment;

  SnapshotWriter(const detail::PeriodProbe& probe, const detail::PeriodProbe::Boundary& boundary,
                 std::int64_t now, std::size_t groups, std::vector<std::uint64_t>& state)
      : b(boundary),
        out(state),
        group_name(groups, kNone),
        segmented(!probe.segments.empty()),
        probe_(probe),
        segs_(probe.segments),
        now_(now) {
    out.clear();
    if (segmented) index_tensor_segments();
  }

  const detail::PeriodProbe::Boundary& b;
  std::vector<std::uint64_t>& out;
  // Group ids are names only (which free slot a new group takes changes nothing else): they
  // are written in order of first use, so equal states with permuted group ids compare equal.
  std::vector<std::uint32_t> group_name;
  const bool segmented;
  bool quiet = true;
  std::int64_t lowest = std::numeric_limits<std::int64_t>::max();
  std::int64_t highest = std::numeric_limits<std::int64_t>::min();
  std::int64_t highest_over = std::numeric_limits<std::int64_t>::min();

  // A time relative to the snapshot's instant.
  std::uint64_t rel(std::int64_t ns) const { return static_cast<std::uint64_t>(ns - now_); }

  // Segments (see detail::PeriodProbe): which one holds an op.
  const Segment* seg_of_op(std::uint32_t x) const {
    auto it = std::upper_bound(segs_.begin(), segs_.end(), x,
                               [](std::uint32_t v, const Segment& g) { return v < g.op_begin; });
    if (it == segs_.begin()) return nullptr;
    --it;
    return x < it->op_end ? &*it : nullptr;
  }

  // Which segment holds a tensor.
  const Segment* seg_of_tensor(std::uint32_t t) const {
    auto it =
        std::upper_bound(by_tensor_.begin(), by_tensor_.end(), t,
                         [](std::uint32_t v, const Segment* g) { return v < g->tensor_begin; });
    if (it == by_tensor_.begin()) return nullptr;
    --it;
    return t < (*it)->tensor_end ? *it : nullptr;
  }

  // With segments: `x` is a lane's next op to end (head) or an op that started (ran).
  void window(std::uint32_t x, bool head, bool ran) {
    const Segment* g = seg_of_op(x);
    if (g == nullptr) {
      if (ran) quiet = false;
      return;
    }
    if (head) {
      lowest = std::min(lowest, g->index);
      if (g->index < b.min_index) quiet = false;
    }
    if (ran) {
      highest = std::max(highest, g->index);
      highest_over = std::max(highest_over, g->index - g->hi);
      if (g->index > b.max_index || g->index > g->hi) quiet = false;
    }
  }

  // An op's name: by segment and offset, by period offset, or as it is.
  void op_id(std::uint32_t x) {
    if (x == kNone) {
      out.push_back(2);
      out.push_back(0);
    } else if (segmented) {
      if (const Segment* g = seg_of_op(x)) {
        out.push_back(3);
        out.push_back(g->kind);
        out.push_back(static_cast<std::uint64_t>(g->index - b.index));
        out.push_back(x - g->op_begin);
      } else {
        out.push_back(0);
        out.push_back(x);
      }
    } else if (x >= probe_.op_lo && x < probe_.op_hi) {
      out.push_back(1);
      out.push_back(static_cast<std::uint64_t>(std::int64_t{x} - std::int64_t{b.first_op}));
    } else {
      out.push_back(0);
      out.push_back(x);
    }
  }

  // A live tensor's name, as op_id names ops.
  void tensor_id(std::uint32_t t) {
    if (segmented) {
      if (const Segment* g = seg_of_tensor(t)) {
        out.push_back(3);
        out.push_back(g->kind);
        out.push_back(static_cast<std::uint64_t>(g->index - b.index));
        out.push_back(t - g->tensor_begin);
      } else {
        out.push_back(0);
        out.push_back(t);
      }
    } else if (t >= probe_.tensor_lo && t < probe_.tensor_hi) {
      out.push_back(1);
      out.push_back(static_cast<std::uint64_t>(std::int64_t{t} - std::int64_t{b.first_tensor}));
    } else {
      out.push_back(0);
      out.push_back(t);
    }
  }

  // A group's name, given in order of first use.
  std::uint64_t group_id(std::uint32_t g) {
    if (g == kNone) return std::uint64_t{kNone};
    if (group_name[g] == kNone) group_name[g] = groups_named_++;
    return std::uint64_t{group_name[g]};
  }

 private:
  // Sorts the segments that hold tensors by their first tensor.
  void index_tensor_segments() {
    for (const Segment& g : segs_) {
      if (g.tensor_end > g.tensor_begin) by_tensor_.push_back(&g);
    }
    std::sort(by_tensor_.begin(), by_tensor_.end(),
              [](const Segment* a, const Segment* c) { return a->tensor_begin < c->tensor_begin; });
  }

  const detail::PeriodProbe& probe_;
  const std::vector<Segment>& segs_;
  std::int64_t now_;
  std::vector<const Segment*> by_tensor_;  // segments with tensors, by tensor_begin
  std::uint32_t groups_named_ = 0;
};

class Engine {
 public:
  Engine(const Plan& plan, const SimOptions& options, detail::EngineProbe* probe,
         detail::PeriodProbe* periods = nullptr)
      : plan_(plan), options_(options), probe_(probe), periods_(periods) {}

  Result<SimResult> run();

 private:
  void setup();
  void seed();
  void run_instant();
  void poll_cancel(std::int64_t& next_poll);
  void sort_spans();
  void fill_outcome(Timeline& t);
  void push_event(std::int64_t time, EventKind kind, std::uint32_t index, std::uint32_t gen) {
    heap_.push_back(Event{time, next_seq_++, index, gen, kind});
    std::push_heap(heap_.begin(), heap_.end(), EventLater{});
  }
  void start_op(std::uint32_t op);
  void begin_flow(std::uint32_t op);
  void end_op(std::uint32_t op);
  void handle_event(const Event& e);
  void apply_solve();
  bool same_flow(std::uint32_t a, std::uint32_t b) const;
  void remove_released();
  std::span<const ResourceUse> uses_of(std::uint32_t op) const {
    const std::uint32_t end = op + 1 < ops_.size() ? ops_[op + 1].use_begin : op_use_end_;
    return {uses_.data() + ops_[op].use_begin, end - ops_[op].use_begin};
  }
  std::uint32_t new_group();
  void release_group(std::uint32_t group);
  bool alloc_tensor(TensorId tensor, std::uint32_t op);
  void free_tensor(TensorId tensor, std::uint32_t op);
  std::vector<LiveTensor> live_tensors(std::uint32_t pool) const;
  void fill_memory(Timeline& timeline);
  void describe_deadlock(Timeline& timeline) const;
  void take_snapshot(std::size_t boundary);
  bool keep_running_after_snapshot();
  void snapshot_lane(SnapshotWriter& w, std::uint32_t lane) const;
  bool timed_lane(std::uint32_t lane) const;
  void snapshot_flows(SnapshotWriter& w) const;
  void snapshot_groups(SnapshotWriter& w) const;
  void snapshot_events(SnapshotWriter& w) const;
  void snapshot_memory(SnapshotWriter& w) const;
  bool is_lane_head(std::uint32_t op) const {
    const std::uint32_t lane = ops_[op].lane;
    const std::uint32_t pos = lane_offsets_[lane] + lane_head_[lane];
    return pos < lane_offsets_[lane + 1] && lane_ops_[pos] == op;
  }
  void make_ready(std::uint32_t op) { ready_.push_back(op); }
  void stop_with_error(Error error) {
    if (!stopped_) error_ = std::move(error);
    stopped_ = true;
  }

  const Plan& plan_;
  const SimOptions& options_;
  detail::EngineProbe* probe_;
  detail::PeriodProbe* periods_;
  std::size_t next_boundary_ = 0;
  bool snapshot_due_ = false;

  HugePageVector<OpState> ops_;
  HugePageVector<ResourceUse> uses_;  // all ops' resource uses, flat, in op order
  std::uint32_t op_use_end_ = 0;
  HugePageVector<std::uint32_t> dependent_offsets_;  // CSR: ops waiting on op i
  HugePageVector<std::uint32_t> dependents_;
  std::vector<std::uint32_t> lane_offsets_;  // CSR: ops of lane l in issue order
  HugePageVector<std::uint32_t> lane_ops_;
  std::vector<std::uint32_t> lane_head_;  // position of the lane's next op to end

  std::vector<Event> heap_;
  std::uint64_t next_seq_ = 0;
  std::vector<std::uint32_t> ready_;
  std::size_t ready_next_ = 0;

  FlowSolver solver_;
  std::vector<FlowState> flows_;  // by FlowId slot
  std::vector<Group> groups_;
  std::vector<std::uint32_t> free_groups_;
  std::vector<std::uint32_t> ending_;    // scratch
  std::vector<std::uint32_t> released_;  // slots of flows that ended in this instant

  std::vector<PoolState> pools_;
  std::vector<std::uint8_t> live_;  // by tensor
  MemoryLedger ledger_;             // every alloc and free, in simulation order
  std::vector<Span> spans_;

  std::int64_t now_ = 0;
  std::int64_t makespan_ = 0;
  std::int64_t last_progress_ns_ = 0;  // last time an op started or ended (stale events skip it)
  std::int64_t ended_ = 0;
  std::int64_t events_ = 0;
  bool stopped_ = false;
  std::optional<Error> error_;
  std::optional<OutOfMemory> oom_;
  std::vector<OutOfMemory> over_capacity_;  // first failure per pool, run_past_capacity
};

void Engine::setup() {
  const std::size_t n = plan_.ops.size();
  ops_.resize(n);
  uses_.clear();
  uses_.reserve(2 * n);  // typical: a kernel uses SM and HBM, a copy a route of a few links
  std::vector<std::uint32_t> lane_count(plan_.lanes.size() + 1, 0);
  HugePageVector<std::uint32_t> dependent_count(n + 1, 0);
  HugePageVector<std::pair<std::uint32_t, std::uint32_t>> edges;  // (dep, op)
  edges.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Op& op = plan_.ops[i];
    OpState& s = ops_[i];
    s.work = op.cost.work;
    s.max_rate = op.cost.max_rate;
    s.latency_ns = op.cost.latency.count();
    s.start_ns = 0;
    s.end_ns = 0;
    s.lane = op.lane.value();
    s.pending_deps = static_cast<std::uint32_t>(op.deps.size());
    s.phase = Phase::kWaiting;
    s.uses_resources = false;
    s.use_begin = static_cast<std::uint32_t>(uses_.size());
    for (const ResourceUse& u : op.cost.uses) {
      s.uses_resources |= u.per_unit > 0.0;
      uses_.push_back(u);
    }
    s.multiplicity = op.cost.multiplicity;
    s.has_allocs = !op.allocs.empty();
    s.has_frees = !op.frees.empty();
    ++lane_count[s.lane];
    for (OpId d : op.deps) {
      ++dependent_count[d.index()];
      edges.emplace_back(d.value(), static_cast<std::uint32_t>(i));
    }
  }
  auto prefix = [](auto& counts) {
    std::uint32_t sum = 0;
    for (std::uint32_t& c : counts) {
      const std::uint32_t c0 = c;
      c = sum;
      sum += c0;
    }
  };
  prefix(dependent_count);
  dependent_offsets_ = dependent_count;
  dependents_.resize(edges.size());
  for (const auto& [dep, op] : edges) dependents_[dependent_count[dep]++] = op;  // op order kept
  prefix(lane_count);
  lane_offsets_ = lane_count;
  lane_ops_.resize(n);
  for (std::size_t i = 0; i < n; ++i)
    lane_ops_[lane_count[ops_[i].lane]++] = static_cast<std::uint32_t>(i);
  lane_head_.assign(plan_.lanes.size(), 0);

  op_use_end_ = static_cast<std::uint32_t>(uses_.size());
  pools_.resize(plan_.pools.size());
  for (std::size_t p = 0; p < pools_.size(); ++p)
    pools_[p].capacity = plan_.pools[p].capacity_bytes;
  live_.assign(plan_.tensors.size(), 0);
  ledger_ = MemoryLedger(plan_.pools.size(), {.record_samples = options_.record_memory,
                                              .record_events = options_.record_memory});

  std::vector<double> capacities(plan_.resources.size());
  for (std::size_t r = 0; r < capacities.size(); ++r) capacities[r] = plan_.resources[r].capacity;
  solver_ = FlowSolver(capacities);
  heap_.reserve(256);
  ready_.reserve(256);
  if (options_.record_spans) spans_.reserve(n);
}

// The live set of a pool now (for an out-of-memory report).
std::vector<LiveTensor> Engine::live_tensors(std::uint32_t pool) const {
  return describe_live(plan_.tensors, ledger_.live_after(PoolId{pool}, ledger_.event_count()));
}

bool Engine::alloc_tensor(TensorId tensor, std::uint32_t op) {
  const Tensor& t = plan_.tensors[tensor.index()];
  auto who = [&] {
    return op == kNone ? std::string("initial_tensors") : plan_.ops[op].name.str();
  };
  if (live_[tensor.index()]) {
    stop_with_error(Error{ErrorCode::kInvalidInput,
                          fmt::format("op '{}' allocates tensor '{}', which is already live at {} "
                                      "(double alloc; validate the plan)",
                                      who(), t.name, format_ms(now_))});
    return false;
  }
  const std::uint32_t pool = t.pool.value();
  PoolState& p = pools_[pool];
  const std::int64_t in_use = ledger_.in_use(t.pool);
  if (t.bytes > p.capacity - in_use && !p.over_capacity) {
    OutOfMemory oom;
    oom.op = op == kNone ? OpId{} : OpId{op};
    oom.op_name = who();
    oom.pool = plan_.pools[pool].name;
    oom.pool_kind = plan_.pools[pool].kind;
    oom.pool_id = PoolId{pool};
    oom.time = TimePoint{Duration{now_}};
    oom.requested_bytes = t.bytes;
    oom.in_use_bytes = in_use;
    oom.capacity_bytes = p.capacity;
    oom.live = live_tensors(pool);
    if (options_.run_past_capacity) {
      // Later allocs in this pool are not failures of their own: it is unbounded from here.
      p.over_capacity = true;
      if (!oom_) oom_ = oom;
      over_capacity_.push_back(std::move(oom));
    } else {
      oom_ = std::move(oom);
      stopped_ = true;
      return false;
    }
  }
  live_[tensor.index()] = 1;
  ledger_.alloc(TimePoint{Duration{now_}}, tensor, t.pool, t.bytes);
  return true;
}

void Engine::free_tensor(TensorId tensor, std::uint32_t op) {
  const Tensor& t = plan_.tensors[tensor.index()];
  if (!live_[tensor.index()]) {
    stop_with_error(Error{ErrorCode::kInvalidInput,
                          fmt::format("op '{}' frees tensor '{}', which is not live at {} "
                                      "(validate the plan)",
                                      plan_.ops[op].name, t.name, format_ms(now_))});
    return;
  }
  live_[tensor.index()] = 0;
  ledger_.free(TimePoint{Duration{now_}}, tensor, t.pool, t.bytes);
}

void Engine::start_op(std::uint32_t op) {
  OpState& s = ops_[op];
  s.phase = Phase::kLatency;
  s.start_ns = now_;
  last_progress_ns_ = now_;
  if (periods_ != nullptr && next_boundary_ < periods_->boundaries.size() &&
      periods_->boundaries[next_boundary_].first_op == op) {
    snapshot_due_ = true;
  }
  // The lane's next op is read when this one ends; ops of a lane are far apart in memory.
  const std::uint32_t after = lane_offsets_[s.lane] + lane_head_[s.lane] + 1;
  if (after < lane_offsets_[s.lane + 1]) __builtin_prefetch(&ops_[lane_ops_[after]]);
  if (s.has_allocs) {
    for (TensorId t : plan_.ops[op].allocs) {
      if (!alloc_tensor(t, op)) return;
    }
  }
  if (s.latency_ns > 0) {
    push_event(now_ + s.latency_ns, EventKind::kOpTimer, op, 0);
  } else {
    begin_flow(op);
  }
}

void Engine::begin_flow(std::uint32_t op) {
  OpState& s = ops_[op];
  s.phase = Phase::kFlowing;
  if (!(s.work > 0.0)) {
    end_op(op);
    return;
  }
  if (!s.uses_resources) {  // only the bound limits it: a fixed duration
    if (probe_) probe_->on_rate(TimePoint{Duration{now_}}, OpId{op}, s.max_rate);
    const std::int64_t d = flow_duration_ns(s.work, s.max_rate);
    if (d == 0) {
      if (probe_) probe_->on_flow_end(TimePoint{Duration{now_}}, OpId{op});
      end_op(op);
    } else {
      push_event(now_ + d, EventKind::kOpTimer, op, 0);
    }
    return;
  }
  // A flow that ended in this instant with the same bound, multiplicity and uses leaves the
  // sharing problem unchanged when this one takes its place: every rate stays as solved.
  for (std::size_t i = 0; i < released_.size(); ++i) {
    const std::uint32_t slot = released_[i];
    FlowState& fs = flows_[slot];
    if (!same_flow(fs.sig_op, op)) continue;
    released_[i] = released_.back();
    released_.pop_back();
    fs.op = op;
    fs.sig_op = op;  // same shape; the newest op's data is the likeliest to be in cache
    fs.remaining = s.work;
    fs.last_ns = now_;
    fs.completion_ns = now_ + flow_duration_ns(s.work, fs.rate);
    push_event(fs.completion_ns, EventKind::kGroup, fs.group, groups_[fs.group].generation);
    if (probe_) probe_->on_rate(TimePoint{Duration{now_}}, OpId{op}, fs.rate);
    return;
  }
  const FlowId f = solver_.add_flow(s.max_rate, s.multiplicity, uses_of(op));
  if (f.index() >= flows_.size()) flows_.resize(f.index() + 1);
  FlowState& fs = flows_[f.index()];
  fs.op = op;
  fs.sig_op = op;
  fs.group = kNone;
  fs.remaining = s.work;
  fs.rate = 0.0;
  fs.last_ns = now_;
  fs.completion_ns = kNeverNs;
}

void Engine::end_op(std::uint32_t op) {
  OpState& s = ops_[op];
  s.phase = Phase::kDone;
  s.end_ns = now_;
  ++ended_;
  if (options_.record_spans) {
    spans_.push_back(
        Span{OpId{op}, LaneId{s.lane}, TimePoint{Duration{s.start_ns}}, TimePoint{Duration{now_}}});
  }
  makespan_ = std::max(makespan_, now_);
  last_progress_ns_ = now_;
  if (s.has_frees) {
    for (TensorId t : plan_.ops[op].frees) {
      free_tensor(t, op);
      if (stopped_) return;
    }
  }
  const std::uint32_t lane = s.lane;
  const std::uint32_t next = lane_offsets_[lane] + ++lane_head_[lane];
  if (next < lane_offsets_[lane + 1]) {
    const OpState& n = ops_[lane_ops_[next]];
    __builtin_prefetch(uses_.data() + n.use_begin);
    if (n.pending_deps == 0) make_ready(lane_ops_[next]);
  }
  for (std::uint32_t i = dependent_offsets_[op]; i < dependent_offsets_[op + 1]; ++i) {
    const std::uint32_t d = dependents_[i];
    if (--ops_[d].pending_deps == 0 && is_lane_head(d)) make_ready(d);
  }
}

std::uint32_t Engine::new_group() {
  std::uint32_t g;
  if (!free_groups_.empty()) {
    g = free_groups_.back();
    free_groups_.pop_back();
  } else {
    g = static_cast<std::uint32_t>(groups_.size());
    groups_.emplace_back();
  }
  return g;
}

void Engine::release_group(std::uint32_t group) {
  Group& g = groups_[group];
  if (--g.live == 0) {
    ++g.generation;  // its pending event, if any, is now stale
    free_groups_.push_back(group);
  }
}

void Engine::handle_event(const Event& e) {
  if (e.kind == EventKind::kOpTimer) {
    const std::uint32_t op = e.index;
    if (ops_[op].phase == Phase::kLatency) {
      begin_flow(op);
    } else {
      if (probe_) probe_->on_flow_end(TimePoint{Duration{now_}}, OpId{op});
      end_op(op);
    }
    return;
  }
  const Group& g = groups_[e.index];
  if (g.generation != e.generation) return;  // superseded by a later solve
  const std::uint32_t generation = g.generation;
  ending_.clear();
  std::int64_t next = kNeverNs;
  for (std::uint32_t f : g.members) {
    const FlowState& fs = flows_[f];
    if (fs.group != e.index || fs.op == kNone) continue;
    if (fs.completion_ns == now_) {
      ending_.push_back(f);
    } else {
      next = std::min(next, fs.completion_ns);
    }
  }
  // Unless a solve supersedes the group, its next completion needs an event of its own.
  if (next != kNeverNs) push_event(next, EventKind::kGroup, e.index, generation);
  for (std::uint32_t f : ending_) {
    FlowState& fs = flows_[f];
    const std::uint32_t op = fs.op;
    fs.op = kNone;
    released_.push_back(f);  // removed from the solver at the end of the instant
    if (probe_) probe_->on_flow_end(TimePoint{Duration{now_}}, OpId{op});
    end_op(op);
    if (stopped_) return;
  }
}

bool Engine::same_flow(std::uint32_t a, std::uint32_t b) const {
  const OpState& x = ops_[a];
  const OpState& y = ops_[b];
  if (x.max_rate != y.max_rate || x.multiplicity != y.multiplicity) return false;
  const std::span<const ResourceUse> ux = uses_of(a);
  const std::span<const ResourceUse> uy = uses_of(b);
  return std::equal(ux.begin(), ux.end(), uy.begin(), uy.end());
}

void Engine::remove_released() {
  for (std::uint32_t f : released_) {
    FlowState& fs = flows_[f];
    solver_.remove_flow(FlowId{f});
    release_group(fs.group);
    fs.group = kNone;
  }
  released_.clear();
}

void Engine::apply_solve() {
  const FlowSolver::Components comps = solver_.solve();
  for (std::size_t c = 0; c < comps.size(); ++c) {
    const std::span<const FlowId> members = comps.component(c);
    const std::uint32_t g = new_group();
    Group& group = groups_[g];
    group.members.clear();
    group.live = static_cast<std::uint32_t>(members.size());
    std::int64_t earliest = kNeverNs;
    for (FlowId id : members) {
      const std::uint32_t f = id.value();
      group.members.push_back(f);
      FlowState& fs = flows_[f];
      if (fs.group != kNone) release_group(fs.group);
      fs.group = g;
      const double rate = solver_.rate(id);
      if (rate != fs.rate) {
        if (fs.rate > 0.0) {
          const double done = fs.rate * static_cast<double>(now_ - fs.last_ns) * 1e-9;
          fs.remaining = std::max(0.0, fs.remaining - done);
        }
        fs.rate = rate;
        fs.last_ns = now_;
        fs.completion_ns = now_ + flow_duration_ns(fs.remaining, rate);
        if (probe_) probe_->on_rate(TimePoint{Duration{now_}}, OpId{fs.op}, rate);
      }
      earliest = std::min(earliest, fs.completion_ns);
    }
    push_event(earliest, EventKind::kGroup, g, group.generation);
  }
}

// Each pool's peak, its time and live set, from the ledger; with record_memory, also the samples
// and the memory events, and the tensors they name.
void Engine::fill_memory(Timeline& timeline) {
  const std::vector<std::vector<TensorId>> at_peak = ledger_.live_at_peaks();
  for (std::size_t p = 0; p < pools_.size(); ++p) {
    PoolTrace& trace = timeline.pools[p];
    const PoolLedger& l = ledger_.pool(PoolId{p});
    trace.peak_bytes = l.peak_bytes;
    trace.peak_time = l.peak_time;
    trace.live_at_peak = describe_live(plan_.tensors, at_peak[p]);
    if (periods_ != nullptr) {
      for (TensorId t : at_peak[p]) periods_->live_at_peak[p].push_back(t.value());
    }
  }
  if (!options_.record_memory) return;
  for (std::size_t p = 0; p < pools_.size(); ++p) {
    timeline.pools[p].samples = ledger_.take_samples(PoolId{p});
  }
  timeline.memory_events = ledger_.take_events();
  timeline.tensors = tensor_infos(plan_);
}

void Engine::describe_deadlock(Timeline& timeline) const {
  Deadlock d;
  d.time = TimePoint{Duration{last_progress_ns_}};
  for (std::uint32_t lane = 0; lane < lane_head_.size(); ++lane) {
    const std::uint32_t pos = lane_offsets_[lane] + lane_head_[lane];
    if (pos >= lane_offsets_[lane + 1]) continue;
    const std::uint32_t head = lane_ops_[pos];
    std::string waits;
    for (OpId dep : plan_.ops[head].deps) {
      if (ops_[dep.index()].phase == Phase::kDone) continue;
      const Op& dop = plan_.ops[dep.index()];
      if (!waits.empty()) waits += ", ";
      waits += fmt::format("'{}' (lane '{}')", dop.name, plan_.lanes[dop.lane.index()].name);
    }
    d.stuck_ops.push_back(fmt::format("'{}' (lane '{}') waits on {}", plan_.ops[head].name,
                                      plan_.lanes[lane].name,
                                      waits.empty() ? std::string("nothing") : waits));
  }
  timeline.outcome.kind = OutcomeKind::kDeadlock;
  timeline.outcome.message =
      fmt::format("deadlock at {}: {} of {} ops ended, {} lane(s) blocked; {}",
                  format_ms(last_progress_ns_), ended_, plan_.ops.size(), d.stuck_ops.size(),
                  d.stuck_ops.empty() ? std::string() : d.stuck_ops.front());
  timeline.outcome.deadlock = std::move(d);
}

// The state at the end of an instant (nothing left to do at now_), written relative to the
// boundary: see detail::PeriodProbe. Everything the engine reads later is here; what it only
// records (spans, samples, peaks, counters) is not.
void Engine::take_snapshot(std::size_t boundary) {
  detail::PeriodProbe::Snapshot& snap = periods_->snapshots[boundary];
  snap.taken = true;
  snap.time_ns = now_;
  SnapshotWriter w(*periods_, periods_->boundaries[boundary], now_, groups_.size(), snap.state);
  w.out.push_back(w.rel(makespan_));
  w.out.push_back(ready_.size() - ready_next_);
  w.out.push_back(released_.size());
  for (std::uint32_t lane = 0; lane < lane_head_.size(); ++lane) snapshot_lane(w, lane);
  snapshot_flows(w);
  snapshot_groups(w);
  snapshot_events(w);
  if (!periods_->timing_only) snapshot_memory(w);
  snap.quiet = w.quiet;
  snap.lowest_index = w.lowest;
  snap.highest_index = w.highest;
  snap.highest_over = w.highest_over;
}

// After a snapshot: false (the run stopped) when it was the last boundary's and the probe's
// caller has no use for the rest of the run.
bool Engine::keep_running_after_snapshot() {
  if (next_boundary_ != periods_->boundaries.size() || !periods_->keep_running ||
      periods_->keep_running(*periods_)) {
    return true;
  }
  periods_->stopped = true;
  stop_with_error(Error{
      ErrorCode::kCancelled,
      fmt::format("simulation stopped after the last period boundary at {}", format_ms(now_))});
  return false;
}

// Whether a lane's last ended op's end is part of the snapshot (detail::PeriodProbe::timed_lanes).
bool Engine::timed_lane(std::uint32_t lane) const {
  const std::vector<LaneId>& timed = periods_->timed_lanes;
  return timed.empty() || std::find(timed.begin(), timed.end(), LaneId{lane}) != timed.end();
}

// One lane in the snapshot: its last ended op, its head, and its unstarted ops' finished deps.
void Engine::snapshot_lane(SnapshotWriter& w, std::uint32_t lane) const {
  const detail::PeriodProbe::Boundary& b = w.b;
  std::vector<std::uint64_t>& out = w.out;
  const std::uint32_t lo = lane_offsets_[lane];
  const std::uint32_t hi = lane_offsets_[lane + 1];
  const std::uint32_t pos = lo + lane_head_[lane];
  out.push_back(kLaneMark | lane);
  if (pos > lo) {
    const std::uint32_t prev = lane_ops_[pos - 1];
    if (w.segmented) {
      w.window(prev, false, true);
    } else if (prev >= b.next_first_op) {
      w.quiet = false;
    }
    if (timed_lane(lane)) out.push_back(w.rel(ops_[prev].end_ns));
  }
  if (pos >= hi) {
    w.op_id(kNone);
    return;
  }
  const std::uint32_t head = lane_ops_[pos];
  const OpState& h = ops_[head];
  if (w.segmented) {
    w.window(head, true, h.phase != Phase::kWaiting);
  } else {
    if (head < b.prev_first_op) w.quiet = false;
    if (h.phase != Phase::kWaiting && head >= b.next_first_op) w.quiet = false;
  }
  w.op_id(head);
  out.push_back(static_cast<std::uint64_t>(h.phase));
  if (h.phase == Phase::kWaiting) {
    out.push_back(h.pending_deps);
  } else if (timed_lane(lane)) {
    out.push_back(w.rel(h.start_ns));  // a running op's flow and timer are written with them
  }
  // Unstarted ops of the lane and the finished ops they wait on (not when those ended: see
  // detail::PeriodProbe).
  for (std::uint32_t i = pos; i < hi; ++i) {
    const std::uint32_t x = lane_ops_[i];
    for (OpId d : plan_.ops[x].deps) {
      const OpState& ds = ops_[d.index()];
      if (ds.phase != Phase::kDone) continue;
      w.op_id(x);
      w.op_id(d.value());
    }
  }
}

// Flows are written as the solver lists them, each named by its op: which slot a flow took
// depends on history but changes nothing (see FlowSolver::append_state).
void Engine::snapshot_flows(SnapshotWriter& w) const {
  std::vector<std::uint64_t>& out = w.out;
  out.push_back(kFlowsMark);
  std::uint64_t in_flight = 0;
  for (const FlowState& fs : flows_) in_flight += fs.op != kNone ? 1 : 0;
  out.push_back(in_flight);
  std::vector<std::uint8_t> flow_named(flows_.size(), 0);
  solver_.append_state(out, [&](std::uint32_t f) {
    const FlowState& fs = flows_[f];
    w.op_id(fs.op);
    if (flow_named[f] != 0) return;
    flow_named[f] = 1;
    w.op_id(fs.sig_op);
    out.push_back(w.group_id(fs.group));
    out.push_back(std::bit_cast<std::uint64_t>(fs.remaining));
    out.push_back(std::bit_cast<std::uint64_t>(fs.rate));
    out.push_back(w.rel(fs.last_ns));
    out.push_back(fs.completion_ns == kNeverNs ? ~std::uint64_t{0} : w.rel(fs.completion_ns));
  });
}

// Live groups in order of their names; a member is its flow's op, or nothing once the flow
// left the group (the group's event skips it).
void Engine::snapshot_groups(SnapshotWriter& w) const {
  std::vector<std::uint64_t>& out = w.out;
  out.push_back(kGroupsMark);
  std::vector<std::uint32_t> live_groups;
  for (std::uint32_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g].live != 0) live_groups.push_back(g);
  }
  for (std::uint32_t g : live_groups) w.group_id(g);  // unnamed ones last (none expected)
  std::sort(live_groups.begin(), live_groups.end(),
            [&](std::uint32_t x, std::uint32_t y) { return w.group_name[x] < w.group_name[y]; });
  for (std::uint32_t g : live_groups) {
    out.push_back(w.group_id(g));
    out.push_back(groups_[g].live);
    out.push_back(groups_[g].members.size());
    for (std::uint32_t f : groups_[g].members) {
      const FlowState& fs = flows_[f];
      w.op_id(fs.group == g ? fs.op : kNone);
    }
  }
}

// Pending events in firing order, less superseded group events.
void Engine::snapshot_events(SnapshotWriter& w) const {
  std::vector<std::uint64_t>& out = w.out;
  out.push_back(kEventsMark);
  std::vector<Event> events = heap_;
  std::sort(events.begin(), events.end(), [](const Event& x, const Event& y) {
    return x.time < y.time || (x.time == y.time && x.seq < y.seq);
  });
  for (const Event& e : events) {
    if (e.kind == EventKind::kGroup && groups_[e.index].generation != e.generation) continue;
    out.push_back(w.rel(e.time));
    out.push_back(static_cast<std::uint64_t>(e.kind));
    if (e.kind == EventKind::kOpTimer) {
      w.op_id(e.index);
    } else {
      out.push_back(w.group_id(e.index));
    }
  }
}

// Bytes in use per pool, then the live tensors.
void Engine::snapshot_memory(SnapshotWriter& w) const {
  w.out.push_back(kMemoryMark);
  for (std::size_t p = 0; p < pools_.size(); ++p) {
    w.out.push_back(static_cast<std::uint64_t>(ledger_.in_use(PoolId{p})));
  }
  for (std::uint32_t t = 0; t < live_.size(); ++t) {
    if (live_[t]) w.tensor_id(t);
  }
}

// Allocates the initial tensors and readies each lane's first op when it waits on nothing.
void Engine::seed() {
  for (TensorId t : plan_.initial_tensors) {
    if (!alloc_tensor(t, kNone)) break;
  }
  if (stopped_) return;
  for (std::uint32_t lane = 0; lane < lane_head_.size(); ++lane) {
    if (lane_offsets_[lane] < lane_offsets_[lane + 1]) {
      const std::uint32_t head = lane_ops_[lane_offsets_[lane]];
      if (ops_[head].pending_deps == 0) make_ready(head);
    }
  }
}

// Everything that happens at now_: timed events first (ends free memory), then ops that
// became ready (their allocs), until neither is left or the run stops.
void Engine::run_instant() {
  for (;;) {
    if (!heap_.empty() && heap_.front().time == now_) {
      std::pop_heap(heap_.begin(), heap_.end(), EventLater{});
      const Event e = heap_.back();
      heap_.pop_back();
      ++events_;
      handle_event(e);
    } else if (ready_next_ < ready_.size()) {
      ++events_;
      start_op(ready_[ready_next_++]);
      if (ready_next_ == ready_.size()) {
        ready_.clear();
        ready_next_ = 0;
      }
    } else {
      return;
    }
    if (stopped_) return;
    if (events_ > options_.max_events) {
      stop_with_error(Error{
          ErrorCode::kLimitExceeded,
          fmt::format("simulation stopped after {} events (max_events = {}) "
                      "at {} with {} of {} ops ended",
                      events_, options_.max_events, format_ms(now_), ended_, plan_.ops.size())});
      return;
    }
  }
}

// Stops the run when the cancel flag is set; polled every kCancelPollEvents events.
void Engine::poll_cancel(std::int64_t& next_poll) {
  if (options_.cancel == nullptr || events_ < next_poll) return;
  next_poll = events_ + kCancelPollEvents;
  if (options_.cancel->load(std::memory_order_relaxed)) {
    stop_with_error(Error{ErrorCode::kCancelled,
                          fmt::format("simulation cancelled at {} after {} events with {} of "
                                      "{} ops ended",
                                      format_ms(now_), events_, ended_, plan_.ops.size())});
  }
}

// Spans were appended in end-time order; equal end times go by op id.
void Engine::sort_spans() {
  for (std::size_t i = 0; i < spans_.size();) {
    std::size_t j = i + 1;
    while (j < spans_.size() && spans_[j].end == spans_[i].end) ++j;
    if (j - i > 1) {
      std::sort(spans_.begin() + static_cast<std::ptrdiff_t>(i),
                spans_.begin() + static_cast<std::ptrdiff_t>(j),
                [](const Span& a, const Span& b) { return a.op < b.op; });
    }
    i = j;
  }
}

// The run's outcome: out of memory, deadlock or completed.
void Engine::fill_outcome(Timeline& t) {
  if (oom_) {
    t.outcome.kind = OutcomeKind::kOutOfMemory;
    t.outcome.message = fmt::format(
        "out of memory at {}: {} allocates {} bytes in pool '{}' with {} of {} bytes in use",
        format_ms(oom_->time.time_since_epoch().count()),
        oom_->op.valid() ? fmt::format("op '{}'", oom_->op_name) : oom_->op_name,
        oom_->requested_bytes, oom_->pool, oom_->in_use_bytes, oom_->capacity_bytes);
    if (!over_capacity_.empty()) {
      t.outcome.message +=
          fmt::format("; ran to the end with {} pool(s) unbounded", over_capacity_.size());
    }
    t.outcome.oom = std::move(oom_);
    t.outcome.over_capacity = std::move(over_capacity_);
  } else if (ended_ < static_cast<std::int64_t>(plan_.ops.size())) {
    describe_deadlock(t);
  } else {
    t.outcome.kind = OutcomeKind::kCompleted;
    t.outcome.message =
        fmt::format("completed {} ops; makespan {}", plan_.ops.size(), format_ms(makespan_));
  }
}

Result<SimResult> Engine::run() {
  if (options_.validate_plan) {
    OFFSIM_RETURN_IF_ERROR(validate(plan_));
  } else {
    OFFSIM_RETURN_IF_ERROR(check_runnable(plan_));
  }
  if (plan_.ops.size() >= kNone) {
    return fail(ErrorCode::kLimitExceeded, "plan has {} ops; at most {} are supported",
                plan_.ops.size(), kNone - 1);
  }
  SimResult result;
  result.timeline = timeline_skeleton(plan_, options_.record_op_infos);
  result.timeline.source = "predicted";
  setup();
  if (periods_ != nullptr) {
    periods_->snapshots.assign(periods_->boundaries.size(), {});
    periods_->live_at_peak.assign(plan_.pools.size(), {});
  }
  seed();

  std::int64_t next_poll = 0;
  while (!stopped_) {
    run_instant();
    if (stopped_) break;
    remove_released();
    if (solver_.dirty()) apply_solve();
    if (snapshot_due_ && (heap_.empty() || heap_.front().time > now_)) {
      snapshot_due_ = false;
      take_snapshot(next_boundary_++);
      if (!keep_running_after_snapshot()) break;
    }
    if (heap_.empty()) break;
    now_ = heap_.front().time;
    poll_cancel(next_poll);
  }
  if (error_) return fail(std::move(*error_));

  Timeline& t = result.timeline;
  sort_spans();
  t.spans = std::move(spans_);
  t.makespan = TimePoint{Duration{makespan_}};
  fill_memory(t);
  fill_outcome(t);
  result.stats.ops_executed = ended_;
  result.stats.flow_solves = solver_.solves();
  result.stats.flows_resolved = solver_.flows_resolved();
  return result;
}

}  // namespace

Result<SimResult> simulate(const Plan& plan, const SimOptions& options) {
  return detail::simulate_with_probe(plan, options, nullptr);
}

namespace detail {

Result<SimResult> simulate_with_probe(const Plan& plan, const SimOptions& options,
                                      EngineProbe* probe) {
  Engine engine(plan, options, probe);
  return engine.run();
}

Result<SimResult> simulate_with_periods(const Plan& plan, const SimOptions& options,
                                        PeriodProbe* probe) {
  Engine engine(plan, options, nullptr, probe);
  return engine.run();
}

const char* first_difference(const std::vector<std::uint64_t>& a,
                             const std::vector<std::uint64_t>& b) {
  const std::size_t n = std::min(a.size(), b.size());
  std::size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  if (i == n) return a.size() == b.size() ? "nothing" : "the state's size";
  // The part that holds word i: the last mark at or before it.
  for (std::size_t j = i + 1; j-- > 0;) {
    switch (a[j] & 0xFFFF000000000000u) {
      case kLaneMark:
        return "a lane's ops";
      case kFlowsMark:
        return "the transfers in flight";
      case kGroupsMark:
        return "the shared-resource groups";
      case kEventsMark:
        return "the pending events";
      case kMemoryMark:
        return "the memory in use";
      default:
        break;
    }
  }
  return "the step's makespan or ready ops";
}

}  // namespace detail

}  // namespace offsim::sim
