// Plan validation: one test per error kind, each checking that the message names the culprit.
#include "sim/plan/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sim/plan/shape_math.h"

namespace offsim::sim {
namespace {

using ::testing::HasSubstr;

// Two lanes, one resource, one pool; op 0 allocates t0 and op 1 (on the other lane, after op 0)
// frees it.
Plan small_plan() {
  PlanBuilder b;
  const LaneId a = b.lane("rank0.compute");
  const LaneId c = b.lane("rank0.d2h");
  const ResourceId link = b.resource("rank0.pcie.d2h", 25e9);
  const PoolId hbm = b.pool("rank0.hbm", 1000);
  const TensorId t0 = b.tensor("act0", hbm, 100, sim::TensorCategory::kActivations);
  b.op({.name = "fwd", .lane = a, .kind = OpKind::kGemm, .allocs = {t0}});
  b.op({.name = "offload",
        .lane = c,
        .kind = OpKind::kCopy,
        .cost = {.work = 100, .uses = {{link, 1.0}}},
        .deps = {OpId{0}},
        .frees = {t0}});
  return std::move(b).build();
}

std::string error_of(const Plan& plan) {
  Status s = validate(plan);
  return s ? std::string("(valid)") : s.error().message;
}

TEST(PlanValidate, AcceptsSmallPlan) { EXPECT_TRUE(validate(small_plan())); }

TEST(PlanValidate, BuilderInternsNames) {
  PlanBuilder b;
  EXPECT_EQ(b.lane("x").value(), b.lane("x").value());
  EXPECT_NE(b.lane("x").value(), b.lane("y").value());
  EXPECT_EQ(b.resource("r", 1.0).value(), b.resource("r", 2.0).value());
  EXPECT_EQ(b.find_pool("p"), std::nullopt);
}

TEST(PlanValidate, RejectsCycleAndNamesIt) {
  Plan p = small_plan();
  // Lane order gives nothing here (different lanes); op 0 waiting on op 1 closes a cycle.
  p.ops[0].deps.push_back(OpId{1});
  const std::string msg = error_of(p);
  EXPECT_THAT(msg, HasSubstr("cycle"));
  EXPECT_THAT(msg, HasSubstr("'fwd'"));
  EXPECT_THAT(msg, HasSubstr("'offload'"));
}

TEST(PlanValidate, RejectsCycleThroughLaneOrder) {
  // op0 and op1 on one lane (op0 first); op0 depends on op1: op1 can only start after op0.
  PlanBuilder b;
  const LaneId l = b.lane("l");
  b.op({.name = "first", .lane = l, .deps = {OpId{1}}});
  b.op({.name = "second", .lane = l});
  EXPECT_THAT(error_of(std::move(b).build()), HasSubstr("cycle"));
}

TEST(PlanValidate, RejectsDanglingDependency) {
  Plan p = small_plan();
  p.ops[1].deps.push_back(OpId{7});
  EXPECT_THAT(error_of(p), HasSubstr("dependency on op id 7, which does not exist"));
}

TEST(PlanValidate, RejectsSelfDependency) {
  Plan p = small_plan();
  p.ops[1].deps = {OpId{1}};
  EXPECT_THAT(error_of(p), HasSubstr("depends on itself"));
}

TEST(PlanValidate, RejectsFreeWithoutAlloc) {
  Plan p = small_plan();
  p.ops[0].allocs.clear();
  EXPECT_THAT(error_of(p), HasSubstr("frees tensor 'act0', which is never allocated"));
}

TEST(PlanValidate, RejectsDoubleFree) {
  Plan p = small_plan();
  p.ops[1].frees.push_back(TensorId{0});
  EXPECT_THAT(error_of(p), HasSubstr("double free of tensor 'act0'"));
}

TEST(PlanValidate, RejectsDoubleAlloc) {
  Plan p = small_plan();
  p.initial_tensors.push_back(TensorId{0});
  EXPECT_THAT(error_of(p), HasSubstr("double alloc of tensor 'act0'"));
}

TEST(PlanValidate, RejectsFreeBeforeAlloc) {
  Plan p = small_plan();
  // Without the dependency, the free on the d2h lane is not ordered after the alloc.
  p.ops[1].deps.clear();
  EXPECT_THAT(error_of(p), HasSubstr("frees tensor 'act0' but is not ordered after ops[0] 'fwd'"));
  // Ordered through a third lane: fwd -> marker (lane m) -> offload.
  Plan q = small_plan();
  const LaneId m{q.lanes.size()};
  q.lanes.push_back(Lane{"rank0.marker"});
  Op mark;
  mark.name = "mark";
  mark.lane = m;
  mark.deps = {OpId{0}};
  q.ops.push_back(std::move(mark));
  q.ops[1].deps = {OpId{2}};
  EXPECT_TRUE(validate(q)) << error_of(q);
}

TEST(PlanValidate, RejectsUnknownPool) {
  Plan p = small_plan();
  p.tensors[0].pool = PoolId{5};
  EXPECT_THAT(error_of(p), HasSubstr("unknown pool id 5"));
}

TEST(PlanValidate, RejectsUnknownLaneResourceAndTensor) {
  Plan p = small_plan();
  p.ops[0].lane = LaneId{9};
  EXPECT_THAT(error_of(p), HasSubstr("unknown lane id 9"));
  p = small_plan();
  p.ops[1].cost.uses[0].resource = ResourceId{3};
  EXPECT_THAT(error_of(p), HasSubstr("uses resource id 3"));
  p = small_plan();
  p.ops[1].frees = {TensorId{4}};
  EXPECT_THAT(error_of(p), HasSubstr("frees tensor id 4"));
}

TEST(PlanValidate, RejectsBadNumbers) {
  Plan p = small_plan();
  p.resources[0].capacity = 0.0;
  EXPECT_THAT(error_of(p), HasSubstr("capacity 0 is not a positive finite rate"));
  p = small_plan();
  p.ops[1].cost.work = -1.0;
  EXPECT_THAT(error_of(p), HasSubstr("work -1"));
  p = small_plan();
  p.ops[1].cost.multiplicity = 0;
  EXPECT_THAT(error_of(p), HasSubstr("multiplicity 0"));
  p = small_plan();
  p.pools[0].capacity_bytes = -5;
  EXPECT_THAT(error_of(p), HasSubstr("negative capacity"));
  p = small_plan();
  p.tensors[0].bytes = -1;
  EXPECT_THAT(error_of(p), HasSubstr("negative size"));
  p = small_plan();
  p.ops[1].cost.latency = Duration{-3};
  EXPECT_THAT(error_of(p), HasSubstr("negative latency"));
}

TEST(PlanValidate, RejectsDuplicateNames) {
  Plan p = small_plan();
  p.lanes[1].name = p.lanes[0].name;
  EXPECT_THAT(error_of(p), HasSubstr("name 'rank0.compute' already used"));
}

TEST(PlanTopologicalOrder, RespectsLaneOrderAndDeps) {
  // lane A: a0, a1; lane B: b0 (depends on a1). Any valid order puts a0 < a1 < b0.
  PlanBuilder b;
  const LaneId la = b.lane("A");
  const LaneId lb = b.lane("B");
  b.op({.name = "b0", .lane = lb, .deps = {OpId{2}}});
  b.op({.name = "a0", .lane = la});
  b.op({.name = "a1", .lane = la});
  auto order = topological_order(std::move(b).build());
  ASSERT_TRUE(order);
  std::vector<std::uint32_t> ids;
  for (OpId id : *order) ids.push_back(id.value());
  EXPECT_EQ(ids, (std::vector<std::uint32_t>{1, 2, 0}));
}

TEST(ShapeArithmetic, GemmFlopsAndOutputDtype) {
  EXPECT_EQ(gemm_flops({.m = 2, .n = 3, .k = 4, .batch = 5}), 240.0);
  EXPECT_EQ(gemm_flops({.m = 2, .n = 3, .k = 4, .batch = 0}), 48.0);  // at least one product
  EXPECT_EQ(gemm_flops({.m = 8192, .n = 28672, .k = 8192}), 2.0 * 8192 * 28672 * 8192);
  EXPECT_EQ(gemm_output_dtype(DType::kFp8), DType::kBf16);
  EXPECT_EQ(gemm_output_dtype(DType::kBf16), DType::kBf16);
  EXPECT_EQ(gemm_output_dtype(DType::kFp32), DType::kFp32);
}

// An FP8 GEMM reads its operands at 1 byte and writes C at bf16's 2; others move one dtype.
TEST(ShapeArithmetic, GemmBytesWriteTheOutputDtype) {
  EXPECT_EQ(gemm_bytes({.m = 2, .n = 3, .k = 4, .batch = 5, .dtype = DType::kBf16}),
            (2 * 4 + 4 * 3 + 2 * 3) * 2.0 * 5);
  EXPECT_EQ(gemm_bytes({.m = 2, .n = 3, .k = 4, .batch = 0, .dtype = DType::kFp8}),
            (2 * 4 + 4 * 3) * 1.0 + 2 * 3 * 2.0);
  EXPECT_EQ(gemm_bytes({.m = 2, .n = 3, .k = 4, .dtype = DType::kFp32}), 26 * 4.0);
}

}  // namespace
}  // namespace offsim::sim
