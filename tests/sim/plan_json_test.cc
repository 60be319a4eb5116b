// Plan JSON: round trip, and errors that name the source and the JSON path.
#include "sim/plan/plan_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace offsim::sim {
namespace {

using ::testing::HasSubstr;

Plan rich_plan() {
  PlanBuilder b;
  const LaneId compute =
      b.lane("rank0.compute", {.rank = 0, .stage = 0, .role = LaneRole::kCompute});
  const LaneId comm = b.lane("rank0.comm");
  const LaneId recv = b.lane("rank1.recv", {.rank = 1, .stage = 1, .role = LaneRole::kRecv});
  const ResourceId sm = b.resource("rank0.sm", 1.0);
  const ResourceId nvl = b.resource("rank0.nvlink.tx", 450e9);
  const PoolId hbm = b.pool("rank0.hbm", 80LL << 30, PoolKind::kHbm, 0);
  b.pool("node0.pinned", 1LL << 40, PoolKind::kPinnedHost, 0);
  const TensorId w = b.tensor("w", hbm, 1 << 20, sim::TensorCategory::kParams);
  const TensorId a = b.tensor("a", hbm, 4096, sim::TensorCategory::kActivations);
  b.initial(w);
  b.metadata("model", "tiny");
  Op gemm{.name = "fwd.l0.qkv",
          .lane = compute,
          .kind = OpKind::kGemm,
          .category = sim::OpCategory::kCompute};
  gemm.layer = 0;
  gemm.sizes.flops = 2.0 * 8 * 16 * 32;
  gemm.sizes.gemm = {.m = 8, .n = 16, .k = 32, .batch = 1, .dtype = DType::kBf16};
  gemm.cost = {.work = gemm.sizes.flops, .max_rate = 7e14, .uses = {{sm, 1.0 / 7e14}}};
  gemm.cost.latency = Duration{4000};
  gemm.allocs = {a};
  b.op(gemm);
  Op ar{
      .name = "ar", .lane = comm, .kind = OpKind::kCollective, .category = sim::OpCategory::kComm};
  ar.sizes.bytes = 4096;
  ar.sizes.collective = {.kind = CollectiveKind::kAllReduce, .group = {0, 1, 2, 3}};
  ar.cost = {.work = 4096, .uses = {{nvl, 1.5}}, .multiplicity = 4};
  ar.deps = {OpId{0}};
  ar.frees = {a};
  b.op(ar);
  Op copy{.name = "h2d", .lane = comm, .kind = OpKind::kCopy};
  copy.sizes.copy_direction = CopyDirection::kH2D;
  copy.sizes.bytes = 10;
  copy.cost = {.work = 10, .uses = {{nvl, 1.0}}};
  b.op(copy);
  Op send{.name = "send", .lane = compute, .kind = OpKind::kP2P};
  send.sizes = {.bytes = 64, .peer = 1, .p2p_role = P2PRole::kSend, .p2p_pair = 7};
  const OpId send_id = b.op(send);
  Op receive{.name = "recv", .lane = recv, .kind = OpKind::kP2P, .deps = {send_id}};
  receive.sizes = {.bytes = 64, .peer = 0, .p2p_role = P2PRole::kRecv, .p2p_pair = 7};
  b.op(receive);
  return std::move(b).build();
}

TEST(PlanJson, IdentityRoundTripsAndOldPlainLaneNamesStillRead) {
  const Plan plan = rich_plan();
  auto back = plan_from_json_text(plan_to_json(plan).dump(), "id.json");
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->lanes[0].rank, 0);
  EXPECT_EQ(back->lanes[0].role, LaneRole::kCompute);
  EXPECT_EQ(back->lanes[1].rank, -1);  // a lane without identity
  EXPECT_EQ(back->lanes[2].stage, 1);
  EXPECT_EQ(back->lanes[2].role, LaneRole::kRecv);
  EXPECT_EQ(back->pools[0].kind, PoolKind::kHbm);
  EXPECT_EQ(back->pools[1].kind, PoolKind::kPinnedHost);
  const Op& r = back->ops.back();
  EXPECT_EQ(r.sizes.p2p_role, P2PRole::kRecv);
  EXPECT_EQ(r.sizes.p2p_pair, 7);
  // A plan written before lanes had identity: plain names, no pool kinds, no p2p role.
  nlohmann::json old = plan_to_json(plan);
  for (auto& lane : old["lanes"]) {
    if (lane.is_object()) lane = lane["name"];
  }
  for (auto& pool : old["pools"]) {
    pool.erase("kind");
    pool.erase("owner");
  }
  auto& ops = old["ops"];
  ops.erase(ops.size() - 1);  // the receive
  ops.back()["sizes"].erase("role");
  ops.back()["sizes"].erase("pair");
  auto legacy = plan_from_json(old, "old.json");
  ASSERT_TRUE(legacy) << legacy.error().message;
  EXPECT_EQ(legacy->lanes[0].name, "rank0.compute");
  EXPECT_EQ(legacy->lanes[0].rank, -1);
  EXPECT_EQ(legacy->pools[0].kind, PoolKind::kOther);
  EXPECT_EQ(legacy->ops.back().sizes.p2p_role, P2PRole::kSend);
}

