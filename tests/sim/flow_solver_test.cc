#include "sim/engine/flow_solver.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace offsim::sim {
namespace {

ResourceUse use(int r, double per_unit = 1.0) { return ResourceUse{ResourceId{r}, per_unit}; }

TEST(FlowSolverTest, OneFlowAloneGetsTheWholeLink) {
  FlowSolver s({25e9});
  FlowId a = s.add_flow(kNoBound, 1, {use(0)});
  s.solve();
  EXPECT_DOUBLE_EQ(s.rate(a), 25e9);
}

TEST(FlowSolverTest, TwoFlowsShareALinkEqually) {
  // Two copies on one 25 GB/s link: 25 / 2 = 12.5 GB/s each.
  FlowSolver s({25e9});
  FlowId a = s.add_flow(kNoBound, 1, {use(0)});
  FlowId b = s.add_flow(kNoBound, 1, {use(0)});
  FlowSolver::Components c = s.solve();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c.component(0).size(), 2u);
  EXPECT_DOUBLE_EQ(s.rate(a), 12.5e9);
  EXPECT_DOUBLE_EQ(s.rate(b), 12.5e9);
  // b leaves: a gets the link back.
  s.remove_flow(b);
  s.solve();
  EXPECT_DOUBLE_EQ(s.rate(a), 25e9);
}

TEST(FlowSolverTest, BottleneckFirstThenTheRestGoesToOthers) {
  // a crosses L0 (25) and L1 (10); b uses L0 only. L1 saturates first at a = 10; L0 has
  // 25 - 10 = 15 left for b.
  FlowSolver s({25e9, 10e9});
  FlowId a = s.add_flow(kNoBound, 1, {use(0), use(1)});
  FlowId b = s.add_flow(kNoBound, 1, {use(0)});
  s.solve();
  EXPECT_DOUBLE_EQ(s.rate(a), 10e9);
  EXPECT_DOUBLE_EQ(s.rate(b), 15e9);
  EXPECT_DOUBLE_EQ(s.usage(ResourceId{0}), 25e9);
  EXPECT_DOUBLE_EQ(s.usage(ResourceId{1}), 10e9);
}

TEST(FlowSolverTest, MultiplicityCountsAsKFlows) {
  // a stands for 4 flows, b for 1, on a 100 GB/s socket: 100 / (4 + 1) = 20 GB/s per flow;
  // the socket carries 4 * 20 + 20 = 100.
  FlowSolver s({100e9});
  FlowId a = s.add_flow(kNoBound, 4, {use(0)});
  FlowId b = s.add_flow(kNoBound, 1, {use(0)});
  s.solve();
  EXPECT_DOUBLE_EQ(s.rate(a), 20e9);
  EXPECT_DOUBLE_EQ(s.rate(b), 20e9);
  EXPECT_DOUBLE_EQ(s.usage(ResourceId{0}), 100e9);
}

TEST(FlowSolverTest, WeightsScaleConsumption) {
  // a consumes 2 units per unit of work, b 1: 2x + x = 30 => x = 10 for both.
  FlowSolver s({30.0});
  FlowId a = s.add_flow(kNoBound, 1, {use(0, 2.0)});
  FlowId b = s.add_flow(kNoBound, 1, {use(0, 1.0)});
  s.solve();
  EXPECT_DOUBLE_EQ(s.rate(a), 10.0);
  EXPECT_DOUBLE_EQ(s.rate(b), 10.0);
}

TEST(FlowSolverTest, BoundedFlowLeavesTheRestToOthers) {
  // a is bounded at 5 GB/s; b gets 25 - 5 = 20.
  FlowSolver s({25e9});
  FlowId a = s.add_flow(5e9, 1, {use(0)});
  FlowId b = s.add_flow(kNoBound, 1, {use(0)});
  s.solve();
  EXPECT_DOUBLE_EQ(s.rate(a), 5e9);
  EXPECT_DOUBLE_EQ(s.rate(b), 20e9);
}

TEST(FlowSolverTest, FlowWithoutResourcesGetsItsBound) {
  FlowSolver s({1.0});
  FlowId a = s.add_flow(3.0, 1, std::initializer_list<ResourceUse>{});
  FlowId b = s.add_flow(kNoBound, 1, {use(0, 0.0)});  // a zero weight is no use
  s.solve();
  EXPECT_DOUBLE_EQ(s.rate(a), 3.0);
  EXPECT_EQ(s.rate(b), kNoBound);
}

