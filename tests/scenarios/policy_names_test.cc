// Framework policy names: MaxText remat_policy as one key, framework preset names, and preset
// options set with --set on a preset written as a plain name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "models/evaluate.h"
#include "scenarios/scenario_loader.h"

namespace offsim::scenarios {
namespace {

namespace fs = std::filesystem;

constexpr const char* kBase =
    "name: t\n"
    "model: {base: llama3-8b, layers: 4}\n"
    "hardware: {system: h100-1gpu}\n"
    "training: {global_batch: 2, micro_batch: 1, seq_len: 2048}\n";

class PolicyNamesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("offsim_policy_names_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  sim::Result<models::Scenario> load(const std::string& text,
                                     const std::vector<std::string>& sets = {}) {
    const std::string path = (dir_ / "s.yaml").string();
    std::ofstream(path) << text;
    auto file = load_scenario_file(path, sets);
    if (!file) return sim::fail(file.error());
    auto s = scenario_from_document(file->base, file->base_dir);
    if (!s) return sim::fail(s.error());
    OFFSIM_RETURN_IF_ERROR(check_loaded(*s, file->base));
    return s;
  }
  fs::path dir_;
};

TEST_F(PolicyNamesTest, SetReachesPresetOptionsOfAPlainPresetName) {
  auto s = load(std::string(kBase) + "offload: megatron_activation_offload\n",
                {"offload.prefetch_layers=2"});
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->offload.preset, "megatron_activation_offload");
  ASSERT_FALSE(s->offload.rules.empty());
  EXPECT_EQ(s->offload.rules[0].prefetch_layers, 2);
  // Also when the preset itself came from --set.
  auto t = load(std::string(kBase) + "offload: none\n",
                {"offload=te_cpu_offload", "offload.num_layers=2"});
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_EQ(t->offload.preset, "te_cpu_offload");
}

TEST_F(PolicyNamesTest, MaxTextRematPolicyIsOneKey) {
  auto s = load(std::string(kBase) + "remat_policy: qkv_proj_offloaded\n");
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->recompute.mode, models::RecomputeConfig::Mode::kFull);
  EXPECT_EQ(s->offload.preset, "maxtext_qkv_proj_offloaded");
  ASSERT_EQ(s->offload.rules.size(), 3u);
  EXPECT_EQ(s->offload.rules[0].where, models::Placement::kHost);

  // save_qkv_proj keeps the same tensors on HBM: more HBM, no host traffic.
  auto saved = load(std::string(kBase) + "remat_policy: save_qkv_proj\n");
  auto full = load(std::string(kBase) + "remat_policy: full\n");
  ASSERT_TRUE(saved && full);
  EXPECT_EQ(saved->offload.rules[0].where, models::Placement::kHbm);
  auto e_saved = models::evaluate(*saved);
  auto e_off = models::evaluate(*s);
  auto e_full = models::evaluate(*full);
  ASSERT_TRUE(e_saved && e_off && e_full);
  EXPECT_GT(e_saved->report.hbm_peak_bytes, e_full->report.hbm_peak_bytes);
  EXPECT_GT(e_saved->report.hbm_peak_bytes, e_off->report.hbm_peak_bytes);
  EXPECT_EQ(e_saved->report.host_peak_bytes, 0);
  EXPECT_GT(e_off->report.host_peak_bytes, 0);
  // Saving the projections means recomputing less than full remat.
  EXPECT_LT(e_saved->report.time.recompute_s, e_full->report.time.recompute_s);
}

TEST_F(PolicyNamesTest, RematPolicyErrors) {
  auto unknown = load(std::string(kBase) + "remat_policy: everything\n");
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().message.find("remat_policy: expected a MaxText remat_policy, one of "
                                         "full, minimal"),
            std::string::npos)
      << unknown.error().message;
  auto both = load(std::string(kBase) + "recompute: none\nremat_policy: full\n");
  ASSERT_FALSE(both);
  EXPECT_NE(both.error().message.find("remat_policy: sets recompute and offload itself; remove "
                                      "'recompute'"),
            std::string::npos)
      << both.error().message;
}

TEST_F(PolicyNamesTest, FrameworkPresetNamesResolve) {
  for (const char* name :
       {"te_cpu_offload", "torchtitan_activation_offload", "inductor_activation_offload",
        "fsdp2_cpu_offload_policy", "megatron_fine_grained_activation_offload",
        "offloaded_gradient_checkpointing", "maxtext_minimal", "maxtext_save_dot_except_mlp",
        "jax_pinned_host_opt_state", "jax_pinned_host_params",
        "jax_pinned_host_params_and_opt_state"}) {
    auto p = models::offload_preset(name, {});
    ASSERT_TRUE(p) << name << ": " << p.error().message;
    EXPECT_FALSE(p->rules.empty()) << name;
  }
  // JAX pinned_host placement keeps the update on the device.
  auto jax = models::offload_preset("jax_pinned_host_params_and_opt_state", {});
  EXPECT_FALSE(jax->optimizer_on_cpu);
  EXPECT_EQ(jax->rules.size(), 3u);
  auto fsdp2 = models::offload_preset("fsdp2_cpu_offload_policy", {});
  EXPECT_TRUE(fsdp2->optimizer_on_cpu);
  auto fine =
      models::offload_preset("megatron_fine_grained_activation_offload", {.names = {"context"}});
  ASSERT_TRUE(fine);
  ASSERT_EQ(fine->rules.size(), 1u);
  EXPECT_EQ(fine->rules[0].name, "context");
  EXPECT_FALSE(
      models::offload_preset("megatron_fine_grained_activation_offload", {.names = {"nope"}}));
}

}  // namespace
}  // namespace offsim::scenarios