TEST(PlanJson, UnknownLaneRoleAndUnmatchedReceiveAreErrors) {
  nlohmann::json j = plan_to_json(rich_plan());
  j["lanes"][0]["role"] = "gpu";
  auto r = plan_from_json(j, "role.json");
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error().message, HasSubstr("$.lanes[0].role"));
  EXPECT_THAT(r.error().message, HasSubstr("unknown lane role 'gpu'"));
  nlohmann::json k = plan_to_json(rich_plan());
  k["ops"].back()["sizes"]["pair"] = 8;
  auto u = plan_from_json(k, "pair.json");
  ASSERT_FALSE(u);
  EXPECT_THAT(u.error().message, HasSubstr("receives p2p pair 8, which no op sends"));
  nlohmann::json w = plan_to_json(rich_plan());
  w["ops"].back()["sizes"]["peer"] = 3;
  auto v = plan_from_json(w, "peer.json");
  ASSERT_FALSE(v);
  EXPECT_THAT(v.error().message, HasSubstr("from rank 3"));
}

// An unknown name of an optional enum member is an error at its path that lists the names known.
TEST(PlanJson, UnknownEnumNamesSayWhatIsExpected) {
  const nlohmann::json good = plan_to_json(rich_plan());
  auto error_of = [&](auto edit) {
    nlohmann::json j = good;
    edit(j);
    auto r = plan_from_json(j, "enum.json");
    return r ? std::string("(parsed)") : r.error().message;
  };
  EXPECT_THAT(error_of([](nlohmann::json& j) { j["pools"][0]["kind"] = "ddr"; }),
              HasSubstr("$.pools[0].kind: unknown pool kind 'ddr' (expected other, hbm or "
                        "pinned_host)"));
  EXPECT_THAT(error_of([](nlohmann::json& j) { j["ops"].back()["sizes"]["role"] = "push"; }),
              HasSubstr("sizes.role: unknown p2p role 'push' (expected send or recv)"));
  EXPECT_THAT(error_of([](nlohmann::json& j) { j["ops"].back()["sizes"]["direction"] = "up"; }),
              HasSubstr("sizes.direction: unknown direction 'up' (expected h2d, d2h, d2d or h2h)"));
  EXPECT_THAT(error_of([](nlohmann::json& j) { j["lanes"][0]["role"] = 7; }),
              HasSubstr("$.lanes[0].role: expected a string, got integer"));
}

TEST(PlanJson, RoundTripIsExact) {
  const Plan plan = rich_plan();
  const std::string text = plan_to_json(plan).dump();
  auto back = plan_from_json_text(text, "mem.json");
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, plan);
  EXPECT_EQ(plan_to_json(*back).dump(), text);
}

std::string error_for(const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = plan_to_json(rich_plan());
  edit(j);
  auto r = plan_from_json(j, "bad.json");
  return r ? std::string("(accepted)") : r.error().message;
}

