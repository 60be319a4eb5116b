#include "scenarios/results_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace offsim::scenarios {
namespace {

namespace fs = std::filesystem;

class ResultsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("offsim_results_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    path_ = (dir_ / "out.csv").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  ResultsFile::Spec spec(std::int64_t rows) const {
    return {.path = path_,
            .header = "index,a,x",
            .expected_rows = rows,
            .expected_key = [](std::int64_t r) { return fmt::format("{},{}", r, r * 10); },
            .row_key = csv_row_key(2)};
  }
  std::string row(std::int64_t r) const { return fmt::format("{},{},\"v,{}\"", r, r * 10, r); }
  std::string read() const {
    std::ifstream in(path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  void write(const std::string& text) const { std::ofstream(path_) << text; }

  fs::path dir_;
  std::string path_;
};

TEST_F(ResultsFileTest, CreateWritesHeaderAndRows) {
  auto f = ResultsFile::open(spec(3), OpenMode::kCreate);
  ASSERT_TRUE(f) << f.error().message;
  ASSERT_TRUE(f->append({row(0), row(1)}));
  ASSERT_TRUE(f->append({row(2)}));
  EXPECT_EQ(read(), "index,a,x\n0,0,\"v,0\"\n1,10,\"v,1\"\n2,20,\"v,2\"\n");
}

TEST_F(ResultsFileTest, CreateRefusesAnExistingFile) {
  write("x\n");
  auto f = ResultsFile::open(spec(3), OpenMode::kCreate);
  ASSERT_FALSE(f);
  EXPECT_NE(f.error().message.find("--resume"), std::string::npos);
}

TEST_F(ResultsFileTest, ResumeCutsAPartialLastLineAndCountsRows) {
  write("index,a,x\n0,0,\"v,0\"\n1,10,\"v,1\"\n2,20,\"v");
  auto f = ResultsFile::open(spec(4), OpenMode::kResume);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(f->rows_done(), 2);
  ASSERT_TRUE(f->append({row(2), row(3)}));
  EXPECT_EQ(read(), "index,a,x\n0,0,\"v,0\"\n1,10,\"v,1\"\n2,20,\"v,2\"\n3,30,\"v,3\"\n");
}

TEST_F(ResultsFileTest, ResumeOfAPartialHeaderRewritesIt) {
  write("index,");
  auto f = ResultsFile::open(spec(1), OpenMode::kResume);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(f->rows_done(), 0);
  ASSERT_TRUE(f->append({row(0)}));
  EXPECT_EQ(read(), "index,a,x\n0,0,\"v,0\"\n");
}

TEST_F(ResultsFileTest, ResumeOfAMissingFileStartsOne) {
  auto f = ResultsFile::open(spec(1), OpenMode::kResume);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->rows_done(), 0);
  EXPECT_EQ(read(), "index,a,x\n");
}

TEST_F(ResultsFileTest, ResumeRejectsAnotherSweepsFile) {
  write("index,b,x\n");
  auto header = ResultsFile::open(spec(2), OpenMode::kResume);
  ASSERT_FALSE(header);
  EXPECT_NE(header.error().message.find("header does not match"), std::string::npos);

  write("index,a,x\n0,0,1\n1,11,1\n");
  auto keys = ResultsFile::open(spec(2), OpenMode::kResume);
  ASSERT_FALSE(keys);
  EXPECT_NE(keys.error().message.find(":3: row does not belong"), std::string::npos)
      << keys.error().message;

  write("index,a,x\n0,0,1\n1,10,1\n");
  auto extra = ResultsFile::open(spec(1), OpenMode::kResume);
  ASSERT_FALSE(extra);
}

TEST(CsvField, QuotesOnlyWhenNeeded) {
  EXPECT_EQ(csv_field("abc"), "abc");
  EXPECT_EQ(csv_field("a,b"), "\"a,b\"");
  EXPECT_EQ(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
}

TEST(RowKeys, CsvAndJsonl) {
  EXPECT_EQ(csv_row_key(2)("3,\"[1, 2]\",x,y"), "3,\"[1, 2]\"");
  EXPECT_EQ(csv_row_key(2)("3"), "");
  EXPECT_EQ(jsonl_row_key()(R"({"index":3,"axes.a":1,"axes.b.c":"x","fits":true,"error":null})"),
            R"({"index":3,"axes.a":1,"axes.b.c":"x"})");
  EXPECT_EQ(jsonl_row_key()(R"({"axes.a":1})"), "");
  EXPECT_EQ(jsonl_row_key()("{not json"), "");
  // A duplicate key never matches a key this sweep wrote, and says why.
  EXPECT_EQ(jsonl_row_key()(R"({"index":3,"index":4,"axes":{"a":1}})"),
            "<row: line 1: $: duplicate key 'index' (first on line 1); each key may appear only "
            "once>");
}

// A schema like a report's: scalars, a nested object, a list, an optional part and a map.
const nlohmann::json kSchema = nlohmann::json::parse(R"({
  "fits": false, "step_time_s": 0.0, "time": {"compute_s": 0.0, "bubble_s": 0.0},
  "ranks": [], "oom": {"pool": "", "live": []}, "metadata": {}})");

TEST(FlatRecords, ColumnsFollowNestedObjectsAndStopAtLeaves) {
  EXPECT_EQ(flat_columns(kSchema),
            (std::vector<std::string>{"fits", "metadata", "oom.live", "oom.pool", "ranks",
                                      "step_time_s", "time.bubble_s", "time.compute_s"}));
  EXPECT_EQ(flat_columns(nlohmann::json(1.0), "x"), std::vector<std::string>{"x"});
}

TEST(FlatRecords, ValuesAreScalarsNullsOrJsonText) {
  const auto value = nlohmann::json::parse(R"({
    "fits": true, "step_time_s": null, "time": {"compute_s": 1.5, "bubble_s": 0.25},
    "ranks": [{"name": "rank0", "multiplicity": 8}], "oom": null,
    "metadata": {"model": "m, \"x\""}, "not_in_schema": 7})");
  nlohmann::ordered_json row;
  flatten_json(kSchema, value, "", row);
  std::vector<std::string> keys;
  for (auto it = row.begin(); it != row.end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, flat_columns(kSchema));  // same columns, same order; extra members dropped
  EXPECT_EQ(row["fits"], true);
  EXPECT_TRUE(row["step_time_s"].is_null());
  EXPECT_EQ(row["time.compute_s"], 1.5);
  EXPECT_EQ(row["ranks"], R"([{"multiplicity":8,"name":"rank0"}])");
  EXPECT_TRUE(row["oom.pool"].is_null());  // a null part: every column under it is null
  EXPECT_TRUE(row["oom.live"].is_null());
  EXPECT_EQ(row["metadata"], R"({"model":"m, \"x\""})");

  // CSV: null is an empty cell, text is quoted when needed, numbers as JSON writes them.
  EXPECT_EQ(csv_row(row),
            R"(true,"{""model"":""m, \""x\""""}",,,"[{""multiplicity"":8,""name"":""rank0""}]",)"
            R"(,0.25,1.5)");
  EXPECT_EQ(csv_cell(nlohmann::ordered_json("two\nlines")), "two lines");
  EXPECT_EQ(csv_cell(nlohmann::ordered_json(1e-7)), "1e-07");
  EXPECT_EQ(json_line(row).find('\n'), std::string::npos);
  EXPECT_EQ(nlohmann::ordered_json::parse(json_line(row)), row);
}

}  // namespace
}  // namespace offsim::scenarios
