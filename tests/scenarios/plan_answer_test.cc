// The README commands of scenarios/examples/README.md about offload, run through the real
// binary: `plan --classes activations` on the 70B example answers "will it fit with activation
// offload?" with the reason and what must move; bad plan arguments are errors (exit 2).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "tests/common/process.h"

namespace {

namespace fs = std::filesystem;

struct CliRun {
  int status = -1;
  std::string out;
  std::string err;
};

CliRun offsim(const std::vector<std::string>& args) {
  const fs::path dir =
      fs::temp_directory_path() / ("offsim_plan_answer_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string out = (dir / "out.txt").string();
  const std::string err = (dir / "err.txt").string();
  const pid_t pid = offsim::testing::spawn_process(OFFSIM_CLI_PATH, args, out, err);
  CliRun r;
  r.status = offsim::testing::wait_exit(pid);
  r.out = offsim::testing::read_file(out);
  r.err = offsim::testing::read_file(err);
  fs::remove_all(dir);
  return r;
}

const std::string kExample =
    (fs::path(OFFSIM_SOURCE_DIR) / "scenarios/examples/llama70b-8xh100-no-offload.yaml").string();

TEST(PlanAnswer, Llama70bOn8H100WithActivationOffloadSaysWhyNot) {
  const CliRun r = offsim({"plan", kExample, "--classes", "activations"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("no candidate fits HBM and host memory."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("why: weights+grads+Adam state alone need 131.43 GiB of 79.19 GiB per "
                       "GPU"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("offload the optimizer state"), std::string::npos) << r.out;
}

TEST(PlanAnswer, RunExplainsAnOutOfMemory) {
  const CliRun r = offsim({"run", kExample});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("why:  weights+grads+Adam state alone need"), std::string::npos) << r.out;
}

TEST(PlanAnswer, BadSearchArgumentsNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const Case cases[] = {
      {{"--micro-batches", "0"}, "--micro-batches 0: expected sizes >= 1"},
      {{"--micro-batches", "2,2"}, "--micro-batches 2: listed twice"},
      {{"--fractions", "0,0.5,0.5"}, "--fractions 0.5: expected distinct fractions"},
      {{"--fractions", "0,1.5"}, "--fractions 1.5: expected fractions in [0, 1]"},
      {{"--prefetch", "-1"}, "--prefetch -1: expected a depth in 1..80"},
      {{"--prefetch", "1000"}, "--prefetch 1000: expected a depth in 1..80"},
      {{"--prefetch", "2,2"}, "--prefetch 2: listed twice"},
      {{"--joint", "batch"},
       "--joint batch: expected micro_batch, recompute and/or moe_a2a_overlap, or none"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"plan", kExample};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const CliRun r = offsim(args);
    EXPECT_EQ(r.status, 2) << c.message;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
  }
}

}  // namespace
