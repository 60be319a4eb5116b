#include "models/evaluate.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <fmt/format.h>

#include "models/static_memory.h"
#include "sim/engine/engine_probe.h"
#include "sim/engine/simulator.h"
#include "sim/trace/analysis.h"

namespace offsim::models {

namespace {

void add_to(MemoryBreakdown& m, sim::TensorCategory category, std::int64_t bytes) {
  using sim::TensorCategory;
  switch (category) {
    case TensorCategory::kParams:
      m.params_bytes += bytes;
      return;
    case TensorCategory::kGrads:
      m.grads_bytes += bytes;
      return;
    case TensorCategory::kOptimizer:
      m.optimizer_bytes += bytes;
      return;
    case TensorCategory::kActivations:
      m.activations_bytes += bytes;
      return;
    case TensorCategory::kBuffers:
      m.buffers_bytes += bytes;
      return;
    case TensorCategory::kTransients:
      m.transient_bytes += bytes;
      return;
    case TensorCategory::kRuntime:
      m.runtime_bytes += bytes;
      return;
    case TensorCategory::kWorkspace:
    case TensorCategory::kNone:
      m.workspace_bytes += bytes;
      return;
  }
}

const sim::PoolTrace* find_pool(const sim::Timeline& t, sim::PoolId pool) {
  return pool.index() < t.pools.size() ? &t.pools[pool.index()] : nullptr;
}

// TimeSplit from the integer-nanosecond split of sim/trace (exact sums: a steady-state step's
// split is the reduced step's plus whole periods, bit for bit).
using SplitNs = sim::TimeSplitNs;
using StartWindow = sim::StartWindow;

TimeSplit seconds(const SplitNs& n) {
  const auto s = [](std::int64_t ns) { return sim::to_seconds(sim::Duration{ns}); };
  return TimeSplit{.compute_s = s(n.compute),
                   .recompute_s = s(n.recompute),
                   .exposed_comm_s = s(n.exposed_comm),
                   .exposed_offload_s = s(n.exposed_offload),
                   .bubble_s = s(n.bubble),
                   .cpu_optimizer_s = s(n.cpu_optimizer),
                   .other_s = s(n.other),
                   .moe_alltoall_s = s(n.moe_alltoall),
                   .grouped_gemm_s = s(n.grouped_gemm)};
}

// What a steady-state extrapolation changes in a reduced step's report (see evaluate()).
struct Extrapolation {
  sim::TimePoint makespan;
  std::int64_t plan_ops = 0;
  SplitNs split;
};

Report report_of(const Scenario& scenario, const BuiltStep& step, const sim::Timeline& t,
                 const Extrapolation* x) {
  Report r;
  r.scenario = scenario.name;
  r.outcome = sim::to_string(t.outcome.kind);
  r.fits = t.outcome.kind == sim::OutcomeKind::kCompleted;
  r.gpus = step.gpus;
  r.step_time_s = sim::to_seconds(x != nullptr ? x->makespan : t.makespan);
  r.flags = step.flags;
  r.metadata = t.metadata;
  r.plan_ops = x != nullptr ? x->plan_ops : static_cast<std::int64_t>(step.plan.ops.size());
  r.hbm_capacity_bytes = step.hbm_capacity_bytes;
  r.host_capacity_bytes = step.host_capacity_bytes;
  if (r.fits && r.step_time_s > 0.0) {
    const double gpus = static_cast<double>(step.gpus);
    r.tokens_per_s = static_cast<double>(step.tokens_per_step) / r.step_time_s;
    r.tokens_per_s_per_gpu = r.tokens_per_s / gpus;
    r.tflops_per_gpu = step.model_flops_per_step / r.step_time_s / gpus / 1e12;
    r.hw_tflops_per_gpu = step.hardware_flops_per_step / r.step_time_s / gpus / 1e12;
    if (step.peak_flops_per_gpu > 0.0) {
      r.mfu = r.tflops_per_gpu * 1e12 / step.peak_flops_per_gpu;
      r.hfu = r.hw_tflops_per_gpu * 1e12 / step.peak_flops_per_gpu;
    }
  }
  std::map<std::size_t, bool> hosts_seen;  // by pool id
  for (const SimRankInfo& info : step.ranks) {
    RankReport rr;
    rr.name = fmt::format("rank{} (stage {})", info.rank, info.stage);
    rr.rank = info.rank;
    rr.stage = info.stage;
    rr.dp_rank = info.dp_rank;
    rr.tp_rank = info.tp_rank;
    rr.multiplicity = info.multiplicity;
    if (const sim::PoolTrace* p = find_pool(t, info.hbm_pool)) {
      rr.hbm_peak_bytes = p->peak_bytes;
      rr.hbm_capacity_bytes = p->capacity_bytes;
      rr.live_at_peak = p->live_at_peak;
      for (const sim::LiveTensor& lt : p->live_at_peak) add_to(rr.memory, lt.category, lt.bytes);
    }
    if (const sim::PoolTrace* h = find_pool(t, info.host_pool);
        h && !hosts_seen[info.host_pool.index()]) {
      hosts_seen[info.host_pool.index()] = true;
      r.host_peak_bytes = std::max(r.host_peak_bytes, h->peak_bytes);
    }
    if (r.ranks.empty() || rr.hbm_peak_bytes > r.hbm_peak_bytes) {
      r.hbm_peak_bytes = rr.hbm_peak_bytes;
      r.worst_rank = rr.name;
      r.memory = rr.memory;
      r.live_at_peak = rr.live_at_peak;
    }
    r.ranks.push_back(std::move(rr));
  }
  if (!step.ranks.empty() && r.fits) {
    // The first stage: in 1F1B every stage sees the same bubble; stage 0 also waits longest on
    // the gradients flowing back.
    const SimRankInfo& crit = step.ranks.front();
    r.time = seconds(x != nullptr ? x->split : sim::split_time(step.plan, t, crit.compute_lane));
  }
  const auto oom_report = [](const sim::OutOfMemory& o) {
    return OomReport{.op = o.op_name,
                     .pool = o.pool,
                     .time_s = sim::to_seconds(o.time),
                     .requested_bytes = o.requested_bytes,
                     .in_use_bytes = o.in_use_bytes,
                     .capacity_bytes = o.capacity_bytes,
                     .live = o.live,
                     .pool_kind = o.pool_kind};
  };
  if (t.outcome.oom) r.oom = oom_report(*t.outcome.oom);
  // Pools over capacity (the step ran to its end with them unbounded): demand = true peak.
  for (const sim::OutOfMemory& o : t.outcome.over_capacity) {
    PoolDemand d;
    d.pool = o.pool;
    d.capacity_bytes = o.capacity_bytes;
    if (const sim::PoolTrace* p = find_pool(t, o.pool_id)) d.demand_bytes = p->peak_bytes;
    d.overshoot_bytes = d.demand_bytes - d.capacity_bytes;
    d.first_failure = oom_report(o);
    if (d.first_failure.live.size() > 20) d.first_failure.live.resize(20);
    r.over_capacity.push_back(std::move(d));
  }
  if (r.live_at_peak.size() > 20) r.live_at_peak.resize(20);
  return r;
}

// The steady-state fast path. A step of M identical micro-batches (one pipeline stage) is
// simulated with K = kReducedMicroBatches of them instead: micro-batches 0..K-2 are built as in
// the full step and the last one as the full step's last (same names, same gradient reduction).
// The engine fingerprints its complete state when micro-batches 1 and 2 start (the period
// boundaries b1, b2; see sim::detail::PeriodProbe). If micro-batches 0..K-2 are identical op for
// op, nothing older than the previous micro-batch is still running and nothing newer than the
// current one has started at b1 and b2, and the two fingerprints are equal, then the engine,
// being deterministic, evolves after b2 exactly as after b1 shifted by Δ = t(b2) - t(b1) and by
// one micro-batch; the full step is therefore the reduced one with M - K more copies of the
// window (b1, b2] inserted at b2. So: makespan + (M - K)·Δ; time split + (M - K)·(the window's
// share, in integer ns); plan ops + (M - K)·(ops per micro-batch); pool peaks and live sets as
// in the reduced run (a peak after b2 moves by (M - K)·Δ, and its live tensors must be static
// or of the last micro-batch or the optimizer, whose names are the full step's). Anything else
// returns nullopt and evaluate() runs the full step.
constexpr int kReducedMicroBatches = 4;

bool same_block_op(const sim::Op& a, const sim::Op& b, std::size_t shift_ops,
                   std::size_t shift_tensors, const MicroBatchStart& lo,
                   const MicroBatchStart& hi) {
  if (a.lane != b.lane || a.kind != b.kind || a.category != b.category || a.layer != b.layer ||
      !(a.cost == b.cost) || a.deps.size() != b.deps.size() || a.allocs.size() != b.allocs.size() ||
      a.frees.size() != b.frees.size()) {
    return false;
  }
  // Ids inside the periodic region move with the block; others (static tensors, the last
  // micro-batch, the optimizer) must be the same.
  const auto same_op = [&](sim::OpId x, sim::OpId y) {
    const bool in = x.index() >= lo.op && x.index() < hi.op;
    return in ? y.index() == x.index() + shift_ops : y == x;
  };
  const auto same_tensor = [&](sim::TensorId x, sim::TensorId y) {
    const bool in = x.index() >= lo.tensor && x.index() < hi.tensor;
    return in ? y.index() == x.index() + shift_tensors : y == x;
  };
  for (std::size_t i = 0; i < a.deps.size(); ++i) {
    if (!same_op(a.deps[i], b.deps[i])) return false;
  }
  for (std::size_t i = 0; i < a.allocs.size(); ++i) {
    if (!same_tensor(a.allocs[i], b.allocs[i])) return false;
  }
  for (std::size_t i = 0; i < a.frees.size(); ++i) {
    if (!same_tensor(a.frees[i], b.frees[i])) return false;
  }
  return true;
}

// Simulates a reduced step with the period probe; nullopt (and why) unless it runs to its end.
// As in the full path, pools go past their capacity (SimOptions::run_past_capacity): the engine
// records each pool's first failing allocation and otherwise runs exactly as with unbounded
// pools, so an out-of-memory step is periodic as a fitting one is (see failures_in_prefix()).
std::optional<sim::SimResult> simulate_reduced(const sim::Plan& plan, const EvalOptions& options,
                                               sim::detail::PeriodProbe& probe, std::string& why) {
  sim::SimOptions sim_options;
  sim_options.record_spans = true;
  sim_options.record_memory = false;
  sim_options.validate_plan = false;
  sim_options.cancel = options.cancel;
  sim_options.run_past_capacity = true;
  sim_options.record_op_infos = false;  // the report reads the plan, as on the full path
  sim::Result<sim::SimResult> result =
      sim::detail::simulate_with_periods(plan, sim_options, &probe);
  if (!result) {
    // Stopped at the last boundary: the probe's keep_running said why.
    if (!probe.stopped) why = "the reduced step does not simulate";
    return std::nullopt;
  }
  const sim::Outcome& o = result->timeline.outcome;
  const bool ran_past_capacity =
      o.kind == sim::OutcomeKind::kOutOfMemory && o.oom && !o.over_capacity.empty();
  if (o.kind != sim::OutcomeKind::kCompleted && !ran_past_capacity) {
    why = "the reduced step does not complete";
    return std::nullopt;
  }
  return std::move(*result);
}

// An out-of-memory reduced step extrapolates exactly when every pool's first failing allocation
// happened by the second boundary b2 (time t2). The full step runs exactly as the reduced one
// up to the end of b2's instant, and there only ops and tensors it shares by name had started
// (the boundaries are quiet), so its first failures are the same (op, time, requested, in use,
// live set) and in the same order. No pool fails later in the full step: its inserted copies of
// (b1, b2] repeat the pool levels of (b1, b2], which stayed within capacity unless the pool had
// already failed, and its tail is the reduced step's tail. A first failure after b2 would move
// in time and name: the full path.
bool failures_in_prefix(const sim::Timeline& t, sim::TimePoint t2, std::string& why) {
  for (const sim::OutOfMemory& o : t.outcome.over_capacity) {
    if (o.time > t2) {
      why = fmt::format("pool '{}' first goes over capacity after the period", o.pool);
      return false;
    }
  }
  return true;
}

// One stage: the first failures come before b2 and every pool's peak holds tensors the full step
// has under the same names (before b2: static or periodic tensors; after: none of the periodic
// region, whose names move by M - K micro-batches).
bool memory_keeps_names(const sim::Timeline& t, const sim::detail::PeriodProbe& probe,
                        sim::TimePoint b2, std::string& why) {
  if (!failures_in_prefix(t, b2, why)) return false;
  for (std::size_t p = 0; p < t.pools.size(); ++p) {
    if (t.pools[p].peak_bytes == 0) continue;
    const bool before = t.pools[p].peak_time <= b2;
    for (std::uint32_t id : probe.live_at_peak[p]) {
      const bool periodic = id >= probe.tensor_lo && id < probe.tensor_hi;
      const bool static_tensor = id < probe.tensor_lo;
      if (before ? !(periodic || static_tensor) : periodic) {
        why = "a pool's peak holds tensors whose names move";
        return false;
      }
    }
  }
  return true;
}

// The reduced step of the fast paths: `k` micro-batches, the last labelled as the scenario's
// last (`m` - 1); on failure `why` says so.
sim::Result<BuiltStep> build_reduced_step(const ResolvedScenario& resolved,
                                          const EvalOptions& options, std::int64_t k,
                                          std::int64_t m, std::string& why) {
  BuildOptions reduced = options.build;
  reduced.micro_batches = static_cast<int>(k);
  reduced.last_micro_batch_label = static_cast<int>(m - 1);
  sim::Result<BuiltStep> built = build_step(resolved, reduced);
  if (!built) why = "the reduced step does not build";
  return built;
}

// The two one-stage boundaries are quiet with equal states; false (with why) otherwise.
bool single_stage_periodic(const sim::detail::PeriodProbe& probe, std::string& why) {
  const auto& s1 = probe.snapshots[0];
  const auto& s2 = probe.snapshots[1];
  if (!s1.taken || !s2.taken || !s1.quiet || !s2.quiet) {
    why = "micro-batches overlap more than one period";
    return false;
  }
  if (s1.state != s2.state || s2.time_ns <= s1.time_ns) {
    why = fmt::format("no periodic state (the boundaries' states first differ in {})",
                      sim::detail::first_difference(s1.state, s2.state));
    return false;
  }
  return true;
}

std::optional<Report> steady_state_report(const ResolvedScenario& resolved,
                                          const EvalOptions& options, std::string& why) {
  const Scenario& scenario = resolved.scenario();
  constexpr int kK = kReducedMicroBatches;
  if (scenario.parallelism.pp != 1) {
    why = "pipeline parallelism";
    return std::nullopt;
  }
  const std::int64_t m = grad_accum_steps(scenario.training, scenario.parallelism);
  if (m <= kK || m > std::int64_t{1} << 30) {
    why = fmt::format("{} micro-batches (the fast path needs more than {})", m, kK);
    return std::nullopt;
  }
  sim::Result<BuiltStep> built = build_reduced_step(resolved, options, kK, m, why);
  if (!built) return std::nullopt;
  const BuiltStep& step = *built;
  const sim::Plan& plan = step.plan;
  const std::vector<MicroBatchStart>& mb = step.micro_batch_starts;
  if (mb.size() != kK) {
    why = "no micro-batch structure";
    return std::nullopt;
  }
  // Micro-batches 0..K-2 (the periodic region) must be the same ops and tensors, shifted.
  const std::size_t block_ops = mb[1].op - mb[0].op;
  const std::size_t block_tensors = mb[1].tensor - mb[0].tensor;
  for (int i = 1; i + 1 < kK; ++i) {
    if (mb[i + 1].op - mb[i].op != block_ops || mb[i + 1].tensor - mb[i].tensor != block_tensors) {
      why = "micro-batches of different sizes";
      return std::nullopt;
    }
    const std::size_t shift_ops = mb[i].op - mb[0].op;
    const std::size_t shift_tensors = mb[i].tensor - mb[0].tensor;
    for (std::size_t k = 0; k < block_ops; ++k) {
      if (!same_block_op(plan.ops[mb[0].op + k], plan.ops[mb[i].op + k], shift_ops, shift_tensors,
                         mb[0], mb[kK - 1])) {
        why = "micro-batches with different ops";
        return std::nullopt;
      }
    }
    for (std::size_t k = 0; k < block_tensors; ++k) {
      const sim::Tensor& a = plan.tensors[mb[0].tensor + k];
      const sim::Tensor& b = plan.tensors[mb[i].tensor + k];
      if (a.pool != b.pool || a.bytes != b.bytes || a.category != b.category) {
        why = "micro-batches with different tensors";
        return std::nullopt;
      }
    }
  }

  sim::detail::PeriodProbe probe;
  probe.op_lo = static_cast<std::uint32_t>(mb[0].op);
  probe.op_hi = static_cast<std::uint32_t>(mb[kK - 1].op);
  probe.tensor_lo = static_cast<std::uint32_t>(mb[0].tensor);
  probe.tensor_hi = static_cast<std::uint32_t>(mb[kK - 1].tensor);
  for (int i = 1; i <= 2; ++i) {
    probe.boundaries.push_back({.first_op = static_cast<std::uint32_t>(mb[i].op),
                                .first_tensor = static_cast<std::uint32_t>(mb[i].tensor),
                                .prev_first_op = static_cast<std::uint32_t>(mb[i - 1].op),
                                .next_first_op = static_cast<std::uint32_t>(mb[i + 1].op)});
  }
  if (!step.ranks.empty()) probe.timed_lanes = {step.ranks.front().compute_lane};  // split_time
  // Checked when the second boundary's snapshot is taken, so a run with no period stops there.
  probe.keep_running = [&why](const sim::detail::PeriodProbe& pr) {
    return single_stage_periodic(pr, why);
  };
  std::optional<sim::SimResult> result = simulate_reduced(plan, options, probe, why);
  if (!result) return std::nullopt;
  const sim::Timeline& t = result->timeline;
  if (!single_stage_periodic(probe, why)) return std::nullopt;
  const auto& s1 = probe.snapshots[0];
  const auto& s2 = probe.snapshots[1];
  const std::int64_t extra = m - kK;
  const std::int64_t period_ns = s2.time_ns - s1.time_ns;
  const sim::TimePoint b1{sim::Duration{s1.time_ns}};
  const sim::TimePoint b2{sim::Duration{s2.time_ns}};
  if (!memory_keeps_names(t, probe, b2, why)) return std::nullopt;
  Extrapolation x;
  x.makespan = t.makespan + sim::Duration{extra * period_ns};
  x.plan_ops =
      static_cast<std::int64_t>(plan.ops.size()) + extra * static_cast<std::int64_t>(block_ops);
  if (!step.ranks.empty()) {
    const SimRankInfo& crit = step.ranks.front();
    x.split = sim::split_time(plan, t, crit.compute_lane);
    x.split.add(sim::split_time(plan, t, crit.compute_lane, StartWindow{b1, b2}), extra);
  }
  return report_of(scenario, step, t, &x);
}

// The pipeline steady state (pp > 1, 1F1B or interleaved 1F1B). The reduced step has K
// micro-batches instead of the scenario's M, its last one named as the full step's last. Every
// task (one forward or backward pass of a micro-batch over a model chunk on a stage, and each
// receive) is numbered by its place in its stage's steady state (PipelineTask::index): a
// stage's lanes run its tasks in the order (forward j, backward j), j = 0, 1, ... between its
// warm-up forwards (index < 0) and its cool-down backwards, for every stage alike; one period is
// P indices (1F1B: 1, one micro-batch; interleaved: pp · v, pp micro-batches). In the full step
// the steady range of every stage is longer by (M - K) / P periods and otherwise the same: the
// full step's plan is the reduced one with (M - K) / P copies of a period of tasks inserted in
// every stage's steady range and in the receives, ids renumbered in an order-preserving way
// (stage by stage, then the receives in send order), which the engine cannot tell apart.
//
// Checked here: tasks of index i and i + P of the same kind (stage, chunk, direction, receive)
// are identical op for op (lane, kind, category, layer, cost, tensors' pool, bytes, category),
// their dependencies, allocs and frees pointing to the same offset in the task of index + P
// (or to the same op or tensor outside the tasks), for every i >= lo with i + P <= hi_s, hi_s
// being below stage s's last steady index and its last micro-batch (a receive counts with its
// send's stage; each stage has its own top because stages run skewed in index, see the
// README's steady-state section). Below, hi is a task's own stage's hi_s. The engine fingerprints
// its complete state (sim::detail::PeriodProbe with segments) when stage 0's forward of index b and
// b + P starts; ids are written as (kind, index - boundary index, offset). If both boundaries
// are quiet (every lane's next op of index >= lo (b1) / lo + P (b2), nothing of index above
// hi - P (b1) / hi (b2) or outside the tasks started) and the two fingerprints are equal, then
// between b1 and b2 the engine touched only tasks in [lo, hi], which the full step has too,
// identical and equally placed; by induction over the inserted periods the full step is the
// reduced one with (M - K) / P copies of (b1, b2] inserted at b2, exactly as in the one-stage
// case below: makespan + n·Δ, time split + n·(the window's share in integer ns), plan ops + n·
// (ops of one period's tasks), pool peaks and live sets as in the reduced run when their live
// tensors keep their names (before b2: no tensor of the last micro-batch, which the reduced
// step renames; after b2: only tensors outside the tasks or of the last micro-batch).
//
// Q (the largest period multiple tried) is 1 for 1F1B: flows are written by their op, not by
// the solver slot they take, and every pipelined point of spaces A and B that proved a period
// with Q = 4 did so with q = 1 (34 of 34 in the stride-10 subsamples), and Q = 4 cost three
// more micro-batches of reduced step plus up to three to make M - K a multiple of Q. A step
// whose state would repeat only after q > 1 periods takes the full path.
constexpr std::int64_t kMaxPeriodMultiple = 1;
// Interleaved stages of unequal work: how many periods later than b1 the first boundary of the
// pair may be (PipelinePeriods::scan).
constexpr std::int64_t kSettleScan = 4;

// The reduced pipeline step's sizes: P (period, in task indices), its micro-batches, Q and K.
struct PipelinePeriods {
  std::int64_t v = 1;           // virtual stages
  std::int64_t period_mbs = 1;  // micro-batches per period
  std::int64_t period = 1;      // in task indices
  std::int64_t m = 0;           // the scenario's micro-batches
  std::int64_t q_max = 0;       // Q
  std::int64_t margin = 0;      // periods of margin above lo's first one, before b1
  std::int64_t scan = 0;        // later first boundaries tried: b1 + a·P for a = 0..scan
  std::int64_t k = 0;           // the reduced step's micro-batches
};

// The periods of a pipelined scenario, or nothing (with why) when it has too few micro-batches.
std::optional<PipelinePeriods> pipeline_periods(const Scenario& scenario, std::string& why) {
  const ParallelConfig& par = scenario.parallelism;
  const bool interleaved =
      par.schedule == ParallelConfig::PipelineSchedule::kInterleaved1F1B && par.virtual_stages > 1;
  const std::int64_t pp = par.pp;
  PipelinePeriods p;
  p.v = par.virtual_stages;
  p.period_mbs = interleaved ? pp : 1;
  p.period = interleaved ? pp * p.v : 1;
  p.m = grad_accum_steps(scenario.training, par);
  // The engine's state may repeat only after q periods (flows can change slots from one
  // period to the next, a permutation that comes back): boundaries at b1 + i·P for i = 0..Q,
  // and M - K a multiple of Q periods so that any q dividing Q extrapolates. K (1F1B): the
  // warm-up (pp - 1 forwards on stage 0), one period of margin for lo (the first steady
  // period often differs from the next), one period below b1, Q periods up to the last
  // boundary, which must stay below stage 0's last steady index (K - pp, the last micro-batch's
  // forward): K = pp + Q + 3. Tasks of later stages in flight at a boundary run ahead of stage
  // 0 in index but have windows that end later by as much (see stage_hi below); the engine
  // checks each against its own stage's window. Interleaved: stage 0's steady indices end at
  // about (K/pp - 1)·pp·v.
  p.q_max = interleaved ? 2 : kMaxPeriodMultiple;
  // Interleaved stages with unequal work (chunks of unequal layer counts: the embedding and
  // loss slots of PipelineLayout, a listed layout, MTP modules on the last chunk) settle a
  // period later: their timing still moves by a few ns from the first steady period to the
  // next. One more period of margin for those when the micro-batches allow it (the GB200 Llama
  // 3.1 405B row of validation table 6 finds its period with it); not for equal chunks, whose
  // reduced step it would make a seventh longer.
  const bool unequal_chunks =
      pipeline_layout(scenario.model.layers, par).unequal() || scenario.model.mtp_layers > 0;
  if (interleaved && unequal_chunks && p.m > pp * (p.q_max + 6)) p.margin = 1;
  // Some settle later still: validation rows whose states repeat only from 1 to 4 periods after
  // b1 (GB200 DeepSeek-V3, 61 layers and MTP over PP 4 x VP 4: 1; GB300 Llama 3.1 405B, PP 8 x
  // VP 4: 2 and 4; H100 Qwen3-235B-A22B, PP 8 x VP 4: 4). Before, a lane of a later stage holds
  // a growing queue of ready ops, or flows sit a few ns apart from one period to the next. The
  // probe then also takes boundaries up to kSettleScan periods later and uses the first pair of
  // equal states (period_pair), as many as the micro-batches allow with the margin's room.
  if (interleaved && unequal_chunks) {
    for (p.scan = kSettleScan; p.scan > 0; --p.scan) {
      if (p.m > pp * (p.q_max + 6 + p.margin + p.scan)) break;
    }
  }
  p.k = interleaved ? pp * (p.q_max + 5 + p.margin + p.scan) : pp + 3 + p.q_max;
  if (p.m > p.k) p.k += (p.m - p.k) % (p.q_max * p.period_mbs);
  if (p.m <= p.k || p.m > std::int64_t{1} << 30 || (p.m - p.k) % p.period_mbs != 0) {
    why = fmt::format("{} micro-batches (the pipeline fast path needs more than {})", p.m, p.k);
    return std::nullopt;
  }
  return p;
}

// A reduced step's pipeline tasks, indexed: each task's kind, its stage's window top, the task
// one period on, and the task that holds an op or a tensor.
class PipelineIndex {
 public:
  PipelineIndex(const sim::Plan& plan, const std::vector<PipelineTask>& tasks,
                const PipelinePeriods& p)
      : plan_(plan), tasks_(tasks), v_(p.v), period_(p.period) {}

