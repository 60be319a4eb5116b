// Helpers for tests that run the real `offsim` binary as a child process: start it with stdout
// and stderr going to files, wait for its exit status, read files back whole.
//
//   const pid_t pid = offsim::testing::spawn_process(OFFSIM_BINARY, {"--version"},
//                                                    dir + "/out.txt", dir + "/err.txt");
//   EXPECT_EQ(offsim::testing::wait_exit(pid), 0);
//   EXPECT_NE(offsim::testing::read_file(dir + "/out.txt").find("offsim"), std::string::npos);
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace offsim::testing {

// Starts `binary args...` with stdout and stderr truncated into the given files. Returns the
// child's pid, or -1 when it could not be started.
inline pid_t spawn_process(const std::string& binary, const std::vector<std::string>& args,
                           const std::string& stdout_path, const std::string& stderr_path) {
  std::vector<std::string> argv_s = {binary};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

// Waits for `pid`: its exit status, or 128 + the signal that ended it.
inline int wait_exit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The file's bytes ("" when it does not exist).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace offsim::testing
