#include "scenarios/policy_search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "scenarios/progress.h"
#include "scenarios/report_format.h"
#include "sim/platform/system.h"

namespace offsim::scenarios {
namespace {

using models::RecomputeConfig;
using models::TensorClass;

enum class State { kUnknown, kFits, kHbmFull, kHostFull, kOtherFailure };

struct Entry {
  Candidate candidate;
  int group = 0;
  int wave = 0;
  bool valid = false;
  State state = State::kUnknown;
  double key = 0.0;  // smaller is better
  std::optional<models::Report> report;
};

void parallel_for(std::size_t n, int jobs, const std::function<void(std::size_t)>& fn) {
  if (jobs <= 0) jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  jobs = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(jobs), n));
  if (jobs <= 1) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < jobs; ++t) {
    threads.emplace_back([&] {
      for (std::size_t i = next++; i < n; i = next++) fn(i);
    });
  }
  for (std::thread& t : threads) t.join();
}

bool below_or_equal(const Candidate& a, const Candidate& b) {
  if (a.prefetch_level > b.prefetch_level) return false;
  for (std::size_t c = 0; c < a.levels.size(); ++c)
    if (a.levels[c] > b.levels[c]) return false;
  return true;
}

double objective_key(const models::Report& r, Objective objective) {
  return objective == Objective::kStepTime ? r.step_time_s : -r.tokens_per_s;
}

State classify(const models::Report& r) {
  if (r.fits) return State::kFits;
  if (r.oom) {
    return r.oom->device_memory ? State::kHbmFull : State::kHostFull;
  }
  return State::kOtherFailure;
}

}  // namespace

models::Scenario apply_candidate(const models::Scenario& base, const SearchSpace& space,
                                 const Candidate& c) {
  models::Scenario s = base;
  s.training.micro_batch = c.micro_batch;
  s.recompute.mode = c.recompute;
  s.recompute.per_layer.clear();
  s.offload = models::OffloadPolicy{};
  s.offload.preset = "search";
  for (std::size_t k = 0; k < space.classes.size(); ++k) {
    const double fraction = space.fractions[static_cast<std::size_t>(c.levels[k])];
    if (fraction <= 0.0) continue;
    models::OffloadRule rule;
    rule.cls = space.classes[k];
    if (fraction < 1.0) {
      rule.layers.kind = models::LayerSelection::Kind::kFraction;
      rule.layers.fraction = fraction;
    }
    rule.where = models::Placement::kHost;
    rule.prefetch_layers = space.prefetch[static_cast<std::size_t>(c.prefetch_level)];
    s.offload.rules.push_back(rule);
  }
  s.offload.optimizer_on_cpu = c.optimizer_on_cpu;
  return s;
}

std::string describe_policy(const SearchSpace& space, const Candidate& c) {
  std::vector<std::string> parts;
  const int prefetch = space.prefetch[static_cast<std::size_t>(c.prefetch_level)];
  for (std::size_t k = 0; k < space.classes.size(); ++k) {
    const double fraction = space.fractions[static_cast<std::size_t>(c.levels[k])];
    if (fraction <= 0.0) continue;
    std::string part =
        fmt::format("{} {:.0f}%", models::to_string(space.classes[k]), 100.0 * fraction);
    if (space.classes[k] == TensorClass::kOptimizerStates) {
      part += c.optimizer_on_cpu ? " (CPU update)" : " (GPU update)";
    }
    parts.push_back(part);
  }
  // The prefetch depth governs H2D copies ahead of use: of offloaded activations and parameters,
  // and of optimizer state streamed back for a GPU update. Without those it changes nothing, and
  // candidates that differ only in it are the same policy.
  bool prefetched = false;
  for (std::size_t k = 0; k < space.classes.size(); ++k) {
    if (space.fractions[static_cast<std::size_t>(c.levels[k])] <= 0.0) continue;
    prefetched |= space.classes[k] != TensorClass::kOptimizerStates || !c.optimizer_on_cpu;
  }
  std::string out = parts.empty() ? "no offload" : fmt::format("{}", fmt::join(parts, ", "));
  if (prefetched) out += fmt::format("; prefetch {}", prefetch);
  out +=
      fmt::format("; micro_batch {}; recompute {}", c.micro_batch, models::to_string(c.recompute));
  return out;
}

