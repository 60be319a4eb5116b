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
  // The candidate resolved (checked) once when enumerated; released once it is simulated.
  std::optional<models::ResolvedScenario> resolved;
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
    return r.oom->device_memory() ? State::kHbmFull : State::kHostFull;
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
  if (!space.a2a_overlap.empty()) {
    models::ParallelConfig& p = s.parallelism;
    p.delay_wgrad_compute = c.a2a_overlap && (!base.parallelism.moe_a2a_overlap ||
                                              base.parallelism.delay_wgrad_compute);
    p.moe_a2a_overlap = c.a2a_overlap;
  }
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
  if (!space.a2a_overlap.empty()) {
    out += c.a2a_overlap ? "; EP all-to-all overlap" : "; no EP all-to-all overlap";
  }
  return out;
}

namespace {

sim::Status check_search_options(const SearchOptions& options) {
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
  return sim::ok();
}

// Every candidate in a fixed order (the index breaks ties between equal objectives), in groups
// of one micro-batch, recompute mode, optimizer placement and all-to-all overlap.
struct Enumeration {
  std::vector<Entry> entries;
  std::vector<std::size_t> group_top;  // the most-offloaded valid candidate of each group
};

// The next offload levels in lexicographic order (the last class fastest); false after the last.
bool next_levels(std::vector<int>& levels, int n_fractions) {
  int k = static_cast<int>(levels.size()) - 1;
  while (k >= 0 && ++levels[static_cast<std::size_t>(k)] == n_fractions) {
    levels[static_cast<std::size_t>(k)] = 0;
    --k;
  }
  return k >= 0;
}

// Each candidate is resolved here, once: from the base's hardware when the base resolved, else
// from the first candidate that resolves (the candidates differ from the base only in offload,
// micro-batch and recompute, never in the hardware keys).
class Enumerator {
 public:
  Enumerator(const models::Scenario& base, const models::ResolvedScenario* resolved,
             const SearchSpace& space)
      : base_(base), space_(space), hardware_(resolved) {
    const auto opt_it =
        std::find(space.classes.begin(), space.classes.end(), TensorClass::kOptimizerStates);
    opt_class_ =
        opt_it == space.classes.end() ? -1 : static_cast<int>(opt_it - space.classes.begin());
  }

  Enumeration run() {
    const std::vector<std::int64_t> mbs =
        space_.micro_batches.empty() ? std::vector<std::int64_t>{base_.training.micro_batch}
                                     : space_.micro_batches;
    const std::vector<RecomputeConfig::Mode> rcs =
        space_.recompute.empty() ? std::vector<RecomputeConfig::Mode>{base_.recompute.mode}
                                 : space_.recompute;
    std::vector<bool> opt_choices = {false};
    if (space_.optimizer_choice && opt_class_ >= 0) opt_choices.push_back(true);
    const std::vector<bool> a2a = space_.a2a_overlap.empty()
                                      ? std::vector<bool>{base_.parallelism.moe_a2a_overlap}
                                      : space_.a2a_overlap;
    for (const bool overlap : a2a) {
      for (std::int64_t mb : mbs) {
        for (RecomputeConfig::Mode rc : rcs) {
          for (bool opt_cpu : opt_choices) add_group(mb, rc, opt_cpu, overlap);
        }
      }
    }
    return std::move(out_);
  }

 private:
  void add_group(std::int64_t mb, RecomputeConfig::Mode rc, bool opt_cpu, bool a2a) {
    std::optional<std::size_t> top;
    std::vector<int> levels(space_.classes.size(), 0);
    do {
      const bool none = std::all_of(levels.begin(), levels.end(), [](int l) { return l == 0; });
      const bool opt_ok = !opt_cpu || levels[static_cast<std::size_t>(opt_class_)] > 0;
      for (int p = 0; p < static_cast<int>(space_.prefetch.size()); ++p) {
        if (none && p > 0) break;  // without offload the prefetch depth means nothing
        if (!opt_ok) break;
        add_entry(Candidate{static_cast<std::int64_t>(out_.entries.size()), levels, p, opt_cpu, mb,
                            rc, a2a});
        if (out_.entries.back().valid) top = out_.entries.size() - 1;  // enumeration ends at top
      }
    } while (next_levels(levels, static_cast<int>(space_.fractions.size())));
    out_.group_top.push_back(top.value_or(SIZE_MAX));
  }

  void add_entry(Candidate candidate) {
    Entry e;
    e.candidate = std::move(candidate);
    e.group = static_cast<int>(out_.group_top.size());
    e.wave = e.candidate.prefetch_level;
    for (int l : e.candidate.levels) e.wave += l;
    const models::Scenario s = apply_candidate(base_, space_, e.candidate);
    sim::Result<models::ResolvedScenario> resolved =
        hardware_ != nullptr ? models::resolve_variant(*hardware_, s) : models::resolve(s);
    if (resolved) {
      if (hardware_ == nullptr) {
        first_resolved_ = *resolved;
        hardware_ = &*first_resolved_;
      }
      e.resolved = std::move(*resolved);
    }
    e.valid = e.resolved.has_value();
    out_.entries.push_back(std::move(e));
  }

