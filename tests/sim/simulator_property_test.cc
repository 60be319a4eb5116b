// Properties of the engine over random valid plans: no resource above its capacity, every op's
// work delivered, a memory curve that matches the effects, determinism, and the recording
// options changing nothing but what is recorded.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "sim/engine/engine_probe.h"
#include "sim/engine/simulator.h"
#include "sim/trace/memory_ledger.h"

#ifdef OFFSIM_HAVE_RAPIDCHECK
#include <rapidcheck/gtest.h>
#endif

namespace offsim::sim {
namespace {

std::int64_t ns(TimePoint t) { return t.time_since_epoch().count(); }

// A random plan whose order is valid by construction: deps point to earlier ops, frees take
// tensors allocated by the op itself, its deps or its lane predecessor (ancestors).
// With `repeat_flows`, ops draw their bound, multiplicity and uses from a few shapes, so flows
// often take over the solver slot of an identical flow that just ended.
Plan random_plan(std::uint64_t seed, int op_count, bool repeat_flows) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  PlanBuilder b;
  const int lanes = uniform(1, 6);
  const int resources = uniform(1, 5);
  const int pools = uniform(1, 2);
  for (int l = 0; l < lanes; ++l) b.lane(fmt::format("lane{}", l));
  for (int r = 0; r < resources; ++r) b.resource(fmt::format("res{}", r), uniform(1, 20) * 1e9);
  for (int p = 0; p < pools; ++p) b.pool(fmt::format("pool{}", p), std::int64_t{1} << 50);
  int tensor_count = 0;
  auto new_tensor = [&]() {
    const PoolId pool{uniform(0, pools - 1)};
    return b.tensor(fmt::format("t{}", tensor_count++), pool, uniform(1, 1'000'000),
                    chance(0.5) ? TensorCategory::kActivations : TensorCategory::kParams);
  };
  std::vector<TensorId> initial;
  for (int i = uniform(0, 3); i > 0; --i) {
    initial.push_back(new_tensor());
    b.initial(initial.back());
  }
  std::vector<std::vector<TensorId>> allocated(static_cast<std::size_t>(op_count));
  std::vector<bool> freed(1 << 16, false);
  std::vector<int> last_on_lane(static_cast<std::size_t>(lanes), -1);
  for (int i = 0; i < op_count; ++i) {
    Op op;
    op.name = fmt::format("op{}", i);
    op.lane = LaneId{uniform(0, lanes - 1)};
    op.kind = OpKind::kCopy;
    if (i > 0 && chance(0.5)) {
      for (int d = uniform(1, 2); d > 0; --d) op.deps.push_back(OpId{uniform(0, i - 1)});
    }
    op.cost.work = chance(0.15) ? 0.0 : uniform(1, 1000) * 1e6;
    if (chance(0.3)) op.cost.max_rate = uniform(1, 10) * 1e9;
    std::vector<int> res(static_cast<std::size_t>(resources));
    for (int r = 0; r < resources; ++r) res[static_cast<std::size_t>(r)] = r;
    std::shuffle(res.begin(), res.end(), rng);
    const int use_count = uniform(0, std::min(3, resources));
    for (int u = 0; u < use_count; ++u) {
      static constexpr double kWeights[] = {0.5, 1.0, 2.0};
      op.cost.uses.push_back(
          {ResourceId{res[static_cast<std::size_t>(u)]}, kWeights[uniform(0, 2)]});
    }
    if (chance(0.5)) op.cost.latency = Duration{uniform(1, 10'000)};
    op.cost.multiplicity = uniform(1, 3);
    if (repeat_flows) {
      const int shape = uniform(0, 2);
      op.cost.max_rate = shape == 2 ? 4e9 : std::numeric_limits<double>::infinity();
      op.cost.multiplicity = 1;
      op.cost.uses = {{ResourceId{0}, 1.0}};
      if (shape == 1) op.cost.uses.push_back({ResourceId{resources - 1}, 2.0});
      op.cost.latency = Duration{chance(0.8) ? 0 : uniform(1, 1000)};
    }
    for (int a = uniform(0, 2); a > 0; --a) op.allocs.push_back(new_tensor());
    allocated[static_cast<std::size_t>(i)] = op.allocs.to_vector();
    // Free candidates: own allocs, ancestors' allocs, initial tensors.
    std::vector<TensorId> candidates = op.allocs.to_vector();
    std::vector<int> ancestors;
    for (OpId d : op.deps) ancestors.push_back(static_cast<int>(d.index()));
    if (last_on_lane[op.lane.index()] >= 0) ancestors.push_back(last_on_lane[op.lane.index()]);
    for (int a : ancestors) {
      for (TensorId t : allocated[static_cast<std::size_t>(a)]) candidates.push_back(t);
    }
    candidates.insert(candidates.end(), initial.begin(), initial.end());
    for (TensorId t : candidates) {
      if (!freed[t.index()] && chance(0.5)) {
        freed[t.index()] = true;
        op.frees.push_back(t);
      }
    }
    last_on_lane[op.lane.index()] = i;
    b.op(std::move(op));
  }
  return std::move(b).build();
}

// Integrates each flow's rate over time, independently of the engine's own bookkeeping, and
// checks the resources at every instant.
class Recorder : public detail::EngineProbe {
 public:
  explicit Recorder(const Plan& plan)
      : plan_(plan),
        rate_(plan.ops.size(), 0.0),
        last_ns_(plan.ops.size(), 0),
        delivered_(plan.ops.size(), 0.0),
        active_(plan.ops.size(), false),
        starts_(plan.ops.size(), 0),
        ends_(plan.ops.size(), 0) {}

  void on_rate(TimePoint now, OpId op, double rate) override {
    advance(ns(now));
    const std::size_t i = op.index();
    if (!active_[i]) {
      active_[i] = true;
      ++starts_[i];
    } else {
      delivered_[i] += rate_[i] * static_cast<double>(ns(now) - last_ns_[i]) * 1e-9;
    }
    rate_[i] = rate;
    last_ns_[i] = ns(now);
  }

  void on_flow_end(TimePoint now, OpId op) override {
    advance(ns(now));
    const std::size_t i = op.index();
    if (!active_[i]) {
      fail("flow of " + plan_.ops[i].name + " ended without starting");
      return;
    }
    delivered_[i] += rate_[i] * static_cast<double>(ns(now) - last_ns_[i]) * 1e-9;
    active_[i] = false;
    ++ends_[i];
    const double work = plan_.ops[i].cost.work;
    // Completion rounds up to a whole ns: at most 1 ns of extra work at the last rate.
    const double slack = std::isfinite(rate_[i]) ? rate_[i] * 1e-9 : 0.0;
    if (std::isfinite(rate_[i]) &&
        (delivered_[i] < work * (1 - 1e-9) || delivered_[i] > work * (1 + 1e-9) + slack)) {
      std::ostringstream s;
      s << plan_.ops[i].name << ": delivered " << delivered_[i] << " of " << work;
      fail(s.str());
    }
  }

  // Called after the run: checks the last instant and every op's flow count.
  void finish() {
    check_capacity();
    for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
      const int expected = plan_.ops[i].cost.work > 0.0 ? 1 : 0;
      if (starts_[i] != expected || ends_[i] != expected) {
        fail(fmt::format("{}: flow started/ended {}/{} times", plan_.ops[i].name, starts_[i],
                         ends_[i]));
      }
    }
  }

  const std::string& problems() const { return problems_; }

 private:
  void advance(std::int64_t now) {
    if (now != now_) {
      check_capacity();  // the state at the end of the previous instant is complete
      now_ = now;
    }
  }

  void check_capacity() {
    std::vector<double> used(plan_.resources.size(), 0.0);
    for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
      if (!active_[i]) continue;
      const OpCost& c = plan_.ops[i].cost;
      for (const ResourceUse& u : c.uses) {
        used[u.resource.index()] += c.multiplicity * u.per_unit * rate_[i];
      }
    }
    for (std::size_t r = 0; r < used.size(); ++r) {
      if (used[r] > plan_.resources[r].capacity * (1 + 1e-9)) {
        std::ostringstream s;
        s << "at " << now_ << " ns resource " << plan_.resources[r].name << " carries " << used[r]
          << " > capacity " << plan_.resources[r].capacity;
        fail(s.str());
      }
    }
    // Max-min fairness leaves no flow below what it could get: each runs at its bound or
    // crosses a saturated resource, and never above its bound.
    for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
      if (!active_[i]) continue;
      const OpCost& c = plan_.ops[i].cost;
      bool limited = rate_[i] >= c.max_rate * (1 - 1e-9);
      for (const ResourceUse& u : c.uses) {
        const double cap = plan_.resources[u.resource.index()].capacity;
        limited = limited || (u.per_unit > 0.0 && used[u.resource.index()] >= cap * (1 - 1e-9));
      }
      if (!limited || rate_[i] > c.max_rate * (1 + 1e-9)) {
        std::ostringstream s;
        s << "at " << now_ << " ns " << plan_.ops[i].name << " runs at " << rate_[i]
          << " with no bottleneck (bound " << c.max_rate << ")";
        fail(s.str());
      }
    }
  }

