// Shared pieces of the offsim subcommands (see common.h).

#include "scenarios/cli/common.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>

#include <fmt/format.h>

#include "sim/core/escape.h"
#include "sim/platform/host.h"

namespace offsim::cli {

int exit_code(const sim::Error& error) {
  switch (error.code) {
    case sim::ErrorCode::kInvalidInput:
    case sim::ErrorCode::kNotFound:
    case sim::ErrorCode::kLimitExceeded:
      return 2;
    default:
      return 1;
  }
}

// Every message may quote user input: invisible and control characters are shown as escapes.
int report(const sim::Error& error) {
  fmt::print(stderr, "offsim: error: {}\n", sim::escape_message_keep_lines(error.message));
  return exit_code(error);
}

int usage_error(const std::string& message) {
  fmt::print(stderr, "offsim: error: {}\n", sim::escape_message_keep_lines(message));
  return 2;
}

sim::Result<Loaded> load_checked(const std::string& path, const std::vector<std::string>& sets,
                                 std::int64_t max_points) {
  scenarios::LoadOptions load;
  load.max_sweep_points = max_points;
  OFFSIM_ASSIGN_OR_RETURN(scenarios::ScenarioFile file,
                          scenarios::load_scenario_file(path, sets, load));
  OFFSIM_ASSIGN_OR_RETURN(models::ResolvedScenario resolved,
                          scenarios::resolve_document(file.base, file.base_dir));
  return Loaded{std::move(file), std::move(resolved)};
}

std::vector<std::string> Loaded::read_files() const {
  const models::HardwareConfig& h = scenario().hardware;
  return {h.profile_path, sim::platform::is_host_file(h.host) ? h.host : std::string()};
}

sim::Error eval_error(const sim::Error& error, const std::string& path) {
  return sim::Error{error.code, fmt::format("{}: {}", path, error.message)};
}

CLI::Validator in_range(double lo, double hi, bool integer, const std::string& unit,
                        bool above_lo) {
  const std::string range = integer
                                ? fmt::format("an integer from {:.0f} to {:.0f}{}", lo, hi, unit)
                                : fmt::format("a number {} {} and at most {}{}",
                                              above_lo ? "above" : "from", lo, hi, unit);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        try {
          std::size_t used = 0;
          const double v = std::stod(text, &used);
          const bool whole = text.find_first_of(".eE") == std::string::npos;
          if (used == text.size() && std::isfinite(v) && (above_lo ? v > lo : v >= lo) && v <= hi &&
              (!integer || whole)) {
            return {};
          }
        } catch (const std::exception&) {
        }
        return "expected " + range + ", got " + sim::escape_for_message(text);
      },
      range);
}

void add_limit_options(CLI::App* cmd, scenarios::ResourceLimits& limits, const char* time_help) {
  // Ops: 1e12 is 50 000 times the default and beyond any memory; bytes: 2^60 (1 EiB).
  cmd->add_option("--max-plan-ops", limits.max_plan_ops,
                  fmt::format("refuse scenarios whose step has more ops than this, estimated "
                              "before building it (default {})",
                              scenarios::kDefaultMaxPlanOps))
      ->check(in_range(1, 1e12, true, ""));
  cmd->add_option("--max-memory", limits.max_memory_bytes,
                  "refuse scenarios whose plan and timeline would take more bytes than this, "
                  "estimated before building (default: half of physical memory)")
      ->check(in_range(1, 1152921504606846976.0, true, " bytes"));
  if (time_help != nullptr) {
    cmd->add_option("--time-limit", limits.time_limit_s, time_help)
        ->check(in_range(0, kMaxTimeLimitS, false, " seconds", /*above_lo=*/true));
  }
}

sim::Result<models::Evaluation> evaluate_limited(const models::ResolvedScenario& scenario,
                                                 models::EvalOptions options,
                                                 const scenarios::ResourceLimits& limits,
                                                 const std::string& path) {
  std::atomic<bool> cancel{false};
  scenarios::Watchdog watchdog(limits.time_limit_s, cancel);
  options.cancel = &cancel;
  auto eval = models::evaluate(scenario, options);
  if (!eval) {
    if (watchdog.fired()) {
      return sim::fail(scenarios::time_limit_error(limits.time_limit_s, "simulating " + path));
    }
    return sim::fail(eval_error(eval.error(), path));
  }
  return eval;
}

}  // namespace offsim::cli