  const models::Scenario& base_;
  const SearchSpace& space_;
  const models::ResolvedScenario* hardware_;  // whose hardware the candidates take, or null
  std::optional<models::ResolvedScenario> first_resolved_;
  int opt_class_ = -1;
  Enumeration out_;
};

// Simulates lists of entries in parallel (each as resolved when enumerated), recording each
// one's state, objective and report.
class Evaluator {
 public:
  Evaluator(const SearchOptions& options, std::vector<Entry>& entries, std::int64_t valid)
      : options_(options), entries_(entries), progress_(valid, options.progress, 5.0) {}

  void evaluate(const std::vector<std::size_t>& todo) {
    parallel_for(todo.size(), options_.jobs, [&](std::size_t i) {
      if (options_.progress) {
        const std::lock_guard<std::mutex> lock(progress_mutex_);
        progress_.update(simulated_++);
      }
      Entry& e = entries_[todo[i]];
      if (!e.resolved) {
        e.state = State::kOtherFailure;
        return;
      }
      auto eval = models::evaluate(*e.resolved, options_.eval);
      e.resolved.reset();
      if (!eval) {
        e.state = State::kOtherFailure;
        return;
      }
      e.state = classify(eval->report);
      e.key = objective_key(eval->report, options_.objective);
      e.report = std::move(eval->report);
    });
    evaluated_ += static_cast<std::int64_t>(todo.size());
  }

  std::int64_t evaluated() const { return evaluated_; }
  void finish() {
    if (options_.progress) progress_.finish(evaluated_);
  }