  // Indexes the tasks; false (with why) when they are not in op order.
  bool build(std::int64_t k, std::string& why) {
    if (!index_kinds(k, why)) return false;
    cap_at_steady_end();
    index_tensors();
    return true;
  }

  // A task's kind: (stage, chunk, direction, receive).
  std::uint32_t kind_of(const PipelineTask& t) const {
    return static_cast<std::uint32_t>(((t.stage * v_ + t.chunk) * 2 + (t.forward ? 1 : 0)) * 2 +
                                      (t.receive ? 1 : 0));
  }

  // The window top of a task's stage (every task's stage has one once built).
  std::int64_t hi_of(const PipelineTask& t) const { return stage_hi_.find(t.stage)->second; }

  // The lowest window top (the boundaries' stage 0).
  std::int64_t hi() const {
    std::int64_t hi = std::numeric_limits<std::int64_t>::max();
    for (const auto& [stage, top] : stage_hi_) hi = std::min(hi, top);
    return hi;
  }

  // The task that holds op `x`, or nothing.
  const PipelineTask* task_of_op(std::size_t x) const {
    auto it = std::upper_bound(tasks_.begin(), tasks_.end(), x,
                               [](std::size_t o, const PipelineTask& t) { return o < t.op_begin; });
    if (it == tasks_.begin()) return nullptr;
    --it;
    return x < it->op_end ? &*it : nullptr;
  }

