#include "gui/model/timeline_model.h"

#include <gtest/gtest.h>

#include "tests/gui/test_timelines.h"

namespace offsim::gui {
namespace {

using testing::TimelineBuilder;

std::vector<std::string> labels(const TimelineModel& model) {
  std::vector<std::string> out;
  for (const LaneRow& row : model.rows()) out.push_back(row.label);
  return out;
}

// A timeline without identity: every lane has rank -1 and kind kOther, whatever its name says.
TEST(LaneOf, NoIdentityMeansNoRankAndNoKind) {
  const sim::Timeline t = TimelineBuilder({"rank3.compute", "host0.cpu", "misc"}).build();
  ASSERT_TRUE(t.lane_identity.empty());
  for (std::size_t l = 0; l < t.lanes.size(); ++l) {
    EXPECT_EQ(lane_of(t, l).rank, -1) << t.lanes[l];
    EXPECT_EQ(lane_of(t, l).kind, LaneKind::kOther) << t.lanes[l];
  }
  sim::PoolTrace pool{.name = "rank2.hbm"};  // kind kOther: no owner to read
  EXPECT_EQ(pool_rank_of(pool), -1);
}

// A timeline with lane identity (every plan-made one): rank and kind come from it, not the name.
TEST(LaneOf, TypedIdentityWinsOverTheName) {
  sim::Timeline t =
      TimelineBuilder({"gpu-a/stream-7", {"rank5.compute", 5, sim::LaneRole::kCompute}}).build();
  t.lane_identity = {{.rank = 3, .stage = 1, .role = sim::LaneRole::kH2D},
                     {.rank = 2, .stage = 0, .role = sim::LaneRole::kRecv}};
  EXPECT_EQ(lane_of(t, 0).rank, 3);
  EXPECT_EQ(lane_of(t, 0).kind, LaneKind::kH2D);
  EXPECT_EQ(lane_of(t, 1).rank, 2);
  EXPECT_EQ(lane_of(t, 1).kind, LaneKind::kComm);
  t.lane_identity.clear();  // an old file: the name is shown, not read
  EXPECT_EQ(lane_of(t, 1).rank, -1);
  EXPECT_EQ(lane_of(t, 1).kind, LaneKind::kOther);
  sim::PoolTrace pool{.name = "node0.pinned", .kind = sim::PoolKind::kHbm, .owner = 4};
  EXPECT_EQ(pool_rank_of(pool), 4);
}

TEST(TimelineModel, OrdersRowsByRankThenKindThenCpu) {
  auto t = TimelineBuilder({{"rank1.compute", 1, sim::LaneRole::kCompute},
                            {"host0.cpu", -1, sim::LaneRole::kCpu},
                            {"rank0.d2h", 0, sim::LaneRole::kD2H},
                            {"rank0.compute", 0, sim::LaneRole::kCompute},
                            {"rank0.h2d", 0, sim::LaneRole::kH2D},
                            {"rank0.comm", 0, sim::LaneRole::kComm},
                            "misc"})
               .build();
  auto model = TimelineModel::build({t});
  ASSERT_TRUE(model) << model.error().message;
  EXPECT_EQ(labels(*model),
            (std::vector<std::string>{"rank0.compute", "rank0.h2d", "rank0.d2h", "rank0.comm",
                                      "rank1.compute", "host0.cpu", "misc"}));
}

TEST(TimelineModel, PairsPredictedAboveMeasuredByLaneName) {
  auto predicted = TimelineBuilder({{"rank0.h2d", 0, sim::LaneRole::kH2D},
                                    {"rank0.compute", 0, sim::LaneRole::kCompute}},
                                   "predicted")
                       .span("a", 1, sim::OpKind::kGemm, 0, 10)
                       .build();
  // The measured timeline lists its lanes in another order; pairing is by name.
  auto measured = TimelineBuilder({{"rank0.compute", 0, sim::LaneRole::kCompute},
                                   {"rank0.h2d", 0, sim::LaneRole::kH2D}},
                                  "measured")
                      .span("a", 0, sim::OpKind::kGemm, 0, 12)
                      .build();
  auto model = TimelineModel::build({predicted, measured});
  ASSERT_TRUE(model);
  EXPECT_EQ(labels(*model),
            (std::vector<std::string>{"rank0.compute (predicted)", "rank0.compute (measured)",
                                      "rank0.h2d (predicted)", "rank0.h2d (measured)"}));
  EXPECT_EQ(model->rows()[0].source, 0);
  EXPECT_EQ(model->rows()[1].source, 1);
  EXPECT_EQ(model->span_count(), 2u);
  EXPECT_EQ(model->extent(), (TimeWindow{0, 12}));
}

TEST(TimelineModel, RejectsSpanOnUnknownLane) {
  auto t = TimelineBuilder({{"rank0.compute", 0, sim::LaneRole::kCompute}})
               .span("a", 3, sim::OpKind::kGemm, 0, 10)
               .build();
  auto model = TimelineModel::build({t});
  ASSERT_FALSE(model);
  EXPECT_NE(model.error().message.find("lane 3"), std::string::npos);
}

TEST(TimelineModel, CancelStopsTheBuild) {
  TimelineBuilder b({"rank0.compute"});
  for (int i = 0; i < 70000; ++i) b.span("op", 0, sim::OpKind::kGemm, i, i + 1);
  std::atomic<bool> cancel{true};
  auto model = TimelineModel::build({b.build()}, &cancel);
  ASSERT_FALSE(model);
  EXPECT_EQ(model.error().code, sim::ErrorCode::kCancelled);
}

// 1000 back-to-back spans of 10 ns: span k covers [10k, 10k + 10).
sim::Timeline dense_lane() {
  TimelineBuilder b({"rank0.compute"});
  // Added in reverse so the model has to sort them.
  for (int k = 999; k >= 0; --k) b.span("op", 0, sim::OpKind::kGemm, 10 * k, 10 * k + 10);
  return b.build();
}

TEST(VisibleSpans, ZoomedOutMergesSubPixelSpansIntoOneRectangle) {
  auto model = TimelineModel::build({dense_lane()});
  ASSERT_TRUE(model);
  std::vector<DrawSpan> out;
  // 10,000 ns over 100 px = 100 ns per pixel: every 10 ns span is narrower than a pixel and they
  // touch, so the whole lane is one rectangle standing for all 1000 spans.
  model->visible_spans(0, {0, 10000}, 100.0, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].start_ns, 0);
  EXPECT_EQ(out[0].end_ns, 10000);
  EXPECT_EQ(out[0].count, 1000u);
}

TEST(VisibleSpans, MergedRectangleTakesTheDominantKindAndItsBusyFraction) {
  TimelineBuilder b({"rank0.compute"});
  // Every 100 ns: a 5 ns elementwise op, then a 45 ns GEMM, then 50 ns idle. The first op of the
  // lane is elementwise, but GEMMs take 90% of the busy time, and the lane is busy half the time.
  for (int k = 0; k < 100; ++k) {
    b.span("norm", 0, sim::OpKind::kElementwise, 100 * k, 100 * k + 5);
    b.span("gemm", 0, sim::OpKind::kGemm, 100 * k + 5, 100 * k + 50);
  }
  auto model = TimelineModel::build({b.build()});
  ASSERT_TRUE(model);
  std::vector<DrawSpan> out;
  model->visible_spans(0, {0, 10000}, 10.0, out);  // 1000 ns per pixel
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].count, 200u);
  EXPECT_EQ(out[0].start_ns, 0);
  EXPECT_EQ(out[0].end_ns, 9950);
  EXPECT_EQ(out[0].kind, sim::OpKind::kGemm);
  EXPECT_DOUBLE_EQ(out[0].busy, 5000.0 / 9950.0);

  // A fully busy merged run and a single span are busy 1.
  auto dense = TimelineModel::build({dense_lane()});
  ASSERT_TRUE(dense);
  dense->visible_spans(0, {0, 10000}, 100.0, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_DOUBLE_EQ(out[0].busy, 1.0);
  dense->visible_spans(0, {95, 205}, 110.0, out);
  for (const DrawSpan& r : out) EXPECT_DOUBLE_EQ(r.busy, 1.0);
}

