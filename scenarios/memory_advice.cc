#include "scenarios/memory_advice.h"

#include <fmt/format.h>

#include "scenarios/report_format.h"

namespace offsim::scenarios {

namespace {

bool optimizer_on_host(const models::Scenario& s) {
  for (const auto& r : s.offload.rules) {
    if (r.where == models::Placement::kHost && (r.cls == models::TensorClass::kOptimizerStates ||
                                                r.cls == models::TensorClass::kMasterWeights)) {
      return true;
    }
  }
  return false;
}

}  // namespace

sim::Result<std::string> memory_advice(const models::Scenario& scenario,
                                       const models::Report& report) {
  if (report.fits) return std::string();
  // A step that does not fit ran to its end with the full pools unbounded (models::evaluate), so
  // its peaks and the breakdown at the worst rank's peak are what the step needs.
  const models::Report& r = report;
  const models::MemoryBreakdown& m = r.memory;
  const std::int64_t capacity = report.hbm_capacity_bytes;
  if (report.oom && report.oom->pool_kind == sim::PoolKind::kPinnedHost) {
    return fmt::format(
        "pinned host memory: the step needs {} per node share of {}; use more nodes (each node's "
        "host memory serves fewer GPUs), a host with more memory "
        "(hardware.overrides.system.host_memory_bytes_per_node) or offload less",
        format_bytes(r.host_peak_bytes), format_bytes(report.host_capacity_bytes));
  }
  const std::int64_t model_state = m.params_bytes + m.grads_bytes + m.optimizer_bytes;
  if (model_state >= capacity) {
    if (!optimizer_on_host(scenario)) {
      return fmt::format(
          "weights+grads+Adam state alone need {} of {} per GPU (weights {}, grads {}, optimizer "
          "{}): activation offload or recomputation cannot fit this; offload the optimizer state "
          "(offload: zero_offload or megatron_optimizer_offload) or shard it "
          "(parallelism.zero_stage>=1 with dp>1, or fsdp)",
          format_bytes(model_state), format_bytes(capacity), format_bytes(m.params_bytes),
          format_bytes(m.grads_bytes), format_bytes(m.optimizer_bytes));
    }
    return fmt::format(
        "weights and gradients alone need {} of {} per GPU with the optimizer state already on "
        "the host: offload the parameters too (offload: fsdp_cpu_offload) or split the model "
        "(parallelism.tp / pp, or fsdp)",
        format_bytes(m.params_bytes + m.grads_bytes + m.optimizer_bytes), format_bytes(capacity));
  }
  if (m.activations_bytes >= model_state) {
    return fmt::format(
        "activations dominate: {} of the {} peak per GPU (capacity {}); recompute them "
        "(recompute: selective or full), offload them (offload: megatron_activation_offload) or "
        "use a smaller training.micro_batch",
        format_bytes(m.activations_bytes), format_bytes(r.hbm_peak_bytes), format_bytes(capacity));
  }
  return fmt::format(
      "the step needs {} per GPU of {} (weights {}, grads {}, optimizer {}, activations {}); the "
      "largest class must move: offload or shard the optimizer state first, then recompute or "
      "offload activations",
      format_bytes(r.hbm_peak_bytes), format_bytes(capacity), format_bytes(m.params_bytes),
      format_bytes(m.grads_bytes), format_bytes(m.optimizer_bytes),
      format_bytes(m.activations_bytes));
}

}  // namespace offsim::scenarios