  // The task that holds tensor `x`, or nothing.
  const PipelineTask* task_of_tensor(std::size_t x) const {
    auto it =
        std::upper_bound(with_tensors_.begin(), with_tensors_.end(), x,
                         [&](std::size_t o, std::size_t t) { return o < tasks_[t].tensor_begin; });
    if (it == with_tensors_.begin()) return nullptr;
    --it;
    return x < tasks_[*it].tensor_end ? &tasks_[*it] : nullptr;
  }

  // The task of the same kind one period on, or nothing.
  const PipelineTask* next_of(const PipelineTask& t) const {
    auto it = by_kind_.find({kind_of(t), t.index + period_});
    return it == by_kind_.end() ? nullptr : &tasks_[it->second];
  }

  // lo: the lowest index from which every period is identical to the next, up to hi.
  std::int64_t steady_lo() const {
    std::int64_t lo = 0;
    for (const PipelineTask& t : tasks_) {
      if (t.index < 0 || t.index + period_ > hi_of(t)) continue;
      const PipelineTask* n = next_of(t);
      if (n == nullptr || !same_task(t, *n)) lo = std::max(lo, t.index + 1);
    }
    return lo;
  }

  // The ops of the tasks with index in [from, to).
  std::int64_t ops_in(std::int64_t from, std::int64_t to) const {
    std::int64_t ops = 0;
    for (const PipelineTask& t : tasks_) {
      if (t.index >= from && t.index < to) ops += static_cast<std::int64_t>(t.op_end - t.op_begin);
    }
    return ops;
  }

