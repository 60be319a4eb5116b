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
#include <nlohmann/json.hpp>

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
        "\"hbm_peak_bytes\"", "\"host_peak_bytes\"", "\"memory.params_bytes\"",
        "\"memory.activations_bytes\"", "\"memory.buffers_bytes\"", "\"time.exposed_offload_s\"",
        "\"time.cpu_optimizer_s\"", "\"time.bubble_s\""}) {
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

// Splits CSV text (RFC 4180 quoting) into records of fields.
std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> records;
  std::vector<std::string> fields;
  std::string field;
  bool quoted = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.push_back(std::move(field));
      field.clear();
    } else if (c == '\n') {
      fields.push_back(std::move(field));
      field.clear();
      records.push_back(std::move(fields));
      fields.clear();
    } else {
      field += c;
    }
  }
  return records;
}

std::vector<std::string> keys_of(const nlohmann::ordered_json& record) {
  std::vector<std::string> keys;
  for (auto it = record.begin(); it != record.end(); ++it) keys.push_back(it.key());
  return keys;
}

std::vector<nlohmann::ordered_json> parse_lines(const std::string& text) {
  std::vector<nlohmann::ordered_json> rows;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    rows.push_back(nlohmann::ordered_json::parse(line));
  return rows;
}

TEST_F(CliTest, RunGivesOneShapeOfFlatRecords) {
  ASSERT_EQ(run({"run", single_, "--format", "json"}), 0) << err();
  const auto one = nlohmann::ordered_json::parse(out());
  ASSERT_TRUE(one.is_array()) << out();  // a list also for one scenario
  ASSERT_EQ(one.size(), 1u);
  const std::vector<std::string> columns = keys_of(one[0]);
  for (const std::string& c : columns) {
    EXPECT_FALSE(one[0][c].is_object() || one[0][c].is_array()) << c << " is not flat";
  }
  for (const char* c : {"scenario", "outcome", "fits", "limited_by", "gpus", "step_time_s",
                        "tokens_per_s", "tokens_per_s_per_gpu", "memory.params_bytes",
                        "time.compute_s", "ranks", "live_at_peak", "oom.pool"}) {
    EXPECT_NE(std::find(columns.begin(), columns.end(), c), columns.end()) << c;
  }
  EXPECT_EQ(one[0]["gpus"], 1);
  EXPECT_EQ(one[0]["fits"], true);
  EXPECT_TRUE(one[0]["oom.pool"].is_null());  // fits: no out-of-memory details
  EXPECT_TRUE(nlohmann::json::parse(one[0]["ranks"].get<std::string>()).is_array());
  EXPECT_DOUBLE_EQ(one[0]["tokens_per_s_per_gpu"].get<double>(),
                   one[0]["tokens_per_s"].get<double>());

  const std::vector<std::string> two_args = {"run", single_, single_, "--set",
                                             "offload=zero_offload"};
  auto with_format = [&](const char* format) {
    std::vector<std::string> args = two_args;
    args.insert(args.end(), {"--format", format});
    EXPECT_EQ(run(args), 0) << err();
    return out();
  };
  const auto two = nlohmann::ordered_json::parse(with_format("json"));
  ASSERT_TRUE(two.is_array());
  ASSERT_EQ(two.size(), 2u);
  for (const auto& record : two) EXPECT_EQ(keys_of(record), columns);

  const std::vector<nlohmann::ordered_json> lines = parse_lines(with_format("jsonl"));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], two[0]);
  EXPECT_EQ(lines[1], two[1]);

  const auto csv = parse_csv(with_format("csv"));
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_EQ(csv[0], columns);
  for (std::size_t c = 0; c < columns.size(); ++c) {
    const auto& cell = two[1][columns[c]];
    if (cell.is_null()) {
      EXPECT_EQ(csv[2][c], "") << columns[c];
    } else if (cell.is_string()) {
      EXPECT_EQ(csv[2][c], cell.get<std::string>()) << columns[c];
    } else {
      EXPECT_EQ(csv[2][c], cell.dump()) << columns[c];
    }
  }
}

