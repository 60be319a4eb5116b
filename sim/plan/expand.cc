// expand_representatives() (declared in plan.h): the full set of ranks from representatives.
#include <algorithm>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "sim/core/check.h"
#include "sim/plan/plan.h"

namespace offsim::sim {

namespace {

// Display name of a member's copy of a representative's lane or pool (names are for display
// only: the copy's identity is in its rank and owner fields).
std::string member_name(const std::string& name, int member) {
  return fmt::format("{}@rank{}", name, member);
}

}  // namespace

Result<Plan> expand_representatives(const Plan& plan) {
  std::map<int, Representative> rep_of;  // representative rank -> its entry
  int k = 0;
  for (const Representative& r : plan.representatives) {
    if (r.multiplicity < 1 || r.stride < 1) {
      return fail(ErrorCode::kInvalidInput,
                  "representative rank {}: multiplicity {} and stride {} must be >= 1", r.rank,
                  r.multiplicity, r.stride);
    }
    if (k != 0 && r.multiplicity != k) {
      return fail(ErrorCode::kInvalidInput,
                  "representative rank {} stands for {} ranks, another for {}: only plans whose "
                  "representatives all stand for as many ranks can be expanded",
                  r.rank, r.multiplicity, k);
    }
    k = r.multiplicity;
    rep_of[r.rank] = r;
  }
  Plan out = plan;
  out.representatives.clear();
  if (k <= 1) return out;
  const auto rank_of_op = [&](std::size_t o) { return plan.lanes[plan.ops[o].lane.index()].rank; };
  const auto member_of = [&](int rank, int i) -> Result<int> {
    auto it = rep_of.find(rank);
    if (it == rep_of.end()) {
      return fail(ErrorCode::kInvalidInput, "rank {} has ops but is not a representative", rank);
    }
    return rank + i * it->second.stride;
  };
  std::int64_t pair_span = 0;
  for (const Op& op : plan.ops) pair_span = std::max(pair_span, op.sizes.p2p_pair + 1);

  // Ids first (a copied receive depends on the copy of a send made for another representative).
  std::map<std::pair<std::size_t, int>, LaneId> lane_copy;      // (lane, member offset)
  std::map<std::pair<std::size_t, int>, PoolId> pool_copy;      // (pool, member offset)
  std::map<std::pair<std::size_t, int>, OpId> op_copy;          // (op, member offset)
  std::map<std::pair<std::size_t, int>, TensorId> tensor_copy;  // (tensor, member offset)
  for (const Representative& r : plan.representatives) {
    for (int i = 1; i < k; ++i) {
      const int member = r.rank + i * r.stride;
      for (std::size_t l = 0; l < plan.lanes.size(); ++l) {
        if (plan.lanes[l].rank != r.rank) continue;
        Lane lane = plan.lanes[l];
        lane.name = member_name(lane.name, member);
        lane.rank = member;
        lane_copy[{l, i}] = LaneId{out.lanes.size()};
        out.lanes.push_back(std::move(lane));
      }
      for (std::size_t p = 0; p < plan.pools.size(); ++p) {
        const Pool& pool = plan.pools[p];
        if (pool.kind != PoolKind::kHbm || pool.owner != r.rank) continue;
        Pool copy = pool;
        copy.name = member_name(pool.name, member);
        copy.owner = member;
        pool_copy[{p, i}] = PoolId{out.pools.size()};
        out.pools.push_back(std::move(copy));
      }
    }
  }
  std::size_t next_op = plan.ops.size();
  for (const Representative& r : plan.representatives) {
    for (int i = 1; i < k; ++i) {
      for (std::size_t o = 0; o < plan.ops.size(); ++o) {
        if (rank_of_op(o) == r.rank) op_copy[{o, i}] = OpId{next_op++};
      }
    }
  }
  // A member's copy of a tensor: the tensors of its representative's HBM and of its ops.
  const auto copy_tensor = [&](TensorId t, int i) {
    auto [it, inserted] = tensor_copy.try_emplace({t.index(), i}, TensorId{out.tensors.size()});
    if (inserted) {
      Tensor copy = plan.tensors[t.index()];
      if (auto p = pool_copy.find({copy.pool.index(), i}); p != pool_copy.end()) {
        copy.pool = p->second;
      }
      out.tensors.push_back(std::move(copy));
    }
    return it->second;
  };
  for (const Representative& r : plan.representatives) {
    for (int i = 1; i < k; ++i) {
      for (TensorId t : plan.initial_tensors) {
        if (pool_copy.count({plan.tensors[t.index()].pool.index(), i}) != 0 &&
            plan.pools[plan.tensors[t.index()].pool.index()].owner == r.rank) {
          out.initial_tensors.push_back(copy_tensor(t, i));
        }
      }
      for (std::size_t o = 0; o < plan.ops.size(); ++o) {
        if (rank_of_op(o) != r.rank) continue;
        const Op& op = plan.ops[o];
        Op copy = op;
        copy.lane = lane_copy.at({op.lane.index(), i});
        for (OpId& d : copy.deps) {
          const int dep_rank = rank_of_op(d.index());
          if (dep_rank < 0) continue;  // a shared lane's op
          if (rep_of.count(dep_rank) == 0) {
            return fail(ErrorCode::kInvalidInput,
                        "op '{}' depends on '{}' of rank {}, which is not a representative",
                        op.name, plan.ops[d.index()].name, dep_rank);
          }
          d = op_copy.at({d.index(), i});
        }
        for (TensorId& t : copy.allocs) t = copy_tensor(t, i);
        for (TensorId& t : copy.frees) t = copy_tensor(t, i);
        if (op.kind == OpKind::kP2P && op.sizes.peer >= 0) {
          OFFSIM_ASSIGN_OR_RETURN(copy.sizes.peer, member_of(op.sizes.peer, i));
          if (op.sizes.p2p_pair >= 0) copy.sizes.p2p_pair = op.sizes.p2p_pair + i * pair_span;
        }
        out.ops.push_back(std::move(copy));
      }
    }
  }
  OFFSIM_CHECK(out.ops.size() == next_op);
  return out;
}

}  // namespace offsim::sim
