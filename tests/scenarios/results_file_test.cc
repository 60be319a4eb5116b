#include "scenarios/results_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

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
  EXPECT_EQ(jsonl_row_key()(R"({"index":3,"scenario":"s","axes":{"a":1},"report":{}})"),
            R"({"index":3,"axes":{"a":1}})");
  EXPECT_EQ(jsonl_row_key()("{not json"), "");
  // A duplicate key never matches a key this sweep wrote, and says why.
  EXPECT_EQ(jsonl_row_key()(R"({"index":3,"index":4,"axes":{"a":1}})"),
            "<row: line 1: $: duplicate key 'index' (first on line 1); each key may appear only "
            "once>");
}

}  // namespace
}  // namespace offsim::scenarios