TEST(VisibleSpans, ZoomedInDrawsEachSpanAlone) {
  auto model = TimelineModel::build({dense_lane()});
  ASSERT_TRUE(model);
  std::vector<DrawSpan> out;
  // [95, 205) over 110 px = 1 ns per pixel: spans 9 ([90,100)) to 20 ([200,210)) are visible,
  // 12 of them, each 10 px wide.
  model->visible_spans(0, {95, 205}, 110.0, out);
  ASSERT_EQ(out.size(), 12u);
  EXPECT_EQ(out.front().start_ns, 90);
  EXPECT_EQ(out.back().start_ns, 200);
  for (const DrawSpan& r : out) EXPECT_EQ(r.count, 1u);
}

TEST(VisibleSpans, SparseNarrowSpansStaySeparate) {
  TimelineBuilder b({"rank0.compute"});
  // 10 ns spans every 3000 ns; at 1000 ns per pixel each is sub-pixel, and the 2990 ns gaps are
  // wider than a pixel, so the 34 spans in [0, 100000) (starts 0, 3000, ..., 99000) stay apart.
  for (int k = 0; k < 100; ++k) b.span("op", 0, sim::OpKind::kCopy, 3000 * k, 3000 * k + 10);
  auto model = TimelineModel::build({b.build()});
  ASSERT_TRUE(model);
  std::vector<DrawSpan> out;
  model->visible_spans(0, {0, 100000}, 100.0, out);
  EXPECT_EQ(out.size(), 34u);
  EXPECT_EQ(out.back().start_ns, 99000);
}