  void fail(const std::string& what) {
    if (problems_.size() < 2000) problems_ += what + "\n";
  }

  const Plan& plan_;
  std::vector<double> rate_;
  std::vector<std::int64_t> last_ns_;
  std::vector<double> delivered_;
  std::vector<bool> active_;
  std::vector<int> starts_;
  std::vector<int> ends_;
  std::int64_t now_ = 0;
  std::string problems_;
};

// The curve the effects imply: after all effects at time t, bytes in use; one sample per change
// (the first at time zero).
std::string check_memory(const Plan& plan, const Timeline& t) {
  std::string problems;
  for (std::size_t p = 0; p < plan.pools.size(); ++p) {
    std::map<std::int64_t, std::int64_t> delta;  // time -> net change
    std::map<std::int64_t, std::int64_t> added;  // time -> allocations only
    delta[0] += 0;
    for (TensorId id : plan.initial_tensors) {
      const Tensor& tensor = plan.tensors[id.index()];
      if (tensor.pool.index() == p) {
        delta[0] += tensor.bytes;
        added[0] += tensor.bytes;
      }
    }
    for (const Span& s : t.spans) {
      const Op& op = plan.ops[s.op.index()];
      for (TensorId id : op.allocs) {
        const Tensor& tensor = plan.tensors[id.index()];
        if (tensor.pool.index() == p) {
          delta[ns(s.start)] += tensor.bytes;
          added[ns(s.start)] += tensor.bytes;
        }
      }
      for (TensorId id : op.frees) {
        const Tensor& tensor = plan.tensors[id.index()];
        if (tensor.pool.index() == p) delta[ns(s.end)] -= tensor.bytes;
      }
    }
    std::vector<MemorySample> expected;
    std::int64_t value = 0;
    std::int64_t max_value = 0;
    std::int64_t upper = 0;  // the most the pool can hold within an instant
    for (const auto& [time, change] : delta) {
      upper = std::max(upper, value + added[time]);
      value += change;
      max_value = std::max(max_value, value);
      if (expected.empty() || expected.back().bytes_in_use != value) {
        expected.push_back(MemorySample{TimePoint{Duration{time}}, value});
      }
    }
    const PoolTrace& trace = t.pools[p];
    if (trace.samples != expected) problems += "pool " + trace.name + ": samples differ\n";
    std::int64_t live = 0;
    for (const LiveTensor& l : trace.live_at_peak) live += l.bytes;
    if (live != trace.peak_bytes) problems += "pool " + trace.name + ": live set != peak\n";
    if (trace.peak_bytes < max_value || trace.peak_bytes > upper) {
      problems += fmt::format("pool {}: peak {} outside [{}, {}]\n", trace.name, trace.peak_bytes,
                              max_value, upper);
    }
  }
  // The memory events: one per alloc and free of the plan (initial tensors included) at its op's
  // start or end, and replaying them gives the engine's samples, peaks and live sets exactly.
  std::size_t effects = plan.initial_tensors.size();
  for (const Span& s : t.spans) {
    effects += plan.ops[s.op.index()].allocs.size() + plan.ops[s.op.index()].frees.size();
  }
  if (t.memory_events.size() != effects) problems += "memory events missing\n";
  if (t.tensors != tensor_infos(plan)) problems += "timeline tensors differ from the plan's\n";
  Result<MemoryLedger> ledger = MemoryLedger::replay(t);
  if (!ledger) return problems + "memory events do not replay: " + ledger.error().message + "\n";
  std::vector<PoolTrace> replayed = t.pools;
  fill_pool_traces(*ledger, t.tensors, replayed);
  if (replayed != t.pools) problems += "replayed memory events differ from the engine's pools\n";
  return problems;
}

