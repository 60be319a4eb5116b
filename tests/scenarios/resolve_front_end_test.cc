// The front ends resolve a scenario once: a sweep point is checked once whichever path its
// evaluation takes, the policy search checks each candidate once (to enumerate it; a simulated
// candidate is simulated from that), and a document's errors keep their file positions.
#include <gtest/gtest.h>

#include <string>

#include "models/evaluate.h"
#include "models/report.h"
#include "models/resolve.h"
#include "models/scenario.h"
#include "scenarios/policy_search.h"
#include "scenarios/scenario_loader.h"
#include "scenarios/sweep_runner.h"

namespace offsim::scenarios {
namespace {

constexpr const char* kScenario =
    "model: {base: llama3-8b, layers: 4}\nhardware: {system: a100-40gb-1gpu}\n"
    "training: {global_batch: 16, micro_batch: 1, seq_len: 2048}\n";

Node document(const std::string& text) {
  auto doc = parse_document(text, "point.yaml");
  EXPECT_TRUE(doc) << doc.error().message;
  return *doc;
}

TEST(ResolveFrontEnd, ASweepPointIsCheckedOnce) {
  const Node doc = document(kScenario);
  for (bool early : {false, true}) {
    models::EvalOptions options;
    options.early_answers = early;
    const std::int64_t before = models::scenario_checks_run();
    const PointOutcome out = evaluate_document(doc, "", options);
    ASSERT_TRUE(out.report) << out.error;
    EXPECT_EQ(models::scenario_checks_run() - before, 1) << "early answers " << early;
  }
}

TEST(ResolveFrontEnd, ASweepPointTakesItsBasesHardwareOnlyWhenItHasTheSame) {
  auto base = resolve_document(document(kScenario), "");
  ASSERT_TRUE(base) << base.error().message;
  const std::string other_system =
      "model: {base: llama3-8b, layers: 4}\nhardware: {system: h100-1gpu}\n"
      "training: {global_batch: 16, micro_batch: 1, seq_len: 2048}\n";
  for (const std::string& text : {std::string(kScenario), other_system}) {
    const Node doc = document(text);
    const PointOutcome alone = evaluate_document(doc, "");
    const PointOutcome with_base = evaluate_document(doc, "", {}, {}, &*base);
    ASSERT_TRUE(alone.report && with_base.report) << alone.error << with_base.error;
    EXPECT_EQ(models::report_to_json(*alone.report).dump(),
              models::report_to_json(*with_base.report).dump());
  }
}

TEST(ResolveFrontEnd, TheSearchChecksEachCandidateOnce) {
  auto resolved = resolve_document(document(kScenario), "");
  ASSERT_TRUE(resolved) << resolved.error().message;
  SearchOptions o;
  o.top_k = 2;
  o.jobs = 1;
  o.space.classes = {models::TensorClass::kActivations};
  o.space.fractions = {0.0, 0.5, 1.0};
  o.space.prefetch = {1};
  const std::int64_t before = models::scenario_checks_run();
  auto r = search_policies(*resolved, o);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_GT(r->evaluated, 0);
  // Once to enumerate it; a simulated candidate is not checked again.
  EXPECT_EQ(models::scenario_checks_run() - before, r->space_size);
}

TEST(ResolveFrontEnd, ASearchFromAnUnresolvedBaseChecksEachCandidateOnce) {
  // micro_batch 3 does not divide global_batch 16: the base does not resolve, its candidates
  // with micro-batch 1 and 2 do, and take the hardware of the first one that resolves.
  auto base = scenario_from_document(
      document("model: {base: llama3-8b, layers: 4}\nhardware: {system: a100-40gb-1gpu}\n"
               "training: {global_batch: 16, micro_batch: 3, seq_len: 2048}\n"),
      "");
  ASSERT_TRUE(base) << base.error().message;
  SearchOptions o;
  o.top_k = 2;
  o.jobs = 1;
  o.space.classes = {models::TensorClass::kActivations};
  o.space.fractions = {0.0, 1.0};
  o.space.prefetch = {1};
  o.space.micro_batches = {1, 2, 3};
  const std::int64_t before = models::scenario_checks_run();
  auto r = search_policies(*base, o);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->space_size, 6);
  EXPECT_EQ(r->valid, 4);
  EXPECT_GT(r->evaluated, 0);
  EXPECT_FALSE(r->best.empty());
  // The base once, then each candidate once.
  EXPECT_EQ(models::scenario_checks_run() - before, 1 + r->space_size);
}

TEST(ResolveFrontEnd, ErrorsNameTheirPositionInTheDocument) {
  const Node doc = document(
      "model: {base: llama3-8b, layers: 4}\nhardware: {system: a100-40gb-1gpu}\n"
      "training: {global_batch: 16, micro_batch: 3, seq_len: 2048}\n");
  auto r = resolve_document(doc, "");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, sim::ErrorCode::kInvalidInput);
  EXPECT_EQ(r.error().message.rfind("point.yaml:3:", 0), 0u) << r.error().message;
  auto s = scenario_from_document(doc, "");
  ASSERT_TRUE(s);
  EXPECT_EQ(check_loaded(*s, doc).error().message, r.error().message);
}

}  // namespace
}  // namespace offsim::scenarios
