// resolve(): a scenario is checked once per evaluation, whichever path evaluate() takes; a
// variant keeps its base's hardware; the cancel flag stops the steady-state path.
#include "models/resolve.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <string>

#include "models/evaluate.h"
#include "models/layer_policy.h"
#include "models/plan_size.h"
#include "models/report.h"
#include "models/scenario.h"
#include "models/step_builder.h"

namespace offsim::models {
namespace {

// Llama 3 8B, eight layers, on one H100: 16 micro-batches take the steady-state fast path.
Scenario small(std::int64_t micro_batches = 16) {
  Scenario s;
  s.name = "resolve";
  s.model = *find_model("llama3-8b");
  s.model.layers = 8;
  s.hardware.system = "h100-1gpu";
  s.training = {.global_batch = micro_batches, .micro_batch = 1, .seq_len = 2048};
  return s;
}

TEST(Resolve, CarriesTheSystemAndProfile) {
  Scenario s = small();
  s.hardware.overrides.emplace_back("profile.host_link.h2d_bytes_per_s", 1.0e10);
  auto r = resolve(s);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->system().name, "h100-1gpu");
  EXPECT_EQ(r->profile().provenance.profile_name, "h100-sxm");
  EXPECT_EQ(r->profile().host_link.h2d_bytes_per_s.value, 1.0e10);  // the override applied
  EXPECT_EQ(r->scenario().name, "resolve");
}

TEST(Resolve, ErrorsAreTheChecksMessagesLocatedByTheCaller) {
  Scenario s = small();
  s.parallelism.tp = 3;  // does not divide the heads
  auto plain = resolve(s);
  ASSERT_FALSE(plain);
  EXPECT_EQ(plain.error().code, sim::ErrorCode::kInvalidInput);
  EXPECT_EQ(plain.error().message, check_scenario(s).error().message);
  ResolveOptions options;
  options.locate = [](const std::string& m) { return "file.yaml:3:5: " + m; };
  auto located = resolve(s, options);
  ASSERT_FALSE(located);
  EXPECT_EQ(located.error().message, "file.yaml:3:5: " + plain.error().message);
  // The GPU count against the system: one H100 cannot hold tp = 2.
  s.parallelism.tp = 2;
  auto gpus = resolve(s);
  ASSERT_FALSE(gpus);
  EXPECT_EQ(gpus.error().message, check_scenario(s, 1).error().message);
  // A profile that does not read is an error of hardware.profile.
  s = small();
  s.hardware.profile_path = "/nonexistent/profile.json";
  auto profile = resolve(s);
  ASSERT_FALSE(profile);
  EXPECT_EQ(profile.error().code, sim::ErrorCode::kInvalidInput);
  EXPECT_EQ(profile.error().message.rfind("hardware.profile: ", 0), 0u) << profile.error().message;
}

TEST(Resolve, EvaluateChecksTheScenarioExactlyOnceOnEveryPath) {
  const Scenario s = small();
  std::int64_t before = scenario_checks_run();
  auto r = resolve(s);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(scenario_checks_run() - before, 1);

  // The steady-state fast path (two reduced builds in the pipeline case, one here).
  before = scenario_checks_run();
  auto fast = evaluate(*r, {});
  ASSERT_TRUE(fast) << fast.error().message;
  EXPECT_TRUE(fast->steady_state);
  // The full path, with the timeline and the plan.
  EvalOptions full_options{.keep_timeline = true, .keep_plan = true};
  auto full = evaluate(*r, full_options);
  ASSERT_TRUE(full) << full.error().message;
  EXPECT_FALSE(full->steady_state);
  EXPECT_EQ(report_to_json(fast->report).dump(), report_to_json(full->report).dump());
  // A pipeline (its fast path builds a reduced step) and an early answer (static memory).
  Scenario pipeline = small(32);
  pipeline.hardware.system = "dgx-h100";
  pipeline.parallelism = {.tp = 2, .pp = 4};
  auto rp = resolve(pipeline);
  ASSERT_TRUE(rp) << rp.error().message;
  Scenario huge = small();
  huge.model.layers = 80;  // about 17e9 parameters: 16 B each of weights and Adam state
  auto rh = resolve(huge);
  ASSERT_TRUE(rh) << rh.error().message;
  before = scenario_checks_run();
  auto p = evaluate(*rp, {});
  ASSERT_TRUE(p) << p.error().message;
  EvalOptions early{.early_answers = true};
  auto h = evaluate(*rh, early);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_TRUE(h->early_answer);
  EXPECT_EQ(scenario_checks_run() - before, 0) << "evaluate() of a resolved scenario re-checked it";

  // evaluate() of a plain scenario resolves it: one check, whichever path it takes.
  before = scenario_checks_run();
  ASSERT_TRUE(evaluate(s, {}));
  EXPECT_EQ(scenario_checks_run() - before, 1);
  before = scenario_checks_run();
  ASSERT_TRUE(evaluate(pipeline, {}));
  EXPECT_EQ(scenario_checks_run() - before, 1);
}

TEST(Resolve, AVariantKeepsItsBasesHardwareAndIsCheckedOnce) {
  auto base = resolve(small());
  ASSERT_TRUE(base) << base.error().message;
  Scenario other = small();
  other.recompute.mode = RecomputeConfig::Mode::kFull;
  const std::int64_t before = scenario_checks_run();
  auto v = resolve_variant(*base, other);
  ASSERT_TRUE(v) << v.error().message;
  EXPECT_EQ(scenario_checks_run() - before, 1);
  EXPECT_EQ(v->scenario().recompute.mode, RecomputeConfig::Mode::kFull);
  EXPECT_EQ(v->system().name, base->system().name);
  // Other hardware: resolved afresh.
  other.hardware.overrides.emplace_back("profile.host_link.h2d_bytes_per_s", 2.0e10);
  auto w = resolve_variant(*base, other);
  ASSERT_TRUE(w) << w.error().message;
  EXPECT_EQ(w->profile().host_link.h2d_bytes_per_s.value, 2.0e10);
  EXPECT_NE(base->profile().host_link.h2d_bytes_per_s.value, 2.0e10);
  // A variant that fails the checks is refused.
  other.training.micro_batch = 3;  // does not divide the global batch of 16
  EXPECT_FALSE(resolve_variant(*base, other));
}

// Weights of layers 1 and 3 on the host, layer 2's activations offloaded two layers ahead,
// layer 5 fully recomputed.
Scenario with_layer_policies() {
  Scenario s = small();
  s.offload.rules.push_back({.cls = TensorClass::kParams,
                             .layers = {.kind = LayerSelection::Kind::kList, .list = {1, 3}}});
  s.offload.rules.push_back({.cls = TensorClass::kActivations,
                             .layers = {.kind = LayerSelection::Kind::kList, .list = {2}},
                             .prefetch_layers = 2});
  s.recompute.per_layer[5] = RecomputeConfig::Mode::kFull;
  return s;
}

// The layers whose weights are copied in from the host: H2D copies of a layer that allocate a
// buffer (activation reloads allocate activations).
std::set<int> layers_with_host_weights(const BuiltStep& step) {
  std::set<int> out;
  for (const sim::Op& op : step.plan.ops) {
    if (op.kind != sim::OpKind::kCopy || op.sizes.copy_direction != sim::CopyDirection::kH2D ||
        op.layer < 0) {
      continue;
    }
    for (sim::TensorId t : op.allocs) {
      if (step.plan.tensors[t.index()].category == sim::TensorCategory::kBuffers) {
        out.insert(op.layer);
      }
    }
  }
  return out;
}

TEST(Resolve, LayerPoliciesAreWorkedOutOnceAndReadByTheBuilderAndTheEstimate) {
  const Scenario s = with_layer_policies();
  std::int64_t before = layer_policies_worked_out();
  auto r = resolve(s);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(layer_policies_worked_out() - before, s.model.layers);
  const LayerPolicies& lp = r->layer_policies();
  ASSERT_EQ(lp.layers.size(), static_cast<std::size_t>(s.model.layers));
  for (int l = 0; l < s.model.layers; ++l) {
    EXPECT_EQ(lp.of(l).params_on_host, l == 1 || l == 3) << "layer " << l;
    const bool any_act_on_host =
        std::find(lp.of(l).on_host.begin(), lp.of(l).on_host.end(), true) != lp.of(l).on_host.end();
    EXPECT_EQ(any_act_on_host, l == 2) << "layer " << l;
  }
  EXPECT_EQ(lp.of(2).prefetch, 2);
  EXPECT_FALSE(lp.outside.params_on_host);  // no rule selects every layer
  // Full recompute saves only the layer input: layer 5 saves less than layer 4.
  const LayerDims d = layer_dims(s);
  EXPECT_LT(lp.of(5).acts.saved_bytes(d), lp.of(4).acts.saved_bytes(d));

  // Building (full and reduced), evaluating on both paths and estimating read them.
  before = layer_policies_worked_out();
  auto step = build_step(*r, {});
  ASSERT_TRUE(step) << step.error().message;
  ASSERT_TRUE(build_step(*r, {.micro_batches = 2}));
  const PlanSize resolved_size = estimate_plan_size(*r);
  ASSERT_TRUE(evaluate(*r, {}));
  ASSERT_TRUE(evaluate(*r, {.keep_timeline = true}));
  EXPECT_EQ(layer_policies_worked_out() - before, 0)
      << "building or estimating a resolved scenario worked out a layer policy again";
  // What the builder emitted follows the resolved policies.
  EXPECT_EQ(layers_with_host_weights(*step), (std::set<int>{1, 3}));
  // The estimate of the resolved scenario is that of the plain one, which works them out.
  const PlanSize plain_size = estimate_plan_size(s);
  EXPECT_EQ(resolved_size.ops, plain_size.ops);
  EXPECT_EQ(resolved_size.tensors, plain_size.tensors);
  EXPECT_EQ(resolved_size.deps, plain_size.deps);
}

TEST(Resolve, AVariantHasItsOwnLayerPolicies) {
  auto base = resolve(with_layer_policies());
  ASSERT_TRUE(base) << base.error().message;
  Scenario other = with_layer_policies();
  other.offload.rules.push_back(
      {.cls = TensorClass::kParams, .layers = {.kind = LayerSelection::Kind::kList, .list = {0}}});
  auto v = resolve_variant(*base, other);
  ASSERT_TRUE(v) << v.error().message;
  EXPECT_TRUE(v->layer_policies().of(0).params_on_host);
  EXPECT_FALSE(base->layer_policies().of(0).params_on_host);
  auto step = build_step(*v, {});
  ASSERT_TRUE(step) << step.error().message;
  EXPECT_EQ(layers_with_host_weights(*step), (std::set<int>{0, 1, 3}));
}

TEST(Resolve, CancelStopsTheSteadyStatePath) {
  auto r = resolve(small());
  ASSERT_TRUE(r) << r.error().message;
  auto uncancelled = evaluate(*r, {});
  ASSERT_TRUE(uncancelled) << uncancelled.error().message;
  ASSERT_TRUE(uncancelled->steady_state);  // the path under test
  std::atomic<bool> cancel{true};
  EvalOptions options;
  options.cancel = &cancel;
  auto e = evaluate(*r, options);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code, sim::ErrorCode::kCancelled) << e.error().message;
  // Stopped in the reduced step: the full step was never built.
  EXPECT_NE(e.error().message.find("before simulating the full step"), std::string::npos)
      << e.error().message;
}

}  // namespace
}  // namespace offsim::models
