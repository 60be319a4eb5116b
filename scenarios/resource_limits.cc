#include "scenarios/resource_limits.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

namespace offsim::scenarios {

namespace {

std::string gib(double bytes) {
  if (bytes < static_cast<double>(1 << 20)) return fmt::format("{:.0f} bytes", bytes);
  if (bytes < static_cast<double>(1 << 30)) return fmt::format("{:.0f} MiB", bytes / (1 << 20));
  return fmt::format("{:.1f} GiB", bytes / static_cast<double>(std::int64_t{1} << 30));
}

}  // namespace

std::int64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<std::int64_t>(pages) * static_cast<std::int64_t>(page);
}

std::int64_t default_max_memory_bytes() {
  const std::int64_t physical = physical_memory_bytes();
  return physical > 0 ? physical / 2 : std::int64_t{64} << 30;
}

namespace {

sim::Status check_size(const models::PlanSize& size, const models::Scenario& scenario,
                       const ResourceLimits& limits) {
  if (limits.max_plan_ops > 0 && size.ops > static_cast<double>(limits.max_plan_ops)) {
    return sim::fail(sim::ErrorCode::kLimitExceeded,
                     "plan too large: the step would have an estimated {} (model.layers {}, "
                     "{} micro-batches per rank, pipeline stages {}), over the limit of {} ops; "
                     "raise it with --max-plan-ops N",
                     models::describe(size), scenario.model.layers,
                     models::grad_accum_steps(scenario.training, scenario.parallelism),
                     scenario.parallelism.pp, limits.max_plan_ops);
  }
  const std::int64_t max_bytes =
      limits.max_memory_bytes > 0 ? limits.max_memory_bytes : default_max_memory_bytes();
  if (size.bytes > static_cast<double>(max_bytes)) {
    return sim::fail(sim::ErrorCode::kLimitExceeded,
                     "plan too large for memory: the step would have an estimated {}, over the "
                     "memory limit of {}{}; raise it with --max-memory BYTES",
                     models::describe(size), gib(static_cast<double>(max_bytes)),
                     limits.max_memory_bytes > 0
                         ? ""
                         : fmt::format(" (half of the {} of physical memory)",
                                       gib(static_cast<double>(physical_memory_bytes()))));
  }
  return sim::ok();
}

}  // namespace

sim::Status check_plan_size(const models::Scenario& scenario, const ResourceLimits& limits,
                            const models::PlanSizeOptions& options) {
  return check_size(models::estimate_plan_size(scenario, options), scenario, limits);
}

sim::Status check_plan_size(const models::ResolvedScenario& scenario, const ResourceLimits& limits,
                            const models::PlanSizeOptions& options) {
  return check_size(models::estimate_plan_size(scenario, options), scenario.scenario(), limits);
}

sim::Error time_limit_error(double limit_s, const std::string& what) {
  return sim::Error{
      sim::ErrorCode::kLimitExceeded,
      fmt::format("time limit of {} s (--time-limit) reached while {}", limit_s, what)};
}

Watchdog::Watchdog(double seconds, std::atomic<bool>& flag) : flag_(flag) {
  if (!(seconds > 0.0) || !std::isfinite(seconds)) return;
  // steady_clock counts 64-bit nanoseconds (about 9.2e9 s): a longer limit would overflow the
  // deadline and fire at once. 1e9 s (31 years) is "never" for an offsim run.
  seconds = std::min(seconds, 1e9);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(seconds));
  thread_ = std::thread([this, deadline] {
    std::unique_lock lock(mu_);
    if (!cv_.wait_until(lock, deadline, [this] { return done_; })) {
      fired_.store(true);
      flag_.store(true);
    }
  });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace offsim::scenarios
