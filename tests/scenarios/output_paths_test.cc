// Output paths checked and reserved before any work (scenarios/output_paths.h).
#include "scenarios/output_paths.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace offsim::scenarios {
namespace {

namespace fs = std::filesystem;

class OutputPaths : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("offsim-output-paths-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    input_ = (dir_ / "in.json").string();
    std::ofstream(input_) << "{}";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename());
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string read(const std::string& path) const {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  fs::path dir_;
  std::string input_;
};

TEST_F(OutputPaths, ReservesThenCommitsAllTogether) {
  const std::string a = (dir_ / "a.json").string();
  const std::string b = (dir_ / "b.json").string();
  {
    OutputFiles out({input_});
    ASSERT_TRUE(out.reserve("--trace", a, {".json"}));
    ASSERT_TRUE(out.reserve("--plan-out", b, {".json"}));
    // Reserved: the temporaries exist, the destinations not yet.
    EXPECT_EQ(files().size(), 3u);
    EXPECT_FALSE(fs::exists(a));
    ASSERT_TRUE(out.write(a, "A"));
    ASSERT_TRUE(out.write(b, "B"));
    ASSERT_TRUE(out.commit());
  }
  EXPECT_EQ(files(), (std::vector<std::string>{"a.json", "b.json", "in.json"}));
  EXPECT_EQ(read(a), "A");
  EXPECT_EQ(read(b), "B");
}

TEST_F(OutputPaths, AFailedSecondOutputLeavesNothingBehind) {
  const std::string a = (dir_ / "a.json").string();
  {
    OutputFiles out({input_});
    ASSERT_TRUE(out.reserve("--trace", a, {".json"}));
    auto st = out.reserve("--plan-out", (dir_ / "missing" / "p.json").string(), {".json"});
    ASSERT_FALSE(st);
    EXPECT_NE(st.error().message.find("--plan-out "), std::string::npos);
    EXPECT_NE(st.error().message.find("missing/p.json: "), std::string::npos) << st.error().message;
    EXPECT_NE(st.error().message.find("missing does not exist; expected a file in an existing "
                                      "folder"),
              std::string::npos)
        << st.error().message;
    EXPECT_EQ(st.error().message.find(".tmp."), std::string::npos) << "names the temporary";
  }
  EXPECT_EQ(files(), (std::vector<std::string>{"in.json"}));
}

TEST_F(OutputPaths, RefusesTheInputByInodeNotByString) {
  const std::string link = (dir_ / "link.json").string();
  fs::create_hard_link(input_, link);
  for (const std::string& path : {input_, link, (dir_ / "." / "in.json").string(),
                                  (dir_ / ".." / dir_.filename() / "in.json").string()}) {
    OutputFiles out({input_});
    auto st = out.reserve("--trace", path, {".json"});
    ASSERT_FALSE(st) << path;
    EXPECT_NE(st.error().message.find("is the input file"), std::string::npos);
  }
  EXPECT_EQ(read(input_), "{}");
}

TEST_F(OutputPaths, RefusesDirectoriesDevicesUnknownExtensionsAndRepeats) {
  OutputFiles out({input_});
  auto dir = out.reserve("--out", dir_.string(), {".csv", ".jsonl"});
  ASSERT_FALSE(dir);
  EXPECT_NE(dir.error().message.find("is a directory, expected a file name"), std::string::npos);
  auto dev = out.reserve("--trace", "/dev/null", {".json"});
  ASSERT_FALSE(dev);
  EXPECT_NE(dev.error().message.find("is a character device"), std::string::npos);
  auto ext = out.reserve("--out", (dir_ / "s.parquet").string(), {".csv", ".jsonl"});
  ASSERT_FALSE(ext);
  EXPECT_NE(ext.error().message.find("extension '.parquet' is not a format this output has; "
                                     "expected a name ending in .csv, .jsonl"),
            std::string::npos)
      << ext.error().message;
  ASSERT_TRUE(out.reserve("--trace", (dir_ / "t.json").string(), {".json"}));
  auto twice = out.reserve("--plan-out", (dir_ / "t.json").string(), {".json"});
  ASSERT_FALSE(twice);
  EXPECT_NE(twice.error().message.find("is also the output of --trace"), std::string::npos);
  EXPECT_TRUE(out.reserve("--timeline-out", "", {".json"}));  // no output
}

TEST_F(OutputPaths, CheckOnlyCreatesNothing) {
  EXPECT_TRUE(check_output_path("--out", (dir_ / "s.csv").string(), {".csv"}, {input_}));
  EXPECT_FALSE(check_output_path("--out", input_, {".json"}, {input_}));
  EXPECT_EQ(files(), (std::vector<std::string>{"in.json"}));
}

}  // namespace
}  // namespace offsim::scenarios
