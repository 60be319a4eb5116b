#include "models/report.h"

#include <map>

namespace offsim::models {

namespace {

nlohmann::json live_json(const std::vector<sim::LiveTensor>& live) {
  nlohmann::json a = nlohmann::json::array();
  for (const sim::LiveTensor& t : live) {
    a.push_back({{"name", t.name}, {"category", sim::to_string(t.category)}, {"bytes", t.bytes}});
  }
  return a;
}

nlohmann::json memory_json(const MemoryBreakdown& m) {
  return {{"params_bytes", m.params_bytes},       {"grads_bytes", m.grads_bytes},
          {"optimizer_bytes", m.optimizer_bytes}, {"activations_bytes", m.activations_bytes},
          {"buffers_bytes", m.buffers_bytes},     {"workspace_bytes", m.workspace_bytes},
          {"transient_bytes", m.transient_bytes}, {"runtime_bytes", m.runtime_bytes}};
}

nlohmann::json oom_json(const OomReport& o) {
  return {{"op", o.op},
          {"pool", o.pool},
          {"time_s", o.time_s},
          {"requested_bytes", o.requested_bytes},
          {"in_use_bytes", o.in_use_bytes},
          {"capacity_bytes", o.capacity_bytes},
          {"live", live_json(o.live)}};
}

// A figure that exists only for a step that fits: null otherwise.
nlohmann::json if_fits(const Report& r, double v) {
  return r.fits ? nlohmann::json(v) : nlohmann::json(nullptr);
}

}  // namespace

nlohmann::json report_to_json(const Report& r) {
  nlohmann::json j;
  j["scenario"] = r.scenario;
  j["outcome"] = r.outcome;
  j["fits"] = r.fits;
  j["gpus"] = r.gpus;
  j["step_time_s"] = if_fits(r, r.step_time_s);
  j["tokens_per_s"] = if_fits(r, r.tokens_per_s);
  j["tokens_per_s_per_gpu"] = if_fits(r, r.tokens_per_s_per_gpu);
  j["tflops_per_gpu"] = if_fits(r, r.tflops_per_gpu);
  j["hw_tflops_per_gpu"] = if_fits(r, r.hw_tflops_per_gpu);
  j["mfu"] = if_fits(r, r.mfu);
  j["hfu"] = if_fits(r, r.hfu);
  j["hbm_peak_bytes"] = r.hbm_peak_bytes;
  j["hbm_capacity_bytes"] = r.hbm_capacity_bytes;
  j["hbm_reserved_bytes"] = r.hbm_reserved_bytes;
  j["host_peak_bytes"] = r.host_peak_bytes;
  j["host_capacity_bytes"] = r.host_capacity_bytes;
  j["worst_rank"] = r.worst_rank;
  j["memory"] = memory_json(r.memory);
  j["live_at_peak"] = live_json(r.live_at_peak);
  j["time"] = {{"compute_s", r.time.compute_s},
               {"recompute_s", r.time.recompute_s},
               {"exposed_comm_s", r.time.exposed_comm_s},
               {"exposed_offload_s", r.time.exposed_offload_s},
               {"bubble_s", r.time.bubble_s},
               {"cpu_optimizer_s", r.time.cpu_optimizer_s},
               {"other_s", r.time.other_s}};
  if (r.time.moe_alltoall_s > 0.0 || r.time.grouped_gemm_s > 0.0) {
    j["time"]["moe_alltoall_s"] = r.time.moe_alltoall_s;
    j["time"]["grouped_gemm_s"] = r.time.grouped_gemm_s;
  }
  nlohmann::json ranks = nlohmann::json::array();
  // Per pipeline stage: the largest peak of its ranks and that rank's breakdown.
  std::map<int, const RankReport*> worst_of_stage;
  for (const RankReport& k : r.ranks) {
    const RankReport*& w = worst_of_stage[k.stage];
    if (w == nullptr || k.hbm_peak_bytes > w->hbm_peak_bytes) w = &k;
    ranks.push_back({{"name", k.name},
                     {"rank", k.rank},
                     {"stage", k.stage},
                     {"dp_rank", k.dp_rank},
                     {"tp_rank", k.tp_rank},
                     {"multiplicity", k.multiplicity},
                     {"hbm_peak_bytes", k.hbm_peak_bytes},
                     {"hbm_capacity_bytes", k.hbm_capacity_bytes},
                     {"hbm_reserved_bytes", k.hbm_reserved_bytes},
                     {"memory", memory_json(k.memory)}});
  }
  j["ranks"] = ranks;
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& [stage, k] : worst_of_stage) {
    stages.push_back({{"stage", stage},
                      {"rank", k->rank},
                      {"hbm_peak_bytes", k->hbm_peak_bytes},
                      {"hbm_capacity_bytes", k->hbm_capacity_bytes},
                      {"memory", memory_json(k->memory)}});
  }
  j["stages"] = stages;
  j["flags"] = r.flags;
  if (r.oom) {
    j["oom"] = oom_json(*r.oom);
  } else {
    j["oom"] = nullptr;
  }
  // Pools the step needs more of than they have (demand = the step's true peak there).
  nlohmann::json demand = nlohmann::json::array();
  for (const PoolDemand& d : r.over_capacity) {
    demand.push_back({{"pool", d.pool},
                      {"demand_bytes", d.demand_bytes},
                      {"capacity_bytes", d.capacity_bytes},
                      {"overshoot_bytes", d.overshoot_bytes},
                      {"first_failure", oom_json(d.first_failure)}});
    if (d.demand_is_lower_bound) demand.back()["demand_is_lower_bound"] = true;
  }
  j["over_capacity"] = demand;
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [k, v] : r.metadata) meta[k] = v;
  j["metadata"] = meta;
  j["plan_ops"] = r.plan_ops;
  return j;
}

}  // namespace offsim::models
