#include "sim/engine/flow_solver.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>

#include "sim/core/check.h"

namespace offsim::sim {

namespace {
constexpr std::uint32_t kNone = TaggedId<void>::kInvalidValue;
}  // namespace

FlowSolver::FlowSolver(std::span<const double> capacities) {
  resources_.resize(capacities.size());
  for (std::size_t r = 0; r < capacities.size(); ++r) {
    OFFSIM_CHECK_MSG(std::isfinite(capacities[r]) && capacities[r] > 0.0,
                     "resource {} has capacity {}", r, capacities[r]);
    resources_[r].capacity = capacities[r];
  }
}

FlowId FlowSolver::add_flow(double max_rate, int multiplicity, std::span<const ResourceUse> uses) {
  OFFSIM_CHECK(max_rate > 0.0);
  OFFSIM_CHECK(multiplicity >= 1);
  std::uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<std::uint32_t>(flows_.size());
    flows_.emplace_back();
  }
  Flow& f = flows_[slot];
  f.uses.clear();
  f.max_rate = max_rate;
  f.rate = 0.0;
  f.active = true;
  f.fixed = false;
  for (const ResourceUse& u : uses) {
    OFFSIM_CHECK_MSG(u.resource.index() < resources_.size(), "resource id {} out of range",
                     u.resource.value());
    OFFSIM_CHECK(std::isfinite(u.per_unit) && u.per_unit >= 0.0);
    if (u.per_unit == 0.0) continue;
    const double weight = static_cast<double>(multiplicity) * u.per_unit;
    Resource& r = resources_[u.resource.index()];
    f.uses.push_back(
        Use{u.resource.value(), static_cast<std::uint32_t>(r.elements.size()), weight});
    r.elements.push_back(Element{slot, static_cast<std::uint32_t>(f.uses.size() - 1), weight});
    mark_dirty(u.resource.value());
  }
  dirty_flows_.push_back(slot);
  ++active_count_;
  return FlowId{slot};
}

void FlowSolver::remove_flow(FlowId flow) {
  OFFSIM_CHECK(active(flow));
  Flow& f = flows_[flow.index()];
  for (const Use& u : f.uses) {
    std::vector<Element>& elements = resources_[u.resource].elements;
    const Element last = elements.back();
    elements[u.position] = last;
    flows_[last.flow].uses[last.use].position = u.position;
    elements.pop_back();
    mark_dirty(u.resource);
  }
  f.uses.clear();
  f.active = false;
  f.rate = 0.0;
  free_slots_.push_back(flow.value());
  --active_count_;
}

void FlowSolver::mark_dirty(std::uint32_t resource) {
  Resource& r = resources_[resource];
  if (!r.dirty) {
    r.dirty = true;
    dirty_resources_.push_back(resource);
  }
}

double FlowSolver::usage(ResourceId r) const {
  double sum = 0.0;
  for (const Element& e : resources_[r.index()].elements) sum += e.weight * flows_[e.flow].rate;
  return sum;
}

void FlowSolver::append_state(std::vector<std::uint64_t>& out,
                              const std::function<void(std::uint32_t slot)>& name) const {
  const auto bits = [](double x) { return std::bit_cast<std::uint64_t>(x); };
  std::vector<std::uint8_t> named(flows_.size(), 0);
  out.push_back(active_count_);
  for (const Resource& r : resources_) {
    out.push_back(r.elements.size());
    for (const Element& e : r.elements) {
      name(e.flow);
      out.push_back(e.use);
      if (named[e.flow] != 0) continue;
      named[e.flow] = 1;
      const Flow& f = flows_[e.flow];
      out.push_back(bits(f.max_rate));
      out.push_back(bits(f.rate));
      out.push_back(f.uses.size());
      for (const Use& u : f.uses) {
        out.push_back(u.resource);
        out.push_back(u.position);
        out.push_back(bits(u.weight));
      }
    }
  }
  // Flows without a use are in no resource's list (their rate is their bound).
  for (std::uint32_t s = 0; s < flows_.size(); ++s) {
    if (flows_[s].active && flows_[s].uses.empty()) out.push_back(0xF1F1000000000000u);
  }
  out.push_back(dirty_resources_.size());
  out.push_back(dirty_flows_.size());
}

