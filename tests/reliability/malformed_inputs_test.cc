// The malformed and hostile input catalogue: every case in cases.tsv runs the real `offsim`
// binary on a bad input and must end with exit status 2, a first error line that names the
// input (and what was expected), no crash or hang, and no output file left behind.
//
// cases.tsv: one case per line, tab-separated: name, a substring the error must contain, then the
// command's arguments separated by spaces. `{in}` is tests/reliability/inputs, `{out}` a fresh
// empty folder whose contents are checked after the run, `{copy:NAME}` a private copy of
// inputs/NAME, `{fifo}` a named pipe, `{profile:SECTION.KEY=VALUE}` a copy of the H100 SXM
// calibration profile with that figure's value replaced, `\n` a newline, and an argument
// `{env:NAME=VALUE}` is not passed but set in the command's environment.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

extern char** environ;

namespace {

namespace fs = std::filesystem;

struct Case {
  std::string name;
  std::string expected;
  std::vector<std::string> args;
};

// Keeps ctest's names short: the case name instead of a byte dump.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> load_cases() {
  std::ifstream in(fs::path(OFFSIM_SOURCE_DIR) / "tests/reliability/cases.tsv");
  std::vector<Case> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    Case c;
    std::string args;
    std::getline(fields, c.name, '\t');
    std::getline(fields, c.expected, '\t');
    std::getline(fields, args);
    std::istringstream words(args);
    for (std::string w; words >> w;) c.args.push_back(w);
    cases.push_back(std::move(c));
  }
  return cases;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size()) {
    s.replace(pos, from.size(), to);
  }
  return s;
}

struct RunResult {
  int exit_code = -1;  // -1: killed by a signal or timed out
  int signal = 0;
  bool timed_out = false;
  std::string output;
};

RunResult run(const std::vector<std::string>& args, const std::vector<std::string>& env_extra,
              const fs::path& log) {
  std::vector<char*> argv;
  std::string binary = OFFSIM_BINARY;
  argv.push_back(binary.data());
  std::vector<std::string> copy = args;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  std::vector<std::string> env_copy = env_extra;
  std::vector<char*> envp;
  for (std::string& e : env_copy) envp.push_back(e.data());
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(nullptr);
  pid_t pid = 0;
  RunResult r;
  if (posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), envp.data()) != 0) {
    posix_spawn_file_actions_destroy(&actions);
    r.output = "posix_spawn failed";
    return r;
  }
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      r.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!r.timed_out && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  std::ifstream in(log);
  std::ostringstream text;
  text << in.rdbuf();
  r.output = text.str();
  return r;
}

class MalformedInput : public ::testing::TestWithParam<Case> {};

TEST_P(MalformedInput, FailsCleanlyWithStatus2) {
  const Case& c = GetParam();
  const fs::path inputs = fs::path(OFFSIM_SOURCE_DIR) / "tests/reliability/inputs";
  const fs::path out =
      fs::temp_directory_path() / ("offsim-malformed-" + c.name + "-" + std::to_string(::getpid()));
  fs::remove_all(out);
  fs::create_directories(out);
  // {copy:NAME} stands for a private copy of inputs/NAME, for commands that may rewrite a file.
  const fs::path scratch = out.string() + ".scratch";
  fs::remove_all(scratch);
  fs::create_directories(scratch);
  std::vector<std::string> args;
  std::vector<std::string> env;
  for (std::string a : c.args) {
    if (a.rfind("{env:", 0) == 0 && a.back() == '}') {
      env.push_back(a.substr(5, a.size() - 6));
      continue;
    }
    const std::size_t at = a.find("{copy:");
    if (at != std::string::npos) {
      const std::size_t end = a.find('}', at);
      const std::string name = a.substr(at + 6, end - at - 6);
      if (!fs::exists(scratch / name)) fs::copy_file(inputs / name, scratch / name);
      a.replace(at, end - at + 1, (scratch / name).string());
    }
    if (const std::size_t f = a.find("{fifo}"); f != std::string::npos) {
      const fs::path fifo = scratch / "fifo";
      if (!fs::exists(fifo)) {
        ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
      }
      a.replace(f, 6, fifo.string());
    }
    if (const std::size_t p = a.find("{profile:"); p != std::string::npos) {
      const std::size_t end = a.find('}', p);
      const std::string edit = a.substr(p + 9, end - p - 9);  // section.key=value
      const std::size_t dot = edit.find('.');
      const std::size_t eq = edit.find('=');
      std::ifstream base(fs::path(OFFSIM_SOURCE_DIR) / "calibrate/profiles/h100-sxm.json");
      nlohmann::json j = nlohmann::json::parse(base);
      j[edit.substr(0, dot)][edit.substr(dot + 1, eq - dot - 1)]["value"] =
          std::stod(edit.substr(eq + 1));
      const fs::path file = scratch / "profile.json";
      std::ofstream(file) << j.dump(1);
      a.replace(p, end - p + 1, file.string());
    }
    a = replace_all(a, "\\n", "\n");  // a newline inside an argument
    args.push_back(replace_all(replace_all(a, "{in}", inputs.string()), "{out}", out.string()));
  }
  const fs::path log = fs::temp_directory_path() / ("offsim-malformed-" + c.name + ".log");
  const RunResult r = run(args, env, log);
  fs::remove(log);
  EXPECT_FALSE(r.timed_out) << c.name << ": hung for 60 s";
  EXPECT_EQ(r.signal, 0) << c.name << ": killed by signal " << r.signal << "\n" << r.output;
  EXPECT_EQ(r.exit_code, 2) << c.name << ": output was\n" << r.output;
  EXPECT_NE(r.output.find(c.expected), std::string::npos)
      << c.name << ": expected the error to mention '" << c.expected << "', got\n"
      << r.output;
  EXPECT_LT(r.output.size(), 20000u) << c.name << ": error output is not a clear message";
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(out)) left.push_back(entry.path().string());
  EXPECT_TRUE(left.empty()) << c.name << ": left " << left.size() << " file(s), e.g. "
                            << (left.empty() ? "" : left[0]);
  fs::remove_all(out);
  fs::remove_all(scratch);
}

TEST(MalformedInputCatalogue, HasAtLeastFiftyCases) { EXPECT_GE(load_cases().size(), 50u); }

INSTANTIATE_TEST_SUITE_P(Catalogue, MalformedInput, ::testing::ValuesIn(load_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

}  // namespace