 private:
  // Each stage's window top: below the stage's last steady index (its forwards after warm-up)
  // and below the indices of its tasks of the last micro-batch (a receive belongs to its send's
  // stage and index). Stages run skewed in index (in 1F1B stage s is about s·t_b / (t_f + t_b)
  // indices ahead of stage 0 at any instant and its steady range ends s indices later), so each
  // stage keeps its own window; hi is the lowest of them (the boundaries' stage 0).
  bool index_kinds(std::int64_t k, std::string& why) {
    for (std::size_t i = 0; i < tasks_.size(); ++i) {
      const PipelineTask& t = tasks_[i];
      by_kind_[{kind_of(t), t.index}] = i;
      stage_hi_.try_emplace(t.stage, std::numeric_limits<std::int64_t>::max() / 2);
      if (t.mb == k - 1) stage_hi_[t.stage] = std::min(stage_hi_[t.stage], t.index - 1);
      if (i > 0 && t.op_begin < tasks_[i - 1].op_end) {
        why = "pipeline tasks out of order";
        return false;
      }
    }
    return true;
  }

  // Caps each stage's window top below its forwards' highest index.
  void cap_at_steady_end() {
    std::map<int, std::int64_t> steady_end;  // stage -> its forwards' highest index
    for (const PipelineTask& t : tasks_) {
      if (!t.receive && t.forward) steady_end[t.stage] = std::max(steady_end[t.stage], t.index);
    }
    for (const auto& [stage, last] : steady_end) {
      stage_hi_[stage] = std::min(stage_hi_[stage], last - 1);
    }
  }

