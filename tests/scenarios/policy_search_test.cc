#include "scenarios/policy_search.h"

#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <set>

#include "scenarios/scenario_loader.h"

namespace offsim::scenarios {
namespace {

models::Scenario load(const std::string& text) {
  auto doc = parse_document(text, "search.yaml");
  EXPECT_TRUE(doc) << doc.error().message;
  auto s = scenario_from_document(*doc, "");
  EXPECT_TRUE(s) << s.error().message;
  return *s;
}

// Runs both methods and checks that the pruned search returns exactly the exhaustive top K
// while simulating fewer candidates.
void expect_same_optimum(const models::Scenario& s, SearchOptions o) {
  o.method = SearchMethod::kExhaustive;
  auto exhaustive = search_policies(s, o);
  ASSERT_TRUE(exhaustive) << exhaustive.error().message;
  o.method = SearchMethod::kPruned;
  auto pruned = search_policies(s, o);
  ASSERT_TRUE(pruned) << pruned.error().message;

  EXPECT_EQ(exhaustive->evaluated, exhaustive->valid);
  EXPECT_EQ(pruned->space_size, exhaustive->space_size);
  ASSERT_FALSE(exhaustive->best.empty());
  ASSERT_EQ(pruned->best.size(), exhaustive->best.size());
  for (std::size_t i = 0; i < exhaustive->best.size(); ++i) {
    EXPECT_EQ(pruned->best[i].candidate.index, exhaustive->best[i].candidate.index)
        << "rank " << i << ": " << pruned->best[i].policy << " vs " << exhaustive->best[i].policy;
    EXPECT_EQ(pruned->best[i].report.step_time_s, exhaustive->best[i].report.step_time_s);
  }
  EXPECT_LT(pruned->evaluated, exhaustive->evaluated);
  EXPECT_EQ(pruned->evaluated + pruned->skipped_bound + pruned->skipped_infeasible, pruned->valid);
}

TEST(PolicySearch, PrunedFindsTheExhaustiveTopKOnOffloadRules) {
  const models::Scenario s = load(
      "model: {base: llama3-8b, layers: 4}\nhardware: {system: a100-40gb-1gpu}\n"
      "training: {global_batch: 8, micro_batch: 2, seq_len: 2048}\n");
  SearchOptions o;
  o.top_k = 3;
  o.space.classes = {models::TensorClass::kActivations, models::TensorClass::kOptimizerStates};
  o.space.fractions = {0.0, 0.5, 1.0};
  o.space.prefetch = {2, 1};
  // 3 × 3 fractions × 2 prefetch, minus the duplicate prefetch of "no offload" = 17, plus the
  // CPU-update variants of the 12 candidates that offload optimizer state = 29.
  expect_same_optimum(s, o);
}

TEST(PolicySearch, PrunedFindsTheExhaustiveTopKJointlyWithMicroBatchAndRecompute) {
  // Llama 3 8B cut to 8 layers has ~2.8B parameters, ~45 GB of weights, gradients and AdamW state
  // at 16 bytes each: on a 40 GB A100 it fits only with some offload, so capacity matters.
  const models::Scenario s = load(
      "model: {base: llama3-8b, layers: 8}\nhardware: {system: a100-40gb-1gpu}\n"
      "training: {global_batch: 8, micro_batch: 1, seq_len: 2048}\n");
  SearchOptions o;
  o.top_k = 2;
  o.space.classes = {models::TensorClass::kActivations, models::TensorClass::kOptimizerStates,
                     models::TensorClass::kParams};
  o.space.fractions = {0.0, 0.5, 1.0};
  o.space.prefetch = {1};
  o.space.micro_batches = {1, 2, 4};
  o.space.recompute = {models::RecomputeConfig::Mode::kNone, models::RecomputeConfig::Mode::kFull};
  expect_same_optimum(s, o);
}

TEST(PolicySearch, AnHbmOverflowRulesOutLargerMicroBatches) {
  // Without offload the 8-layer cut does not fit a 40 GB A100 at any micro-batch: the overflow
  // found at micro-batch 1 rules out the same policy at 2 and 4 without simulating them, and
  // the top K, limits included, is the exhaustive one.
  const models::Scenario s = load(
      "model: {base: llama3-8b, layers: 8}\nhardware: {system: a100-40gb-1gpu}\n"
      "training: {global_batch: 8, micro_batch: 1, seq_len: 2048}\n");
  SearchOptions o;
  o.top_k = 2;
  o.space.classes = {models::TensorClass::kActivations, models::TensorClass::kOptimizerStates};
  o.space.fractions = {0.0, 0.5, 1.0};
  o.space.prefetch = {1};
  o.space.micro_batches = {1, 2, 4};
  auto pruned = search_policies(s, o);
  ASSERT_TRUE(pruned) << pruned.error().message;
  EXPECT_GT(pruned->skipped_infeasible, 0);
  o.method = SearchMethod::kExhaustive;
  auto exhaustive = search_policies(s, o);
  ASSERT_TRUE(exhaustive) << exhaustive.error().message;
  ASSERT_EQ(pruned->best.size(), exhaustive->best.size());
  for (std::size_t i = 0; i < exhaustive->best.size(); ++i) {
    EXPECT_EQ(pruned->best[i].policy, exhaustive->best[i].policy);
    EXPECT_EQ(pruned->best[i].limit, exhaustive->best[i].limit);
  }
}

TEST(PolicySearch, TopListsEquivalentCandidatesOnce) {
  // Optimizer state updated on the CPU is never copied back ahead of use, so the prefetch depth
  // changes nothing for it: of the 5 fitting candidates (no offload; 100% with the CPU update at
  // prefetch 2 and 1; 100% with the GPU update at prefetch 2 and 1) 4 are distinct policies.
  const models::Scenario s = load(
      "model: {base: llama3-8b, layers: 2}\nhardware: {system: a100-40gb-1gpu}\n"
      "training: {global_batch: 4, micro_batch: 1, seq_len: 1024}\n");
  SearchOptions o;
  o.top_k = 5;
  o.space.classes = {models::TensorClass::kOptimizerStates};
  o.space.fractions = {0.0, 1.0};
  o.space.prefetch = {2, 1};
  for (SearchMethod method : {SearchMethod::kExhaustive, SearchMethod::kPruned}) {
    o.method = method;
    auto r = search_policies(s, o);
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(r->best.size(), 4u);
    std::set<std::string> seen;
    for (const auto& c : r->best) EXPECT_TRUE(seen.insert(c.policy).second) << c.policy;
    EXPECT_TRUE(seen.count("optimizer_states 100% (CPU update); micro_batch 1; recompute none"))
        << fmt::format("{}", fmt::join(seen, " | "));
  }
}

// For an MoE model with expert parallelism the expert-parallel all-to-all overlap is a search
// axis (parallelism.moe_a2a_overlap with the delayed weight gradients, as Megatron-Bridge sets
// them): each candidate with it on holds one more micro-batch's activations and hides the
// all-to-alls behind the other pass, the pruned search finds the exhaustive top K, and the
// best policy overlaps where it fits.
TEST(PolicySearch, SearchesTheAllToAllOverlapOfAnMoeModel) {
  const models::Scenario s = load(
      "model: {base: qwen3-30b-a3b, layers: 2}\nhardware: {system: dgx-h100}\n"
      "training: {global_batch: 32, micro_batch: 1, seq_len: 4096}\n"
      "parallelism: {dp: 8, ep: 8, zero_stage: 1}\n");
  SearchOptions o;
  o.top_k = 2;
  o.space.classes = {models::TensorClass::kActivations, models::TensorClass::kOptimizerStates};
  o.space.fractions = {0.0, 0.5, 1.0};
  o.space.prefetch = {2, 1};
  o.space.a2a_overlap = {false, true};
  expect_same_optimum(s, o);
  auto r = search_policies(s, o);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_FALSE(r->best.empty());
  const RankedCandidate& best = r->best.front();
  EXPECT_TRUE(best.candidate.a2a_overlap) << best.policy;
  EXPECT_TRUE(best.scenario.parallelism.moe_a2a_overlap);
  EXPECT_TRUE(best.scenario.parallelism.delay_wgrad_compute);
  EXPECT_NE(best.policy.find("; EP all-to-all overlap"), std::string::npos) << best.policy;
  // The same policy without the overlap is slower.
  Candidate plain = best.candidate;
  plain.a2a_overlap = false;
  const models::Scenario without = apply_candidate(s, o.space, plain);
  EXPECT_FALSE(without.parallelism.moe_a2a_overlap);
  EXPECT_FALSE(without.parallelism.delay_wgrad_compute);
  auto e = models::evaluate(without);
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_GT(e->report.step_time_s, best.report.step_time_s);
  EXPECT_NE(describe_policy(o.space, plain).find("; no EP all-to-all overlap"), std::string::npos);
}

TEST(PolicySearch, RejectsABadSpace) {
  const models::Scenario s = load(
      "model: {base: llama3-8b, layers: 2}\nhardware: {system: a100-40gb-1gpu}\n"
      "training: {global_batch: 8, micro_batch: 1, seq_len: 512}\n");
  SearchOptions o;
  o.space.fractions = {0.5, 1.0};
  EXPECT_FALSE(search_policies(s, o));
  o.space.fractions = {0.0, 1.0};
  o.top_k = 0;
  EXPECT_FALSE(search_policies(s, o));
}

}  // namespace
}  // namespace offsim::scenarios
