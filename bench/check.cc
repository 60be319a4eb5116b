#include "bench/check.h"

#include <fmt/format.h>

#include "models/report.h"
#include "models/static_memory.h"

namespace offsim::bench {

namespace {

using nlohmann::json;

// Adds "what: full vs early" to `out` when the two differ.
template <typename T>
void same(std::string& out, const std::string& what, const T& full, const T& early) {
  if (full == early) return;
  out += fmt::format("{}: full {} vs early {}; ", what, json(full).dump(), json(early).dump());
}

json live(const std::vector<sim::LiveTensor>& v) {
  json a = json::array();
  for (const sim::LiveTensor& t : v) a.push_back({t.name, sim::to_string(t.category), t.bytes});
  return a;
}

json oom(const models::OomReport& o) {
  return {o.op,           o.pool,           o.time_s,     o.requested_bytes,
          o.in_use_bytes, o.capacity_bytes, live(o.live), sim::to_string(o.pool_kind)};
}

// Every field an early answer can know equals the full report's; the rest are lower bounds.
std::string compare_early(const models::Report& f, const models::Report& e) {
  std::string d;
  same(d, "scenario", f.scenario, e.scenario);
  same(d, "outcome", f.outcome, e.outcome);
  same(d, "fits", f.fits, e.fits);
  same(d, "gpus", f.gpus, e.gpus);
  same(d, "hbm_capacity_bytes", f.hbm_capacity_bytes, e.hbm_capacity_bytes);
  same(d, "host_capacity_bytes", f.host_capacity_bytes, e.host_capacity_bytes);
  same(d, "hbm_reserved_bytes", f.hbm_reserved_bytes, e.hbm_reserved_bytes);
  same(d, "metadata", f.metadata, e.metadata);
  std::vector<std::string> flags = f.flags;
  flags.emplace_back(models::kStaticMemoryFlag);
  same(d, "flags", flags, e.flags);
  // No rate of a step that does not fit is reported (JSON null), on either path.
  same(d, "time.compute_s", f.time.compute_s, e.time.compute_s);
  same(d, "mfu", f.mfu, e.mfu);
  same(d, "tokens_per_s", f.tokens_per_s, e.tokens_per_s);
  if (!f.oom || !e.oom) {
    d += "oom missing; ";
  } else {
    same(d, "oom", oom(*f.oom), oom(*e.oom));
  }
  // The pools failing at t = 0 are the full report's first ones, in the same order; any later
  // one of the full report failed after t = 0 (so the early answer could not know it).
  if (e.over_capacity.empty() || e.over_capacity.size() > f.over_capacity.size()) {
    d += fmt::format("over_capacity: full {} pools vs early {}; ", f.over_capacity.size(),
                     e.over_capacity.size());
  } else {
    for (std::size_t i = 0; i < e.over_capacity.size(); ++i) {
      const models::PoolDemand& a = f.over_capacity[i];
      const models::PoolDemand& b = e.over_capacity[i];
      const std::string k = fmt::format("over_capacity[{}]", i);
      same(d, k + ".pool", a.pool, b.pool);
      same(d, k + ".capacity_bytes", a.capacity_bytes, b.capacity_bytes);
      same(d, k + ".first_failure", oom(a.first_failure), oom(b.first_failure));
      if (!b.demand_is_lower_bound || b.demand_bytes > a.demand_bytes) {
        d += fmt::format("{}: demand {} is not a flagged lower bound of {}; ", k, b.demand_bytes,
                         a.demand_bytes);
      }
      same(d, k + ".overshoot_bytes", b.demand_bytes - b.capacity_bytes, b.overshoot_bytes);
    }
    for (std::size_t i = e.over_capacity.size(); i < f.over_capacity.size(); ++i) {
      const models::OomReport& o = f.over_capacity[i].first_failure;
      if (o.op == "initial_tensors") {
        d += fmt::format(
            "over_capacity[{}]: pool {} fails at t = 0 but is not in the early "
            "answer; ",
            i, f.over_capacity[i].pool);
      }
    }
  }
  if (f.ranks.size() != e.ranks.size()) {
    d += fmt::format("ranks: {} vs {}; ", f.ranks.size(), e.ranks.size());
  } else {
    for (std::size_t i = 0; i < f.ranks.size(); ++i) {
      same(d, "ranks.name", f.ranks[i].name, e.ranks[i].name);
      same(d, "ranks.hbm_capacity_bytes", f.ranks[i].hbm_capacity_bytes,
           e.ranks[i].hbm_capacity_bytes);
      if (e.ranks[i].hbm_peak_bytes > f.ranks[i].hbm_peak_bytes) {
        d += fmt::format("{}: peak {} above the full {}; ", e.ranks[i].name,
                         e.ranks[i].hbm_peak_bytes, f.ranks[i].hbm_peak_bytes);
      }
    }
  }
  if (e.hbm_peak_bytes > f.hbm_peak_bytes || e.host_peak_bytes > f.host_peak_bytes) {
    d += "a peak above the full report's; ";
  }
  return d;
}

}  // namespace

models::EvalOptions sweep_eval_options(bool full_path) {
  models::EvalOptions o;
  o.steady_state = !full_path;
  o.early_answers = !full_path;
  return o;
}

std::string path_of(const models::Evaluation& e) {
  return e.early_answer ? "early" : e.steady_state ? "steady" : "full";
}

std::string compare_with_full_path(const models::Scenario& scenario,
                                   const models::Evaluation& shortcut) {
  sim::Result<models::Evaluation> full = models::evaluate(scenario, sweep_eval_options(true));
  if (!full) return "full path: " + full.error().message;
  if (shortcut.early_answer) return compare_early(full->report, shortcut.report);
  const std::string a = models::report_to_json(full->report).dump();
  const std::string b = models::report_to_json(shortcut.report).dump();
  if (a != b) return fmt::format("report differs:\n full     {}\n shortcut {}", a, b);
  return {};
}

}  // namespace offsim::bench
