// Every example scenario shows the outcome it declares, and scenarios/examples/README.md quotes
// exactly the figures the tool prints for them.
#include "scenarios/examples_table.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

namespace offsim::scenarios {
namespace {

namespace fs = std::filesystem;

const fs::path kExamples = fs::path(OFFSIM_SOURCE_DIR) / "scenarios" / "examples";

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ExamplesTable, EveryExampleShowsItsDeclaredOutcome) {
  auto runs = run_examples(kExamples.string());
  ASSERT_TRUE(runs) << runs.error().message;
  EXPECT_GE(runs->size(), 11u);
  int fits = 0;
  for (const ExampleRun& run : *runs) {
    EXPECT_TRUE(check_expectation(run)) << check_expectation(run).error().message;
    fits += run.report.fits ? 1 : 0;
  }
  // The README's story: most examples fit; the 70B and the MoE no-offload files show an
  // out-of-memory on purpose (each declared, and checked above).
  EXPECT_EQ(fits, static_cast<int>(runs->size()) - 2);
}

TEST(ExamplesTable, ReadmeFiguresAreWhatTheToolPrints) {
  auto runs = run_examples(kExamples.string());
  ASSERT_TRUE(runs) << runs.error().message;
  const std::string readme = read(kExamples / "README.md");
  auto updated = replace_generated(readme, examples_table(*runs), "README.md");
  ASSERT_TRUE(updated) << updated.error().message;
  EXPECT_EQ(*updated, readme)
      << "scenarios/examples/README.md is stale: run `offsim-examples-table scenarios/examples`";
}

TEST(ExamplesTable, ExpectationLineIsRequiredAndStrict) {
  auto fits = parse_expectation("# a comment\n# expect: fits\nname: x\n", "a.yaml");
  ASSERT_TRUE(fits) << fits.error().message;
  EXPECT_EQ(*fits, ExpectedOutcome::kFits);
  auto hbm = parse_expectation("# expect: out_of_memory in hbm\n", "a.yaml");
  ASSERT_TRUE(hbm);
  EXPECT_EQ(*hbm, ExpectedOutcome::kOutOfHbm);

  auto missing = parse_expectation("name: x\n", "b.yaml");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("b.yaml: no '# expect: fits'"), std::string::npos)
      << missing.error().message;
  auto bad = parse_expectation("#\n# expect: fast\n", "c.yaml");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("c.yaml:2:"), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find("got 'fast'"), std::string::npos);
  auto twice = parse_expectation("# expect: fits\n# expect: fits\n", "d.yaml");
  ASSERT_FALSE(twice);
  EXPECT_NE(twice.error().message.find("d.yaml:2: a second"), std::string::npos);
}

TEST(ExamplesTable, CheckNamesTheFileAndWhatHappened) {
  ExampleRun run{.file = "x.yaml", .expected = ExpectedOutcome::kFits, .report = {}};
  run.report.fits = false;
  run.report.oom = models::OomReport{
      .op = "initial_tensors", .pool = "node0.pinned", .pool_kind = sim::PoolKind::kPinnedHost};
  auto status = check_expectation(run);
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error().message,
            "x.yaml: declares '# expect: fits' but out of memory in node0.pinned");
  run.expected = ExpectedOutcome::kOutOfHbm;
  EXPECT_FALSE(check_expectation(run));
  run.expected = ExpectedOutcome::kOutOfHostMemory;
  EXPECT_TRUE(check_expectation(run));
  // The pool's kind decides, not its display name.
  run.report.oom->pool = "rank0.hbm";
  EXPECT_TRUE(check_expectation(run));
  run.expected = ExpectedOutcome::kOutOfHbm;
  EXPECT_FALSE(check_expectation(run));
  run.report.oom->pool_kind = sim::PoolKind::kHbm;
  run.report.oom->pool = "node0.pinned";
  EXPECT_TRUE(check_expectation(run));
  run.expected = ExpectedOutcome::kOutOfHostMemory;
  EXPECT_FALSE(check_expectation(run));
  run.report.fits = true;
  run.report.oom.reset();
  EXPECT_FALSE(check_expectation(run));
}

TEST(ExamplesTable, ReplaceGeneratedNeedsBothMarkersInOrder) {
  const std::string readme =
      std::string("intro\n") + kGeneratedBegin + "\nold\n" + kGeneratedEnd + "\noutro\n";
  auto out = replace_generated(readme, "new\n", "R.md");
  ASSERT_TRUE(out) << out.error().message;
  EXPECT_EQ(*out,
            std::string("intro\n") + kGeneratedBegin + "\nnew\n" + kGeneratedEnd + "\noutro\n");
  auto none = replace_generated("intro\n", "new\n", "R.md");
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message.find("R.md: expected a line"), std::string::npos);
  const std::string reversed = std::string(kGeneratedEnd) + "\n" + kGeneratedBegin + "\n";
  EXPECT_FALSE(replace_generated(reversed, "new\n", "R.md"));
}

}  // namespace
}  // namespace offsim::scenarios