  // Tasks with tensors, by first tensor, for mapping a reference into the next period.
  void index_tensors() {
    for (std::size_t i = 0; i < tasks_.size(); ++i) {
      if (tasks_[i].tensor_end > tasks_[i].tensor_begin) with_tensors_.push_back(i);
    }
    std::sort(with_tensors_.begin(), with_tensors_.end(), [&](std::size_t a, std::size_t b) {
      return tasks_[a].tensor_begin < tasks_[b].tensor_begin;
    });
  }

  // Op `y` is op `x` moved one period on (or the same op outside the tasks).
  bool moved_op(std::size_t x, std::size_t y) const {
    const PipelineTask* t = task_of_op(x);
    if (t == nullptr) return y == x;
    const PipelineTask* n = next_of(*t);
    return n != nullptr && n->op_end - n->op_begin == t->op_end - t->op_begin &&
           y == n->op_begin + (x - t->op_begin);
  }

  // Tensor `y` is tensor `x` moved one period on (or the same tensor outside the tasks).
  bool moved_tensor(std::size_t x, std::size_t y) const {
    const PipelineTask* t = task_of_tensor(x);
    if (t == nullptr) return y == x;
    const PipelineTask* n = next_of(*t);
    return n != nullptr && n->tensor_end - n->tensor_begin == t->tensor_end - t->tensor_begin &&
           y == n->tensor_begin + (x - t->tensor_begin);
  }

