// The Chrome trace that `offsim run --trace` writes (sim::chrome_trace_json) read back.
#include "gui/model/chrome_trace.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "gui/model/timeline_model.h"
#include "sim/trace/timeline_json.h"
#include "tests/gui/test_timelines.h"

namespace offsim::gui {
namespace {

using testing::TimelineBuilder;

sim::TimePoint at(std::int64_t ns) { return sim::kTimeZero + sim::Duration{ns}; }

// Two lanes, a GEMM with FLOPs and a copy with bytes, times that are not whole microseconds,
// and one HBM pool with three samples.
sim::Timeline sample(const std::string& source) {
  auto t = TimelineBuilder({{"rank0.compute", 0, sim::LaneRole::kCompute},
                            {"rank0.h2d", 0, sim::LaneRole::kH2D},
                            {"rank0.comm", 0, sim::LaneRole::kComm}},
                           source)
               .span("fwd.l0.qkv", 0, sim::OpKind::kGemm, 1'500, 2'000'250, 1.25e12)
               .span("load.l1", 1, sim::OpKind::kCopy, 0, 3'000'001, 0.0, 1'048'576)
               .build();
  sim::PoolTrace pool;
  pool.name = "rank0.hbm";
  pool.kind = sim::PoolKind::kHbm;
  pool.owner = 0;
  pool.capacity_bytes = 80;
  pool.samples = {{at(0), 10}, {at(1'500), 60}, {at(3'000'001), 20}};
  pool.peak_bytes = 60;
  pool.peak_time = at(1'500);
  t.pools.push_back(pool);
  return t;
}

TEST(ChromeTrace, RoundTripsLanesSpansAndMemory) {
  const sim::Timeline original = sample("predicted");
  const std::string text = sim::chrome_trace_json({&original});
  ASSERT_TRUE(is_chrome_trace(text));
  EXPECT_FALSE(is_chrome_trace(sim::timeline_to_json(original).dump()));
  auto back = timelines_from_chrome_trace(text, "step.trace.json");
  ASSERT_TRUE(back) << back.error().message;
  ASSERT_EQ(back->size(), 1u);
  const sim::Timeline& t = back->front();
  EXPECT_EQ(t.source, "predicted");
  EXPECT_EQ(t.lanes, original.lanes);  // the empty comm lane too
  EXPECT_EQ(t.lane_identity, original.lane_identity);
  EXPECT_EQ(t.makespan, original.makespan);
  ASSERT_EQ(t.spans.size(), 2u);
  // Spans by end time: the GEMM ends first.
  const sim::Span& gemm = t.spans[0];
  EXPECT_EQ(gemm.lane, sim::LaneId(0));
  EXPECT_EQ(gemm.start, at(1'500));
  EXPECT_EQ(gemm.end, at(2'000'250));
  const sim::OpInfo& op = t.ops[gemm.op.index()];
  EXPECT_EQ(op.name, "fwd.l0.qkv");
  EXPECT_EQ(op.kind, sim::OpKind::kGemm);
  EXPECT_DOUBLE_EQ(op.flops, 1.25e12);
  const sim::Span& copy = t.spans[1];
  EXPECT_EQ(copy.lane, sim::LaneId(1));
  EXPECT_EQ(copy.end, at(3'000'001));
  EXPECT_EQ(t.ops[copy.op.index()].kind, sim::OpKind::kCopy);
  EXPECT_EQ(t.ops[copy.op.index()].bytes, 1'048'576);
  ASSERT_EQ(t.pools.size(), 1u);
  EXPECT_EQ(t.pools[0].name, "rank0.hbm");
  EXPECT_EQ(t.pools[0].kind, sim::PoolKind::kHbm);
  EXPECT_EQ(t.pools[0].owner, 0);
  EXPECT_EQ(t.pools[0].samples, original.pools[0].samples);
  EXPECT_EQ(t.pools[0].peak_bytes, 60);
  EXPECT_EQ(t.pools[0].peak_time, at(1'500));
  EXPECT_EQ(t.pools[0].capacity_bytes, 0);  // not in a trace
}

// Identity travels in the trace's metadata, not in the names: lanes and pools renamed to
// something no name parser could read keep their ranks, roles and pool owners.
TEST(ChromeTrace, IdentitySurvivesRenamedLanesAndPools) {
  const sim::Timeline original = sample("predicted");
  nlohmann::json doc = nlohmann::json::parse(sim::chrome_trace_json({&original}));
  int renamed = 0;
  for (nlohmann::json& e : doc["traceEvents"]) {
    const std::string name = e.value("name", "");
    if (name == "thread_name") e["args"]["name"] = "stream #" + std::to_string(++renamed);
    if (name == "offsim_pool" || e.value("ph", "") == "C") {
      if (name == "offsim_pool") e["args"]["name"] = "device memory";
      if (e.value("ph", "") == "C") e["name"] = "device memory";
    }
  }
  ASSERT_EQ(renamed, 3);
  auto back = timelines_from_chrome_trace(doc.dump(), "renamed.json");
  ASSERT_TRUE(back) << back.error().message;
  const sim::Timeline& t = back->front();
  EXPECT_EQ(t.lanes, (std::vector<std::string>{"stream #1", "stream #2", "stream #3"}));
  EXPECT_EQ(t.lane_identity, original.lane_identity);
  EXPECT_EQ(lane_of(t, 1).rank, 0);
  EXPECT_EQ(lane_of(t, 1).kind, LaneKind::kH2D);
  ASSERT_EQ(t.pools.size(), 1u);
  EXPECT_EQ(t.pools[0].name, "device memory");
  EXPECT_EQ(t.pools[0].kind, sim::PoolKind::kHbm);
  EXPECT_EQ(pool_rank_of(t.pools[0]), 0);
}

// A trace from another writer has no identity: rank -1 and kind kOther, whatever the names say.
TEST(ChromeTrace, ForeignTraceHasNoIdentity) {
  const std::string text =
      R"({"traceEvents":[{"ph":"M","pid":1,"tid":1,"name":"thread_name","args":{"name":"rank3.compute"}},)"
      R"({"ph":"X","pid":1,"tid":1,"name":"k","ts":0,"dur":1},)"
      R"({"ph":"C","pid":1,"tid":0,"name":"rank3.hbm","ts":0,"args":{"bytes_in_use":5}}]})";
  auto back = timelines_from_chrome_trace(text, "foreign.json");
  ASSERT_TRUE(back) << back.error().message;
  const sim::Timeline& t = back->front();
  EXPECT_TRUE(t.lane_identity.empty());
  EXPECT_EQ(lane_of(t, 0).rank, -1);
  EXPECT_EQ(lane_of(t, 0).kind, LaneKind::kOther);
  EXPECT_EQ(pool_rank_of(t.pools[0]), -1);
}

TEST(ChromeTrace, OneTimelinePerProcessAndOtherEventsSkipped) {
  const sim::Timeline predicted = sample("predicted");
  const sim::Timeline measured = sample("measured");
  std::string text = sim::chrome_trace_json({&predicted, &measured});
  // Flow arrows and an instant event, as other writers add them: skipped.
  const std::string extra = R"({"ph":"s","pid":1,"tid":1,"id":7,"ts":1.0,"name":"dep"},)"
                            R"({"ph":"f","pid":1,"tid":2,"id":7,"ts":2.0,"bp":"e","name":"dep"},)"
                            R"({"ph":"i","pid":2,"tid":1,"ts":3.0,"name":"mark"},)";
  text.insert(text.find('[') + 1, extra);
  auto back = timelines_from_chrome_trace(text, "t.json");
  ASSERT_TRUE(back) << back.error().message;
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].source, "predicted");
  EXPECT_EQ((*back)[1].source, "measured");
  EXPECT_EQ((*back)[1].spans.size(), 2u);
}

TEST(ChromeTrace, ErrorsNameTheEventAndKey) {
  auto not_json = timelines_from_chrome_trace("{\"traceEvents\": [", "t.json");
  ASSERT_FALSE(not_json);
  EXPECT_NE(not_json.error().message.find("t.json: not valid JSON"), std::string::npos);
  // Strict JSON, as every input: a duplicate key is refused with its line and path.
  auto duplicate =
      timelines_from_chrome_trace("{\"traceEvents\": [],\n \"traceEvents\": []}", "t.json");
  ASSERT_FALSE(duplicate);
  EXPECT_NE(duplicate.error().message.find("duplicate key 'traceEvents'"), std::string::npos)
      << duplicate.error().message;
  auto no_events = timelines_from_chrome_trace(R"({"displayTimeUnit": "ns"})", "t.json");
  ASSERT_FALSE(no_events);
  EXPECT_NE(no_events.error().message.find("traceEvents"), std::string::npos);
  auto negative = timelines_from_chrome_trace(
      R"({"traceEvents": [{"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": -5, "name": "a"}]})",
      "t.json");
  ASSERT_FALSE(negative);
  EXPECT_NE(negative.error().message.find("t.json: traceEvents[0].dur: expected a time in µs >= 0"),
            std::string::npos)
      << negative.error().message;
  auto huge = timelines_from_chrome_trace(
      R"([{"ph": "X", "pid": 1, "tid": 1, "ts": 1e300, "dur": 1, "name": "a"}])", "t.json");
  ASSERT_FALSE(huge);
  EXPECT_NE(huge.error().message.find("traceEvents[0].ts"), std::string::npos);
  auto no_pid = timelines_from_chrome_trace(R"([{"ph": "C", "ts": 0, "name": "p"}])", "t.json");
  ASSERT_FALSE(no_pid);
  EXPECT_NE(no_pid.error().message.find("traceEvents[0].pid: expected an integer"),
            std::string::npos);
  auto bytes = timelines_from_chrome_trace(
      R"([{"ph": "C", "pid": 1, "ts": 0, "name": "p", "args": {"bytes_in_use": -1}}])", "t.json");
  ASSERT_FALSE(bytes);
  EXPECT_NE(bytes.error().message.find("args.bytes_in_use"), std::string::npos);
  auto empty = timelines_from_chrome_trace(R"({"traceEvents": []})", "t.json");
  ASSERT_FALSE(empty);
  EXPECT_NE(empty.error().message.find("no slices"), std::string::npos);
}

}  // namespace
}  // namespace offsim::gui
