// The benchmark spaces: the point counts of the issue (747 and 918), why the other combinations
// are dropped, and that every point is a valid scenario.
#include "bench/spaces.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "bench/check.h"

namespace offsim::bench {
namespace {

TEST(Spaces, SpaceAHas747PointsAndDropsWhatCannotRun) {
  const SpaceDef def = space_definition(Space::kA);
  const std::vector<SpacePoint> points = space_points(def);
  // 4 tp x 6 pp x 4 micro-batch = 96 combinations; tp*pp > 64 for (4,32), (8,16), (8,32): 12
  // dropped; tp 1 pp 1 (dp 64) with micro-batch 8 needs 512 sequences: 1 dropped. 83 x 9 = 747.
  EXPECT_EQ(points.size(), 747u);
  EXPECT_NE(dropped_because(def, 8, 16, 1), "");
  EXPECT_NE(dropped_because(def, 1, 1, 8), "");
  EXPECT_EQ(dropped_because(def, 1, 1, 4), "");
  std::set<std::string> labels;
  for (const SpacePoint& p : points) {
    EXPECT_EQ(p.dp * p.tp * p.pp, 64) << p.label;
    EXPECT_TRUE(models::check_scenario(p.scenario, 8)) << p.label;
    labels.insert(p.label);
  }
  EXPECT_EQ(labels.size(), points.size());
}

TEST(Spaces, SpaceBHas918Points) {
  const SpaceDef def = space_definition(Space::kB);
  const std::vector<SpacePoint> points = space_points(def);
  // 4 tp x 7 pp x 4 micro-batch = 112; dp * micro-batch > 1024 when micro-batch > tp * pp:
  // tp*pp = 1 (3 micro-batches), 2 (2 layouts x 2), 4 (3 layouts x 1): 10 dropped. 102 x 9 = 918.
  EXPECT_EQ(points.size(), 918u);
  for (const SpacePoint& p : points) {
    EXPECT_EQ(p.dp * p.tp * p.pp, 1024) << p.label;
    EXPECT_TRUE(models::check_scenario(p.scenario, 8)) << p.label;
  }
  const SpacePoint ref = megatron_1t_reference();
  EXPECT_EQ(ref.dp, 2);
  EXPECT_EQ(ref.scenario.model.layers, 128);
}

// A subsample of both spaces through the path a sweep takes, each against the full simulation
// (offsim-bench --check runs all of them). Every 37th point of A and every 61st of B: both have
// early answers, and full or steady-state steps.
TEST(Spaces, ShortcutsAgreeWithTheFullSimulationOnASubsample) {
  int early = 0;
  int others = 0;
  for (const auto& [space, stride] : {std::pair{Space::kA, 37}, std::pair{Space::kB, 61}}) {
    const std::vector<SpacePoint> points = space_points(space_definition(space));
    for (std::size_t i = 0; i < points.size(); i += static_cast<std::size_t>(stride)) {
      auto e = models::evaluate(points[i].scenario, sweep_eval_options(false));
      ASSERT_TRUE(e) << points[i].label << ": " << e.error().message;
      EXPECT_EQ(compare_with_full_path(points[i].scenario, *e), "") << points[i].label;
      (e->early_answer ? early : others) += 1;
    }
  }
  EXPECT_GE(early, 5);
  EXPECT_GE(others, 5);
}

}  // namespace
}  // namespace offsim::bench