sim::Result<SearchResult> search_policies(const models::Scenario& base,
                                          const SearchOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  const SearchSpace& space = options.space;
  if (space.fractions.empty() || space.fractions.front() != 0.0 ||
      !std::is_sorted(space.fractions.begin(), space.fractions.end())) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "search fractions: expected an ascending list starting at 0");
  }
  if (space.prefetch.empty() || space.classes.empty()) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "search space: expected at least one tensor class and one prefetch depth");
  }
  if (options.top_k < 1) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "--top: expected K >= 1, got {}",
                     options.top_k);
  }
  const std::vector<std::int64_t> mbs = space.micro_batches.empty()
                                            ? std::vector<std::int64_t>{base.training.micro_batch}
                                            : space.micro_batches;
  const std::vector<RecomputeConfig::Mode> rcs =
      space.recompute.empty() ? std::vector<RecomputeConfig::Mode>{base.recompute.mode}
                              : space.recompute;
  const auto opt_it =
      std::find(space.classes.begin(), space.classes.end(), TensorClass::kOptimizerStates);
  const int opt_class =
      opt_it == space.classes.end() ? -1 : static_cast<int>(opt_it - space.classes.begin());
  std::vector<bool> opt_choices = {false};
  if (space.optimizer_choice && opt_class >= 0) opt_choices.push_back(true);
  std::optional<int> gpus_per_node;
  if (auto system = sim::platform::find_system(base.hardware.system)) {
    gpus_per_node = system->gpus_per_node;
  }

  // Enumerate the space in a fixed order; the index breaks ties between equal objectives.
  const int n_classes = static_cast<int>(space.classes.size());
  const int n_fractions = static_cast<int>(space.fractions.size());
  const int n_prefetch = static_cast<int>(space.prefetch.size());
  std::vector<Entry> entries;
  std::vector<std::size_t> group_top;  // the most-offloaded candidate of each group
  int group = 0;
  for (std::int64_t mb : mbs) {
    for (RecomputeConfig::Mode rc : rcs) {
      for (bool opt_cpu : opt_choices) {
        std::optional<std::size_t> top;
        std::vector<int> levels(static_cast<std::size_t>(n_classes), 0);
        while (true) {
          const bool none = std::all_of(levels.begin(), levels.end(), [](int l) { return l == 0; });
          const bool opt_ok = !opt_cpu || levels[static_cast<std::size_t>(opt_class)] > 0;
          for (int p = 0; p < n_prefetch; ++p) {
            if (none && p > 0) break;  // without offload the prefetch depth means nothing
            if (!opt_ok) break;
            Entry e;
            e.candidate =
                Candidate{static_cast<std::int64_t>(entries.size()), levels, p, opt_cpu, mb, rc};
            e.group = group;
            e.wave = p;
            for (int l : levels) e.wave += l;
            const models::Scenario s = apply_candidate(base, space, e.candidate);
            e.valid = gpus_per_node ? static_cast<bool>(models::check_scenario(s, *gpus_per_node))
                                    : static_cast<bool>(models::check_scenario(s));
            entries.push_back(std::move(e));
            if (entries.back().valid) top = entries.size() - 1;  // enumeration ends at the top
          }
          int k = n_classes - 1;
          while (k >= 0 && ++levels[static_cast<std::size_t>(k)] == n_fractions) {
            levels[static_cast<std::size_t>(k)] = 0;
            --k;
          }
          if (k < 0) break;
        }
        group_top.push_back(top.value_or(SIZE_MAX));
        ++group;
      }
    }
  }

  SearchResult result;
  result.space_size = static_cast<std::int64_t>(entries.size());
  for (const Entry& e : entries) result.valid += e.valid ? 1 : 0;

  Progress progress(result.valid, options.progress, 5.0);
  std::mutex progress_mutex;
  std::int64_t simulated = 0;
  auto evaluate = [&](std::vector<std::size_t> todo) {
    parallel_for(todo.size(), options.jobs, [&](std::size_t i) {
      if (options.progress) {
        const std::lock_guard<std::mutex> lock(progress_mutex);
        progress.update(simulated++);
      }
      Entry& e = entries[todo[i]];
      auto eval = models::evaluate(apply_candidate(base, space, e.candidate), options.eval);
      if (!eval) {
        e.state = State::kOtherFailure;
        return;
      }
      e.state = classify(eval->report);
      e.key = objective_key(eval->report, options.objective);
      e.report = std::move(eval->report);
    });
    result.evaluated += static_cast<std::int64_t>(todo.size());
  };

  // Equivalent candidates (the same policy reached with another prefetch depth or optimizer
  // placement when nothing they govern is offloaded) are listed once. A policy has at most
  // `copies` equivalent candidates, so the K·copies-th best key bounds the K-th distinct one.
  const int copies = static_cast<int>(space.prefetch.size()) * (space.optimizer_choice ? 2 : 1);
  const int bound_k = options.top_k * copies;
  auto kth_key = [&]() -> std::optional<double> {
    std::vector<double> keys;
    for (const Entry& e : entries)
      if (e.state == State::kFits) keys.push_back(e.key);
    if (static_cast<int>(keys.size()) < bound_k) return std::nullopt;
    std::nth_element(keys.begin(), keys.begin() + (bound_k - 1), keys.end());
    return keys[static_cast<std::size_t>(bound_k - 1)];
  };

  if (options.method == SearchMethod::kExhaustive) {
    std::vector<std::size_t> todo;
    for (std::size_t i = 0; i < entries.size(); ++i)
      if (entries[i].valid) todo.push_back(i);
    evaluate(todo);
  } else {
    // Probe each group's top: when even it does not fit HBM, nothing in the group does.
    std::vector<std::size_t> tops;
    for (std::size_t t : group_top)
      if (t != SIZE_MAX) tops.push_back(t);
    evaluate(tops);
    std::vector<bool> group_dead(static_cast<std::size_t>(group), false);
    for (std::size_t g = 0; g < group_top.size(); ++g) {
      if (group_top[g] != SIZE_MAX && entries[group_top[g]].state == State::kHbmFull)
        group_dead[g] = true;
    }
    int max_wave = 0;
    for (const Entry& e : entries) max_wave = std::max(max_wave, e.wave);
    for (int wave = 0; wave <= max_wave; ++wave) {
      const std::optional<double> kth = kth_key();
      std::vector<std::size_t> todo;
      for (std::size_t i = 0; i < entries.size(); ++i) {
        Entry& x = entries[i];
        if (x.wave != wave || !x.valid || x.state != State::kUnknown) continue;
        if (group_dead[static_cast<std::size_t>(x.group)]) {
          ++result.skipped_infeasible;
          continue;
        }
        bool infeasible = false;
        std::optional<double> lower_bound;
        for (const Entry& z : entries) {
          if (z.group != x.group || z.state == State::kUnknown || &z == &x) continue;
          if (z.state == State::kHostFull && below_or_equal(z.candidate, x.candidate))
            infeasible = true;
          if (z.state == State::kHbmFull && below_or_equal(x.candidate, z.candidate))
            infeasible = true;
          if (z.state == State::kFits && below_or_equal(z.candidate, x.candidate))
            lower_bound = std::max(lower_bound.value_or(z.key), z.key);
        }
        if (infeasible) {
          ++result.skipped_infeasible;
        } else if (kth && lower_bound && *lower_bound > *kth) {
          ++result.skipped_bound;
        } else {
          todo.push_back(i);
        }
      }
      evaluate(todo);
    }
  }

  std::vector<const Entry*> fitting;
  for (const Entry& e : entries)
    if (e.state == State::kFits) fitting.push_back(&e);
  result.fitting = static_cast<std::int64_t>(fitting.size());
  std::sort(fitting.begin(), fitting.end(), [](const Entry* a, const Entry* b) {
    return a->key != b->key ? a->key < b->key : a->candidate.index < b->candidate.index;
  });
  std::set<std::string> listed;
  for (std::size_t i = 0;
       i < fitting.size() && static_cast<int>(result.best.size()) < options.top_k; ++i) {
    const Entry& e = *fitting[i];
    if (!listed.insert(describe_policy(space, e.candidate)).second) continue;
    RankedCandidate rc;
    rc.candidate = e.candidate;
    rc.scenario = apply_candidate(base, space, e.candidate);
    rc.report = *e.report;
    rc.policy = describe_policy(space, e.candidate);
    rc.limit = limiting_factor(*e.report);
    // Capacity-bound: one step less offload (or deeper prefetch) is known not to fit.
    for (const Entry& z : entries) {
      if (z.group != e.group || z.state != State::kHbmFull) continue;
      if (below_or_equal(z.candidate, e.candidate) && z.wave + 1 == e.wave) {
        rc.limit += "; capacity: less offload does not fit HBM";
        break;
      }
    }
    result.best.push_back(std::move(rc));
  }
  if (options.progress) progress.finish(result.evaluated);
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

}  // namespace offsim::scenarios
