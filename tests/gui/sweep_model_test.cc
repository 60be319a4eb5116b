#include "gui/model/sweep_model.h"

#include <gtest/gtest.h>

namespace offsim::gui {
namespace {

constexpr const char* kJsonl =
    R"({"index": 0, "scenario": "a.yaml", "axes": {"offload.policy": "none", "train.micro_batch": 1}, "report": {"step_time_s": 1.5, "tokens_per_s": 1000.0, "fits": true, "hbm_peak_bytes": 70000000000, "mfu": 0.4}}
{"index": 1, "scenario": "a.yaml", "axes": {"offload.policy": "optimizer", "train.micro_batch": 2}, "report": {"step_time_s": 1.8, "tokens_per_s": 900.0, "fits": true, "hbm_peak_bytes": 50000000000}}

{"index": 2, "scenario": "a.yaml", "axes": {"offload.policy": "none", "train.micro_batch": 4}, "report": {"step_time_s": 1.2, "tokens_per_s": 1200.0, "fits": false, "hbm_peak_bytes": 95000000000}}
{"index": 3, "scenario": "a.yaml", "axes": {"offload.policy": "all", "train.micro_batch": 4}, "error": "unknown model 'x'"}
)";

TEST(SweepJsonl, ParsesRowsAxesAndReports) {
  auto table = parse_sweep_jsonl(kJsonl, "s.jsonl");
  ASSERT_TRUE(table) << table.error().message;
  EXPECT_EQ(table->axes, (std::vector<std::string>{"offload.policy", "train.micro_batch"}));
  ASSERT_EQ(table->rows.size(), 4u);
  const SweepRow& r0 = table->rows[0];
  EXPECT_EQ(r0.index, 0);
  EXPECT_EQ(r0.scenario, "a.yaml");
  EXPECT_EQ(r0.axis_values, (std::vector<std::string>{"none", "1"}));
  EXPECT_DOUBLE_EQ(*r0.step_time_s, 1.5);
  EXPECT_DOUBLE_EQ(*r0.tokens_per_s, 1000.0);
  EXPECT_EQ(*r0.hbm_peak_bytes, 70'000'000'000);
  EXPECT_TRUE(r0.feasible());
  EXPECT_FALSE(table->rows[2].feasible());  // does not fit
  EXPECT_EQ(table->rows[3].error, "unknown model 'x'");
  EXPECT_FALSE(table->rows[3].feasible());
  EXPECT_TRUE(table->warnings.empty());
}

TEST(SweepJsonl, TruncatedLastLineIsSkippedWithAWarning) {
  std::string text = std::string(kJsonl) + R"({"index": 4, "axes": {"offload.pol)";
  auto table = parse_sweep_jsonl(text, "s.jsonl");
  ASSERT_TRUE(table);
  EXPECT_EQ(table->rows.size(), 4u);
  ASSERT_EQ(table->warnings.size(), 1u);
  EXPECT_NE(table->warnings[0].find("s.jsonl:6"), std::string::npos) << table->warnings[0];
}

TEST(SweepJsonl, BadLinesNameTheLine) {
  auto bad_json = parse_sweep_jsonl("{\"index\": 0, \"report\": {}}\n{oops\n{}\n", "s.jsonl");
  ASSERT_FALSE(bad_json);
  EXPECT_NE(bad_json.error().message.find("s.jsonl:2: not valid JSON"), std::string::npos);
  auto no_index = parse_sweep_jsonl("{\"report\": {}}\n", "s.jsonl");
  ASSERT_FALSE(no_index);
  EXPECT_NE(no_index.error().message.find("s.jsonl:1: 'index'"), std::string::npos);
  auto negative = parse_sweep_jsonl(
      "{\"index\": 0, \"report\": {\"step_time_s\": -1.0, \"fits\": true}}\n", "s.jsonl");
  ASSERT_FALSE(negative);
  EXPECT_NE(negative.error().message.find("step_time_s"), std::string::npos);
  auto neither = parse_sweep_jsonl("{\"index\": 0}\n", "s.jsonl");
  ASSERT_FALSE(neither);
  EXPECT_NE(neither.error().message.find("'report' or 'error'"), std::string::npos);
}

TEST(SweepCsv, AxesAreTheColumnsBetweenIndexAndStepTime) {
  const char* csv =
      "index,offload.policy,model.name,step_time_s,tokens_per_s,fits,hbm_peak_bytes,error\n"
      "0,none,\"llama, 8b\",1.5,1000,true,70000000000,\n"
      "1,optimizer,\"say \"\"hi\"\"\",1.8,900,false,50000000000,\n"
      "2,all,x,,,,,\"bad, input\"\n";
  auto table = parse_sweep_csv(csv, "s.csv");
  ASSERT_TRUE(table) << table.error().message;
  EXPECT_EQ(table->axes, (std::vector<std::string>{"offload.policy", "model.name"}));
  ASSERT_EQ(table->rows.size(), 3u);
  EXPECT_EQ(table->rows[0].axis_values[1], "llama, 8b");
  EXPECT_EQ(table->rows[1].axis_values[1], "say \"hi\"");
  EXPECT_TRUE(table->rows[0].feasible());
  EXPECT_FALSE(table->rows[1].fits);
  EXPECT_EQ(table->rows[2].error, "bad, input");
  EXPECT_FALSE(table->rows[2].step_time_s.has_value());
}

TEST(SweepCsv, RejectsWrongHeaderAndFieldCounts) {
  EXPECT_FALSE(parse_sweep_csv("a,b\n1,2\n", "s.csv"));
  auto short_row = parse_sweep_csv("index,step_time_s\n0,1.0\n1\n2,1.0\n", "s.csv");
  ASSERT_FALSE(short_row);
  EXPECT_NE(short_row.error().message.find("s.csv:3"), std::string::npos);
  auto not_number = parse_sweep_csv("index,step_time_s\n0,fast\n", "s.csv");
  ASSERT_FALSE(not_number);
  EXPECT_NE(not_number.error().message.find("step_time_s 'fast'"), std::string::npos);
}

SweepTable plane(const std::vector<std::tuple<double, std::int64_t, bool>>& points) {
  SweepTable t;
  for (std::size_t i = 0; i < points.size(); ++i) {
    SweepRow r;
    r.index = static_cast<int>(i);
    r.step_time_s = std::get<0>(points[i]);
    r.hbm_peak_bytes = std::get<1>(points[i]);
    r.fits = std::get<2>(points[i]);
    t.rows.push_back(r);
  }
  return t;
}

TEST(ParetoFront, MinimisesStepTimeAndPeakHbmAmongFeasible) {
  // (time, hbm): A(5,10) B(3,20) C(4,30) D(1,40) E(6,15) F(0.5,5, does not fit).
  // C is beaten by B (faster, less HBM), E by A; F is infeasible. Front by HBM: A, B, D.
  auto t = plane(
      {{5, 10, true}, {3, 20, true}, {4, 30, true}, {1, 40, true}, {6, 15, true}, {0.5, 5, false}});
  EXPECT_EQ(pareto_front(t), (std::vector<std::size_t>{0, 1, 3}));
}

TEST(ParetoFront, KeepsExactDuplicatesAndDropsWeaklyDominated) {
  // B(5,10) duplicates A(5,10); C(5,12) has equal time and more HBM: dominated.
  auto t = plane({{5, 10, true}, {5, 10, true}, {5, 12, true}});
  EXPECT_EQ(pareto_front(t), (std::vector<std::size_t>{0, 1}));
  EXPECT_TRUE(pareto_front(SweepTable{}).empty());
}

TEST(ColourByAxis, CategoricalAndNumeric) {
  auto table = parse_sweep_jsonl(kJsonl, "s.jsonl");
  ASSERT_TRUE(table);
  auto policy = colour_by_axis(*table, "offload.policy");
  ASSERT_TRUE(policy);
  EXPECT_FALSE(policy->numeric);
  EXPECT_EQ(policy->categories, (std::vector<std::string>{"none", "optimizer", "all"}));
  EXPECT_EQ(policy->value, (std::vector<double>{0, 1, 0, 2}));
  // micro_batch 1, 2, 4, 4 over [1, 4]: (v - 1) / 3.
  auto mb = colour_by_axis(*table, "train.micro_batch");
  ASSERT_TRUE(mb);
  EXPECT_TRUE(mb->numeric);
  EXPECT_DOUBLE_EQ(mb->min, 1.0);
  EXPECT_DOUBLE_EQ(mb->max, 4.0);
  EXPECT_DOUBLE_EQ(mb->value[0], 0.0);
  EXPECT_DOUBLE_EQ(mb->value[1], 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(mb->value[3], 1.0);
  auto missing = colour_by_axis(*table, "nope");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("offload.policy"), std::string::npos);
}

}  // namespace
}  // namespace offsim::gui
