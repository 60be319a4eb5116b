// Report: what one evaluated scenario says — step time, throughput, MFU/HFU, whether it fits,
// memory per rank with a breakdown and the live set at the peak, where the time went, flags, and
// out-of-memory details — and its JSON form (the keys of `offsim run --format json`).
//
//   OFFSIM_ASSIGN_OR_RETURN(models::Evaluation e, models::evaluate(scenario, {}));
//   const models::Report& r = e.report;
//   fmt::print("{:.3f} s/step, {:.0f} TFLOP/s/GPU, fits={}\n", r.step_time_s, r.tflops_per_gpu,
//              r.fits);
//   std::string text = models::report_to_json(r).dump(2);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/trace/timeline.h"

namespace offsim::models {

// Bytes on one rank's HBM at its peak, by tensor category.
struct MemoryBreakdown {
  std::int64_t params_bytes = 0;
  std::int64_t grads_bytes = 0;
  std::int64_t optimizer_bytes = 0;  // moments and fp32 master weights
  std::int64_t activations_bytes = 0;
  std::int64_t buffers_bytes = 0;    // communication buffers (gathered params, p2p, buckets)
  std::int64_t workspace_bytes = 0;  // kernel workspace (cuBLAS), allocator overhead
};

// Where the step time went, on the critical rank. compute_s + recompute_s + exposed_comm_s +
// exposed_offload_s + bubble_s + cpu_optimizer_s + other_s == step_time_s.
struct TimeSplit {
  double compute_s = 0.0;          // compute lane busy with forward/backward/optimizer work
  double recompute_s = 0.0;        // compute lane busy re-running forward ops
  double exposed_comm_s = 0.0;     // compute idle while a collective or p2p runs
  double exposed_offload_s = 0.0;  // compute idle while an H2D/D2H copy runs
  double bubble_s = 0.0;           // compute idle waiting on another pipeline stage
  double cpu_optimizer_s = 0.0;    // compute idle while the CPU optimizer runs
  double other_s = 0.0;            // compute idle for any other reason (launch gaps)
};

struct RankReport {
  std::string name;  // "rank0" (the representative), stage and role
  int multiplicity = 1;
  std::int64_t hbm_peak_bytes = 0;
  std::int64_t hbm_capacity_bytes = 0;
  MemoryBreakdown memory;  // at this rank's peak
  std::vector<sim::LiveTensor> live_at_peak;
};

struct OomReport {
  std::string op;
  std::string pool;
  double time_s = 0.0;
  std::int64_t requested_bytes = 0;
  std::int64_t in_use_bytes = 0;
  std::int64_t capacity_bytes = 0;
  std::vector<sim::LiveTensor> live;
  bool device_memory = false;  // the pool is a GPU's HBM (else host memory); not in the JSON
};

struct Report {
  std::string scenario;
  std::string outcome;  // "completed", "out_of_memory", ...
  bool fits = false;
  int gpus = 0;
  double step_time_s = 0.0;
  double tokens_per_s = 0.0;  // whole job
  double tokens_per_s_per_gpu = 0.0;
  double tflops_per_gpu = 0.0;     // model FLOPs (no recompute) per GPU per second / 1e12
  double hw_tflops_per_gpu = 0.0;  // hardware FLOPs incl. recompute
  double mfu = 0.0;                // model FLOP/s / peak dense FLOP/s of the compute dtype
  double hfu = 0.0;
  std::int64_t hbm_peak_bytes = 0;  // largest over ranks
  std::int64_t hbm_capacity_bytes = 0;
  std::int64_t host_peak_bytes = 0;  // pinned host memory, largest over hosts
  std::int64_t host_capacity_bytes = 0;
  std::string worst_rank;  // the rank with the largest HBM peak
  MemoryBreakdown memory;  // on worst_rank at its peak
  std::vector<sim::LiveTensor> live_at_peak;
  TimeSplit time;
  std::vector<RankReport> ranks;
  std::vector<std::string> flags;  // e.g. "megatron cannot offload activations with pp>1"
  std::optional<OomReport> oom;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::int64_t plan_ops = 0;
};

nlohmann::json report_to_json(const Report& r);

}  // namespace offsim::models
