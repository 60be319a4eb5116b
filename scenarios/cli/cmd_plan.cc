// `offsim plan` (see commands.h): the offload-policy search, with the best configurations
// printed as a table or JSON, and why nothing fits when nothing does.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "models/evaluate.h"
#include "scenarios/cli/commands.h"
#include "scenarios/cli/common.h"
#include "scenarios/memory_advice.h"
#include "scenarios/policy_search.h"
#include "scenarios/report_format.h"
#include "scenarios/resource_limits.h"
#include "scenarios/scenario_loader.h"

namespace offsim::cli {
namespace {

// --classes into the search space; an error message for a class that cannot be offloaded.
std::string set_classes(const PlanArgs& a, scenarios::SearchSpace& space) {
  if (a.classes.empty()) return {};
  space.classes.clear();
  for (const std::string& c : a.classes) {
    auto cls = models::tensor_class_from_string(c);
    if (!cls || *cls == models::TensorClass::kNamedActivation) {
      return fmt::format(
          "--classes {}: expected params, grads, optimizer_states, master_weights or "
          "activations",
          c);
    }
    space.classes.push_back(*cls);
  }
  return {};
}

std::string fractions_error(const std::vector<double>& fractions) {
  for (std::size_t i = 0; i < fractions.size(); ++i) {
    const double f = fractions[i];
    if (!(f >= 0.0 && f <= 1.0)) {
      return fmt::format("--fractions {}: expected fractions in [0, 1]", f);
    }
    if (i > 0 && f <= fractions[i - 1]) {
      return fmt::format(
          "--fractions {}: expected distinct fractions in ascending order (after {})", f,
          fractions[i - 1]);
    }
  }
  return {};
}

std::string prefetch_error(const std::vector<int>& prefetch, std::int64_t layers) {
  for (std::size_t i = 0; i < prefetch.size(); ++i) {
    const int p = prefetch[i];
    if (p < 1 || p > layers) {
      return fmt::format("--prefetch {}: expected a depth in 1..{} (the model's layers)", p,
                         layers);
    }
    if (std::find(prefetch.begin(), prefetch.begin() + static_cast<std::ptrdiff_t>(i), p) !=
        prefetch.begin() + static_cast<std::ptrdiff_t>(i)) {
      return fmt::format("--prefetch {}: listed twice", p);
    }
  }
  return {};
}

std::string micro_batches_error(const std::vector<std::int64_t>& micro_batches) {
  for (std::size_t i = 0; i < micro_batches.size(); ++i) {
    const std::int64_t mb = micro_batches[i];
    if (mb < 1) return fmt::format("--micro-batches {}: expected sizes >= 1", mb);
    if (std::find(micro_batches.begin(), micro_batches.begin() + static_cast<std::ptrdiff_t>(i),
                  mb) != micro_batches.begin() + static_cast<std::ptrdiff_t>(i)) {
      return fmt::format("--micro-batches {}: listed twice", mb);
    }
  }
  return {};
}

// "Offload or recompute, and at which micro-batch?" is the question: both are searched unless
// --joint names a subset (or none); for an MoE model with expert parallelism also whether to
// overlap its all-to-alls with another micro-batch (it holds one more micro-batch's activations).
std::string set_joint(const PlanArgs& a, const models::Scenario& scenario,
                      scenarios::SearchSpace& space) {
  std::vector<std::string> joint = a.joint;
  if (joint.empty()) {
    joint = {"micro_batch", "recompute"};
    if (scenario.model.moe.experts > 0 && scenario.parallelism.ep > 1) {
      joint.emplace_back("moe_a2a_overlap");
    }
  }
  if (joint == std::vector<std::string>{"none"}) joint.clear();
  if (!a.micro_batches.empty() &&
      std::find(joint.begin(), joint.end(), "micro_batch") == joint.end()) {
    return "--micro-batches: needs micro_batch in --joint";
  }
  for (const std::string& j : joint) {
    if (j == "micro_batch") {
      if (!a.micro_batches.empty()) {
        space.micro_batches = a.micro_batches;
        continue;
      }
      // Every micro-batch that divides the per-rank batch, up to 16.
      const std::int64_t per_rank = scenario.training.global_batch / scenario.parallelism.dp;
      for (std::int64_t mb = 1; mb <= std::min<std::int64_t>(per_rank, 16); ++mb)
        if (per_rank % mb == 0) space.micro_batches.push_back(mb);
    } else if (j == "recompute") {
      space.recompute = {models::RecomputeConfig::Mode::kNone,
                         models::RecomputeConfig::Mode::kSelective,
                         models::RecomputeConfig::Mode::kFull};
    } else if (j == "moe_a2a_overlap") {
      space.a2a_overlap = {false, true};
    } else {
      return fmt::format(
          "--joint {}: expected micro_batch, recompute and/or moe_a2a_overlap, or none", j);
    }
  }
  return {};
}

// The search options from the flags; an error message for a flag that does not fit.
std::string search_options(const PlanArgs& a, const models::Scenario& scenario,
                           scenarios::SearchOptions& o) {
  o.top_k = a.top;
  o.jobs = a.jobs;
  o.progress = ::isatty(STDERR_FILENO) == 1 && a.format == "table";
  o.objective = a.objective == "tokens_per_s" ? scenarios::Objective::kTokensPerS
                                              : scenarios::Objective::kStepTime;
  o.method = a.search == "exhaustive" ? scenarios::SearchMethod::kExhaustive
                                      : scenarios::SearchMethod::kPruned;
  for (const std::string& error :
       {set_classes(a, o.space), fractions_error(a.fractions),
        prefetch_error(a.prefetch, scenario.model.layers), micro_batches_error(a.micro_batches)}) {
    if (!error.empty()) return error;
  }
  if (!a.fractions.empty()) o.space.fractions = a.fractions;
  if (!a.prefetch.empty()) o.space.prefetch = a.prefetch;
  return set_joint(a, scenario, o.space);
}

// The largest plan of the search: the smallest micro-batch (most micro-batches), full
// recompute when recompute is searched.
models::Scenario largest_candidate(const models::Scenario& scenario,
                                   const scenarios::SearchSpace& space) {
  models::Scenario largest = scenario;
  if (!space.micro_batches.empty()) {
    largest.training.micro_batch =
        *std::min_element(space.micro_batches.begin(), space.micro_batches.end());
  }
  if (!space.recompute.empty()) largest.recompute.mode = models::RecomputeConfig::Mode::kFull;
  return largest;
}

void print_json(const scenarios::SearchResult& r) {
  nlohmann::json j;
  j["space_size"] = r.space_size;
  j["valid"] = r.valid;
  j["evaluated"] = r.evaluated;
  j["fitting"] = r.fitting;
  j["skipped_bound"] = r.skipped_bound;
  j["skipped_infeasible"] = r.skipped_infeasible;
  j["wall_s"] = r.wall_s;
  j["best"] = nlohmann::json::array();
  for (const auto& c : r.best) {
    auto doc = scenarios::scenario_to_document(c.scenario);
    j["best"].push_back({{"policy", c.policy},
                         {"limit", c.limit},
                         {"offload_yaml", scenarios::emit_yaml(*doc.find("offload"))},
                         {"report", models::report_to_json(c.report)}});
  }
  fmt::print("{}\n", j.dump(2));
}

// Nothing fits: why, for the scenario as given, with every offloadable class explained.
void print_no_fit(const models::Scenario& probe) {
  fmt::print("no candidate fits HBM and host memory.\n");
  if (auto e = models::evaluate(probe); e && !e->report.fits) {
    auto advice = scenarios::memory_advice(probe, e->report);
    if (advice && !advice->empty()) fmt::print("why: {}\n", *advice);
  }
}

void print_best(const scenarios::SearchResult& r, bool parallelism) {
  for (std::size_t i = 0; i < r.best.size(); ++i) {
    const auto& c = r.best[i];
    fmt::print(
        "#{}  {:.3f} s/step  {:.0f} tokens/s  MFU {:.1f}%  HBM {}  host {}\n    {}\n    "
        "limited by: {}\n",
        i + 1, c.report.step_time_s, c.report.tokens_per_s, 100 * c.report.mfu,
        scenarios::format_bytes(c.report.hbm_peak_bytes),
        scenarios::format_bytes(c.report.host_peak_bytes), c.policy, c.limit);
  }
  const auto& best = r.best.front();
  fmt::print("\nbest configuration, as scenario YAML:\n");
  auto doc = scenarios::scenario_to_document(best.scenario);
  scenarios::Node excerpt = scenarios::make_map();
  for (const char* key : {"training", "parallelism", "recompute", "offload"}) {
    if (std::string_view(key) == "parallelism" && !parallelism) continue;
    excerpt.entries.emplace_back(key, *doc.find(key));
  }
  fmt::print("{}\n", scenarios::emit_yaml(excerpt));
  fmt::print("{}", scenarios::format_table({{best.scenario.name, best.report}}));
}

// `parallelism`: the search chose a parallelism key (the all-to-all overlap), which the best
// configuration's excerpt then shows.
void print_table(const PlanArgs& a, const scenarios::SearchResult& r,
                 const models::Scenario& largest, bool parallelism) {
  const double share =
      r.valid > 0 ? 100.0 * static_cast<double>(r.evaluated) / static_cast<double>(r.valid) : 0.0;
  fmt::print(
      "{} search over {} candidates ({} valid): evaluated {} ({:.1f}%), skipped {} by "
      "lower bound and {} known not to fit, in {:.2f} s; {} fit\n\n",
      a.search, r.space_size, r.valid, r.evaluated, share, r.skipped_bound, r.skipped_infeasible,
      r.wall_s, r.fitting);
  if (r.best.empty()) {
    print_no_fit(largest);
  } else {
    print_best(r, parallelism);
  }
}

}  // namespace

CLI::App* add_plan_command(CLI::App& app, PlanArgs& plan) {
  auto* cmd = app.add_subcommand(
      "plan",
      "Search offload policies (tensor classes x layer fraction x prefetch depth x CPU/GPU\n"
      "optimizer) x recompute x micro-batch (x the expert-parallel all-to-all overlap of an\n"
      "MoE model) under HBM and host capacity; when nothing fits, say what dominates memory\n"
      "and which class must move.\n\n"
      "Examples:\n"
      "  offsim plan ex.yaml --top 3\n"
      "  offsim plan ex.yaml --joint none --objective tokens_per_s\n"
      "  offsim plan ex.yaml --classes activations --fractions 0,0.5,1 --search exhaustive");
  cmd->add_option("scenario", plan.scenario, "scenario file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--set", plan.sets, "override a key: key.path=value (repeatable)");
  cmd->add_option("--objective", plan.objective, "step_time or tokens_per_s")
      ->check(CLI::IsMember({"step_time", "tokens_per_s"}));
  cmd->add_option("--top", plan.top, "how many configurations to print")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--search", plan.search, "pruned (default) or exhaustive")
      ->check(CLI::IsMember({"pruned", "exhaustive"}));
  cmd->add_option("--joint", plan.joint,
                  "what to search with the offload policy: micro_batch, recompute and/or "
                  "moe_a2a_overlap (default micro_batch and recompute, and moe_a2a_overlap for an "
                  "MoE model with ep > 1), or none")
      ->delimiter(',');
  cmd->add_option("--classes", plan.classes,
                  "tensor classes to offload (default activations,optimizer_states,params)")
      ->delimiter(',');
  cmd->add_option("--fractions", plan.fractions,
                  "layer fractions, ascending from 0 (default 0,0.25,0.5,0.75,1)")
      ->delimiter(',');
  cmd->add_option("--prefetch", plan.prefetch, "prefetch depths, deepest first (default 2,1)")
      ->delimiter(',');
  cmd->add_option("--micro-batches", plan.micro_batches,
                  "micro-batch sizes for --joint micro_batch (default: divisors up to 16)")
      ->delimiter(',');
  cmd->add_option("--jobs,-j", plan.jobs, "threads (default: all cores)")
      ->check(in_range(0, kMaxJobs, true, ""));
  cmd->add_option("--format", plan.format, "table or json")
      ->check(CLI::IsMember({"table", "json"}));
  add_limit_options(cmd, plan.limits, "stop the search after this many seconds (exit 2)");
  return cmd;
}

int cmd_plan(const PlanArgs& a) {
  auto l = load_checked(a.scenario, a.sets);
  if (!l) return report(l.error());
  scenarios::SearchOptions o;
  if (std::string error = search_options(a, l->scenario(), o); !error.empty()) {
    return usage_error(error);
  }
  const models::Scenario largest = largest_candidate(l->scenario(), o.space);
  if (auto st = scenarios::check_plan_size(largest, a.limits); !st) {
    return report(eval_error(st.error(), a.scenario));
  }
  std::atomic<bool> cancel{false};
  scenarios::Watchdog watchdog(a.limits.time_limit_s, cancel);
  if (a.limits.time_limit_s > 0.0) o.eval.cancel = &cancel;
  auto r = scenarios::search_policies(l->resolved, o);
  if (watchdog.fired()) {
    return report(
        scenarios::time_limit_error(a.limits.time_limit_s, "searching policies for " + a.scenario));
  }
  if (!r) return report(r.error());
  if (a.format == "json") {
    print_json(*r);
  } else {
    print_table(a, *r, largest, !o.space.a2a_overlap.empty());
  }
  return 0;
}

}  // namespace offsim::cli