  // Op `y` is op `x` one period on: same fields, references moved.
  bool same_op(const sim::Op& x, const sim::Op& y) const {
    if (x.lane != y.lane || x.kind != y.kind || x.category != y.category || x.layer != y.layer ||
        !(x.cost == y.cost) || x.deps.size() != y.deps.size() ||
        x.allocs.size() != y.allocs.size() || x.frees.size() != y.frees.size()) {
      return false;
    }
    for (std::size_t j = 0; j < x.deps.size(); ++j) {
      if (!moved_op(x.deps[j].index(), y.deps[j].index())) return false;
    }
    for (std::size_t j = 0; j < x.allocs.size(); ++j) {
      if (!moved_tensor(x.allocs[j].index(), y.allocs[j].index())) return false;
    }
    for (std::size_t j = 0; j < x.frees.size(); ++j) {
      if (!moved_tensor(x.frees[j].index(), y.frees[j].index())) return false;
    }
    return true;
  }

  // Task `b` is task `a` one period on, op for op and tensor for tensor.
  bool same_task(const PipelineTask& a, const PipelineTask& b) const {
    if (b.op_end - b.op_begin != a.op_end - a.op_begin ||
        b.tensor_end - b.tensor_begin != a.tensor_end - a.tensor_begin) {
      return false;
    }
    for (std::size_t i = 0; i < a.op_end - a.op_begin; ++i) {
      if (!same_op(plan_.ops[a.op_begin + i], plan_.ops[b.op_begin + i])) return false;
    }
    for (std::size_t i = 0; i < a.tensor_end - a.tensor_begin; ++i) {
      const sim::Tensor& x = plan_.tensors[a.tensor_begin + i];
      const sim::Tensor& y = plan_.tensors[b.tensor_begin + i];
      if (x.pool != y.pool || x.bytes != y.bytes || x.category != y.category) return false;
    }
    return true;
  }