TEST(VisibleSpans, ManySpansGiveAtMostAboutOneRectanglePerPixel) {
  TimelineBuilder b({"rank0.compute"});
  // Alternating 7 ns spans and 5 ns gaps: span k covers [12k, 12k + 7).
  constexpr int kSpans = 200'000;
  for (int k = 0; k < kSpans; ++k) b.span("op", 0, sim::OpKind::kGemm, 12LL * k, 12LL * k + 7);
  auto model = TimelineModel::build({b.build()});
  ASSERT_TRUE(model);
  std::vector<DrawSpan> out;
  for (double width : {100.0, 1000.0, 3000.0}) {
    const std::int64_t end = 12LL * kSpans;
    model->visible_spans(0, {0, end}, width, out);
    std::uint64_t total = 0;
    for (const DrawSpan& r : out) total += r.count;
    EXPECT_EQ(total, static_cast<std::uint64_t>(kSpans)) << width;
    EXPECT_LE(out.size(), static_cast<std::size_t>(width) + 1) << width;
  }
  // A window of 120 ns at 1 ns per pixel shows spans 500 to 509 only, each alone.
  model->visible_spans(0, {6000, 6120}, 120.0, out);
  ASSERT_EQ(out.size(), 10u);
  EXPECT_EQ(out[0].start_ns, 6000);
}

TEST(SpanAt, FindsSpanUnderTimeOrNearestWithinTolerance) {
  auto t = TimelineBuilder({{"rank0.compute", 0, sim::LaneRole::kCompute}})
               .span("a", 0, sim::OpKind::kGemm, 0, 10)
               .span("b", 0, sim::OpKind::kGemm, 20, 30)
               .build();
  auto model = TimelineModel::build({t});
  ASSERT_TRUE(model);
  EXPECT_EQ(model->span_at(0, 5, 0), std::optional<std::uint32_t>(0));
  EXPECT_EQ(model->span_at(0, 25, 0), std::optional<std::uint32_t>(1));
  EXPECT_EQ(model->span_at(0, 15, 0), std::nullopt);
  // 18 is 2 ns from b and 8 ns from a.
  EXPECT_EQ(model->span_at(0, 18, 3), std::optional<std::uint32_t>(1));
  EXPECT_EQ(model->span_at(0, 100, 3), std::nullopt);
}

TEST(TimelineModel, MarksTheTimeComputeWaitedOnACopy) {
  // The report's definition (sim::idle_intervals): compute idle while it waits on a copy. c1
  // waits on load: [10,30) on the h2d row; c2 waits on save: [40,50) on the d2h row. The
  // prefetch [60,80) runs while compute waits on the all-reduce: exposed comm, not a copy's.
  auto t = TimelineBuilder({{"rank0.compute", 0, sim::LaneRole::kCompute},
                            {"rank0.h2d", 0, sim::LaneRole::kH2D},
                            {"rank0.d2h", 0, sim::LaneRole::kD2H},
                            {"rank0.comm", 0, sim::LaneRole::kComm}})
               .span("c0", 0, sim::OpKind::kGemm, 0, 10)
               .span("load", 1, sim::OpKind::kCopy, 0, 30)
               .span("c1", 0, sim::OpKind::kGemm, 30, 40)
               .span("save", 2, sim::OpKind::kCopy, 35, 50)
               .span("c2", 0, sim::OpKind::kGemm, 50, 60)
               .span("prefetch", 1, sim::OpKind::kCopy, 60, 80)
               .span("ar", 3, sim::OpKind::kCollective, 60, 90)
               .span("c3", 0, sim::OpKind::kGemm, 90, 100)
               .dep(2, 1)
               .dep(4, 3)
               .dep(7, 6)
               .build();
  auto model = TimelineModel::build({t});
  ASSERT_TRUE(model);
  ASSERT_EQ(model->rows()[1].lane_name, "rank0.h2d");
  EXPECT_EQ(model->rows()[1].exposed, (std::vector<TimeWindow>{{10, 30}}));
  ASSERT_EQ(model->rows()[2].lane_name, "rank0.d2h");
  EXPECT_EQ(model->rows()[2].exposed, (std::vector<TimeWindow>{{40, 50}}));
  EXPECT_TRUE(model->rows()[3].exposed.empty());
}

