// The steady-state fast path of evaluate() against the full simulation: every example scenario
// (each sweep point too) and a parameterised set of layouts, policies and micro-batch counts give
// byte-identical reports; the fast path is taken where the step is periodic and falls back where
// it is not.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "models/evaluate.h"
#include "models/report.h"
#include "models/scenario.h"
#include "scenarios/scenario_loader.h"

namespace offsim::models {
namespace {

using Mode = RecomputeConfig::Mode;
using Schedule = ParallelConfig::PipelineSchedule;

struct Both {
  Evaluation full;
  Evaluation fast;
};

// Evaluates through both paths and checks the reports are equal field by field (the JSON dump
// holds every field, doubles printed to round-trip, so equal dumps mean bit-equal doubles).
Both evaluate_both(const Scenario& s, const std::string& what) {
  EvalOptions full_options;
  full_options.steady_state = false;
  auto full = evaluate(s, full_options);
  auto fast = evaluate(s, EvalOptions{});
  EXPECT_EQ(full.has_value(), fast.has_value()) << what;
  if (!full || !fast) return {};
  EXPECT_FALSE(full->steady_state) << what;
  const Report& a = full->report;
  const Report& b = fast->report;
  EXPECT_EQ(report_to_json(a).dump(), report_to_json(b).dump()) << what;
  EXPECT_EQ(a.step_time_s, b.step_time_s) << what;
  EXPECT_EQ(a.mfu, b.mfu) << what;
  EXPECT_EQ(a.time.compute_s, b.time.compute_s) << what;
  EXPECT_EQ(a.time.exposed_offload_s, b.time.exposed_offload_s) << what;
  EXPECT_EQ(a.hbm_peak_bytes, b.hbm_peak_bytes) << what;
  EXPECT_EQ(a.plan_ops, b.plan_ops) << what;
  return {std::move(*full), std::move(*fast)};
}

TEST(SteadyState, EveryExampleAndSweepPointMatchesTheFullSimulation) {
  const std::filesystem::path dir = std::filesystem::path(OFFSIM_SOURCE_DIR) / "scenarios/examples";
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 10u);
  int points = 0;
  int fast = 0;
  for (const auto& path : files) {
    auto file = scenarios::load_scenario_file(path.string());
    ASSERT_TRUE(file) << file.error().message;
    std::vector<scenarios::Node> docs;
    if (file->sweep) {
      for (std::int64_t i = 0; i < file->sweep->size(); ++i) {
        docs.push_back(*scenarios::apply_point(file->base, file->sweep->point(i)));
      }
    } else {
      docs.push_back(file->base);
    }
    for (std::size_t i = 0; i < docs.size(); ++i) {
      auto scenario = scenarios::scenario_from_document(docs[i], file->base_dir);
      ASSERT_TRUE(scenario) << scenario.error().message;
      const Both both =
          evaluate_both(*scenario, path.filename().string() + " point " + std::to_string(i));
      ++points;
      fast += both.fast.steady_state ? 1 : 0;
    }
  }
  // The 2B sweep alone has 18 points with 8 or more micro-batches; they must not all fall back.
  EXPECT_GE(points, 40);
  EXPECT_GE(fast, 18);
}

Scenario base(const std::string& model, const std::string& system, std::int64_t micro_batches) {
  Scenario s;
  s.name = "steady";
  s.model = *find_model(model);
  s.model.layers = 8;  // small and fast; the structure is the same with 80 layers
  s.hardware.system = system;
  s.training = {.global_batch = micro_batches, .micro_batch = 1, .seq_len = 2048};
  return s;
}

struct Case {
  std::string name;
  ParallelConfig p;
  Mode mode;
  std::string preset;
};

std::vector<Case> cases() {
  return {
      {"single_gpu", {}, Mode::kNone, "none"},
      {"act_offload", {}, Mode::kNone, "megatron_activation_offload"},
      {"selective_offload", {}, Mode::kSelective, "megatron_activation_offload"},
      {"full_remat", {}, Mode::kFull, "none"},
      {"jax_named", {}, Mode::kFull, "jax_offload_dot_with_no_batch_dims"},
      {"cpu_optimizer", {}, Mode::kSelective, "zero_offload"},
      {"dp_allreduce", {.dp = 8}, Mode::kNone, "none"},
      {"dp_no_overlap", {.dp = 8, .overlap_grad_reduce = false}, Mode::kNone, "none"},
      {"zero1_tp",
       {.dp = 2, .tp = 4, .sequence_parallel = true, .zero_stage = 1},
       Mode::kSelective,
       "megatron_activation_offload"},
      {"zero2", {.dp = 8, .zero_stage = 2}, Mode::kNone, "zero_offload"},
      {"zero3", {.dp = 8, .zero_stage = 3}, Mode::kFull, "none"},
      {"fsdp_offload", {.dp = 8, .fsdp = true}, Mode::kNone, "fsdp_cpu_offload"},
      {"tp8", {.tp = 8, .sequence_parallel = true}, Mode::kSelective, "none"},
      {"pp_1f1b", {.tp = 2, .pp = 4, .schedule = Schedule::k1F1B}, Mode::kFull, "none"},
      {"pp_interleaved",
       {.tp = 2, .pp = 4, .schedule = Schedule::kInterleaved1F1B, .virtual_stages = 2},
       Mode::kSelective,
       "megatron_activation_offload"},
  };
}

TEST(SteadyState, LayoutsPoliciesAndMicroBatchCountsMatchTheFullSimulation) {
  int fast = 0;
  int total = 0;
  for (const Case& c : cases()) {
    for (const std::int64_t mbs : std::vector<std::int64_t>{3, 5, 6, 9, 16}) {
      const int gpus = c.p.dp * c.p.tp * c.p.pp;
      Scenario s = base("llama3-8b", gpus == 1 ? "h100-1gpu" : "dgx-h100", mbs * c.p.dp);
      s.parallelism = c.p;
      s.recompute.mode = c.mode;
      auto preset = offload_preset(c.preset, {});
      ASSERT_TRUE(preset) << c.preset;
      s.offload = *preset;
      const Both both = evaluate_both(s, c.name + " with " + std::to_string(mbs) + " mbs");
      ++total;
      fast += both.fast.steady_state ? 1 : 0;
      if (c.p.pp > 1) {
        EXPECT_FALSE(both.fast.steady_state) << c.name;
      }
    }
  }
  EXPECT_GE(fast, total / 3) << "the fast path is hardly ever taken";
}

TEST(SteadyState, TakenForGradientAccumulationOnOneGpu) {
  // 2 × 16 micro-batches of one sequence on one A100: plain gradient accumulation.
  Scenario s = base("llama3-8b", "a100-80gb-1gpu", 16);
  auto e = evaluate(s, EvalOptions{});
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_TRUE(e->steady_state) << e->full_path_reason;
  // The reduced run has 4 micro-batches; the report still counts the full step's ops.
  EvalOptions full;
  full.steady_state = false;
  full.keep_plan = true;
  auto f = evaluate(s, full);
  ASSERT_TRUE(f);
  EXPECT_EQ(e->report.plan_ops, static_cast<std::int64_t>(f->plan->ops.size()));
}

TEST(SteadyState, FallsBackWhereNothingCanBeProven) {
  // Pipeline parallelism, too few micro-batches, a timeline asked for, out of memory.
  Scenario pp = base("llama3-8b", "dgx-h100", 16);
  pp.parallelism = {.tp = 2, .pp = 4};
  auto a = evaluate(pp, EvalOptions{});
  ASSERT_TRUE(a);
  EXPECT_FALSE(a->steady_state);
  EXPECT_EQ(a->full_path_reason, "pipeline parallelism");

  Scenario few = base("llama3-8b", "h100-1gpu", 4);
  auto b = evaluate(few, EvalOptions{});
  ASSERT_TRUE(b);
  EXPECT_FALSE(b->steady_state);
  EXPECT_NE(b->full_path_reason.find("4 micro-batches"), std::string::npos);

  Scenario timeline = base("llama3-8b", "h100-1gpu", 16);
  auto c = evaluate(timeline, EvalOptions{.keep_timeline = true});
  ASSERT_TRUE(c);
  EXPECT_FALSE(c->steady_state);
  ASSERT_TRUE(c->timeline);

  Scenario oom = base("llama3-70b", "h100-1gpu", 16);
  oom.model.layers = 80;
  oom.training.micro_batch = 1;
  auto d = evaluate(oom, EvalOptions{});
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->report.fits);
  EXPECT_FALSE(d->steady_state);
  EXPECT_EQ(d->full_path_reason, "the reduced step does not complete");
}

}  // namespace
}  // namespace offsim::models
