#include "sim/trace/timeline.h"

namespace offsim::sim {

const char* to_string(OutcomeKind kind) {
  switch (kind) {
    case OutcomeKind::kCompleted:
      return "completed";
    case OutcomeKind::kOutOfMemory:
      return "out_of_memory";
    case OutcomeKind::kDeadlock:
      return "deadlock";
    case OutcomeKind::kLimitExceeded:
      return "limit_exceeded";
  }
  return "?";
}

Timeline timeline_skeleton(const Plan& plan, bool with_op_infos) {
  Timeline t;
  t.lanes.reserve(plan.lanes.size());
  t.lane_identity.reserve(plan.lanes.size());
  for (const Lane& lane : plan.lanes) {
    t.lanes.push_back(lane.name);
    t.lane_identity.push_back({.rank = lane.rank, .stage = lane.stage, .role = lane.role});
  }
  if (with_op_infos) {
    t.ops.reserve(plan.ops.size());
    for (const Op& op : plan.ops) {
      t.ops.push_back(OpInfo{op.name, op.kind, op.category, op.layer, op.sizes.flops,
                             op.sizes.bytes, op.deps.to_vector()});
    }
  }
  t.pools.reserve(plan.pools.size());
  for (const Pool& pool : plan.pools) {
    PoolTrace p;
    p.name = pool.name;
    p.kind = pool.kind;
    p.owner = pool.owner;
    p.capacity_bytes = pool.capacity_bytes;
    t.pools.push_back(std::move(p));
  }
  t.metadata = plan.metadata;
  return t;
}

std::vector<TensorInfo> tensor_infos(const Plan& plan) {
  std::vector<TensorInfo> out;
  out.reserve(plan.tensors.size());
  for (const Tensor& t : plan.tensors) out.push_back({t.name, t.category, t.bytes, t.pool});
  return out;
}

}  // namespace offsim::sim
