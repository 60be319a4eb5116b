#include "models/evaluate.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "sim/engine/simulator.h"

namespace offsim::models {

namespace {

void add_to(MemoryBreakdown& m, const std::string& category, std::int64_t bytes) {
  if (category == "params") {
    m.params_bytes += bytes;
  } else if (category == "grads") {
    m.grads_bytes += bytes;
  } else if (category == "optimizer") {
    m.optimizer_bytes += bytes;
  } else if (category == "activations") {
    m.activations_bytes += bytes;
  } else if (category == "buffers") {
    m.buffers_bytes += bytes;
  } else {
    m.workspace_bytes += bytes;
  }
}

const sim::PoolTrace* find_pool(const sim::Timeline& t, const std::string& name) {
  for (const sim::PoolTrace& p : t.pools) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

// Attributes the compute lane's time of one rank: busy time by the running op's category, idle
// time by the kind of the dependency that ended last before the next op could start.
TimeSplit split_time(const sim::Plan& plan, const sim::Timeline& t, const std::string& lane_name,
                     const std::string& rank_prefix) {
  TimeSplit split;
  std::vector<const sim::Span*> by_op(plan.ops.size(), nullptr);
  for (const sim::Span& s : t.spans) {
    if (s.op.index() < by_op.size()) by_op[s.op.index()] = &s;
  }
  std::optional<sim::LaneId> lane;
  for (std::size_t i = 0; i < plan.lanes.size(); ++i) {
    if (plan.lanes[i].name == lane_name) lane = sim::LaneId(i);
  }
  if (!lane) return split;
  const auto idle_bucket = [&](const sim::Op& op) -> double& {
    if (op.kind == sim::OpKind::kCopy) return split.exposed_offload_s;
    if (op.kind == sim::OpKind::kHostCompute) return split.cpu_optimizer_s;
    if (op.kind == sim::OpKind::kP2P) return split.bubble_s;
    if (op.kind == sim::OpKind::kCollective) return split.exposed_comm_s;
    return split.other_s;
  };
  sim::TimePoint cursor = sim::kTimeZero;
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    const sim::Op& op = plan.ops[i];
    if (op.lane != *lane || by_op[i] == nullptr) continue;
    const sim::Span& s = *by_op[i];
    if (s.start > cursor) {
      const sim::Op* blocker = nullptr;
      sim::TimePoint latest = sim::kTimeZero;
      for (sim::OpId dep : op.deps) {
        const sim::Span* ds = by_op[dep.index()];
        if (ds != nullptr && ds->end >= latest) {
          latest = ds->end;
          blocker = &plan.ops[dep.index()];
        }
      }
      const double gap = sim::to_seconds(s.start - cursor);
      if (blocker != nullptr) {
        idle_bucket(*blocker) += gap;
      } else {
        split.other_s += gap;
      }
    }
    const double busy = sim::to_seconds(s.end - std::max(s.start, cursor));
    if (op.category == "recompute") {
      split.recompute_s += busy;
    } else if (op.category == "comm") {
      split.exposed_comm_s += busy;
    } else {
      split.compute_s += busy;
    }
    cursor = std::max(cursor, s.end);
  }
  // The tail after the last compute op: in each piece of it, the most telling op of this rank
  // still running (CPU optimizer, then copies, then collectives); nothing running = waiting on
  // another pipeline stage.
  if (t.makespan > cursor) {
    std::vector<std::size_t> active;
    std::vector<sim::TimePoint> cuts = {cursor, t.makespan};
    for (std::size_t i = 0; i < plan.ops.size(); ++i) {
      if (by_op[i] == nullptr || by_op[i]->end <= cursor) continue;
      if (plan.lanes[plan.ops[i].lane.index()].name.rfind(rank_prefix, 0) != 0) continue;
      active.push_back(i);
      cuts.push_back(std::max(cursor, by_op[i]->start));
      cuts.push_back(by_op[i]->end);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    const auto rank_of = [](sim::OpKind k) {
      switch (k) {
        case sim::OpKind::kHostCompute:
          return 4;
        case sim::OpKind::kCopy:
          return 3;
        case sim::OpKind::kCollective:
          return 2;
        case sim::OpKind::kP2P:
          return 1;
        default:
          return 0;
      }
    };
    for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
      const double piece = sim::to_seconds(cuts[c + 1] - cuts[c]);
      const sim::Op* best = nullptr;
      for (std::size_t i : active) {
        const sim::Span& s = *by_op[i];
        if (s.start <= cuts[c] && s.end >= cuts[c + 1] &&
            (best == nullptr || rank_of(plan.ops[i].kind) > rank_of(best->kind))) {
          best = &plan.ops[i];
        }
      }
      if (best != nullptr) {
        idle_bucket(*best) += piece;
      } else {
        split.bubble_s += piece;
      }
    }
  }
  return split;
}

}  // namespace

Report make_report(const Scenario& scenario, const BuiltStep& step, const sim::Timeline& t) {
  Report r;
  r.scenario = scenario.name;
  r.outcome = sim::to_string(t.outcome.kind);
  r.fits = t.outcome.kind == sim::OutcomeKind::kCompleted;
  r.gpus = step.gpus;
  r.step_time_s = sim::to_seconds(t.makespan);
  r.flags = step.flags;
  r.metadata = t.metadata;
  r.plan_ops = static_cast<std::int64_t>(step.plan.ops.size());
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
  std::map<std::string, bool> hosts_seen;
  for (const SimRankInfo& info : step.ranks) {
    RankReport rr;
    rr.name = fmt::format("rank{} (stage {})", info.rank, info.stage);
    rr.multiplicity = info.multiplicity;
    if (const sim::PoolTrace* p = find_pool(t, info.hbm_pool)) {
      rr.hbm_peak_bytes = p->peak_bytes;
      rr.hbm_capacity_bytes = p->capacity_bytes;
      rr.live_at_peak = p->live_at_peak;
      for (const sim::LiveTensor& lt : p->live_at_peak) add_to(rr.memory, lt.category, lt.bytes);
    }
    if (const sim::PoolTrace* h = find_pool(t, info.host_pool); h && !hosts_seen[info.host_pool]) {
      hosts_seen[info.host_pool] = true;
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
    r.time = split_time(step.plan, t, crit.compute_lane, fmt::format("rank{}.", crit.rank));
  }
  if (t.outcome.oom) {
    const sim::OutOfMemory& o = *t.outcome.oom;
    r.oom = OomReport{.op = o.op_name,
                      .pool = o.pool,
                      .time_s = sim::to_seconds(o.time),
                      .requested_bytes = o.requested_bytes,
                      .in_use_bytes = o.in_use_bytes,
                      .capacity_bytes = o.capacity_bytes,
                      .live = o.live};
  }
  if (r.live_at_peak.size() > 20) r.live_at_peak.resize(20);
  return r;
}

sim::Result<Evaluation> evaluate(const Scenario& scenario, const EvalOptions& options) {
  OFFSIM_ASSIGN_OR_RETURN(BuiltStep step, build_step(scenario, options.build));
  sim::SimOptions sim_options;
  sim_options.record_spans = true;
  sim_options.record_memory = options.keep_timeline;
  sim_options.validate_plan = false;  // build_step's plans are valid by construction (tested)
  sim_options.cancel = options.cancel;
  OFFSIM_ASSIGN_OR_RETURN(sim::SimResult result, sim::simulate(step.plan, sim_options));
  Evaluation e;
  e.report = make_report(scenario, step, result.timeline);
  if (options.keep_timeline) e.timeline = std::move(result.timeline);
  if (options.keep_plan) e.plan = std::move(step.plan);
  return e;
}

}  // namespace offsim::models
