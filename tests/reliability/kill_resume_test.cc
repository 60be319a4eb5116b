// Repeated kill -9 of a running sweep: the real `offsim sweep --out FILE --resume` is started,
// SIGKILLed after a pseudo-random delay (fixed seed), and started again, many times, for CSV and
// JSON lines. After every kill the file must be a byte prefix of the uninterrupted run's file (a
// partial last line allowed); whenever a run completes it, the file must equal that run's file
// byte for byte (then it is deleted and the next cycle starts from nothing).
//
// Where each run is killed is drawn from the seed, not from the clock (start-up alone varies by
// seconds when CUDA libraries load on a busy machine): a random row k still to do is drawn, the
// test waits until the file holds k rows, then kills after a further random 0-300 us, so kills
// land anywhere in the sweep, during evaluation and during appends. Each append is one write(2)
// of whole rows, which SIGKILL does not split, so a torn last line (as a crash of the machine or
// a full disk could leave) is also made by hand after every third kill: a random prefix of the
// next row is appended, and --resume must cut it.
//
// Also: --jobs 1 and --jobs 2 give identical files, and --time-limit ends a sweep with its
// finished rows kept and a message pointing at --resume.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/common/process.h"

namespace {

namespace fs = std::filesystem;

// 4 × 5 × 3 × 2 = 120 points of a two-layer model, each well under a millisecond: the writer
// appends many small batches.
constexpr const char* kFastSweep =
    "name: kill\n"
    "model: {name: tiny, vocab_size: 512, hidden: 128, layers: 2, heads: 4, activation: swiglu,"
    " norm: rmsnorm}\n"
    "hardware: {system: h100-1gpu}\n"
    "training: {global_batch: 8, micro_batch: 1, seq_len: 128}\n"
    "sweep:\n"
    "  training.micro_batch: [1, 2, 4, 8]\n"
    "  training.seq_len: [64, 128, 256, 512, 1024]\n"
    "  recompute: [none, selective, full]\n"
    "  offload: [none, megatron_activation_offload]\n";

// Kills that must land mid-sweep, per format, and a bound on the runs it may take.
constexpr int kKills = 12;
constexpr int kMaxRuns = 3 * kKills;

class KillResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("offsim_kill_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    scenario_ = path("sweep.yaml");
    std::ofstream(scenario_) << kFastSweep;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string read(const std::string& file) { return offsim::testing::read_file(file); }

  pid_t spawn(const std::vector<std::string>& args) {
    const pid_t pid =
        offsim::testing::spawn_process(OFFSIM_BINARY, args, path("stdout.txt"), path("stderr.txt"));
    EXPECT_GT(pid, 0) << "cannot start " << OFFSIM_BINARY;
    return pid;
  }

  static int wait_exit(pid_t pid) { return offsim::testing::wait_exit(pid); }

  int run(const std::vector<std::string>& args) { return wait_exit(spawn(args)); }
  // Waits until `file` holds at least `size` bytes, the process ended (not reaped), or 60 s
  // passed.
  static void wait_for_size(pid_t pid, const std::string& file, std::uintmax_t size) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < give_up) {
      std::error_code ec;
      const auto now = fs::file_size(file, ec);
      if (!ec && now >= size) return;
      siginfo_t info{};
      if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == pid) {
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  std::string err() const { return read(path("stderr.txt")); }

  fs::path dir_;
  std::string scenario_;
};

TEST_F(KillResumeTest, RepeatedKillsResumeToTheBytesOfAnUninterruptedRun) {
  std::mt19937 rng(20261129);
  for (const char* ext : {"csv", "jsonl"}) {
    SCOPED_TRACE(ext);
    const std::string reference = path(fmt::format("reference.{}", ext));
    ASSERT_EQ(run({"sweep", scenario_, "--jobs", "1", "--out", reference, "--quiet"}), 0) << err();
    const std::string expected = read(reference);
    ASSERT_FALSE(expected.empty());
    // Byte offsets where each line of the finished file ends (the header first for CSV).
    std::vector<std::size_t> line_end;
    for (std::size_t pos = expected.find('\n'); pos != std::string::npos;
         pos = expected.find('\n', pos + 1)) {
      line_end.push_back(pos + 1);
    }
    const std::size_t lines = line_end.size();

    const std::string target = path(fmt::format("killed.{}", ext));
    std::uniform_int_distribution<long> delay_us(0, 300);
    int kills_mid_sweep = 0;
    int completed = 0;
    int torn = 0;
    for (int r = 0; r < kMaxRuns && kills_mid_sweep < kKills; ++r) {
      // Lines complete before this run (a torn tail is cut by the run itself).
      const std::uintmax_t size_before = fs::exists(target) ? fs::file_size(target) : 0;
      const std::size_t done = static_cast<std::size_t>(
          std::upper_bound(line_end.begin(), line_end.end(), size_before) - line_end.begin());
      if (done >= lines) {  // the last kill came after the last row
        ASSERT_EQ(read(target), expected) << "run " << r;
        ++completed;
        fs::remove(target);
        continue;
      }
      const pid_t pid =
          spawn({"sweep", scenario_, "--jobs", "2", "--out", target, "--resume", "--quiet"});
      if (done + 1 < lines) {
        // Kill once the file holds k lines, k drawn from [done + 1, lines - 1]. With one row
        // left, the run finishes.
        std::uniform_int_distribution<std::size_t> kill_at(done + 1, lines - 1);
        wait_for_size(pid, target, line_end[kill_at(rng) - 1]);
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
        ::kill(pid, SIGKILL);
      }
      const int code = wait_exit(pid);
      if (code != 128 + SIGKILL) {
        ASSERT_EQ(code, 0) << err();
        ASSERT_EQ(read(target), expected) << "run " << r << " completed the file";
        ++completed;
        fs::remove(target);
        continue;
      }
      if (!fs::exists(target)) continue;  // killed before the file was created
      std::string now = read(target);
      ASSERT_LE(now.size(), expected.size()) << "after run " << r;
      ASSERT_EQ(now, expected.substr(0, now.size())) << "after run " << r << ": not a prefix";
      if (now.size() == expected.size()) continue;  // killed after the last row
      const bool has_rows = std::count(now.begin(), now.end(), '\n') > (ext[0] == 'c' ? 1 : 0);
      if (has_rows) ++kills_mid_sweep;
      if (has_rows && kills_mid_sweep % 3 == 0 && !now.empty() && now.back() == '\n') {
        // A torn write: part of the next row, without its newline.
        const std::size_t next_len = expected.find('\n', now.size()) - now.size();
        std::uniform_int_distribution<std::size_t> cut(1, next_len - 1);
        std::ofstream(target, std::ios::app | std::ios::binary)
            << expected.substr(now.size(), cut(rng));
        ++torn;
      }
    }
    ASSERT_EQ(run({"sweep", scenario_, "--jobs", "2", "--out", target, "--resume", "--quiet"}), 0)
        << err();
    EXPECT_EQ(read(target), expected);
    EXPECT_GE(kills_mid_sweep, kKills) << "too few kills landed while rows were being written";
    std::printf(
        "%s: %d kills mid-sweep (%d with a torn last line added), %d runs completed the "
        "file\n",
        ext, kills_mid_sweep, torn, completed);
  }
}

TEST_F(KillResumeTest, JobsOneAndTwoWriteTheSameBytes) {
  for (const char* ext : {"csv", "jsonl"}) {
    const std::string one = path(fmt::format("one.{}", ext));
    const std::string two = path(fmt::format("two.{}", ext));
    ASSERT_EQ(run({"sweep", scenario_, "--jobs", "1", "--out", one, "--quiet"}), 0) << err();
    ASSERT_EQ(run({"sweep", scenario_, "--jobs", "2", "--out", two, "--quiet"}), 0) << err();
    EXPECT_EQ(read(one), read(two)) << ext;
  }
}

// Points of about 20 000 ops each (16 layers, 64 micro-batches): far slower than the 1 ms limit,
// so the limit ends the sweep before it completes.
TEST_F(KillResumeTest, TimeLimitKeepsFinishedRowsAndResumeCompletes) {
  const std::string slow = path("slow.yaml");
  std::ofstream(slow) << "name: slow\n"
                         "model: {base: llama3-8b, layers: 16}\n"
                         "hardware: {system: h100-1gpu}\n"
                         "training: {global_batch: 64, micro_batch: 1, seq_len: 1024}\n"
                         "sweep:\n"
                         "  recompute: [none, selective, full]\n"
                         "  offload: [none, megatron_activation_offload]\n";
  const std::string reference = path("slow_reference.csv");
  ASSERT_EQ(run({"sweep", slow, "--jobs", "1", "--out", reference, "--quiet"}), 0) << err();
  const std::string target = path("slow.csv");
  EXPECT_EQ(
      run({"sweep", slow, "--jobs", "1", "--out", target, "--quiet", "--time-limit", "0.001"}), 2);
  EXPECT_NE(err().find("time limit of 0.001 s (--time-limit) reached while sweeping: "),
            std::string::npos)
      << err();
  EXPECT_NE(
      err().find("of 6 points done and kept in " + target + "; rerun with --resume to continue"),
      std::string::npos)
      << err();
  const std::string partial = read(target);
  EXPECT_EQ(partial, read(reference).substr(0, partial.size()));
  ASSERT_EQ(run({"sweep", slow, "--jobs", "2", "--out", target, "--quiet", "--resume"}), 0)
      << err();
  EXPECT_EQ(read(target), read(reference));
}

}  // namespace
