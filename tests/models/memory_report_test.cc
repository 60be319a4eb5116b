// The example that does not fit on purpose (scenarios/examples/llama70b-8xh100-no-offload.yaml)
// prints its demand: the table says "needs X of Y (over by Z)" with the figures of the report's
// over_capacity entry, and a dtype preset and a runtime load from YAML.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "models/evaluate.h"
#include "scenarios/report_format.h"
#include "scenarios/scenario_loader.h"

namespace offsim {
namespace {

sim::Result<models::Scenario> load(const std::string& name,
                                   const std::vector<std::string>& overrides = {}) {
  const std::filesystem::path path =
      std::filesystem::path(OFFSIM_SOURCE_DIR) / "scenarios/examples" / name;
  OFFSIM_ASSIGN_OR_RETURN(scenarios::ScenarioFile file,
                          scenarios::load_scenario_file(path.string(), overrides));
  return scenarios::scenario_from_document(file.base, file.base_dir);
}

TEST(MemoryReport, TheOutOfMemoryExamplePrintsItsDemand) {
  auto s = load("llama70b-8xh100-no-offload.yaml");
  ASSERT_TRUE(s) << s.error().message;
  auto e = models::evaluate(*s, {});
  ASSERT_TRUE(e) << e.error().message;
  const models::Report& r = e->report;
  ASSERT_FALSE(r.fits);
  ASSERT_EQ(r.over_capacity.size(), 1u);
  const models::PoolDemand& d = r.over_capacity[0];
  EXPECT_GT(d.overshoot_bytes, 0);
  const std::string table = scenarios::format_table({{s->name, r}});
  const std::string needs = fmt::format(
      "needs {} of {} (over by {})", scenarios::format_bytes(d.demand_bytes),
      scenarios::format_bytes(d.capacity_bytes), scenarios::format_bytes(d.overshoot_bytes));
  EXPECT_NE(table.find(needs), std::string::npos) << table;
  // `run --format json` is a list of flat records; lists are JSON text columns.
  const nlohmann::ordered_json j = scenarios::format_json({{s->name, r}});
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 1u);
  EXPECT_TRUE(j[0]["step_time_s"].is_null());
  const nlohmann::json over = nlohmann::json::parse(j[0]["over_capacity"].get<std::string>());
  EXPECT_EQ(over[0]["demand_bytes"].get<std::int64_t>(), d.demand_bytes);
}

TEST(MemoryReport, DtypePresetAndRuntimeLoadFromYaml) {
  auto s = load("llama70b-8xh100-offload.yaml",
                {"training.dtype_preset=megatron_bf16", "training.dtypes.first_moment=bf16",
                 "hardware.runtime=pytorch_expandable"});
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->training.dtype_preset, "megatron_bf16");
  EXPECT_EQ(s->training.dtypes.grads, sim::DType::kFp32);
  EXPECT_EQ(s->training.dtypes.first_moment, sim::DType::kBf16);
  EXPECT_EQ(s->hardware.runtime, models::HardwareConfig::Runtime::kPytorchExpandable);
  auto none = load("llama70b-8xh100-offload.yaml", {"training.dtypes.master=none"});
  ASSERT_TRUE(none) << none.error().message;
  EXPECT_FALSE(none->training.fp32_master_weights);
}

}  // namespace
}  // namespace offsim
