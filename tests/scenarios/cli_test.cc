// Runs the real `offsim` binary: exit codes, --jobs invariance, sharding and resume after kill -9.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "tests/common/process.h"

namespace {

namespace fs = std::filesystem;

// 5 × 4 × 3 × 2 = 120 points of a tiny model; micro_batch 3 does not divide global_batch 8, so
// those 24 points are error rows.
constexpr const char* kSweep =
    "name: tiny\n"
    "model: {name: tiny, vocab_size: 1024, hidden: 256, layers: 2, heads: 4, activation: swiglu,"
    " norm: rmsnorm}\n"
    "hardware: {system: h100-1gpu}\n"
    "training: {global_batch: 8, micro_batch: 1, seq_len: 256}\n"
    "sweep:\n"
    "  training.micro_batch: [1, 2, 3, 4, 8]\n"
    "  training.seq_len: [128, 256, 512, 1024]\n"
    "  recompute: [none, selective, full]\n"
    "  offload: [none, megatron_activation_offload]\n";
constexpr int kPoints = 120;

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("offsim_cli_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    scenario_ = write("sweep.yaml", kSweep);
    const std::string text = kSweep;
    single_ = write("single.yaml", text.substr(0, text.find("sweep:")));
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string read(const std::string& file) { return offsim::testing::read_file(file); }

  static int count_lines(const std::string& file) {
    const std::string text = read(file);
    return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  }

  // Starts offsim with stdout/stderr to files in the test folder; returns the pid.
  pid_t spawn(const std::vector<std::string>& args) {
    const pid_t pid = offsim::testing::spawn_process(OFFSIM_CLI_PATH, args, path("stdout.txt"),
                                                     path("stderr.txt"));
    EXPECT_GT(pid, 0) << "cannot start " << OFFSIM_CLI_PATH;
    return pid;
  }

  static int wait_exit(pid_t pid) { return offsim::testing::wait_exit(pid); }

  int run(const std::vector<std::string>& args) { return wait_exit(spawn(args)); }
  std::string err() const { return read(path("stderr.txt")); }
  std::string out() const { return read(path("stdout.txt")); }

  fs::path dir_;
  std::string scenario_;
  std::string single_;  // the same scenario without its sweep block
};

TEST_F(CliTest, ExitCodes) {
  EXPECT_EQ(run({"--version"}), 0);
  EXPECT_EQ(run({"validate", scenario_}), 0) << err();
  EXPECT_EQ(run({"list", "models"}), 0);
  EXPECT_NE(out().find("llama3-70b"), std::string::npos);

  const std::string bad = write("bad.yaml", std::string(kSweep) + "colour: red\n");
  EXPECT_EQ(run({"run", bad}), 2);
  EXPECT_EQ(err().rfind("offsim: error: " + bad + ":10:9: colour: unknown key", 0), 0u) << err();
  EXPECT_EQ(run({"run", single_, "--set", "training.seq_len=long"}), 2);
  EXPECT_NE(err().find("--set training.seq_len=long: training.seq_len: expected an integer"),
            std::string::npos)
      << err();
  EXPECT_EQ(run({"run", path("missing.yaml")}), 2);
  EXPECT_EQ(run({"run", scenario_, "--format", "xml"}), 2);
  EXPECT_EQ(run({"list", "colours"}), 2);
  EXPECT_EQ(run({"sweep", bad, "--out", path("x.csv")}), 2);
  EXPECT_FALSE(fs::exists(path("x.csv")));
  EXPECT_EQ(run({"run", scenario_, "--set", "training.seq_len=64"}), 2);  // the sweep varies it
  EXPECT_NE(err().find("the sweep also varies 'training.seq_len'"), std::string::npos) << err();
  EXPECT_EQ(run({"run", single_, "--set", "parallelism.tp=3"}), 2);
  EXPECT_NE(err().find("parallelism.tp: 3 does not divide model.heads 4"), std::string::npos)
      << err();
  EXPECT_EQ(run({"sweep", scenario_, "--shard", "3/3", "--out", path("s.csv")}), 2);
}

TEST_F(CliTest, RunFormatsAndOutputs) {
  ASSERT_EQ(run({"run", single_, "--format", "json", "--trace", path("trace.json"), "--plan-out",
                 path("plan.json"), "--timeline-out", path("timeline.json")}),
            0)
      << err();
  const std::string json = out();
  for (const char* key :
       {"\"step_time_s\"", "\"tokens_per_s\"", "\"tflops_per_gpu\"", "\"mfu\"", "\"fits\"",
        "\"hbm_peak_bytes\"", "\"host_peak_bytes\"", "\"params_bytes\"", "\"activations_bytes\"",
        "\"buffers_bytes\"", "\"exposed_offload_s\"", "\"cpu_optimizer_s\"", "\"bubble_s\""}) {
    EXPECT_NE(json.find(key), std::string::npos) << key;
  }
  EXPECT_GT(fs::file_size(path("trace.json")), 100u);
  EXPECT_GT(fs::file_size(path("plan.json")), 100u);
  EXPECT_GT(fs::file_size(path("timeline.json")), 100u);

  ASSERT_EQ(run({"run", single_, single_, "--set", "offload=zero_offload"}), 0) << err();
  EXPECT_NE(out().find("limited by"), std::string::npos);
  ASSERT_EQ(run({"run", single_, "--print-effective", "--set", "training.micro_batch=2"}), 0);
  EXPECT_NE(out().find("  micro_batch: 2\n"), std::string::npos) << out();
}

TEST_F(CliTest, SweepRowsAreIdenticalForAnyJobs) {
  for (const char* ext : {"csv", "jsonl"}) {
    const std::string one = path(fmt::format("one.{}", ext));
    const std::string four = path(fmt::format("four.{}", ext));
    ASSERT_EQ(run({"sweep", scenario_, "--jobs", "1", "--out", one, "--quiet"}), 0) << err();
    ASSERT_EQ(run({"sweep", scenario_, "--jobs", "4", "--out", four, "--quiet"}), 0) << err();
    EXPECT_EQ(read(one), read(four)) << ext;
    EXPECT_EQ(count_lines(one), kPoints + (std::string(ext) == "csv" ? 1 : 0));
  }
  // 24 error rows: micro_batch 3 does not divide global_batch 8.
  const std::string csv = read(path("one.csv"));
  std::size_t errors = 0;
  for (std::size_t pos = 0; (pos = csv.find("is not divisible", pos)) != std::string::npos; ++pos)
    ++errors;
  EXPECT_EQ(errors, 24u);
  EXPECT_EQ(run({"sweep", scenario_, "--out", path("one.csv"), "--quiet"}), 2);  // exists
  EXPECT_NE(err().find("--resume"), std::string::npos);
}

TEST_F(CliTest, ShardsPartitionTheSweep) {
  const std::string full = path("full.csv");
  ASSERT_EQ(run({"sweep", scenario_, "--out", full, "--quiet"}), 0) << err();
  std::vector<std::string> rows;
  std::string header;
  for (int i = 0; i < 3; ++i) {
    const std::string part = path(fmt::format("part{}.csv", i));
    ASSERT_EQ(
        run({"sweep", scenario_, "--shard", fmt::format("{}/3", i), "--out", part, "--quiet"}), 0)
        << err();
    std::istringstream in(read(part));
    std::string line;
    std::getline(in, header);
    while (std::getline(in, line)) {
      EXPECT_EQ(std::stoi(line.substr(0, line.find(','))) % 3, i) << line;
      rows.push_back(line);
    }
  }
  std::sort(rows.begin(), rows.end(), [](const std::string& a, const std::string& b) {
    return std::stoi(a.substr(0, a.find(','))) < std::stoi(b.substr(0, b.find(',')));
  });
  std::string merged = header + "\n";
  for (const std::string& r : rows) merged += r + "\n";
  EXPECT_EQ(merged, read(full));
}

TEST_F(CliTest, ResumeAfterKillGivesTheRowsOfAnUninterruptedRun) {
  for (const char* ext : {"csv", "jsonl"}) {
    const std::string reference = path(fmt::format("reference.{}", ext));
    ASSERT_EQ(run({"sweep", scenario_, "--jobs", "2", "--out", reference, "--quiet"}), 0) << err();
    const std::string target = path(fmt::format("killed.{}", ext));
    int kills_mid_way = 0;
    // Kill at increasing depths: after the first row, then later and later.
    for (int attempt = 0; attempt < 4; ++attempt) {
      const int before = fs::exists(target) ? count_lines(target) : 0;
      const pid_t pid =
          spawn({"sweep", scenario_, "--jobs", "2", "--out", target, "--resume", "--quiet"});
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      bool exited = false;
      while (std::chrono::steady_clock::now() < deadline) {
        int status = 0;
        if (waitpid(pid, &status, WNOHANG) == pid) {
          exited = true;
          EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << err();
          break;
        }
        if (fs::exists(target) && count_lines(target) > before + 5 * attempt) break;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (exited) break;
      ::kill(pid, SIGKILL);
      wait_exit(pid);
      if (count_lines(target) < kPoints) ++kills_mid_way;
    }
    EXPECT_GE(kills_mid_way, 1) << "the sweep finished before any kill";
    // Finish whatever is left.
    ASSERT_EQ(run({"sweep", scenario_, "--jobs", "3", "--out", target, "--resume", "--quiet"}), 0)
        << err();
    EXPECT_EQ(read(target), read(reference)) << ext;
  }
}

TEST_F(CliTest, ResumeRejectsAFileOfAnotherSweep) {
  const std::string file = path("other.csv");
  ASSERT_EQ(run({"sweep", scenario_, "--out", file, "--quiet", "--shard", "1/2"}), 0) << err();
  EXPECT_EQ(run({"sweep", scenario_, "--out", file, "--quiet", "--resume"}), 2);
  EXPECT_NE(err().find("row does not belong to this sweep"), std::string::npos) << err();
}

TEST_F(CliTest, PlanPrintsRankedPolicies) {
  const std::string s =
      write("plan.yaml",
            "model: {base: llama3-8b, layers: 2}\nhardware: {system: a100-40gb-1gpu}\n"
            "training: {global_batch: 4, micro_batch: 1, seq_len: 1024}\n");
  ASSERT_EQ(run({"plan", s, "--top", "2", "--classes", "activations,optimizer_states",
                 "--fractions", "0,1", "--prefetch", "1"}),
            0)
      << err();
  EXPECT_NE(out().find("#1 "), std::string::npos) << out();
  EXPECT_NE(out().find("limited by: "), std::string::npos) << out();
  EXPECT_NE(out().find("evaluated "), std::string::npos) << out();
}

}  // namespace
