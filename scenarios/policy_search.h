// Policy search: the best offload policies for a scenario under its HBM and host capacities.
//
// The space is tensor classes × layer fraction offloaded × prefetch depth × CPU/GPU optimizer,
// optionally jointly with micro-batch size, recompute mode and, for MoE models, the expert-
// parallel all-to-all overlap. Within a group (same micro-batch, recompute, optimizer placement
// and overlap) a candidate is a point of a lattice whose coordinates only
// ever move memory one way: a higher fraction offloaded or a shallower prefetch means less HBM,
// more host memory and no less step time. The pruned search walks each lattice upward, wave by
// wave (by the sum of the coordinates), and skips a candidate when
//   * a candidate below it already fits and is slower than the K-th best (a lower bound),
//   * the most-offloaded candidate of its group does not fit HBM (nothing in the group can),
//   * a candidate below it already exceeds host memory,
// so it evaluates the same top K as exhaustive enumeration with fewer simulations.
//
//   scenarios::SearchOptions o;
//   o.space.micro_batches = {1, 2, 4};
//   OFFSIM_ASSIGN_OR_RETURN(scenarios::SearchResult r, scenarios::search_policies(s, o));
//   for (const auto& c : r.best) fmt::print("{} {:.3f} s\n", c.policy, c.report.step_time_s);
//   fmt::print("evaluated {} of {}\n", r.evaluated, r.valid);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/evaluate.h"
#include "models/scenario.h"
#include "sim/core/result.h"

namespace offsim::scenarios {

struct SearchSpace {
  std::vector<models::TensorClass> classes = {models::TensorClass::kActivations,
                                              models::TensorClass::kOptimizerStates,
                                              models::TensorClass::kParams};
  std::vector<double> fractions = {0.0, 0.25, 0.5, 0.75, 1.0};  // ascending, from 0
  std::vector<int> prefetch = {2, 1};  // deepest first: later entries use less HBM
  bool optimizer_choice = true;        // try the CPU update when optimizer states are offloaded
  std::vector<std::int64_t> micro_batches;               // empty: the scenario's
  std::vector<models::RecomputeConfig::Mode> recompute;  // empty: the scenario's
  // The expert-parallel all-to-all overlap with another micro-batch (parallelism.moe_a2a_overlap,
  // Megatron-Core's combined 1F1B): empty: the scenario's. With it on a candidate delays the
  // expert weight gradients too (parallelism.delay_wgrad_compute, as Megatron-Bridge's
  // moe_a2a_overlap setting does) unless the scenario runs the overlap without them.
  std::vector<bool> a2a_overlap;
};

enum class Objective { kStepTime, kTokensPerS };
enum class SearchMethod { kExhaustive, kPruned };

struct SearchOptions {
  SearchSpace space;
  Objective objective = Objective::kStepTime;
  SearchMethod method = SearchMethod::kPruned;
  int top_k = 5;
  int jobs = 0;  // 0 = every hardware thread
  // Candidates simulated so far, on stderr (a bar on a terminal; progress.h), out of the valid
  // ones (the pruned search finishes early).
  bool progress = false;
  models::EvalOptions eval{.early_answers = true};  // static-memory early answers (static_memory.h)
};

struct Candidate {
  std::int64_t index = 0;   // position in the enumeration of the whole space
  std::vector<int> levels;  // per class: index into fractions
  int prefetch_level = 0;   // index into prefetch
  bool optimizer_on_cpu = false;
  std::int64_t micro_batch = 0;
  models::RecomputeConfig::Mode recompute = models::RecomputeConfig::Mode::kNone;
  bool a2a_overlap = false;
};

struct RankedCandidate {
  Candidate candidate;
  models::Scenario scenario;
  models::Report report;
  std::string policy;  // "activations 50% (prefetch 2), optimizer_states 100% (CPU update)"
  std::string limit;   // what limits it (report_format.h limiting_factor, plus capacity)
};

struct SearchResult {
  std::vector<RankedCandidate> best;    // up to top_k fitting candidates, best first
  std::int64_t space_size = 0;          // candidates enumerated
  std::int64_t valid = 0;               // of those, passing the scenario checks
  std::int64_t evaluated = 0;           // simulated
  std::int64_t fitting = 0;             // simulated and fitting
  std::int64_t skipped_bound = 0;       // pruned: a lower bound above the K-th best
  std::int64_t skipped_infeasible = 0;  // pruned: known not to fit
  double wall_s = 0.0;
};

// Each candidate is resolved once, when it is enumerated (models::resolve_variant: checked
// once, its hardware and profile those of the base), and simulated from that.
sim::Result<SearchResult> search_policies(const models::ResolvedScenario& base,
                                          const SearchOptions& options);
// Resolves the base first; when it does not resolve, the first candidate that resolves lends
// its hardware to the others.
sim::Result<SearchResult> search_policies(const models::Scenario& base,
                                          const SearchOptions& options);

// The scenario a candidate describes (base with its offload, micro-batch, recompute and
// all-to-all overlap).
models::Scenario apply_candidate(const models::Scenario& base, const SearchSpace& space,
                                 const Candidate& candidate);
std::string describe_policy(const SearchSpace& space, const Candidate& candidate);

}  // namespace offsim::scenarios
