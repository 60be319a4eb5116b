#include "models/report.h"

namespace offsim::models {

namespace {

nlohmann::json live_json(const std::vector<sim::LiveTensor>& live) {
  nlohmann::json a = nlohmann::json::array();
  for (const sim::LiveTensor& t : live) {
    a.push_back({{"name", t.name}, {"category", t.category}, {"bytes", t.bytes}});
  }
  return a;
}

nlohmann::json memory_json(const MemoryBreakdown& m) {
  return {{"params_bytes", m.params_bytes},       {"grads_bytes", m.grads_bytes},
          {"optimizer_bytes", m.optimizer_bytes}, {"activations_bytes", m.activations_bytes},
          {"buffers_bytes", m.buffers_bytes},     {"workspace_bytes", m.workspace_bytes}};
}

}  // namespace

nlohmann::json report_to_json(const Report& r) {
  nlohmann::json j;
  j["scenario"] = r.scenario;
  j["outcome"] = r.outcome;
  j["fits"] = r.fits;
  j["gpus"] = r.gpus;
  j["step_time_s"] = r.step_time_s;
  j["tokens_per_s"] = r.tokens_per_s;
  j["tokens_per_s_per_gpu"] = r.tokens_per_s_per_gpu;
  j["tflops_per_gpu"] = r.tflops_per_gpu;
  j["hw_tflops_per_gpu"] = r.hw_tflops_per_gpu;
  j["mfu"] = r.mfu;
  j["hfu"] = r.hfu;
  j["hbm_peak_bytes"] = r.hbm_peak_bytes;
  j["hbm_capacity_bytes"] = r.hbm_capacity_bytes;
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
  for (const RankReport& k : r.ranks) {
    ranks.push_back({{"name", k.name},
                     {"multiplicity", k.multiplicity},
                     {"hbm_peak_bytes", k.hbm_peak_bytes},
                     {"hbm_capacity_bytes", k.hbm_capacity_bytes},
                     {"memory", memory_json(k.memory)}});
  }
  j["ranks"] = ranks;
  j["flags"] = r.flags;
  if (r.oom) {
    j["oom"] = {{"op", r.oom->op},
                {"pool", r.oom->pool},
                {"time_s", r.oom->time_s},
                {"requested_bytes", r.oom->requested_bytes},
                {"in_use_bytes", r.oom->in_use_bytes},
                {"capacity_bytes", r.oom->capacity_bytes},
                {"live", live_json(r.oom->live)}};
  } else {
    j["oom"] = nullptr;
  }
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [k, v] : r.metadata) meta[k] = v;
  j["metadata"] = meta;
  j["plan_ops"] = r.plan_ops;
  return j;
}

}  // namespace offsim::models