TEST(FlowSolverTest, OnlyTheTouchedComponentIsResolved) {
  // Components {a, b} on L0 and {c} on L1. Removing b re-solves a alone; c keeps its rate.
  FlowSolver s({10.0, 20.0});
  FlowId a = s.add_flow(kNoBound, 1, {use(0)});
  FlowId b = s.add_flow(kNoBound, 1, {use(0)});
  FlowId c = s.add_flow(kNoBound, 1, {use(1)});
  FlowSolver::Components first = s.solve();
  EXPECT_EQ(first.size(), 2u);
  EXPECT_EQ(s.flows_resolved(), 3);
  s.remove_flow(b);
  FlowSolver::Components second = s.solve();
  ASSERT_EQ(second.size(), 1u);
  ASSERT_EQ(second.component(0).size(), 1u);
  EXPECT_EQ(second.component(0)[0], a);
  EXPECT_EQ(s.flows_resolved(), 4);
  EXPECT_EQ(s.solves(), 2);
  EXPECT_DOUBLE_EQ(s.rate(a), 10.0);
  EXPECT_DOUBLE_EQ(s.rate(c), 20.0);
  EXPECT_FALSE(s.dirty());
}

TEST(FlowSolverTest, ReusedSlotsKeepListsConsistent) {
  // Remove from the middle of a resource's list, then add again: the swap-removal must keep
  // every flow's back-pointer right.
  FlowSolver s({12.0});
  std::vector<FlowId> flows;
  for (int i = 0; i < 4; ++i) flows.push_back(s.add_flow(kNoBound, 1, {use(0)}));
  s.solve();
  s.remove_flow(flows[1]);
  s.remove_flow(flows[0]);
  FlowId e = s.add_flow(kNoBound, 1, {use(0)});
  s.solve();
  // Three flows on 12: 4 each.
  EXPECT_DOUBLE_EQ(s.rate(flows[2]), 4.0);
  EXPECT_DOUBLE_EQ(s.rate(flows[3]), 4.0);
  EXPECT_DOUBLE_EQ(s.rate(e), 4.0);
  EXPECT_EQ(s.active_flows(), 3u);
  s.remove_flow(flows[3]);
  s.remove_flow(e);
  s.solve();
  EXPECT_DOUBLE_EQ(s.rate(flows[2]), 12.0);
}

TEST(FlowSolverTest, StateNamesFlowsNotSlots) {
  // The same three flows x, y, z (by name) on one link, reached by two histories that put them
  // in different slots: one where a flow came and went first, one without it.
  std::vector<int> name_of;  // by slot
  const auto state = [&name_of](const FlowSolver& s) {
    std::vector<std::uint64_t> out;
    s.append_state(out, [&](std::uint32_t slot) { out.push_back(name_of.at(slot)); });
    return out;
  };
  FlowSolver one({25e9, 10e9});
  const FlowId w = one.add_flow(kNoBound, 1, {use(1)});
  const FlowId x1 = one.add_flow(5e9, 1, {use(0)});
  one.remove_flow(w);  // x's slot is 1; y takes w's slot 0
  const FlowId y1 = one.add_flow(5e9, 1, {use(0)});
  const FlowId z1 = one.add_flow(kNoBound, 1, {use(0), use(1)});
  one.solve();
  name_of.assign(3, -1);
  name_of[x1.index()] = 0;
  name_of[y1.index()] = 1;
  name_of[z1.index()] = 2;
  const std::vector<std::uint64_t> first = state(one);

  FlowSolver two({25e9, 10e9});
  const FlowId x2 = two.add_flow(5e9, 1, {use(0)});
  const FlowId y2 = two.add_flow(5e9, 1, {use(0)});
  const FlowId z2 = two.add_flow(kNoBound, 1, {use(0), use(1)});
  two.solve();
  ASSERT_NE(x1.index(), x2.index());  // the histories did put them in different slots
  name_of.assign(3, -1);
  name_of[x2.index()] = 0;
  name_of[y2.index()] = 1;
  name_of[z2.index()] = 2;
  EXPECT_EQ(first, state(two));
  // And the rates agree bit for bit: x and y tie at their bound, z gets L1's 10.
  EXPECT_EQ(one.rate(x1), two.rate(x2));
  EXPECT_EQ(one.rate(y1), two.rate(y2));
  EXPECT_EQ(one.rate(z1), 10e9);
  EXPECT_EQ(two.rate(z2), 10e9);
}

