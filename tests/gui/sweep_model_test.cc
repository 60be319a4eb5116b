#include "gui/model/sweep_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>

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
  EXPECT_NE(neither.error().message.find("'error'"), std::string::npos) << neither.error().message;
}

// Flat records as `offsim sweep` writes them: the same columns in JSONL and CSV; a point that
// does not fit has null throughput figures, an error row null report columns.
constexpr const char* kFlatJsonl =
    R"({"index":0,"axes.offload":"none","axes.training.micro_batch":1,"scenario":"s","outcome":"completed","fits":true,"limited_by":"compute","step_time_s":1.5,"tokens_per_s":1000.0,"hbm_peak_bytes":70000000000,"memory.params_bytes":1000,"ranks":"[]","error":null}
{"index":1,"axes.offload":"none","axes.training.micro_batch":8,"scenario":"s","outcome":"out_of_memory","fits":false,"limited_by":"capacity","step_time_s":null,"tokens_per_s":null,"hbm_peak_bytes":90000000000,"memory.params_bytes":1000,"ranks":"[]","error":null}
{"index":2,"axes.offload":"all","axes.training.micro_batch":3,"scenario":null,"outcome":null,"fits":null,"limited_by":null,"step_time_s":null,"tokens_per_s":null,"hbm_peak_bytes":null,"memory.params_bytes":null,"ranks":null,"error":"3 does not divide 8"}
)";
constexpr const char* kFlatCsv =
    "index,axes.offload,axes.training.micro_batch,scenario,outcome,fits,limited_by,step_time_s,"
    "tokens_per_s,hbm_peak_bytes,memory.params_bytes,ranks,error\n"
    "0,none,1,s,completed,true,compute,1.5,1000.0,70000000000,1000,[],\n"
    "1,none,8,s,out_of_memory,false,capacity,,,90000000000,1000,[],\n"
    "2,all,3,,,,,,,,,,3 does not divide 8\n";

TEST(SweepFlat, JsonlAndCsvGiveTheSameTable) {
  auto jsonl = parse_sweep_jsonl(kFlatJsonl, "s.jsonl");
  auto csv = parse_sweep_csv(kFlatCsv, "s.csv");
  ASSERT_TRUE(jsonl) << jsonl.error().message;
  ASSERT_TRUE(csv) << csv.error().message;
  for (const SweepTable* t : {&*jsonl, &*csv}) {
    EXPECT_EQ(t->axes, (std::vector<std::string>{"offload", "training.micro_batch"}));
    ASSERT_EQ(t->rows.size(), 3u);
    EXPECT_EQ(t->rows[0].axis_values, (std::vector<std::string>{"none", "1"}));
    EXPECT_DOUBLE_EQ(*t->rows[0].step_time_s, 1.5);
    EXPECT_EQ(*t->rows[0].hbm_peak_bytes, 70'000'000'000);
    EXPECT_TRUE(t->rows[0].feasible());
    EXPECT_FALSE(t->rows[1].fits);
    EXPECT_FALSE(t->rows[1].step_time_s.has_value());  // null: no step time
    EXPECT_EQ(*t->rows[1].hbm_peak_bytes, 90'000'000'000);
    EXPECT_EQ(t->rows[2].error, "3 does not divide 8");
    EXPECT_EQ(t->rows[2].axis_values, (std::vector<std::string>{"all", "3"}));
  }
  auto a = jsonl->rows[0].metrics;
  auto b = csv->rows[0].metrics;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
}

TEST(PlotPoints, PointsThatDoNotFitStayOutOfTheFastEnd) {
  // (time, hbm, fits): the point that does not fit reports a partial 0.2 s (it stopped at the
  // out-of-memory); it is drawn 5% beyond the slowest fitting point (3 s), not at 0.2 s.
  SweepTable t;
  for (auto [time, hbm, fits] : std::vector<std::tuple<double, std::int64_t, bool>>{
           {1.0, 10, true}, {3.0, 5, true}, {0.2, 40, false}}) {
    SweepRow r;
    r.step_time_s = time;
    r.tokens_per_s = 100.0 / time;
    r.hbm_peak_bytes = hbm;
    r.fits = fits;
    t.rows.push_back(r);
  }
  SweepRow failed;
  failed.error = "bad";
  t.rows.push_back(failed);
  const auto time = plot_points(t, SweepMetric::kStepTime);
  ASSERT_EQ(time.size(), 3u);
  EXPECT_DOUBLE_EQ(time[0].y, 1.0);
  EXPECT_DOUBLE_EQ(time[1].y, 3.0);
  EXPECT_EQ(time[2].row, 2u);
  EXPECT_FALSE(time[2].fits);
  EXPECT_DOUBLE_EQ(time[2].y, 3.15);
  EXPECT_DOUBLE_EQ(time[2].hbm_peak_bytes, 40.0);
  const auto rate = plot_points(t, SweepMetric::kTokensPerS);
  ASSERT_EQ(rate.size(), 3u);
  EXPECT_DOUBLE_EQ(rate[0].y, 100.0);
  EXPECT_DOUBLE_EQ(rate[2].y, 0.0);  // not 500 tokens/s
  // Without step times (null when nothing fits) the points still show, at 1 s.
  SweepTable none;
  SweepRow oom;
  oom.hbm_peak_bytes = 7;
  none.rows.push_back(oom);
  ASSERT_EQ(plot_points(none, SweepMetric::kStepTime).size(), 1u);
  EXPECT_DOUBLE_EQ(plot_points(none, SweepMetric::kStepTime)[0].y, 1.0);
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
