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

// Member copies of the representatives' lanes, pools, ops and tensors, appended to a copy of the
// plan. Member i (1 <= i < k) of representative r is rank r.rank + i * r.stride.
class Expansion {
 public:
  Expansion(const Plan& plan, std::map<int, Representative> rep_of, int k)
      : plan_(plan), rep_of_(std::move(rep_of)), k_(k), out_(plan) {
    out_.representatives.clear();
    for (const Op& op : plan_.ops) pair_span_ = std::max(pair_span_, op.sizes.p2p_pair + 1);
  }

  Result<Plan> run() {
    // Ids first (a copied receive depends on the copy of a send made for another
    // representative).
    for (const Representative& r : plan_.representatives) {
      for (int i = 1; i < k_; ++i) copy_lanes_and_pools(r, i);
    }
    std::size_t next_op = plan_.ops.size();
    for (const Representative& r : plan_.representatives) {
      for (int i = 1; i < k_; ++i) {
        for (std::size_t o = 0; o < plan_.ops.size(); ++o) {
          if (rank_of_op(o) == r.rank) op_copy_[{o, i}] = OpId{next_op++};
        }
      }
    }
    for (const Representative& r : plan_.representatives) {
      for (int i = 1; i < k_; ++i) {
        copy_initial_tensors(r, i);
        for (std::size_t o = 0; o < plan_.ops.size(); ++o) {
          if (rank_of_op(o) != r.rank) continue;
          OFFSIM_ASSIGN_OR_RETURN(Op copy, copy_op(o, i));
          out_.ops.push_back(std::move(copy));
        }
      }
    }
    OFFSIM_CHECK(out_.ops.size() == next_op);
    return std::move(out_);
  }

 private:
  using Key = std::pair<std::size_t, int>;  // (index in the plan, member offset)

  int rank_of_op(std::size_t o) const { return plan_.lanes[plan_.ops[o].lane.index()].rank; }

  Result<int> member_of(int rank, int i) const {
    auto it = rep_of_.find(rank);
    if (it == rep_of_.end()) {
      return fail(ErrorCode::kInvalidInput, "rank {} has ops but is not a representative", rank);
    }
    return rank + i * it->second.stride;
  }

  // Member i's copies of r's lanes and HBM pools.
  void copy_lanes_and_pools(const Representative& r, int i) {
    const int member = r.rank + i * r.stride;
    for (std::size_t l = 0; l < plan_.lanes.size(); ++l) {
      if (plan_.lanes[l].rank != r.rank) continue;
      Lane lane = plan_.lanes[l];
      lane.name = member_name(lane.name, member);
      lane.rank = member;
      lane_copy_[{l, i}] = LaneId{out_.lanes.size()};
      out_.lanes.push_back(std::move(lane));
    }
    for (std::size_t p = 0; p < plan_.pools.size(); ++p) {
      const Pool& pool = plan_.pools[p];
      if (pool.kind != PoolKind::kHbm || pool.owner != r.rank) continue;
      Pool copy = pool;
      copy.name = member_name(pool.name, member);
      copy.owner = member;
      pool_copy_[{p, i}] = PoolId{out_.pools.size()};
      out_.pools.push_back(std::move(copy));
    }
  }

  // A member's copy of a tensor: the tensors of its representative's HBM and of its ops.
  TensorId copy_tensor(TensorId t, int i) {
    auto [it, inserted] = tensor_copy_.try_emplace({t.index(), i}, TensorId{out_.tensors.size()});
    if (inserted) {
      Tensor copy = plan_.tensors[t.index()];
      if (auto p = pool_copy_.find({copy.pool.index(), i}); p != pool_copy_.end()) {
        copy.pool = p->second;
      }
      out_.tensors.push_back(std::move(copy));
    }
    return it->second;
  }

  // Member i's copies of the initial tensors in r's HBM.
  void copy_initial_tensors(const Representative& r, int i) {
    for (TensorId t : plan_.initial_tensors) {
      const std::size_t pool = plan_.tensors[t.index()].pool.index();
      if (pool_copy_.count({pool, i}) != 0 && plan_.pools[pool].owner == r.rank) {
        out_.initial_tensors.push_back(copy_tensor(t, i));
      }
    }
  }

  // Member i's copy of op `o`: on the member's lane, depending on the member's copies, with the
  // member's tensors and, for a point-to-point transfer, the peer's member and its own pair id.
  Result<Op> copy_op(std::size_t o, int i) {
    const Op& op = plan_.ops[o];
    Op copy = op;
    copy.lane = lane_copy_.at({op.lane.index(), i});
    for (OpId& d : copy.deps) {
      const int dep_rank = rank_of_op(d.index());
      if (dep_rank < 0) continue;  // a shared lane's op
      if (rep_of_.count(dep_rank) == 0) {
        return fail(ErrorCode::kInvalidInput,
                    "op '{}' depends on '{}' of rank {}, which is not a representative", op.name,
                    plan_.ops[d.index()].name, dep_rank);
      }
      d = op_copy_.at({d.index(), i});
    }
    for (TensorId& t : copy.allocs) t = copy_tensor(t, i);
    for (TensorId& t : copy.frees) t = copy_tensor(t, i);
    if (op.kind == OpKind::kP2P && op.sizes.peer >= 0) {
      OFFSIM_ASSIGN_OR_RETURN(copy.sizes.peer, member_of(op.sizes.peer, i));
      if (op.sizes.p2p_pair >= 0) copy.sizes.p2p_pair = op.sizes.p2p_pair + i * pair_span_;
    }
    return copy;
  }

  const Plan& plan_;
  const std::map<int, Representative> rep_of_;  // representative rank -> its entry
  const int k_;                                 // ranks each representative stands for
  Plan out_;
  std::int64_t pair_span_ = 0;  // p2p pair ids of the plan are below this
  std::map<Key, LaneId> lane_copy_;
  std::map<Key, PoolId> pool_copy_;
  std::map<Key, OpId> op_copy_;
  std::map<Key, TensorId> tensor_copy_;
};

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
  if (k <= 1) {
    Plan out = plan;
    out.representatives.clear();
    return out;
  }
  return Expansion(plan, std::move(rep_of), k).run();
}

}  // namespace offsim::sim
