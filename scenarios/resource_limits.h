// Resource limits of the offsim commands: plans too large to build are refused up front from the
// closed-form estimate of models/plan_size.h, and a watchdog ends evaluations that run past a
// time limit through the engine's cancel flag (models::EvalOptions::cancel).
//
//   scenarios::ResourceLimits limits{.max_plan_ops = 50'000'000};
//   OFFSIM_RETURN_IF_ERROR(scenarios::check_plan_size(scenario, limits));
//   std::atomic<bool> cancel{false};
//   scenarios::Watchdog dog(limits.time_limit_s, cancel);  // 0 s: never fires
//   options.cancel = &cancel;
//   auto e = models::evaluate(scenario, options);
//   if (!e && dog.fired()) return scenarios::time_limit_error(limits.time_limit_s, "run");
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "models/plan_size.h"
#include "models/scenario.h"
#include "sim/core/result.h"

namespace offsim::scenarios {

// 20 M ops, 300 times the largest example scenario (52 k ops). Measured on a 1.3 M-op step
// (llama70b-8xh100-offload with global_batch 512, dev build): the estimate is 590 bytes of plan
// and timeline per op, the process peaks at 830 bytes per op (1.1 GB RSS), and the engine runs
// about 65 k ops per second. So 20 M ops is about 16 GB and 5 minutes: more than that is
// rarely what a user meant, and is one explicit flag away.
inline constexpr std::int64_t kDefaultMaxPlanOps = 20'000'000;

// Physical memory of this machine (sysconf), 0 when unknown.
std::int64_t physical_memory_bytes();
// The --max-memory default: half of physical memory, so that the estimate's error and the
// engine's own per-op state still fit; 64 GiB when physical memory is unknown.
std::int64_t default_max_memory_bytes();

struct ResourceLimits {
  std::int64_t max_plan_ops = kDefaultMaxPlanOps;
  std::int64_t max_memory_bytes = 0;  // 0: default_max_memory_bytes()
  double time_limit_s = 0.0;          // 0: none
};

// kLimitExceeded when the scenario's estimated plan exceeds max_plan_ops or its estimated plan
// and timeline bytes exceed max_memory_bytes; the message gives the estimate, the limit and the
// flag that raises it.
sim::Status check_plan_size(const models::Scenario& scenario, const ResourceLimits& limits,
                            const models::PlanSizeOptions& options = {});
// The same for a resolved scenario, whose layer policies the estimate reads.
sim::Status check_plan_size(const models::ResolvedScenario& scenario, const ResourceLimits& limits,
                            const models::PlanSizeOptions& options = {});

// "time limit of 5 s (--time-limit) reached while <what>"
sim::Error time_limit_error(double limit_s, const std::string& what);

// Sets `flag` once `seconds` have passed, unless destroyed first; 0 or less never fires.
class Watchdog {
 public:
  Watchdog(double seconds, std::atomic<bool>& flag);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  bool fired() const { return fired_.load(); }

 private:
  std::atomic<bool>& flag_;
  std::atomic<bool> fired_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace offsim::scenarios