TEST(PlanJson, ErrorsNameSourceAndPath) {
  EXPECT_EQ(error_for([](auto& j) { j["ops"][1]["lane"] = "rank9.comm"; }),
            "bad.json: $.ops[1].lane: unknown lane 'rank9.comm'");
  EXPECT_EQ(error_for([](auto& j) { j["ops"][0]["cost"]["work"] = "many"; }),
            "bad.json: $.ops[0].cost.work: expected a number, got string");
  EXPECT_THAT(error_for([](auto& j) { j["ops"][0]["kind"] = "matmul"; }),
              HasSubstr("$.ops[0].kind: unknown op kind 'matmul'"));
  EXPECT_THAT(error_for([](auto& j) { j["ops"][0]["colour"] = 1; }),
              HasSubstr("$.ops[0]: unknown key 'colour'"));
  EXPECT_THAT(error_for([](auto& j) { j["tensors"][0]["pool"] = "nowhere"; }),
              HasSubstr("$.tensors[0].pool: unknown pool 'nowhere'"));
  EXPECT_THAT(error_for([](auto& j) { j["ops"][1]["cost"]["uses"][0][0] = "x"; }),
              HasSubstr("$.ops[1].cost.uses[0]: unknown resource 'x'"));
  EXPECT_THAT(error_for([](auto& j) { j["format_version"] = 99; }),
              HasSubstr("$.format_version: this offsim reads version 1, got 99"));
  EXPECT_THAT(error_for([](auto& j) { j["ops"][1]["deps"] = {-1}; }),
              HasSubstr("$.ops[1].deps[0]: id -1 is out of range"));
  EXPECT_THAT(error_for([](auto& j) { j.erase("ops"); }), HasSubstr("$: missing key 'ops'"));
  EXPECT_THAT(error_for([](auto& j) { j["ops"][1]["sizes"]["collective"]["kind"] = "gossip"; }),
              HasSubstr("unknown collective 'gossip'"));
  EXPECT_THAT(error_for([](auto& j) { j["ops"][0]["category"] = "gpu"; }),
              HasSubstr("$.ops[0].category: unknown op category 'gpu' (expected one of \"\", "
                        "\"compute\", \"recompute\", \"comm\", \"offload\", \"optimizer\", "
                        "\"cpu_optimizer\")"));
  EXPECT_THAT(error_for([](auto& j) { j["tensors"][0]["category"] = "weights"; }),
              HasSubstr("$.tensors[0].category: unknown tensor category 'weights' (expected one "
                        "of \"\", \"params\", \"grads\", \"optimizer\", \"activations\", "
                        "\"buffers\", \"transients\", \"runtime\", \"workspace\")"));
}

// The categories' names are the strings plans, timelines and reports carried before they were
// enums; each parses back to its value and nothing else parses.
TEST(PlanJson, CategoryNamesRoundTrip) {
  const std::vector<std::pair<OpCategory, std::string>> ops = {
      {OpCategory::kNone, ""},
      {OpCategory::kCompute, "compute"},
      {OpCategory::kRecompute, "recompute"},
      {OpCategory::kComm, "comm"},
      {OpCategory::kOffload, "offload"},
      {OpCategory::kOptimizer, "optimizer"},
      {OpCategory::kCpuOptimizer, "cpu_optimizer"}};
  for (const auto& [c, name] : ops) {
    EXPECT_EQ(to_string(c), name);
    EXPECT_EQ(op_category_from_string(name), c) << name;
  }
  const std::vector<std::pair<TensorCategory, std::string>> tensors = {
      {TensorCategory::kNone, ""},
      {TensorCategory::kParams, "params"},
      {TensorCategory::kGrads, "grads"},
      {TensorCategory::kOptimizer, "optimizer"},
      {TensorCategory::kActivations, "activations"},
      {TensorCategory::kBuffers, "buffers"},
      {TensorCategory::kTransients, "transients"},
      {TensorCategory::kRuntime, "runtime"},
      {TensorCategory::kWorkspace, "workspace"}};
  for (const auto& [c, name] : tensors) {
    EXPECT_EQ(to_string(c), name);
    EXPECT_EQ(tensor_category_from_string(name), c) << name;
  }
  EXPECT_EQ(op_category_from_string("Compute"), std::nullopt);
  EXPECT_EQ(op_category_from_string("params"), std::nullopt);
  EXPECT_EQ(tensor_category_from_string("compute"), std::nullopt);
}

TEST(PlanJson, ValidationErrorsCarryTheSource) {
  // Structurally fine JSON, semantically a double free.
  EXPECT_THAT(error_for([](auto& j) { j["ops"][2]["frees"] = {1}; }),
              HasSubstr("bad.json: ops[2] 'h2d': double free of tensor 'a'"));
}

TEST(PlanJson, SyntaxErrorsAndHostileNesting) {
  auto r = plan_from_json_text("{\"format\": ", "cut.json");
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error().message, HasSubstr("cut.json: not valid JSON"));
  const std::string deep(100000, '[');
  auto d = plan_from_json_text(deep, "deep.json");
  ASSERT_FALSE(d);
  EXPECT_THAT(d.error().message, HasSubstr("nested deeper than 256 levels"));
}

TEST(PlanJson, MissingFileIsNotFound) {
  auto r = read_plan_file("/nonexistent/plan.json");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kNotFound);
}

}  // namespace
}  // namespace offsim::sim