  const sim::Plan& plan_;
  const std::vector<PipelineTask>& tasks_;
  std::int64_t v_;
  std::int64_t period_;
  std::map<int, std::int64_t> stage_hi_;
  std::map<std::pair<std::uint32_t, std::int64_t>, std::size_t> by_kind_;
  std::vector<std::size_t> with_tensors_;
};

// The probe's segments and boundaries: boundaries at b1 + i·P, i = 0..Q + scan; the last
// micro-batch's tasks stand for the full step's last: outside the periodic segments (ids written as
// they are; they may only wait at a boundary). False (with why) when a boundary has no task.
bool fill_period_probe(const PipelineIndex& index, const std::vector<PipelineTask>& tasks,
                       const PipelinePeriods& p, std::int64_t lo, std::int64_t b1,
                       sim::detail::PeriodProbe& probe, std::string& why) {
  for (const PipelineTask& t : tasks) {
    if (t.mb == p.k - 1) continue;
    probe.segments.push_back({.op_begin = static_cast<std::uint32_t>(t.op_begin),
                              .op_end = static_cast<std::uint32_t>(t.op_end),
                              .tensor_begin = static_cast<std::uint32_t>(t.tensor_begin),
                              .tensor_end = static_cast<std::uint32_t>(t.tensor_end),
                              .kind = index.kind_of(t),
                              .index = t.index,
                              .hi = index.hi_of(t)});
  }
  for (std::int64_t i = 0; i <= p.q_max + p.scan; ++i) {
    const std::int64_t base = b1 + i * p.period;
    const PipelineTask* first = nullptr;
    for (const PipelineTask& t : tasks) {
      if (t.stage == 0 && t.forward && !t.receive && t.index == base &&
          (first == nullptr || t.op_begin < first->op_begin)) {
        first = &t;
      }
    }
    if (first == nullptr || first->op_end == first->op_begin) {
      why = "no boundary task";
      return false;
    }
    probe.boundaries.push_back({.first_op = static_cast<std::uint32_t>(first->op_begin),
                                .first_tensor = static_cast<std::uint32_t>(first->tensor_begin),
                                .index = base,
                                .min_index = lo + i * p.period,
                                .max_index = std::numeric_limits<std::int64_t>::max()});
  }
  return true;
}

// A pair of probe boundaries with equal states: a (the first, b1 + a·P) and a + q.
struct PeriodPair {
  std::int64_t a = 0;
  std::int64_t q = 0;  // 0: none
};
// The first pair (smallest a, then the smallest q dividing Q) of boundaries a and a + q, both
// quiet (nothing above hi - q·P started at boundary a), with equal states; q = 0 (with why)
// when none is. Boundary a's window starts at lo + a·P (Boundary::min_index): within [lo, hi],
// so the argument above holds for the pair as for boundaries 0 and q.
PeriodPair period_pair(const sim::detail::PeriodProbe& probe, const PipelinePeriods& p,
                       std::int64_t lo, std::int64_t hi, std::int64_t b1, std::string& why) {
  why = "no periodic state";
  bool differs = false;  // why names the first quiet pair's difference
  for (std::int64_t a = 0; a <= p.scan; ++a) {
    const auto& s1 = probe.snapshots[static_cast<std::size_t>(a)];
    for (std::int64_t c = 1; c <= p.q_max; ++c) {
      const auto& sc = probe.snapshots[static_cast<std::size_t>(a + c)];
      if (p.q_max % c != 0 || !s1.taken || !sc.taken) continue;
      if (!s1.quiet || !sc.quiet || s1.highest_over > -c * p.period) {
        why = fmt::format(
            "tasks in flight beyond the window (indices {}..{} and {}..{} at boundaries {} and "
            "{}, {} and {} above their stage's window, window {}..{} on stage 0)",
            s1.lowest_index, s1.highest_index, sc.lowest_index, sc.highest_index, b1 + a * p.period,
            b1 + (a + c) * p.period, s1.highest_over, sc.highest_over, lo, hi);
        continue;
      }
      if (s1.state == sc.state && sc.time_ns > s1.time_ns) return {.a = a, .q = c};
      if (!differs) {
        differs = true;
        why = fmt::format("no periodic state (the boundaries' states first differ in {})",
                          sim::detail::first_difference(s1.state, sc.state));
      }
    }
  }
  return {};
}

// Each pool's peak keeps its live tensors' names: before t2 no tensor of the last micro-batch
// (which the reduced step renames), after t2 only tensors outside the tasks or of the last
// micro-batch. False (with why) otherwise.
bool pipeline_peaks_keep_names(const sim::Timeline& t, sim::TimePoint t2,
                               const sim::detail::PeriodProbe& probe, const PipelineIndex& index,
                               std::int64_t k, std::string& why) {
  for (std::size_t p = 0; p < t.pools.size(); ++p) {
    if (t.pools[p].peak_bytes == 0) continue;
    const bool before = t.pools[p].peak_time <= t2;
    for (std::uint32_t id : probe.live_at_peak[p]) {
      const PipelineTask* owner = index.task_of_tensor(id);
      const bool last = owner != nullptr && owner->mb == k - 1;
      if (before ? last : (owner != nullptr && !last)) {
        why = "a pool's peak holds tensors whose names move";
        return false;
      }
    }
  }
  return true;
}

std::optional<Report> pipeline_steady_state_report(const ResolvedScenario& resolved,
                                                   const EvalOptions& options, std::string& why) {
  const Scenario& scenario = resolved.scenario();
  const std::optional<PipelinePeriods> periods = pipeline_periods(scenario, why);
  if (!periods) return std::nullopt;
  const PipelinePeriods& p = *periods;
  sim::Result<BuiltStep> built = build_reduced_step(resolved, options, p.k, p.m, why);
  if (!built) return std::nullopt;
  const BuiltStep& step = *built;
  const sim::Plan& plan = step.plan;
  const std::vector<PipelineTask>& tasks = step.pipeline_tasks;
  if (tasks.empty() || step.ranks.empty()) {
    why = "no pipeline task structure";
    return std::nullopt;
  }
  PipelineIndex index(plan, tasks, p);
  if (!index.build(p.k, why)) return std::nullopt;
  const std::int64_t hi = index.hi();
  const std::int64_t lo = index.steady_lo();
  // Boundaries at b1 + i·P, i = 0..Q + scan, one period (and the margin) above lo.
  const std::int64_t b1 = lo + (1 + p.margin) * p.period;
  if (b1 + (p.q_max + p.scan) * p.period > hi) {
    why = fmt::format("no identical periods in the reduced step's steady state (from {} to {})", lo,
                      hi);
    return std::nullopt;
  }
  sim::detail::PeriodProbe probe;
  if (!fill_period_probe(index, tasks, p, lo, b1, probe, why)) return std::nullopt;
  probe.timed_lanes = {step.ranks.front().compute_lane};  // what split_time walks
  // With no usable boundary pair the run stops at the last boundary (its cool-down is wasted).
  probe.keep_running = [&](const sim::detail::PeriodProbe& pr) {
    return period_pair(pr, p, lo, hi, b1, why).q != 0;
  };
  std::optional<sim::SimResult> result = simulate_reduced(plan, options, probe, why);
  if (!result) return std::nullopt;
  const sim::Timeline& t = result->timeline;
  const PeriodPair pair = period_pair(probe, p, lo, hi, b1, why);
  const std::int64_t q = pair.q;
  if (q == 0) return std::nullopt;
  const std::int64_t ba = b1 + pair.a * p.period;  // the pair's first boundary
  const auto& s1 = probe.snapshots[static_cast<std::size_t>(pair.a)];
  const auto& s2 = probe.snapshots[static_cast<std::size_t>(pair.a + q)];
  const std::int64_t extra = (p.m - p.k) / (q * p.period_mbs);
  const std::int64_t period_ns = s2.time_ns - s1.time_ns;
  const sim::TimePoint t1{sim::Duration{s1.time_ns}};
  const sim::TimePoint t2{sim::Duration{s2.time_ns}};
  if (!failures_in_prefix(t, t2, why)) return std::nullopt;
  if (!pipeline_peaks_keep_names(t, t2, probe, index, p.k, why)) return std::nullopt;
  const std::int64_t period_ops = index.ops_in(ba, ba + q * p.period);  // q periods' tasks
  Extrapolation x;
  x.makespan = t.makespan + sim::Duration{extra * period_ns};
  x.plan_ops = static_cast<std::int64_t>(plan.ops.size()) + extra * period_ops;
  const SimRankInfo& crit = step.ranks.front();
  x.split = sim::split_time(plan, t, crit.compute_lane);
  x.split.add(sim::split_time(plan, t, crit.compute_lane, StartWindow{t1, t2}), extra);
  return report_of(scenario, step, t, &x);
}

// One rank's HBM allocs and frees in simulated order, as the allocator sees them: the initial
// tensors (weights, optimizer state) first, allocated on the compute stream, then each op's
// allocations on its lane's stream (a block returns to the pool it came from) and its frees,
// ordered by (time, frees before allocs as the engine orders an instant, op, position).
struct RankAllocEvents {
  struct Timed {
    std::int64_t time;
    int phase;
    std::size_t op;
    std::size_t pos;
    AllocEvent event;
  };
  std::vector<Timed> timed;
  std::vector<AllocEvent> events;  // the initial tensors', then timed's events in order
  std::size_t first_timed = 0;     // events[first_timed + i] is timed[i].event
};

RankAllocEvents rank_alloc_events(const sim::Plan& plan, const std::vector<const sim::Span*>& by_op,
                                  const SimRankInfo& info) {
  using Timed = RankAllocEvents::Timed;
  const std::size_t pool = info.hbm_pool.index();
  const auto mine = [&](sim::TensorId id) {
    const sim::Tensor& x = plan.tensors[id.index()];
    return x.pool.index() == pool && x.category != sim::TensorCategory::kRuntime;
  };
  RankAllocEvents out;
  const std::uint32_t compute = info.compute_lane.value();
  for (sim::TensorId id : plan.initial_tensors) {
    if (mine(id))
      out.events.push_back({id.value(), plan.tensors[id.index()].bytes, false, compute});
  }
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    const sim::Span* s = by_op[i];
    if (s == nullptr) continue;
    const sim::Op& op = plan.ops[i];
    for (std::size_t j = 0; j < op.allocs.size(); ++j) {
      if (!mine(op.allocs[j])) continue;
      out.timed.push_back({s->start.time_since_epoch().count(),
                           1,
                           i,
                           j,
                           {op.allocs[j].value(), plan.tensors[op.allocs[j].index()].bytes, false,
                            op.lane.value()}});
    }
    for (std::size_t j = 0; j < op.frees.size(); ++j) {
      if (!mine(op.frees[j])) continue;
      out.timed.push_back({s->end.time_since_epoch().count(),
                           0,
                           i,
                           j,
                           {op.frees[j].value(), plan.tensors[op.frees[j].index()].bytes, true}});
    }
  }
  std::sort(out.timed.begin(), out.timed.end(), [](const Timed& a, const Timed& b) {
    return std::tie(a.time, a.phase, a.op, a.pos) < std::tie(b.time, b.phase, b.op, b.pos);
  });
  out.first_timed = out.events.size();
  for (const Timed& x : out.timed) out.events.push_back(x.event);
  return out;
}

// The allocator's failure at events[at] of a rank: reserved memory went past what the allocator
// may hold.
OomReport allocator_oom(const sim::Plan& plan, const SimRankInfo& info, const RankAllocEvents& ev,
                        const AllocatorReplay& a, std::size_t at, const RuntimeModel& rt,
                        std::int64_t outside) {
  OomReport o;
  o.pool = plan.pools[info.hbm_pool.index()].name;
  o.pool_kind = sim::PoolKind::kHbm;
  o.requested_bytes = ev.events[at].bytes;
  o.in_use_bytes = a.reserved_at_failure_bytes + outside;
  o.capacity_bytes = rt.allocator_limit_bytes + outside;
  o.op = "initial_tensors";
  if (at >= ev.first_timed) {
    const RankAllocEvents::Timed& x = ev.timed[at - ev.first_timed];
    o.op = plan.ops[x.op].name + " (allocator: reserved memory)";
    o.time_s = sim::to_seconds(sim::Duration{x.time});
  }
  return o;
}

// Out of memory in this framework although the tensors alone fit (or a second reason when they
// did not): the pool is listed over capacity once, and a step that fitted no longer does.
void mark_allocator_oom(const OomReport& o, std::int64_t demand_bytes, Report& r) {
  const bool already = std::any_of(r.over_capacity.begin(), r.over_capacity.end(),
                                   [&](const PoolDemand& d) { return d.pool == o.pool; });
  if (!already) {
    PoolDemand d;
    d.pool = o.pool;
    d.capacity_bytes = o.capacity_bytes;
    d.demand_bytes = demand_bytes;
    d.overshoot_bytes = d.demand_bytes - d.capacity_bytes;
    d.first_failure = o;
    r.over_capacity.push_back(d);
  }
  if (!r.oom) r.oom = o;
  if (r.fits) {
    r.fits = false;
    r.outcome = sim::to_string(sim::OutcomeKind::kOutOfMemory);
    r.tokens_per_s = r.tokens_per_s_per_gpu = r.tflops_per_gpu = r.hw_tflops_per_gpu = 0.0;
    r.mfu = r.hfu = 0.0;
    r.time = TimeSplit{};
  }
}

// The framework's device allocator over each rank's HBM allocs and frees in simulated order
// (runtime.h): reserved memory per rank, and a step that fits its tensors but not the
// allocator's reserved memory (fragmentation, block rounding) does not fit.
void apply_allocator(const BuiltStep& step, const sim::Timeline& t, Report& r) {
  const RuntimeModel& rt = step.runtime;
  if (rt.runtime == HardwareConfig::Runtime::kNone) return;
  const sim::Plan& plan = step.plan;
  std::vector<const sim::Span*> by_op(plan.ops.size(), nullptr);
  for (const sim::Span& s : t.spans) by_op[s.op.index()] = &s;
  const std::int64_t outside = rt.preallocated ? 0 : rt.cuda_context_bytes + rt.nccl_bytes;
  for (std::size_t k = 0; k < step.ranks.size() && k < r.ranks.size(); ++k) {
    const SimRankInfo& info = step.ranks[k];
    if (info.hbm_pool.index() >= plan.pools.size()) continue;
    const RankAllocEvents ev = rank_alloc_events(plan, by_op, info);
    const AllocatorReplay a = replay_allocator(rt, ev.events, rt.allocator_limit_bytes);
    RankReport& rr = r.ranks[k];
    rr.hbm_reserved_bytes =
        (rt.preallocated ? rt.allocator_limit_bytes : a.reserved_peak_bytes) + outside;
    r.hbm_reserved_bytes = std::max(r.hbm_reserved_bytes, rr.hbm_reserved_bytes);
    if (a.first_failure < 0) continue;
    const OomReport o =
        allocator_oom(plan, info, ev, a, static_cast<std::size_t>(a.first_failure), rt, outside);
    mark_allocator_oom(o, a.reserved_peak_bytes + outside, r);
  }
}

}  // namespace