TEST_F(CliTest, SweepCsvAndJsonlHaveTheSameFlatColumns) {
  ASSERT_EQ(run({"sweep", scenario_, "--out", path("s.csv"), "--quiet"}), 0) << err();
  ASSERT_EQ(run({"sweep", scenario_, "--out", path("s.jsonl"), "--quiet"}), 0) << err();
  const auto csv = parse_csv(read(path("s.csv")));
  const auto rows = parse_lines(read(path("s.jsonl")));
  ASSERT_EQ(csv.size(), static_cast<std::size_t>(kPoints) + 1);
  ASSERT_EQ(rows.size(), static_cast<std::size_t>(kPoints));
  const std::vector<std::string>& header = csv[0];
  const std::vector<std::string> lead(header.begin(), header.begin() + 5);
  EXPECT_EQ(lead,
            (std::vector<std::string>{"index", "axes.training.micro_batch", "axes.training.seq_len",
                                      "axes.recompute", "axes.offload"}));
  EXPECT_EQ(header.back(), "error");
  const auto step = static_cast<std::size_t>(
      std::find(header.begin(), header.end(), "step_time_s") - header.begin());
  ASSERT_LT(step, header.size());
  int errors = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(keys_of(rows[i]), header) << i;
    ASSERT_EQ(csv[i + 1].size(), header.size()) << i;
    EXPECT_EQ(rows[i]["index"], i);
    const bool error = !rows[i]["error"].is_null();
    errors += error ? 1 : 0;
    // An error row has null report columns (empty CSV cells); a row that ran has no error.
    EXPECT_EQ(rows[i]["step_time_s"].is_null(), error) << i;
    EXPECT_EQ(csv[i + 1][step].empty(), error) << i;
    EXPECT_EQ(csv[i + 1].back().empty(), !error) << i;
    if (error) {
      EXPECT_EQ(rows[i]["axes.training.micro_batch"], 3) << i;
    }
  }
  EXPECT_EQ(errors, 24);
}

// The README's pandas section names columns; each must exist in the files offsim writes.
TEST_F(CliTest, ReadmeColumnsExistInTheOutputs) {
  const std::string readme = read("README.md");
  const std::size_t begin = readme.find("### Results as tables (pandas)");
  ASSERT_NE(begin, std::string::npos);
  const std::size_t end = readme.find("\n#", begin + 4);
  std::vector<std::string> documented;
  std::istringstream in(readme.substr(begin, end - begin));
  bool in_code = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("```", 0) == 0) in_code = !in_code;
    if (line.rfind("| `", 0) == 0) {
      documented.push_back(line.substr(3, line.find('`', 3) - 3));
    } else if (in_code && line.find('#') == std::string::npos) {
      // Quoted names in the code: columns, except file names.
      for (std::size_t q = line.find('"'); q != std::string::npos; q = line.find('"', q + 1)) {
        const std::size_t close = line.find('"', q + 1);
        const std::string name = line.substr(q + 1, close - q - 1);
        if (name.find(".json") == std::string::npos && name.find(".csv") == std::string::npos) {
          documented.push_back(name);
        }
        q = close;
      }
    }
  }
  ASSERT_GE(documented.size(), 20u);

  const std::string example = "scenarios/examples/2b-1xa100-sweep.yaml";
  ASSERT_EQ(run({"sweep", example, "--out", path("p.csv"), "--quiet"}), 0) << err();
  ASSERT_EQ(run({"sweep", example, "--out", path("p.jsonl"), "--quiet"}), 0) << err();
  ASSERT_EQ(run({"run", example, "--format", "json"}), 0) << err();
  const auto runs = nlohmann::ordered_json::parse(out());
  const std::vector<std::string> header = parse_csv(read(path("p.csv")))[0];
  EXPECT_EQ(keys_of(parse_lines(read(path("p.jsonl")))[0]), header);
  for (const std::string& name : documented) {
    const std::string prefix = name.substr(0, name.find('<'));
    const bool found = std::any_of(header.begin(), header.end(), [&](const std::string& c) {
      return name.find('<') != std::string::npos ? c.rfind(prefix, 0) == 0 : c == name;
    });
    EXPECT_TRUE(found) << "README column '" << name << "' is not in the sweep output";
  }
  // Every column of `run` is a column of a sweep row.
  for (const std::string& c : keys_of(runs[0])) {
    EXPECT_NE(std::find(header.begin(), header.end(), c), header.end()) << c;
  }
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
