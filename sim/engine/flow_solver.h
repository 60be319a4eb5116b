// FlowSolver: weighted max-min fair sharing of resources among flows, with rate bounds, solved
// incrementally (the model of SimGrid's lmm).
//
// Each flow f has an optional bound max_rate_f, a multiplicity k_f (it stands for k_f identical
// flows) and uses resources r with weights w_fr (resource units per unit of work). Rates x_f
// (work units per second) satisfy, for every resource r,   sum_f k_f * w_fr * x_f <= C_r,
// and are max-min fair in x: progressive filling raises all unfixed rates together, fixes the
// flows of the first resource to saturate (or the first bound to be reached), and repeats.
// Fairness is in work units per second, so flows that share a resource should count work in
// comparable units.
//
// Adding or removing a flow marks its resources dirty; solve() re-solves only the connected
// components (flows linked through shared resources) that contain a dirty resource or a new flow.
//
//   FlowSolver solver({25e9});                          // one 25 GB/s link
//   FlowId a = solver.add_flow(kNoBound, 1, {{ResourceId{0}, 1.0}});
//   FlowId b = solver.add_flow(kNoBound, 1, {{ResourceId{0}, 1.0}});
//   FlowSolver::Components c = solver.solve();          // one component {a, b}
//   solver.rate(a);                                     // 12.5e9 bytes/s
//   solver.remove_flow(b);  solver.solve();             // a alone: 25e9
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "sim/core/ids.h"
#include "sim/plan/plan.h"

namespace offsim::sim {

using FlowId = TaggedId<struct FlowTag>;

inline constexpr double kNoBound = std::numeric_limits<double>::infinity();

class FlowSolver {
 public:
  // The flows re-solved by one solve(), grouped by connected component: component c holds
  // flows[offsets[c] .. offsets[c + 1]). Valid until the next call to a mutating member.
  struct Components {
    std::span<const FlowId> flows;
    std::span<const std::uint32_t> offsets;
    std::size_t size() const { return offsets.empty() ? 0 : offsets.size() - 1; }
    std::span<const FlowId> component(std::size_t c) const {
      return flows.subspan(offsets[c], offsets[c + 1] - offsets[c]);
    }
  };

  FlowSolver() = default;
  // Capacities in resource units per second, by ResourceId; each must be positive and finite.
  explicit FlowSolver(std::span<const double> capacities);
  explicit FlowSolver(std::initializer_list<double> capacities)
      : FlowSolver(std::span<const double>(capacities.begin(), capacities.size())) {}

  // Starts a flow. Uses with a zero weight are ignored; a flow without any use gets its bound
  // (kNoBound gives an infinite rate). Slots of removed flows are reused.
  FlowId add_flow(double max_rate, int multiplicity, std::span<const ResourceUse> uses);
  FlowId add_flow(double max_rate, int multiplicity, std::initializer_list<ResourceUse> uses) {
    return add_flow(max_rate, multiplicity,
                    std::span<const ResourceUse>(uses.begin(), uses.size()));
  }
  void remove_flow(FlowId flow);

  // Re-solves the components touched since the last solve. Rates of other flows are unchanged.
  Components solve();
  bool dirty() const { return !dirty_resources_.empty() || !dirty_flows_.empty(); }

  // Work units per second, as of the last solve (0 for a flow added since).
  double rate(FlowId flow) const { return flows_[flow.index()].rate; }
  bool active(FlowId flow) const {
    return flow.index() < flows_.size() && flows_[flow.index()].active;
  }
  std::size_t active_flows() const { return active_count_; }
  std::size_t resource_count() const { return resources_.size(); }
  double capacity(ResourceId r) const { return resources_[r.index()].capacity; }
  // Sum of k_f * w_fr * x_f over the active flows on r, with the current rates.
  double usage(ResourceId r) const;

  // Appends what later solves depend on to `out`: each resource's flow list in order (a flow by
  // its use index and `name(slot)`) and, where a flow is first named, its bound, rate and uses.
  // Slots are names only: which slot a flow takes changes no rate and no order (ties between
  // bounds go by order in the component), so `name` may write a slot-independent name, such as
  // the op of the flow, and equal outputs still mean equal futures.
  void append_state(std::vector<std::uint64_t>& out,
                    const std::function<void(std::uint32_t slot)>& name) const;

  // solve() calls that re-solved at least one flow, and the flows they re-solved.
  std::int64_t solves() const { return solves_; }
  std::int64_t flows_resolved() const { return flows_resolved_; }

 private:
  struct Element {  // flow f on resource r, stored in r's list
    std::uint32_t flow;
    std::uint32_t use;  // index into f's uses
    double weight;      // k_f * w_fr
  };
  struct Use {  // resource r of flow f, stored in f's list
    std::uint32_t resource;
    std::uint32_t position;  // index of f's element in r's list
    double weight;           // k_f * w_fr
  };
  struct Flow {
    std::vector<Use> uses;
    double max_rate = kNoBound;
    double rate = 0.0;
    std::uint32_t visited = 0;  // BFS epoch
    std::uint32_t order = 0;    // position in the component being filled (breaks bound ties)
    bool active = false;
    bool fixed = false;
  };
  struct Resource {
    std::vector<Element> elements;
    double capacity = 0.0;
    // Progressive-filling scratch.
    double remaining = 0.0;
    double weight_sum = 0.0;
    double level = 0.0;  // remaining / weight_sum, refreshed when a fixed flow touched it
    std::uint32_t unfixed = 0;
    bool stale = false;
    std::uint32_t visited = 0;  // BFS epoch
    bool dirty = false;
  };

  void mark_dirty(std::uint32_t resource);
  bool solve_alone(std::uint32_t flow);
  void collect_component(std::uint32_t seed_flow, std::uint32_t seed_resource);
  void fill_component(std::size_t flow_begin);
  void start_filling(std::span<const FlowId> flows);
  std::pair<std::uint32_t, double> first_to_saturate();
  void fix_flow(std::uint32_t flow, double rate);

  std::vector<Flow> flows_;
  std::vector<Resource> resources_;
  std::vector<std::uint32_t> free_slots_;
  std::vector<std::uint32_t> dirty_resources_;
  std::vector<std::uint32_t> dirty_flows_;  // added flows (their own seeds)
  std::size_t active_count_ = 0;
  std::uint32_t epoch_ = 0;

  // Scratch reused by every solve (no allocation once warm).
  std::vector<FlowId> out_flows_;
  std::vector<std::uint32_t> out_offsets_;
  std::vector<std::uint32_t> comp_resources_;
  std::vector<std::uint32_t> active_resources_;
  std::vector<std::uint32_t> bounded_;
  std::vector<std::uint32_t> stale_;

  std::int64_t solves_ = 0;
  std::int64_t flows_resolved_ = 0;
};

}  // namespace offsim::sim
