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
  std::int64_t optimizer_bytes = 0;    // moments and fp32 master weights
  std::int64_t activations_bytes = 0;  // saved for backward (forward to backward)
  std::int64_t buffers_bytes = 0;      // communication buffers (gathered params, p2p, buckets)
  std::int64_t workspace_bytes = 0;    // kernel workspace (cuBLAS), calibrated allocator term
  // Alive only inside one op or one layer's backward: tensors a recompute re-creates (e.g.
  // recomputed attention scores), staging copies of offloaded activations.
  std::int64_t transient_bytes = 0;
  // What the framework's runtime holds (runtime.h): CUDA context, NCCL buffers, library
  // workspaces, the caching allocator's reserved-but-unallocated bytes.
  std::int64_t runtime_bytes = 0;
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
  // Mixture of experts, of the above: the compute lane busy with token dispatch/combine
  // all-to-alls or waiting for them on their own stream (within exposed_comm_s), and busy with
  // the experts' grouped GEMMs (within compute_s and recompute_s).
  double moe_alltoall_s = 0.0;
  double grouped_gemm_s = 0.0;
};

struct RankReport {
  std::string name;  // "rank0" (the representative), stage and role
  int rank = 0;      // global rank of the representative
  int stage = 0;     // pipeline stage
  int dp_rank = 0;
  int tp_rank = 0;
  int multiplicity = 1;
  std::int64_t hbm_peak_bytes = 0;
  std::int64_t hbm_capacity_bytes = 0;
  // With hardware.runtime: what the framework holds from the driver at its largest (caching
  // allocator's reserved memory or JAX's preallocated pool, plus context and NCCL buffers).
  std::int64_t hbm_reserved_bytes = 0;
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
  // What memory ran out (the pool's typed kind, sim::Pool::kind); not in the JSON.
  sim::PoolKind pool_kind = sim::PoolKind::kOther;
  bool device_memory() const { return pool_kind == sim::PoolKind::kHbm; }  // a GPU's HBM
};

// A pool that the step needs more of than it has (the step was run to its end with the pool
// unbounded): demand = the pool's true peak; overshoot = demand - capacity.
struct PoolDemand {
  std::string pool;
  std::int64_t demand_bytes = 0;
  std::int64_t capacity_bytes = 0;
  std::int64_t overshoot_bytes = 0;
  OomReport first_failure;  // the pool's first allocation that did not fit
  // An early answer (models/static_memory.h): the step was not simulated and demand_bytes is the
  // pool's static memory, a lower bound of the true demand (JSON "demand_is_lower_bound": true).
  bool demand_is_lower_bound = false;
};

struct Report {
  std::string scenario;
  std::string outcome;  // "completed", "out_of_memory", ...
  bool fits = false;
  int gpus = 0;
  // When !fits: the time of the step run to its end with unbounded memory (not a time the
  // step can run in); JSON gives null for it and for the rates below.
  double step_time_s = 0.0;
  double tokens_per_s = 0.0;  // whole job
  double tokens_per_s_per_gpu = 0.0;
  double tflops_per_gpu = 0.0;     // model FLOPs (no recompute) per GPU per second / 1e12
  double hw_tflops_per_gpu = 0.0;  // hardware FLOPs incl. recompute
  double mfu = 0.0;                // model FLOP/s / peak dense FLOP/s of the compute dtype
  double hfu = 0.0;
  std::int64_t hbm_peak_bytes = 0;  // largest over ranks
  std::int64_t hbm_capacity_bytes = 0;
  std::int64_t hbm_reserved_bytes = 0;  // largest over ranks (RankReport::hbm_reserved_bytes)
  std::int64_t host_peak_bytes = 0;     // pinned host memory, largest over hosts
  std::int64_t host_capacity_bytes = 0;
  std::string worst_rank;  // the rank with the largest HBM peak
  MemoryBreakdown memory;  // on worst_rank at its peak
  std::vector<sim::LiveTensor> live_at_peak;
  TimeSplit time;
  std::vector<RankReport> ranks;
  std::vector<std::string> flags;         // e.g. "megatron cannot offload activations with pp>1"
  std::optional<OomReport> oom;           // the first failing allocation over all pools
  std::vector<PoolDemand> over_capacity;  // every pool over capacity, in order of failure
  std::vector<std::pair<std::string, std::string>> metadata;
  std::int64_t plan_ops = 0;
};

nlohmann::json report_to_json(const Report& r);

}  // namespace offsim::models