 private:
  const SearchOptions& options_;
  std::vector<Entry>& entries_;
  Progress progress_;
  std::mutex progress_mutex_;
  std::int64_t simulated_ = 0;
  std::int64_t evaluated_ = 0;
};

// The `bound_k`-th best objective among the fitting entries, when that many fit.
std::optional<double> kth_key(const std::vector<Entry>& entries, int bound_k) {
  std::vector<double> keys;
  for (const Entry& e : entries)
    if (e.state == State::kFits) keys.push_back(e.key);
  if (static_cast<int>(keys.size()) < bound_k) return std::nullopt;
  std::nth_element(keys.begin(), keys.begin() + (bound_k - 1), keys.end());
  return keys[static_cast<std::size_t>(bound_k - 1)];
}

enum class Verdict { kEvaluate, kHbmFull, kHostFull, kBelowBound };
// Whether z's overflow says that x overflows the same memory, within a group or across micro-
// batch sizes. HBM and host use are non-decreasing in the micro-batch size (activations,
// their offload buffers and the pipeline's in-flight micro-batches, min(pp, m) · mb, grow with
// it; weights, gradients and optimizer state do not change) and move one way with the offload
// levels (the lattice above). So, for the same recompute mode and optimizer placement:
//   * z overflows HBM, z.mb <= x.mb and x offloads no more than z: x overflows HBM;
//   * z overflows host memory, z.mb <= x.mb and x offloads at least as much: x overflows it.
// (The all-to-all overlap holds one more micro-batch's activations: candidates with and without
// it are not compared.)
bool comparable(const Candidate& z, const Candidate& x) {
  return z.recompute == x.recompute && z.optimizer_on_cpu == x.optimizer_on_cpu &&
         z.a2a_overlap == x.a2a_overlap && z.micro_batch <= x.micro_batch;
}
// What the evaluated (or inferred) entries say about x: a candidate that overflows as above
// means x does not fit; the worst fitting candidate of its group with no more offload bounds
// x's objective from below.
Verdict judge(const std::vector<Entry>& entries, const Entry& x, std::optional<double> kth) {
  std::optional<double> lower_bound;
  for (const Entry& z : entries) {
    if (z.state == State::kUnknown || &z == &x || !comparable(z.candidate, x.candidate)) continue;
    if (z.state == State::kHbmFull && below_or_equal(x.candidate, z.candidate))
      return Verdict::kHbmFull;
    if (z.state == State::kHostFull && below_or_equal(z.candidate, x.candidate))
      return Verdict::kHostFull;
    if (z.group == x.group && z.state == State::kFits && below_or_equal(z.candidate, x.candidate))
      lower_bound = std::max(lower_bound.value_or(z.key), z.key);
  }
  if (kth && lower_bound && *lower_bound > *kth) return Verdict::kBelowBound;
  return Verdict::kEvaluate;
}
// The distinct micro-batch sizes of the entries, ascending.
std::vector<std::int64_t> micro_batch_sizes(const std::vector<Entry>& entries) {
  std::set<std::int64_t> mbs;
  for (const Entry& e : entries) mbs.insert(e.candidate.micro_batch);
  return {mbs.begin(), mbs.end()};
}
// Probes each group's top (when even it does not fit HBM, nothing in the group does), then
// evaluates wave by wave (total offload level), each wave by ascending micro-batch size, skipping
// what the evaluated entries rule out. An entry ruled out by an overflow is recorded as
// overflowing (it is known to), so it rules out others in turn.
void pruned_search(Enumeration& en, const SearchOptions& options, Evaluator& evaluator,
                   SearchResult& result) {
  std::vector<Entry>& entries = en.entries;
  std::vector<std::size_t> tops;
  for (std::size_t t : en.group_top)
    if (t != SIZE_MAX) tops.push_back(t);
  evaluator.evaluate(tops);
  std::vector<bool> group_dead(en.group_top.size(), false);
  for (std::size_t g = 0; g < en.group_top.size(); ++g) {
    if (en.group_top[g] != SIZE_MAX && entries[en.group_top[g]].state == State::kHbmFull)
      group_dead[g] = true;
  }
  // Equivalent candidates (the same policy reached with another prefetch depth or optimizer
  // placement when nothing they govern is offloaded) are listed once. A policy has at most
  // `copies` equivalent candidates, so the K·copies-th best key bounds the K-th distinct one.
  const int copies =
      static_cast<int>(options.space.prefetch.size()) * (options.space.optimizer_choice ? 2 : 1);
  const int bound_k = options.top_k * copies;
  int max_wave = 0;
  for (const Entry& e : entries) max_wave = std::max(max_wave, e.wave);
  const std::vector<std::int64_t> mbs = micro_batch_sizes(entries);
  for (int wave = 0; wave <= max_wave; ++wave) {
    for (std::int64_t mb : mbs) {
      const std::optional<double> kth = kth_key(entries, bound_k);
      std::vector<std::size_t> todo;
      for (std::size_t i = 0; i < entries.size(); ++i) {
        Entry& x = entries[i];
        if (x.wave != wave || x.candidate.micro_batch != mb || !x.valid ||
            x.state != State::kUnknown) {
          continue;
        }
        if (group_dead[static_cast<std::size_t>(x.group)]) {
          ++result.skipped_infeasible;
          continue;
        }
        const Verdict verdict = judge(entries, x, kth);
        if (verdict == Verdict::kHbmFull || verdict == Verdict::kHostFull) {
          ++result.skipped_infeasible;
          x.state = verdict == Verdict::kHbmFull ? State::kHbmFull : State::kHostFull;
        } else if (verdict == Verdict::kBelowBound) {
          ++result.skipped_bound;
        } else {
          todo.push_back(i);
        }
      }
      evaluator.evaluate(todo);
    }
  }
}
RankedCandidate ranked(const models::Scenario& base, const SearchSpace& space,
                       const std::vector<Entry>& entries, const Entry& e) {
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
  return rc;
}

// The best `top_k` distinct policies among the fitting entries, best first.
void rank_best(const models::Scenario& base, const SearchOptions& options,
               const std::vector<Entry>& entries, SearchResult& result) {
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
    if (!listed.insert(describe_policy(options.space, e.candidate)).second) continue;
    result.best.push_back(ranked(base, options.space, entries, e));
  }
}

}  // namespace

namespace {

sim::Result<SearchResult> search(const models::Scenario& base,
                                 const models::ResolvedScenario* resolved,
                                 const SearchOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  OFFSIM_RETURN_IF_ERROR(check_search_options(options));
  Enumeration en = Enumerator(base, resolved, options.space).run();
  SearchResult result;
  result.space_size = static_cast<std::int64_t>(en.entries.size());
  for (const Entry& e : en.entries) result.valid += e.valid ? 1 : 0;

  Evaluator evaluator(options, en.entries, result.valid);
  if (options.method == SearchMethod::kExhaustive) {
    std::vector<std::size_t> todo;
    for (std::size_t i = 0; i < en.entries.size(); ++i)
      if (en.entries[i].valid) todo.push_back(i);
    evaluator.evaluate(todo);
  } else {
    pruned_search(en, options, evaluator, result);
  }
  result.evaluated = evaluator.evaluated();
  rank_best(base, options, en.entries, result);
  evaluator.finish();
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

}  // namespace

sim::Result<SearchResult> search_policies(const models::ResolvedScenario& base,
                                          const SearchOptions& options) {
  return search(base.scenario(), &base, options);
}

sim::Result<SearchResult> search_policies(const models::Scenario& base,
                                          const SearchOptions& options) {
  // A base that does not resolve may still have candidates that do (another micro-batch size).
  const sim::Result<models::ResolvedScenario> resolved = models::resolve(base);
  return search(base, resolved ? &*resolved : nullptr, options);
}

}  // namespace offsim::scenarios
