// The mixture-of-experts example scenarios through the scenario loader: the outcome and the
// figures scenarios/examples/README.md quotes for them, and the MoE shares of the time split
// (bit-identical between the steady-state fast path and the full simulation).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "models/evaluate.h"
#include "models/report.h"
#include "scenarios/scenario_loader.h"

namespace offsim::models {
namespace {

Scenario load(const std::string& name) {
  const auto path = std::filesystem::path(OFFSIM_SOURCE_DIR) / "scenarios/examples" / name;
  auto file = scenarios::load_scenario_file(path.string());
  EXPECT_TRUE(file) << file.error().message;
  auto s = scenarios::scenario_from_document(file->base, file->base_dir);
  EXPECT_TRUE(s) << s.error().message;
  return *s;
}

constexpr double gib = 1024.0 * 1024.0 * 1024.0;

// The full simulation of `s` gives the step time and HBM peak of `fast` (the steady-state fast
// path's report) bit for bit.
void expect_full_simulation_agrees(const Scenario& s, const Report& fast) {
  EvalOptions full_options;
  full_options.steady_state = false;
  auto full = evaluate(s, full_options);
  ASSERT_TRUE(full) << full.error().message;
  EXPECT_EQ(full->report.step_time_s, fast.step_time_s);
  EXPECT_EQ(full->report.hbm_peak_bytes, fast.hbm_peak_bytes);
}

TEST(MoeExamples, NoOffloadRunsOutOfHbm) {
  auto e = evaluate(load("qwen3-30b-a3b-8xh100-no-offload.yaml"));
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->report.outcome, "out_of_memory");
  // The 16 local experts' fp32 optimizer state alone is a large part of the 80 GB (its figures
  // are in the generated table of scenarios/examples/README.md, checked by examples_table_test).
  EXPECT_GT(static_cast<double>(e->report.memory.optimizer_bytes) / gib, 30.0);
  ASSERT_TRUE(e->report.oom.has_value());
  EXPECT_FALSE(e->report.over_capacity.empty());
}

TEST(MoeExamples, OptimizerOffloadFitsWithTheQuotedFigures) {
  const Scenario s = load("qwen3-30b-a3b-8xh100-optimizer-offload.yaml");
  auto fast = evaluate(s);
  ASSERT_TRUE(fast) << fast.error().message;
  const Report& r = fast->report;
  EXPECT_TRUE(r.fits);
  // The figures themselves are in the generated table of scenarios/examples/README.md (checked
  // by examples_table_test); here, what the README's prose says of them.
  EXPECT_LT(r.hbm_peak_bytes, r.hbm_capacity_bytes);
  EXPECT_GT(r.time.cpu_optimizer_s, 0.0);
  // The all-to-alls and grouped GEMMs appear in the time split as shares of comm and compute.
  EXPECT_GT(r.time.moe_alltoall_s, 0.0);
  EXPECT_LE(r.time.moe_alltoall_s, r.time.exposed_comm_s);
  EXPECT_GT(r.time.grouped_gemm_s, 0.0);
  EXPECT_LE(r.time.grouped_gemm_s, r.time.compute_s + r.time.recompute_s);
  EvalOptions full_options;
  full_options.steady_state = false;
  auto full = evaluate(s, full_options);
  ASSERT_TRUE(full);
  EXPECT_EQ(full->report.step_time_s, r.step_time_s);
  EXPECT_EQ(full->report.time.moe_alltoall_s, r.time.moe_alltoall_s);
  EXPECT_EQ(full->report.time.grouped_gemm_s, r.time.grouped_gemm_s);
}

// What the FSDP example's comment says: it fits; the same layout with the distributed optimizer
// does not, nor this one with selective recompute. The steady-state path and the full
// simulation agree on the sharded experts' gathers and reductions.
TEST(MoeExamples, FsdpShardsTheExpertsAndFits) {
  const Scenario s = load("qwen3-30b-a3b-8xh100-fsdp.yaml");
  auto e = evaluate(s);
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_TRUE(e->report.fits);
  expect_full_simulation_agrees(s, e->report);
  Scenario zero1 = s;
  zero1.parallelism.fsdp = false;
  zero1.parallelism.zero_stage = 1;
  auto z = evaluate(zero1);
  ASSERT_TRUE(z) << z.error().message;
  EXPECT_EQ(z->report.outcome, "out_of_memory");
  Scenario selective = s;
  selective.recompute.mode = RecomputeConfig::Mode::kSelective;
  auto sel = evaluate(selective);
  ASSERT_TRUE(sel) << sel.error().message;
  EXPECT_EQ(sel->report.outcome, "out_of_memory");
}

// The all-to-all overlap example: it fits, and the same step with the all-to-alls on the compute
// stream is slower, most of the difference the exposed all-to-all.
TEST(MoeExamples, AllToAllOverlapHidesTheDispatchBehindTheOtherPass) {
  const Scenario s = load("qwen3-30b-a3b-16xh100-a2a-overlap.yaml");
  ASSERT_TRUE(s.parallelism.moe_a2a_overlap);
  auto e = evaluate(s);
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_TRUE(e->report.fits);
  Scenario serial = s;
  serial.parallelism.moe_a2a_overlap = false;
  auto off = evaluate(serial);
  ASSERT_TRUE(off) << off.error().message;
  EXPECT_TRUE(off->report.fits);
  const double saved = off->report.step_time_s - e->report.step_time_s;
  const double hidden = off->report.time.moe_alltoall_s - e->report.time.moe_alltoall_s;
  EXPECT_GT(saved, 0.0);
  EXPECT_GT(hidden, 0.5 * saved);
}

TEST(MoeExamples, ExpertOffloadFetchesTheRoutedExperts) {
  const Scenario s = load("qwen3-30b-a3b-8xh100-expert-offload.yaml");
  EXPECT_EQ(s.offload.expert_fetch, OffloadPolicy::ExpertFetch::kRouted);
  ASSERT_TRUE(s.offload.expert_prediction_hit.has_value());
  auto e = evaluate(s);
  ASSERT_TRUE(e) << e.error().message;
  const Report& r = e->report;
  EXPECT_TRUE(r.fits);
  // What the file's comment says: all 16 local experts are hit, so the predictor cannot miss.
  bool noted = false;
  for (const auto& [k, v] : r.metadata) {
    if (k != "moe_expert_fetch") continue;
    noted = true;
    EXPECT_NE(v.find("16.00 of 16 local experts"), std::string::npos) << v;
    EXPECT_NE(v.find("16 fetched, 16 prefetched with the layer, 0 after the router"),
              std::string::npos)
        << v;
  }
  EXPECT_TRUE(noted);
  // Fetching every expert after the router (no predictor) exposes more of the copies; with the
  // predictor the step is the whole-set prefetch's.
  Scenario without = s;
  without.offload.expert_prediction_hit.reset();
  auto slow = evaluate(without);
  ASSERT_TRUE(slow) << slow.error().message;
  EXPECT_GT(slow->report.step_time_s, r.step_time_s);
  EXPECT_GT(slow->report.time.exposed_offload_s, r.time.exposed_offload_s);
  Scenario whole = s;
  whole.offload.expert_fetch = OffloadPolicy::ExpertFetch::kWhole;
  whole.offload.expert_prediction_hit.reset();
  auto ahead = evaluate(whole);
  ASSERT_TRUE(ahead) << ahead.error().message;
  EXPECT_EQ(ahead->report.step_time_s, r.step_time_s);
  // The steady-state fast path and the full simulation agree bit for bit.
  expect_full_simulation_agrees(without, slow->report);
}

TEST(MoeExamples, ExpertFetchKeysRoundTripAndNameBadValues) {
  const auto path = std::filesystem::path(OFFSIM_SOURCE_DIR) / "scenarios/examples" /
                    "qwen3-30b-a3b-8xh100-expert-offload.yaml";
  const Scenario s = load("qwen3-30b-a3b-8xh100-expert-offload.yaml");
  auto back = scenarios::scenario_from_document(scenarios::scenario_to_document(s), "");
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->offload.expert_fetch, s.offload.expert_fetch);
  EXPECT_EQ(back->offload.expert_prediction_hit, s.offload.expert_prediction_hit);
  const auto error_of = [&](const std::string& assignment) {
    auto file = scenarios::load_scenario_file(path.string(), {assignment});
    if (!file) return file.error().message;
    auto loaded = scenarios::scenario_from_document(file->base, file->base_dir);
    return loaded ? std::string() : loaded.error().message;
  };
  const std::string hit = error_of("offload.experts.prediction_hit=1.5");
  EXPECT_NE(hit.find("offload.experts.prediction_hit"), std::string::npos) << hit;
  EXPECT_NE(hit.find("[0, 1]"), std::string::npos) << hit;
  const std::string fetch = error_of("offload.experts.fetch=some");
  EXPECT_NE(fetch.find("offload.experts.fetch"), std::string::npos) << fetch;
  EXPECT_NE(fetch.find("whole, routed"), std::string::npos) << fetch;
}

}  // namespace
}  // namespace offsim::models