Report make_report(const Scenario& scenario, const BuiltStep& step, const sim::Timeline& t) {
  return report_of(scenario, step, t, nullptr);
}

sim::Result<Evaluation> evaluate(const Scenario& scenario, const EvalOptions& options) {
  OFFSIM_ASSIGN_OR_RETURN(ResolvedScenario resolved, resolve(scenario));
  return evaluate(resolved, options);
}

sim::Result<Evaluation> evaluate(const ResolvedScenario& resolved, const EvalOptions& options) {
  const Scenario& scenario = resolved.scenario();
  if (options.early_answers && !options.keep_timeline && !options.keep_plan) {
    if (std::optional<Report> early = static_memory_report(resolved, options.build)) {
      Evaluation e;
      e.report = std::move(*early);
      e.early_answer = true;
      return e;
    }
  }
  std::string why = "disabled";
  if (scenario.hardware.runtime != HardwareConfig::Runtime::kNone) {
    why = "hardware.runtime: the allocator replay needs the whole step's allocation order";
  } else if (scenario.parallelism.moe_a2a_overlap) {
    why = "parallelism.moe_a2a_overlap: a combined step's two passes run on two compute streams";
  } else if (options.steady_state && !options.keep_timeline && !options.keep_plan) {
    std::optional<Report> report = scenario.parallelism.pp == 1
                                       ? steady_state_report(resolved, options, why)
                                       : pipeline_steady_state_report(resolved, options, why);
    if (report) {
      Evaluation e;
      e.report = std::move(*report);
      e.steady_state = true;
      return e;
    }
  }
  // A reduced step the cancel flag stopped: stop here rather than build the full one.
  if (options.cancel != nullptr && options.cancel->load(std::memory_order_relaxed)) {
    return sim::fail(sim::ErrorCode::kCancelled,
                     "evaluation cancelled before simulating the full step ({})", why);
  }
  OFFSIM_ASSIGN_OR_RETURN(BuiltStep step, build_step(resolved, options.build));
  sim::SimOptions sim_options;
  sim_options.record_spans = true;
  sim_options.record_memory = options.keep_timeline;
  sim_options.validate_plan = false;  // build_step's plans are valid by construction (tested)
  sim_options.cancel = options.cancel;
  // A step that does not fit still runs to its end, so the report gives each pool's demand.
  sim_options.run_past_capacity = true;
  sim_options.record_op_infos = options.keep_timeline;  // the report reads the plan
  OFFSIM_ASSIGN_OR_RETURN(sim::SimResult result, sim::simulate(step.plan, sim_options));
  Evaluation e;
  e.report = make_report(scenario, step, result.timeline);
  apply_allocator(step, result.timeline, e.report);
  e.full_path_reason = std::move(why);
  if (options.keep_timeline) e.timeline = std::move(result.timeline);
  if (options.keep_plan) e.plan = std::move(step.plan);
  return e;
}

void retain_freed_memory() {
#if defined(__GLIBC__)
  // Large blocks come from the heap, not from per-block mappings, and the heap is never trimmed.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
#endif
}

}  // namespace offsim::models