FlowSolver::Components FlowSolver::solve() {
  out_flows_.clear();
  out_offsets_.clear();
  out_offsets_.push_back(0);
  if (!dirty()) return Components{out_flows_, {}};
  if (++epoch_ == 0) {  // wrapped: forget every old mark
    for (Flow& f : flows_) f.visited = 0;
    for (Resource& r : resources_) r.visited = 0;
    epoch_ = 1;
  }
  // Resources first, then new flows, each in the order they were touched: deterministic.
  for (std::uint32_t r : dirty_resources_) {
    resources_[r].dirty = false;
    if (resources_[r].visited == epoch_) continue;
    const std::size_t begin = out_flows_.size();
    const std::vector<Element>& elements = resources_[r].elements;
    if (elements.empty()) {  // the last flow on it left
      resources_[r].visited = epoch_;
      continue;
    }
    if (elements.size() == 1 && solve_alone(elements.front().flow)) {
      out_offsets_.push_back(static_cast<std::uint32_t>(out_flows_.size()));
      continue;
    }
    collect_component(kNone, r);
    fill_component(begin);
    out_offsets_.push_back(static_cast<std::uint32_t>(out_flows_.size()));
  }
  for (std::uint32_t f : dirty_flows_) {
    if (!flows_[f].active || flows_[f].visited == epoch_) continue;
    const std::size_t begin = out_flows_.size();
    if (solve_alone(f)) {
      out_offsets_.push_back(static_cast<std::uint32_t>(out_flows_.size()));
      continue;
    }
    collect_component(f, kNone);
    fill_component(begin);
    out_offsets_.push_back(static_cast<std::uint32_t>(out_flows_.size()));
  }
  dirty_resources_.clear();
  dirty_flows_.clear();
  if (!out_flows_.empty()) ++solves_;
  flows_resolved_ += static_cast<std::int64_t>(out_flows_.size());
  return Components{out_flows_, out_offsets_};
}

// A flow that shares none of its resources is a component of its own, and progressive filling
// fixes it at its bound or at its tightest resource's capacity / weight, whichever is lower:
// computed here directly, with the same arithmetic (most solves are of such a flow: a kernel
// alone on its GPU, a copy alone on its link). Returns false, touching nothing, when a resource
// of the flow carries another flow (or this one twice).
bool FlowSolver::solve_alone(std::uint32_t flow) {
  Flow& f = flows_[flow];
  for (const Use& u : f.uses) {
    if (resources_[u.resource].elements.size() != 1) return false;
  }
  f.visited = epoch_;
  double best = kNoBound;
  for (const Use& u : f.uses) {
    Resource& r = resources_[u.resource];
    r.visited = epoch_;
    best = std::min(best, r.capacity / u.weight);
  }
  f.fixed = true;
  f.rate = f.max_rate <= best ? f.max_rate : best;
  out_flows_.push_back(FlowId{flow});
  return true;
}

// Breadth-first over the bipartite flow/resource graph; appends the component's flows to
// out_flows_ and leaves its resources in comp_resources_.
void FlowSolver::collect_component(std::uint32_t seed_flow, std::uint32_t seed_resource) {
  comp_resources_.clear();
  std::size_t next_flow = out_flows_.size();
  std::size_t next_resource = 0;
  if (seed_resource != kNone) {
    resources_[seed_resource].visited = epoch_;
    comp_resources_.push_back(seed_resource);
  } else {
    flows_[seed_flow].visited = epoch_;
    out_flows_.push_back(FlowId{seed_flow});
  }
  while (next_flow < out_flows_.size() || next_resource < comp_resources_.size()) {
    while (next_resource < comp_resources_.size()) {
      for (const Element& e : resources_[comp_resources_[next_resource]].elements) {
        Flow& f = flows_[e.flow];
        if (f.visited != epoch_) {
          f.visited = epoch_;
          out_flows_.push_back(FlowId{e.flow});
        }
      }
      ++next_resource;
    }
    while (next_flow < out_flows_.size()) {
      for (const Use& u : flows_[out_flows_[next_flow].index()].uses) {
        Resource& r = resources_[u.resource];
        if (r.visited != epoch_) {
          r.visited = epoch_;
          comp_resources_.push_back(u.resource);
        }
      }
      ++next_flow;
    }
  }
}

[[gnu::always_inline]] inline void FlowSolver::fix_flow(std::uint32_t flow, double rate) {
  Flow& f = flows_[flow];
  f.fixed = true;
  f.rate = rate;
  for (const Use& u : f.uses) {
    Resource& r = resources_[u.resource];
    r.remaining -= u.weight * rate;
    r.weight_sum -= u.weight;
    if (--r.unfixed == 0) r.weight_sum = 0.0;
    if (!r.stale) {
      r.stale = true;
      stale_.push_back(u.resource);
    }
  }
}

