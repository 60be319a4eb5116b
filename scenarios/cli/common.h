// What the offsim command's subcommands (scenarios/cli/cmd_*.cc) share: exit status and error
// lines, loading a checked scenario, range validators for options, the plan-size, memory and time
// limit flags, and an evaluation under the time limit.
//
//   auto l = cli::load_checked(path, sets);
//   if (!l) return cli::report(l.error());          // prints "offsim: error: ...", returns 2 or 1
//   cmd->add_option("--jobs", jobs)->check(cli::in_range(0, cli::kMaxJobs, true, ""));
//   cli::add_limit_options(cmd, limits, "stop after this many seconds (exit 2)");
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "models/evaluate.h"
#include "models/resolve.h"
#include "scenarios/resource_limits.h"
#include "scenarios/scenario_loader.h"
#include "sim/core/result.h"

namespace offsim::cli {

// 2 for input errors (invalid input, missing file, limit exceeded), 1 for the rest.
int exit_code(const sim::Error& error);

// Prints the error on stderr (control characters escaped) and returns its exit code.
int report(const sim::Error& error);

// Prints a usage error on stderr and returns 2.
int usage_error(const std::string& message);

// A scenario loaded, mapped and checked; input errors come back as kInvalidInput. The scenario
// is held once, in its resolved form (models/resolve.h).
struct Loaded {
  scenarios::ScenarioFile file;
  models::ResolvedScenario resolved;
  const models::Scenario& scenario() const { return resolved.scenario(); }
  // The files the scenario reads besides itself (a calibration profile, a host file), which no
  // output may overwrite; empty entries where it reads none.
  std::vector<std::string> read_files() const;
};

// `max_points` bounds the file's sweep block: run, plan and replay evaluate only the base
// scenario, so their default is no bound; validate checks every point (its --max-points).
sim::Result<Loaded> load_checked(
    const std::string& path, const std::vector<std::string>& sets,
    std::int64_t max_points = std::numeric_limits<std::int64_t>::max());

// Model errors that come from the scenario's content are input errors.
sim::Error eval_error(const sim::Error& error, const std::string& path);

// A number in [lo, hi] (an integer when `integer`), checked on the text before CLI11 converts
// it, so that values beyond the option's type (1e30 for an int64, 1e10 s for a clock in
// nanoseconds) are refused with the range instead of overflowing. CLI11 prefixes the option name.
CLI::Validator in_range(double lo, double hi, bool integer, const std::string& unit,
                        bool above_lo = false);

// The time limit's watchdog counts in nanoseconds of a 64-bit clock (about 9.2e9 s); 1e9 s
// (31 years) is below that with room for the start time.
constexpr double kMaxTimeLimitS = 1e9;

// Threads: more than 4096 is more than any machine's cores and only costs memory (each thread
// keeps its own simulator state).
constexpr double kMaxJobs = 4096;

// The plan-size and memory flags of run, sweep, plan, replay and validate; --time-limit where
// `time_help` is given.
void add_limit_options(CLI::App* cmd, scenarios::ResourceLimits& limits, const char* time_help);

// Evaluates under the time limit of `limits` (a watchdog cancels the engine).
sim::Result<models::Evaluation> evaluate_limited(const models::ResolvedScenario& scenario,
                                                 models::EvalOptions options,
                                                 const scenarios::ResourceLimits& limits,
                                                 const std::string& path);

}  // namespace offsim::cli
