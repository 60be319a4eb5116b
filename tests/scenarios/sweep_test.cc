#include "scenarios/sweep.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace offsim::scenarios {
namespace {

SweepSpec parse(const std::string& text) {
  auto doc = parse_document(text, "s.yaml");
  EXPECT_TRUE(doc) << doc.error().message;
  auto spec = parse_sweep(*doc->find("sweep"));
  EXPECT_TRUE(spec) << spec.error().message;
  return *spec;
}

std::string point_text(const SweepSpec& spec, std::int64_t i) {
  std::string out;
  for (const SweepAssignment& a : spec.point(i)) out += a.path + "=" + emit_flow(a.value) + " ";
  return out;
}

TEST(Sweep, CrossProductIsRowMajorInFileOrder) {
  const SweepSpec spec = parse("sweep:\n  a: [1, 2]\n  b: [x, y, z]\n");
  // 2 × 3 = 6 points; the first axis is outermost.
  ASSERT_EQ(spec.size(), 6);
  EXPECT_EQ(point_text(spec, 0), "a=1 b=x ");
  EXPECT_EQ(point_text(spec, 1), "a=1 b=y ");
  EXPECT_EQ(point_text(spec, 2), "a=1 b=z ");
  EXPECT_EQ(point_text(spec, 3), "a=2 b=x ");
  EXPECT_EQ(point_text(spec, 5), "a=2 b=z ");
}

TEST(Sweep, ZipGroupsVaryTogether) {
  const SweepSpec spec =
      parse("sweep:\n  a: [1, 2]\n  zip:\n    - {p.tp: [1, 2, 4], p.dp: [8, 4, 2]}\n");
  // 2 × 3 = 6 points, tp and dp paired.
  ASSERT_EQ(spec.size(), 6);
  EXPECT_EQ(spec.axis_paths(), (std::vector<std::string>{"a", "p.tp", "p.dp"}));
  EXPECT_EQ(point_text(spec, 0), "a=1 p.tp=1 p.dp=8 ");
  EXPECT_EQ(point_text(spec, 2), "a=1 p.tp=4 p.dp=2 ");
  EXPECT_EQ(point_text(spec, 4), "a=2 p.tp=2 p.dp=4 ");
  std::set<std::string> all;
  for (std::int64_t i = 0; i < spec.size(); ++i) all.insert(point_text(spec, i));
  EXPECT_EQ(all.size(), 6u);
}

TEST(Sweep, ZipLengthMismatchNamesTheAxis) {
  auto doc = parse_document("sweep:\n  zip:\n    - {a: [1, 2], b: [1]}\n", "s.yaml");
  ASSERT_TRUE(doc);
  auto spec = parse_sweep(*doc->find("sweep"));
  ASSERT_FALSE(spec);
  // Line 3 is "    - {a: [1, 2], b: [1]}": b's list opens at column 22.
  EXPECT_EQ(spec.error().message, "s.yaml:3:22: sweep.zip.0.b: expected 2 values like 'a', got 1");
}

TEST(Sweep, BadAxesAreErrors) {
  for (const char* text :
       {"sweep:\n  a: 3\n", "sweep:\n  a: []\n", "sweep:\n  zip: {a: [1]}\n",
        "sweep:\n  a: [1]\n  a.b: [2]\n", "sweep:\n  sweep.x: [1]\n", "sweep: [1, 2]\n"}) {
    auto doc = parse_document(text, "s.yaml");
    ASSERT_TRUE(doc) << text;
    auto spec = parse_sweep(*doc->find("sweep"));
    EXPECT_FALSE(spec) << text;
    if (!spec) {
      EXPECT_EQ(spec.error().message.rfind("s.yaml:", 0), 0u) << spec.error().message;
    }
  }
}

TEST(Sweep, TooManyPointsIsRefused) {
  auto doc = parse_document("sweep:\n  a: [1, 2, 3]\n  b: [1, 2, 3]\n", "s.yaml");
  ASSERT_TRUE(doc);
  auto spec = parse_sweep(*doc->find("sweep"), 8);
  ASSERT_FALSE(spec);
  EXPECT_EQ(spec.error().code, sim::ErrorCode::kLimitExceeded);
}

TEST(Sweep, ApplyPointSetsValuesAndDropsTheSweep) {
  auto doc = parse_document("training: {micro_batch: 1}\nsweep:\n  training.micro_batch: [2, 4]\n",
                            "s.yaml");
  ASSERT_TRUE(doc);
  auto spec = parse_sweep(*doc->find("sweep"));
  ASSERT_TRUE(spec);
  auto point = apply_point(*doc, spec->point(1));
  ASSERT_TRUE(point);
  EXPECT_EQ(point->find("sweep"), nullptr);
  const Node* mb = find_path(*point, "training.micro_batch");
  EXPECT_EQ(scalar_int(*mb), 4);
  // Errors on a swept value point at the sweep list: "  training.micro_batch: [2, 4]" has
  // the 4 at column 29.
  EXPECT_EQ(mb->origin, "s.yaml:3:29");
}

}  // namespace
}  // namespace offsim::scenarios