TEST(TimelineModel, MarksExposedCopiesPerRank) {
  auto t = TimelineBuilder({{"rank0.compute", 0, sim::LaneRole::kCompute},
                            {"rank0.h2d", 0, sim::LaneRole::kH2D},
                            {"rank1.compute", 1, sim::LaneRole::kCompute},
                            {"rank1.h2d", 1, sim::LaneRole::kH2D}})
               .span("fwd0", 0, sim::OpKind::kGemm, 0, 100)
               .span("load0", 1, sim::OpKind::kCopy, 50, 150)  // exposed [100,150)
               .span("fwd1", 2, sim::OpKind::kGemm, 0, 200)
               .span("load1", 3, sim::OpKind::kCopy, 50, 150)  // hidden by rank 1's compute
               .build();
  auto model = TimelineModel::build({t});
  ASSERT_TRUE(model);
  ASSERT_EQ(model->rows()[1].lane_name, "rank0.h2d");
  EXPECT_EQ(model->rows()[1].exposed, (std::vector<TimeWindow>{{100, 150}}));
  ASSERT_EQ(model->rows()[3].lane_name, "rank1.h2d");
  EXPECT_TRUE(model->rows()[3].exposed.empty());
}

TEST(CriticalPath, FollowsTheLatestEndingPredecessor) {
  // c0 [0,10) and c1 [30,40) on compute; h0 [0,30) on h2d. c1 started when h0 ended, so the
  // path back from c1 (the last end) goes through h0 (ends 30) rather than c0 (ends 10).
  auto t = TimelineBuilder({{"rank0.compute", 0, sim::LaneRole::kCompute},
                            {"rank0.h2d", 0, sim::LaneRole::kH2D}})
               .span("c0", 0, sim::OpKind::kGemm, 0, 10)
               .span("h0", 1, sim::OpKind::kCopy, 0, 30)
               .span("c1", 0, sim::OpKind::kGemm, 30, 40)
               .build();
  EXPECT_EQ(critical_path(t), (std::vector<std::uint32_t>{1, 2}));
  // With the plan's deps saying c1 waits only on c0 (its lane predecessor), h0 is off the path.
  std::vector<std::vector<sim::OpId>> deps(3);
  EXPECT_EQ(critical_path(t, deps), (std::vector<std::uint32_t>{0, 2}));
  auto model = TimelineModel::build({t});
  ASSERT_TRUE(model);
  EXPECT_EQ(model->critical_path(0), (std::vector<std::uint32_t>{1, 2}));
  EXPECT_EQ(model->rows()[0].critical, (std::vector<TimeWindow>{{30, 40}}));
  EXPECT_EQ(model->rows()[1].critical, (std::vector<TimeWindow>{{0, 30}}));
}

TEST(CriticalPath, ZeroLengthSpansTerminate) {
  auto t = TimelineBuilder({{"rank0.compute", 0, sim::LaneRole::kCompute},
                            {"rank0.h2d", 0, sim::LaneRole::kH2D}})
               .span("m0", 0, sim::OpKind::kMarker, 5, 5)
               .span("m1", 1, sim::OpKind::kMarker, 5, 5)
               .span("m2", 0, sim::OpKind::kMarker, 5, 5)
               .build();
  EXPECT_EQ(critical_path(t).size(), 3u);
}

TEST(SpanTooltip, GemmShowsFlopsDurationAndRate) {
  // 1e12 FLOP in 2 ms = 5e14 FLOP/s = 500 TFLOP/s.
  auto t = TimelineBuilder({{"rank0.compute", 0, sim::LaneRole::kCompute}})
               .span("fwd.l0.qkv", 0, sim::OpKind::kGemm, 0, 2'000'000, 1e12)
               .build();
  const std::string tip = span_tooltip(t, 0);
  EXPECT_NE(tip.find("fwd.l0.qkv"), std::string::npos) << tip;
  EXPECT_NE(tip.find("gemm"), std::string::npos) << tip;
  EXPECT_NE(tip.find("1.00 TFLOP"), std::string::npos) << tip;
  EXPECT_NE(tip.find("2.000 ms"), std::string::npos) << tip;
  EXPECT_NE(tip.find("500.00 TFLOP/s"), std::string::npos) << tip;
}

TEST(SpanTooltip, CopyShowsBytesAndBandwidth) {
  // 2.5 GiB in 100 ms = 25 GiB/s: binary units, as the CLI prints them.
  auto t = TimelineBuilder({{"rank0.h2d", 0, sim::LaneRole::kH2D}})
               .span("load", 0, sim::OpKind::kCopy, 0, 100'000'000, 0.0, 2'684'354'560)
               .build();
  const std::string tip = span_tooltip(t, 0);
  EXPECT_NE(tip.find("2.50 GiB"), std::string::npos) << tip;
  EXPECT_NE(tip.find("25.00 GiB/s"), std::string::npos) << tip;
  EXPECT_EQ(format_bytes(1536.0), "1.5 KiB");
  EXPECT_EQ(format_bytes(3.0 * 1024 * 1024), "3.00 MiB");
}

}  // namespace
}  // namespace offsim::gui