TEST(FlowSolverTest, AFlowAloneGetsItsBoundOrItsTightestResourceExactly) {
  // No other flow on its resources: the rate is min(bound, capacity / (k * w)) over its uses,
  // bit for bit what progressive filling gives (the same division), and the flow is a
  // component of its own.
  FlowSolver s({25e9, 900e9, 3e12});
  const FlowId a = s.add_flow(kNoBound, 3, {use(0, 0.7), use(1, 2.0)});
  FlowSolver::Components c = s.solve();
  ASSERT_EQ(c.size(), 1u);
  ASSERT_EQ(c.component(0).size(), 1u);
  EXPECT_EQ(c.component(0)[0], a);
  EXPECT_EQ(s.rate(a), std::min(25e9 / (3 * 0.7), 900e9 / (3 * 2.0)));
  s.remove_flow(a);
  // A bound below every resource's level wins; one above loses to the tightest resource.
  const FlowId b = s.add_flow(1e9, 1, {use(2, 1.5)});
  const FlowId d = s.add_flow(4e12, 1, {use(1, 0.5)});
  const FlowId e = s.add_flow(7e6, 1, {});       // no resource: its bound
  const FlowId f = s.add_flow(kNoBound, 1, {});  // neither: unbounded
  c = s.solve();
  EXPECT_EQ(c.size(), 4u);
  EXPECT_EQ(s.rate(b), 1e9);
  EXPECT_EQ(s.rate(d), 900e9 / 0.5);
  EXPECT_EQ(s.rate(e), 7e6);
  EXPECT_EQ(s.rate(f), kNoBound);
  // The resource it left is idle; its flows re-solve alone, with their rates unchanged.
  s.remove_flow(d);
  c = s.solve();
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(s.rate(b), 1e9);
}

TEST(FlowSolverTest, AFlowUsingAResourceTwiceSharesItWithItself) {
  // Two uses of one link (a route through it both ways): the link carries 1.0 + 0.5 units per
  // unit of work, so 25e9 / 1.5, not 25e9 / 1.0.
  FlowSolver s({25e9});
  const FlowId a = s.add_flow(kNoBound, 1, {use(0, 1.0), use(0, 0.5)});
  s.solve();
  EXPECT_DOUBLE_EQ(s.rate(a), 25e9 / 1.5);
  // A second flow joins: both are re-solved together, and when it leaves a is alone again.
  const FlowId b = s.add_flow(kNoBound, 1, {use(0)});
  s.solve();
  EXPECT_DOUBLE_EQ(s.rate(a), 25e9 / 2.5);
  EXPECT_DOUBLE_EQ(s.rate(b), 25e9 / 2.5);
  s.remove_flow(b);
  s.solve();
  EXPECT_DOUBLE_EQ(s.rate(a), 25e9 / 1.5);
}

TEST(FlowSolverTest, StateDiffersWhenTheListOrderDiffers) {
  // y before x on the link: a different order for later sums, so a different state.
  std::vector<int> name_of;
  const auto state = [&name_of](const FlowSolver& s) {
    std::vector<std::uint64_t> out;
    s.append_state(out, [&](std::uint32_t slot) { out.push_back(name_of.at(slot)); });
    return out;
  };
  FlowSolver one({25e9});
  const FlowId x1 = one.add_flow(kNoBound, 1, {use(0)});
  const FlowId y1 = one.add_flow(kNoBound, 1, {use(0)});
  one.solve();
  name_of = {-1, -1};
  name_of[x1.index()] = 0;
  name_of[y1.index()] = 1;
  const std::vector<std::uint64_t> first = state(one);
  name_of[x1.index()] = 1;
  name_of[y1.index()] = 0;
  EXPECT_NE(first, state(one));
}

}  // namespace
}  // namespace offsim::sim
