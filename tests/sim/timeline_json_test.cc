#include "sim/trace/timeline_json.h"

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include <gtest/gtest.h>

#include "sim/core/file_io.h"
#include "sim/engine/simulator.h"

namespace offsim::sim {
namespace {

// A small plan with two lanes, a shared link, a latency term and memory effects.
Plan small_plan() {
  PlanBuilder b;
  b.metadata("model", "toy");
  ResourceId link = b.resource("rank0.pcie.h2d", 25e9);
  ResourceId sm = b.resource("rank0.sm", 1.0);
  PoolId hbm = b.pool("rank0.hbm", 80'000'000'000);
  TensorId w = b.tensor("l0.weights", hbm, 1'000'000, sim::TensorCategory::kParams);
  TensorId act = b.tensor("l0.act", hbm, 250'000, sim::TensorCategory::kActivations);
  TensorId pre = b.tensor("l1.weights", hbm, 500'000'000, sim::TensorCategory::kParams);
  b.initial(w);
  LaneId compute = b.lane("rank0.compute");
  LaneId h2d = b.lane("rank0.h2d");
  Op gemm{.name = "fwd.l0.qkv",
          .lane = compute,
          .kind = OpKind::kGemm,
          .category = sim::OpCategory::kCompute,
          .layer = 0};
  gemm.sizes.flops = 2e12;
  gemm.cost.work = 2e12;
  gemm.cost.uses = {{sm, 1.0 / 5e14}};
  gemm.cost.latency = Duration{4'321};
  gemm.allocs = {act};
  OpId g = b.op(gemm);
  Op copy{.name = "prefetch.l1",
          .lane = h2d,
          .kind = OpKind::kCopy,
          .category = sim::OpCategory::kOffload,
          .layer = 1};
  copy.sizes.bytes = 500'000'000;
  copy.cost.work = 5e8;
  copy.cost.uses = {{link, 1.0}};
  copy.allocs = {pre};
  b.op(copy);
  Op next{.name = "fwd.l1.qkv",
          .lane = compute,
          .kind = OpKind::kGemm,
          .category = sim::OpCategory::kCompute,
          .layer = 1};
  next.sizes.flops = 1e12;
  next.cost.work = 1e12;
  next.cost.uses = {{sm, 1.0 / 5e14}};
  next.deps = {OpId{1}};
  next.frees = {act};
  b.op(next);
  (void)g;
  return std::move(b).build();
}

Timeline small_timeline() {
  Result<SimResult> r = simulate(small_plan());
  EXPECT_TRUE(r.has_value());
  return r ? r->timeline : Timeline{};
}

TEST(TimelineJsonTest, RoundTripIsLossless) {
  const Timeline t = small_timeline();
  ASSERT_EQ(t.spans.size(), 3u);
  Result<Timeline> back = timeline_from_json_text(timeline_to_json(t).dump(), "t.json");
  ASSERT_TRUE(back.has_value()) << back.error().message;
  EXPECT_EQ(*back, t);
}

TEST(TimelineJsonTest, RoundTripOfOutOfMemoryAndDeadlock) {
  Timeline t = small_timeline();
  t.source = "measured";
  t.outcome.kind = OutcomeKind::kOutOfMemory;
  t.outcome.message = "out of memory";
  t.outcome.oom = OutOfMemory{
      OpId{2},     "fwd.l1.qkv",
      "rank0.hbm", TimePoint{Duration{17}},
      100,         900,
      1000,        {{"a", TensorCategory::kParams, 600}, {"b", TensorCategory::kActivations, 300}}};
  t.outcome.deadlock = Deadlock{TimePoint{Duration{5}}, {"'x' (lane 'l') waits on 'y'"}};
  Result<Timeline> back = timeline_from_json(timeline_to_json(t), "t.json");
  ASSERT_TRUE(back.has_value()) << back.error().message;
  EXPECT_EQ(*back, t);
  // An OOM at time zero from initial tensors has no op.
  t.outcome.oom->op = OpId{};
  back = timeline_from_json(timeline_to_json(t), "t.json");
  ASSERT_TRUE(back.has_value()) << back.error().message;
  EXPECT_FALSE(back->outcome.oom->op.valid());
}

// Each malformed input gives an error naming the source and the JSON path.
struct BadCase {
  const char* what;
  std::function<void(nlohmann::json&)> edit;
  const char* expected;
};

TEST(TimelineJsonTest, ErrorsNameSourceAndPath) {
  const nlohmann::json good = timeline_to_json(small_timeline());
  const std::vector<BadCase> cases = {
      {"wrong format", [](nlohmann::json& j) { j["format"] = "offsim-trace"; },
       "t.json: $.format: expected \"offsim-timeline\", got \"offsim-trace\""},
      {"a plan", [](nlohmann::json& j) { j["format"] = "offsim-plan"; },
       "t.json: $: this is a Plan JSON (offsim run --plan-out), expected a Timeline JSON"},
      {"makespan before a span's end", [](nlohmann::json& j) { j["makespan_ns"] = 1; },
       "t.json: $.makespan_ns: makespan 1 ns precedes the end of $.spans["},
      {"negative makespan", [](nlohmann::json& j) { j["makespan_ns"] = -1; },
       "t.json: $.makespan_ns: expected a time >= 0 ns, got -1"},
      {"negative op bytes", [](nlohmann::json& j) { j["ops"][0]["bytes"] = -1; },
       "t.json: $.ops[0].bytes: expected a count >= 0, got -1"},
      {"negative pool capacity", [](nlohmann::json& j) { j["pools"][0]["capacity_bytes"] = -8; },
       "t.json: $.pools[0].capacity_bytes: expected a byte count >= 0, got -8"},
      {"negative sample", [](nlohmann::json& j) { j["pools"][0]["samples"][0][1] = -3; },
       "t.json: $.pools[0].samples[0]: expected a time and a byte count >= 0"},
      {"negative span start", [](nlohmann::json& j) { j["spans"][0]["start_ns"] = -5; },
       "t.json: $.spans[0].start_ns: expected a time >= 0 ns, got -5"},
      {"newer version", [](nlohmann::json& j) { j["format_version"] = 2; },
       "t.json: $.format_version: this offsim reads version 1, got 2"},
      {"unknown key", [](nlohmann::json& j) { j["extra"] = 1; }, "t.json: $: unknown key 'extra'"},
      {"missing key", [](nlohmann::json& j) { j.erase("spans"); },
       "t.json: $: missing key 'spans'"},
      {"span end type", [](nlohmann::json& j) { j["spans"][1]["end_ns"] = "soon"; },
       "t.json: $.spans[1].end_ns: expected an integer, got string"},
      {"span op range", [](nlohmann::json& j) { j["spans"][0]["op"] = 9; },
       "t.json: $.spans[0].op: op index 9 is out of range (the timeline has 3 ops)"},
      {"span order", [](nlohmann::json& j) { j["spans"][0]["end_ns"] = -1; },
       "t.json: $.spans[0].end_ns: end -1 ns is before start"},
      {"op kind", [](nlohmann::json& j) { j["ops"][2]["kind"] = "matmul"; },
       "t.json: $.ops[2].kind: unknown op kind \"matmul\""},
      {"op category", [](nlohmann::json& j) { j["ops"][0]["category"] = "gpu"; },
       "t.json: $.ops[0].category: unknown op category \"gpu\" (expected one of \"\", "
       "\"compute\", \"recompute\", \"comm\", \"offload\", \"optimizer\", \"cpu_optimizer\")"},
      {"tensor category", [](nlohmann::json& j) { j["tensors"][0]["category"] = "weights"; },
       "t.json: $.tensors[0].category: unknown tensor category \"weights\" (expected one of "
       "\"\", \"params\", \"grads\", \"optimizer\", \"activations\", \"buffers\", "
       "\"transients\", \"runtime\", \"workspace\")"},
      {"live category", [](nlohmann::json& j) { j["pools"][0]["live_at_peak"][0]["category"] = 3; },
       "t.json: $.pools[0].live_at_peak[0].category: expected a string"},
      {"sample shape", [](nlohmann::json& j) { j["pools"][0]["samples"][0] = 5; },
       "t.json: $.pools[0].samples[0]: expected [time_ns, bytes_in_use]"},
      {"pool kind", [](nlohmann::json& j) { j["pools"][0]["kind"] = "ddr"; },
       "t.json: $.pools[0].kind: unknown pool kind 'ddr'"},
      {"pool kind type", [](nlohmann::json& j) { j["pools"][0]["kind"] = 3; },
       "t.json: $.pools[0].kind: expected a string, got integer"},
      {"outcome kind", [](nlohmann::json& j) { j["outcome"]["kind"] = "done"; },
       "t.json: $.outcome.kind: unknown outcome \"done\""},
      {"live entry", [](nlohmann::json& j) { j["pools"][0]["live_at_peak"][0]["bytes"] = 1.5; },
       "t.json: $.pools[0].live_at_peak[0].bytes: expected an integer, got number"},
      {"metadata", [](nlohmann::json& j) { j["metadata"][0] = "model"; },
       "t.json: $.metadata[0]: expected [key, value] strings"},
      {"tensor pool", [](nlohmann::json& j) { j["tensors"][1]["pool"] = 4; },
       "t.json: $.tensors[1].pool: pool index 4 is out of range (the timeline has 1 pools)"},
      {"tensor key", [](nlohmann::json& j) { j["tensors"][0]["dtype"] = "bf16"; },
       "t.json: $.tensors[0]: unknown key 'dtype'"},
      {"event shape",
       [](nlohmann::json& j) {
         j["memory_events"][0] = {0, 1};
       },
       "t.json: $.memory_events[0]: expected [time_ns, tensor, delta_bytes]"},
      {"event tensor", [](nlohmann::json& j) { j["memory_events"][1][1] = 7; },
       "t.json: $.memory_events[1][1]: tensor index 7 is out of range (the timeline has 3 "
       "tensors"},
      {"event size", [](nlohmann::json& j) { j["memory_events"][1][2] = 5; },
       "t.json: $.memory_events[1]: expected 250000 bytes (an alloc, as it is not live"},
      {"event order", [](nlohmann::json& j) { j["memory_events"][2][0] = -2; },
       "t.json: $.memory_events[2][0]: expected a time >= 0 ns, got -2"},
      {"events without tensors", [](nlohmann::json& j) { j.erase("tensors"); },
       "t.json: $.memory_events[0][1]: tensor index 0 is out of range (the timeline has 0"},
  };
  for (const BadCase& c : cases) {
    nlohmann::json j = good;
    c.edit(j);
    Result<Timeline> r = timeline_from_json(j, "t.json");
    ASSERT_FALSE(r.has_value()) << c.what;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidInput) << c.what;
    EXPECT_EQ(r.error().message.rfind(c.expected, 0), 0u)
        << c.what << ": got \"" << r.error().message << "\"";
  }
  Result<Timeline> syntax = timeline_from_json_text("{\"format\": ", "broken.json");
  ASSERT_FALSE(syntax.has_value());
  EXPECT_NE(syntax.error().message.find("broken.json"), std::string::npos);
}

TEST(TimelineJsonTest, ChromeTraceMatchesGolden) {
  const Timeline t = small_timeline();
  const std::string trace = chrome_trace_json({&t});
  ASSERT_TRUE(nlohmann::json::accept(trace));
  const std::string path =
      std::string(OFFSIM_SOURCE_DIR) + "/tests/sim/golden/chrome_trace_small.json";
  const char* update = std::getenv("OFFSIM_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    ASSERT_TRUE(write_text_file_atomic(path, trace).has_value());
  }
  Result<std::string> golden = read_text_file(path);
  ASSERT_TRUE(golden.has_value()) << golden.error().message
                                  << " (run with OFFSIM_UPDATE_GOLDEN=1 to create it)";
  EXPECT_EQ(trace, *golden) << "run with OFFSIM_UPDATE_GOLDEN=1 to accept a deliberate change";
}

TEST(TimelineJsonTest, ChromeTraceShape) {
  // Two timelines: two processes; X slices in µs with three decimals from integer ns.
  Timeline t;
  t.source = "predicted";
  t.lanes = {"rank0.compute"};
  t.ops = {OpInfo{"a", OpKind::kGemm, OpCategory::kCompute, 0, 1e12, 0}};
  t.spans = {
      Span{OpId{0}, LaneId{0}, TimePoint{Duration{1'234'567}}, TimePoint{Duration{1'235'067}}}};
  Timeline m = t;
  m.source = "measured";
  const nlohmann::json j = nlohmann::json::parse(chrome_trace_json({&t, &m}));
  std::vector<std::string> processes;
  int slices = 0;
  for (const nlohmann::json& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") processes.push_back(e["args"]["name"]);
    if (e["ph"] == "X") {
      ++slices;
      EXPECT_EQ(e["tid"], 1);
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 1234.567);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 0.5);
    }
  }
  EXPECT_EQ(processes, (std::vector<std::string>{"predicted", "measured"}));
  EXPECT_EQ(slices, 2);
  EXPECT_NE(chrome_trace_json({&t}).find("\"ts\":1234.567,\"dur\":0.500"), std::string::npos);
}

// A cross-lane dependency becomes one flow: "s" on the producer's lane inside its slice, "f" on
// the consumer's lane at its start, bound to the enclosing slice; same-lane order draws none.
TEST(TimelineJsonTest, ChromeTraceDrawsCrossLaneDependencies) {
  const Timeline t = small_timeline();
  ASSERT_EQ(t.ops[2].deps, std::vector<OpId>{OpId{1}});  // fwd.l1.qkv waits for prefetch.l1
  const nlohmann::json j = nlohmann::json::parse(chrome_trace_json({&t}));
  std::map<std::string, double> slice_start, slice_end;
  std::map<std::string, int> slice_tid;
  std::vector<nlohmann::json> flows;
  for (const nlohmann::json& e : j["traceEvents"]) {
    if (e["ph"] == "X") {
      const std::string name = e["name"];
      slice_start[name] = e["ts"].get<double>();
      slice_end[name] = e["ts"].get<double>() + e["dur"].get<double>();
      slice_tid[name] = e["tid"].get<int>();
    }
    if (e["ph"] == "s" || e["ph"] == "f") flows.push_back(e);
  }
  ASSERT_EQ(flows.size(), 2u);
  EXPECT_EQ(flows[0]["ph"], "s");
  EXPECT_EQ(flows[1]["ph"], "f");
  EXPECT_EQ(flows[1]["bp"], "e");
  EXPECT_EQ(flows[0]["id"], flows[1]["id"]);
  EXPECT_EQ(flows[0]["tid"], slice_tid["prefetch.l1"]);
  EXPECT_EQ(flows[1]["tid"], slice_tid["fwd.l1.qkv"]);
  EXPECT_GE(flows[0]["ts"].get<double>(), slice_start["prefetch.l1"]);
  EXPECT_LT(flows[0]["ts"].get<double>(), slice_end["prefetch.l1"]);
  EXPECT_DOUBLE_EQ(flows[1]["ts"].get<double>(), slice_start["fwd.l1.qkv"]);
}

TEST(TimelineJsonTest, DepsLaneIdentityAndPoolKindRoundTrip) {
  Plan plan = small_plan();
  plan.lanes[0].rank = 0;
  plan.lanes[0].role = LaneRole::kCompute;
  plan.pools[0].kind = PoolKind::kHbm;
  plan.pools[0].owner = 0;
  Result<SimResult> r = simulate(plan);
  ASSERT_TRUE(r);
  const Timeline& t = r->timeline;
  ASSERT_EQ(t.lane_identity.size(), 2u);
  EXPECT_EQ(t.lane_identity[0].role, LaneRole::kCompute);
  EXPECT_EQ(t.pools[0].kind, PoolKind::kHbm);
  auto back = timeline_from_json_text(timeline_to_json(t).dump(), "t.json");
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, t);
  nlohmann::json bad = timeline_to_json(t);
  bad["ops"][2]["deps"] = {9};
  auto e = timeline_from_json(bad, "bad.json");
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("$.ops[2].deps[0]"), std::string::npos) << e.error().message;
}

}  // namespace
}  // namespace offsim::sim
