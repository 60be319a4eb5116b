// Advice for configurations that do not fit: what dominates memory and which class must move.
#include "scenarios/memory_advice.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "models/evaluate.h"
#include "scenarios/scenario_loader.h"

namespace offsim::scenarios {
namespace {

namespace fs = std::filesystem;

models::Scenario load(const std::string& name, const std::vector<std::string>& sets = {}) {
  const fs::path path = fs::path(OFFSIM_SOURCE_DIR) / "scenarios" / "examples" / name;
  auto file = load_scenario_file(path.string(), sets);
  EXPECT_TRUE(file) << file.error().message;
  auto s = scenario_from_document(file->base, file->base_dir);
  EXPECT_TRUE(s) << s.error().message;
  return *s;
}

std::string advice_for(const models::Scenario& s) {
  auto e = models::evaluate(s);
  EXPECT_TRUE(e) << e.error().message;
  auto a = memory_advice(s, e->report);
  EXPECT_TRUE(a) << a.error().message;
  return *a;
}

TEST(MemoryAdvice, NothingToSayWhenItFits) {
  EXPECT_EQ(advice_for(load("zero-offload-1gpu.yaml")), "");
}

TEST(MemoryAdvice, Llama70bOn8H100NeedsTheOptimizerMovedNotTheActivations) {
  // 70.6B parameters over TP 8: 2 + 2 + 12 bytes each = ~131 GiB per GPU before activations.
  const std::string a =
      advice_for(load("llama70b-8xh100-no-offload.yaml", {"offload=megatron_activation_offload"}));
  EXPECT_NE(a.find("weights+grads+Adam state alone need 131."), std::string::npos) << a;
  EXPECT_NE(a.find("of 79.19 GiB per GPU"), std::string::npos) << a;
  EXPECT_NE(a.find("activation offload or recomputation cannot fit this; offload the optimizer "
                   "state"),
            std::string::npos)
      << a;
}

TEST(MemoryAdvice, ActivationsDominatingAskForRecomputeOrOffload) {
  const std::string a = advice_for(
      load("2b-1xa100-no-offload.yaml", {"training.micro_batch=32", "training.global_batch=32"}));
  EXPECT_NE(a.find("activations dominate"), std::string::npos) << a;
  EXPECT_NE(a.find("recompute: selective or full"), std::string::npos) << a;
}

TEST(MemoryAdvice, PinnedHostMemory) {
  const std::string a =
      advice_for(load("gb200-optimizer-offload.yaml",
                      {"hardware.nodes=1", "parallelism.dp=4", "training.global_batch=8"}));
  EXPECT_NE(a.find("pinned host memory"), std::string::npos) << a;
  EXPECT_NE(a.find("more nodes"), std::string::npos) << a;
}

TEST(MemoryAdvice, ThePoolsKindDecidesNotItsName) {
  const models::Scenario s =
      load("gb200-optimizer-offload.yaml",
           {"hardware.nodes=1", "parallelism.dp=4", "training.global_batch=8"});
  auto e = models::evaluate(s);
  ASSERT_TRUE(e) << e.error().message;
  models::Report r = e->report;
  ASSERT_TRUE(r.oom);
  ASSERT_EQ(r.oom->pool_kind, sim::PoolKind::kPinnedHost);
  r.oom->pool = "rank0.hbm";  // a display name that says otherwise
  auto host = memory_advice(s, r);
  ASSERT_TRUE(host) << host.error().message;
  EXPECT_NE(host->find("pinned host memory"), std::string::npos) << *host;
  r.oom->pool = "node0.pinned";
  r.oom->pool_kind = sim::PoolKind::kHbm;
  auto hbm = memory_advice(s, r);
  ASSERT_TRUE(hbm) << hbm.error().message;
  EXPECT_EQ(hbm->find("pinned host memory"), std::string::npos) << *hbm;
}

}  // namespace
}  // namespace offsim::scenarios