std::string check_plan(std::uint64_t seed, int op_count, bool repeat_flows) {
  const Plan plan = random_plan(seed, op_count, repeat_flows);
  Recorder recorder(plan);
  Result<SimResult> r = detail::simulate_with_probe(plan, {}, &recorder);
  if (!r) return "simulate failed: " + r.error().message;
  recorder.finish();
  std::string problems = recorder.problems();
  const Timeline& t = r->timeline;
  if (t.outcome.kind != OutcomeKind::kCompleted) problems += "outcome: " + t.outcome.message + "\n";
  if (t.spans.size() != plan.ops.size()) problems += "not every op has a span\n";
  std::int64_t latest = 0;
  for (std::size_t i = 0; i < t.spans.size(); ++i) {
    const Span& s = t.spans[i];
    latest = std::max(latest, ns(s.end));
    if (ns(s.end) - ns(s.start) < plan.ops[s.op.index()].cost.latency.count()) {
      problems += "span shorter than its latency\n";
    }
    if (i > 0 && (t.spans[i - 1].end > s.end ||
                  (t.spans[i - 1].end == s.end && t.spans[i - 1].op >= s.op))) {
      problems += "spans not in (end, op) order\n";
    }
  }
  if (ns(t.makespan) != latest) problems += "makespan is not the last end\n";
  problems += check_memory(plan, t);

  // Determinism, and the recording options change nothing else.
  Result<SimResult> again = simulate(plan);
  if (!again || !(again->timeline == t) || again->stats.flow_solves != r->stats.flow_solves ||
      again->stats.flows_resolved != r->stats.flows_resolved) {
    problems += "a second run differs\n";
  }
  SimOptions quiet;
  quiet.record_spans = false;
  quiet.record_memory = false;
  Result<SimResult> q = simulate(plan, quiet);
  if (!q || q->timeline.makespan != t.makespan || !q->timeline.spans.empty() ||
      q->timeline.outcome != t.outcome) {
    problems += "record_spans/record_memory = false changed the run\n";
  } else {
    for (std::size_t p = 0; p < t.pools.size(); ++p) {
      const PoolTrace& a = t.pools[p];
      const PoolTrace& b = q->timeline.pools[p];
      if (a.peak_bytes != b.peak_bytes || a.peak_time != b.peak_time ||
          a.live_at_peak != b.live_at_peak || !b.samples.empty()) {
        problems += "record_memory = false changed pool " + a.name + "\n";
      }
    }
  }
  return problems;
}

#ifdef OFFSIM_HAVE_RAPIDCHECK
RC_GTEST_PROP(EnginePropertyTest, RandomValidPlans, ()) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const int op_count = *rc::gen::inRange(1, 80);
  const bool repeat_flows = *rc::gen::arbitrary<bool>();
  const std::string problems = check_plan(seed, op_count, repeat_flows);
  if (!problems.empty()) RC_FAIL(problems);
}
#endif

// Seeded loop: runs whether or not rapidcheck is installed, with larger plans.
TEST(EnginePropertyTest, SeededLargerPlans) {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    const std::string problems = check_plan(seed, 300, seed % 2 == 0);
    EXPECT_TRUE(problems.empty()) << "seed " << seed << ":\n" << problems;
  }
}

}  // namespace
}  // namespace offsim::sim