// Resets the component's resources and flows for a filling: nothing fixed, every resource's
// unfixed weight summed, bounded_ in bound order (ties: component order) and the resources that
// carry a flow in active_resources_ with their level.
void FlowSolver::start_filling(std::span<const FlowId> flows) {
  for (std::uint32_t r : comp_resources_) {
    Resource& res = resources_[r];
    res.remaining = res.capacity;
    res.weight_sum = 0.0;
    res.unfixed = 0;
  }
  bounded_.clear();
  std::uint32_t order = 0;
  for (FlowId id : flows) {
    Flow& f = flows_[id.index()];
    f.fixed = false;
    f.order = order++;
    for (const Use& u : f.uses) {
      Resource& res = resources_[u.resource];
      res.weight_sum += u.weight;
      ++res.unfixed;
    }
    if (f.max_rate != kNoBound) bounded_.push_back(id.value());
  }
  std::sort(bounded_.begin(), bounded_.end(), [this](std::uint32_t a, std::uint32_t b) {
    const double ra = flows_[a].max_rate;
    const double rb = flows_[b].max_rate;
    return ra < rb || (ra == rb && flows_[a].order < flows_[b].order);
  });
  active_resources_.clear();
  for (std::uint32_t r : comp_resources_) {
    Resource& res = resources_[r];
    res.stale = false;
    if (res.unfixed == 0) continue;
    res.level = res.remaining / res.weight_sum;
    active_resources_.push_back(r);
  }
  stale_.clear();
}

// The resource that saturates first if every unfixed rate rises together, and its level
// (kNone and kNoBound when no active resource is left). Only the resources that fixed flows
// touched since the last round need a new level; resources without unfixed flows drop out.
std::pair<std::uint32_t, double> FlowSolver::first_to_saturate() {
  for (std::uint32_t r : stale_) {
    Resource& res = resources_[r];
    res.stale = false;
    if (res.unfixed != 0) res.level = res.remaining / res.weight_sum;
  }
  stale_.clear();
  double best = kNoBound;
  std::uint32_t best_resource = kNone;
  for (std::size_t i = 0; i < active_resources_.size();) {
    const Resource& res = resources_[active_resources_[i]];
    if (res.unfixed == 0) {
      active_resources_[i] = active_resources_.back();
      active_resources_.pop_back();
      continue;
    }
    const double candidate = res.level;
    if (candidate < best) {
      best = candidate;
      best_resource = active_resources_[i];
    }
    ++i;
  }
  return {best_resource, best};
}

// Progressive filling over one component (flows out_flows_[flow_begin..], comp_resources_).
void FlowSolver::fill_component(std::size_t flow_begin) {
  const std::span<const FlowId> flows(out_flows_.data() + flow_begin,
                                      out_flows_.size() - flow_begin);
  start_filling(flows);
  std::size_t unfixed = flows.size();
  std::size_t next_bounded = 0;
  double level = 0.0;  // never decreases, which keeps rounding from lowering later levels
  while (unfixed > 0) {
    const auto [best_resource, best] = first_to_saturate();
    while (next_bounded < bounded_.size() && flows_[bounded_[next_bounded]].fixed) ++next_bounded;
    if (next_bounded < bounded_.size() && flows_[bounded_[next_bounded]].max_rate <= best) {
      // Bounds reached before any resource saturates: fixing them only raises other candidates.
      while (next_bounded < bounded_.size()) {
        Flow& f = flows_[bounded_[next_bounded]];
        if (!f.fixed) {
          if (f.max_rate > best) break;
          level = std::max(level, f.max_rate);
          fix_flow(bounded_[next_bounded], f.max_rate);
          --unfixed;
        }
        ++next_bounded;
      }
      continue;
    }
    if (best_resource == kNone) {  // what is left uses no resource and has no bound
      for (FlowId id : flows) {
        if (!flows_[id.index()].fixed) {
          fix_flow(id.value(), kNoBound);
          --unfixed;
        }
      }
      break;
    }
    level = std::max(level, best);
    for (const Element& e : resources_[best_resource].elements) {
      if (!flows_[e.flow].fixed) {
        fix_flow(e.flow, level);
        --unfixed;
      }
    }
  }
}

}  // namespace offsim::sim
