#include "sim/plan/plan.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/topological_sort.hpp>

#include "sim/plan/shape_math.h"

namespace offsim::sim {

const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::kGemm:
      return "gemm";
    case OpKind::kAttention:
      return "attention";
    case OpKind::kElementwise:
      return "elementwise";
    case OpKind::kCopy:
      return "copy";
    case OpKind::kCollective:
      return "collective";
    case OpKind::kP2P:
      return "p2p";
    case OpKind::kHostCompute:
      return "host_compute";
    case OpKind::kAlloc:
      return "alloc";
    case OpKind::kFree:
      return "free";
    case OpKind::kMarker:
      return "marker";
  }
  return "?";
}

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::kFp32:
      return "fp32";
    case DType::kBf16:
      return "bf16";
    case DType::kFp16:
      return "fp16";
    case DType::kFp8:
      return "fp8";
  }
  return "?";
}

const char* to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
  }
  return "?";
}

const char* to_string(CopyDirection direction) {
  switch (direction) {
    case CopyDirection::kH2D:
      return "h2d";
    case CopyDirection::kD2H:
      return "d2h";
    case CopyDirection::kD2D:
      return "d2d";
    case CopyDirection::kH2H:
      return "h2h";
  }
  return "?";
}

const char* to_string(LaneRole role) {
  switch (role) {
    case LaneRole::kOther:
      return "other";
    case LaneRole::kCompute:
      return "compute";
    case LaneRole::kComm:
      return "comm";
    case LaneRole::kP2P:
      return "p2p";
    case LaneRole::kRecv:
      return "recv";
    case LaneRole::kH2D:
      return "h2d";
    case LaneRole::kD2H:
      return "d2h";
    case LaneRole::kCpu:
      return "cpu";
  }
  return "?";
}

const char* to_string(PoolKind kind) {
  switch (kind) {
    case PoolKind::kOther:
      return "other";
    case PoolKind::kHbm:
      return "hbm";
    case PoolKind::kPinnedHost:
      return "pinned_host";
  }
  return "?";
}

const char* to_string(P2PRole role) {
  switch (role) {
    case P2PRole::kSend:
      return "send";
    case P2PRole::kRecv:
      return "recv";
  }
  return "?";
}

const char* to_string(OpCategory category) {
  switch (category) {
    case OpCategory::kNone:
      return "";
    case OpCategory::kCompute:
      return "compute";
    case OpCategory::kRecompute:
      return "recompute";
    case OpCategory::kComm:
      return "comm";
    case OpCategory::kOffload:
      return "offload";
    case OpCategory::kOptimizer:
      return "optimizer";
    case OpCategory::kCpuOptimizer:
      return "cpu_optimizer";
  }
  return "?";
}

const char* to_string(TensorCategory category) {
  switch (category) {
    case TensorCategory::kNone:
      return "";
    case TensorCategory::kParams:
      return "params";
    case TensorCategory::kGrads:
      return "grads";
    case TensorCategory::kOptimizer:
      return "optimizer";
    case TensorCategory::kActivations:
      return "activations";
    case TensorCategory::kBuffers:
      return "buffers";
    case TensorCategory::kTransients:
      return "transients";
    case TensorCategory::kRuntime:
      return "runtime";
    case TensorCategory::kWorkspace:
      return "workspace";
  }
  return "?";
}

namespace {

template <class Enum, int N>
std::optional<Enum> parse_enum(std::string_view name, const Enum (&values)[N]) {
  for (Enum v : values) {
    if (name == to_string(v)) return v;
  }
  return std::nullopt;
}

template <class Enum, int N>
std::string enum_names(const Enum (&values)[N]) {
  std::string out;
  for (Enum v : values) {
    if (!out.empty()) out += ", ";
    out += '"';
    out += to_string(v);
    out += '"';
  }
  return out;
}

constexpr OpCategory kOpCategories[] = {
    OpCategory::kNone,    OpCategory::kCompute,   OpCategory::kRecompute,   OpCategory::kComm,
    OpCategory::kOffload, OpCategory::kOptimizer, OpCategory::kCpuOptimizer};

constexpr TensorCategory kTensorCategories[] = {
    TensorCategory::kNone,       TensorCategory::kParams,      TensorCategory::kGrads,
    TensorCategory::kOptimizer,  TensorCategory::kActivations, TensorCategory::kBuffers,
    TensorCategory::kTransients, TensorCategory::kRuntime,     TensorCategory::kWorkspace};

}  // namespace

std::optional<OpCategory> op_category_from_string(std::string_view name) {
  return parse_enum(name, kOpCategories);
}

std::optional<TensorCategory> tensor_category_from_string(std::string_view name) {
  return parse_enum(name, kTensorCategories);
}

std::string op_category_names() { return enum_names(kOpCategories); }

std::string tensor_category_names() { return enum_names(kTensorCategories); }

std::optional<OpKind> op_kind_from_string(std::string_view name) {
  static constexpr OpKind kAll[] = {
      OpKind::kGemm, OpKind::kAttention,   OpKind::kElementwise, OpKind::kCopy, OpKind::kCollective,
      OpKind::kP2P,  OpKind::kHostCompute, OpKind::kAlloc,       OpKind::kFree, OpKind::kMarker};
  return parse_enum(name, kAll);
}

std::optional<DType> dtype_from_string(std::string_view name) {
  static constexpr DType kAll[] = {DType::kFp32, DType::kBf16, DType::kFp16, DType::kFp8};
  return parse_enum(name, kAll);
}

std::optional<CollectiveKind> collective_kind_from_string(std::string_view name) {
  static constexpr CollectiveKind kAll[] = {CollectiveKind::kAllReduce, CollectiveKind::kAllGather,
                                            CollectiveKind::kReduceScatter,
                                            CollectiveKind::kBroadcast, CollectiveKind::kAllToAll};
  return parse_enum(name, kAll);
}

std::optional<CopyDirection> copy_direction_from_string(std::string_view name) {
  static constexpr CopyDirection kAll[] = {CopyDirection::kH2D, CopyDirection::kD2H,
                                           CopyDirection::kD2D, CopyDirection::kH2H};
  return parse_enum(name, kAll);
}

std::optional<LaneRole> lane_role_from_string(std::string_view name) {
  static constexpr LaneRole kAll[] = {LaneRole::kOther, LaneRole::kCompute, LaneRole::kComm,
                                      LaneRole::kP2P,   LaneRole::kRecv,    LaneRole::kH2D,
                                      LaneRole::kD2H,   LaneRole::kCpu};
  return parse_enum(name, kAll);
}

std::optional<PoolKind> pool_kind_from_string(std::string_view name) {
  static constexpr PoolKind kAll[] = {PoolKind::kOther, PoolKind::kHbm, PoolKind::kPinnedHost};
  return parse_enum(name, kAll);
}

std::optional<P2PRole> p2p_role_from_string(std::string_view name) {
  static constexpr P2PRole kAll[] = {P2PRole::kSend, P2PRole::kRecv};
  return parse_enum(name, kAll);
}

double gemm_flops(const GemmShape& g) {
  return 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k) *
         static_cast<double>(std::max<std::int64_t>(g.batch, 1));
}

DType gemm_output_dtype(DType input) { return input == DType::kFp8 ? DType::kBf16 : input; }

double gemm_bytes(const GemmShape& g) {
  const double batch = static_cast<double>(std::max<std::int64_t>(g.batch, 1));
  const double m = static_cast<double>(g.m);
  const double n = static_cast<double>(g.n);
  const double k = static_cast<double>(g.k);
  const double in = static_cast<double>(dtype_bytes(g.dtype));
  const double out = static_cast<double>(dtype_bytes(gemm_output_dtype(g.dtype)));
  return ((m * k + k * n) * in + m * n * out) * batch;
}

std::int64_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::kFp32:
      return 4;
    case DType::kBf16:
      return 2;
    case DType::kFp16:
      return 2;
    case DType::kFp8:
      return 1;
  }
  return 0;
}

// --- PlanBuilder ------------------------------------------------------------------------------

LaneId PlanBuilder::lane(const std::string& name, LaneIdentity identity) {
  auto [it, inserted] = lanes_.try_emplace(name, LaneId{plan_.lanes.size()});
  if (inserted) {
    plan_.lanes.push_back(
        Lane{.name = name, .rank = identity.rank, .stage = identity.stage, .role = identity.role});
  }
  return it->second;
}

ResourceId PlanBuilder::resource(const std::string& name, double capacity) {
  auto [it, inserted] = resources_.try_emplace(name, ResourceId{plan_.resources.size()});
  if (inserted) plan_.resources.push_back(Resource{name, capacity});
  return it->second;
}

PoolId PlanBuilder::pool(const std::string& name, std::int64_t capacity_bytes, PoolKind kind,
                         int owner) {
  auto [it, inserted] = pools_.try_emplace(name, PoolId{plan_.pools.size()});
  if (inserted) {
    plan_.pools.push_back(
        Pool{.name = name, .capacity_bytes = capacity_bytes, .kind = kind, .owner = owner});
  }
  return it->second;
}

TensorId PlanBuilder::tensor(const std::string& name, PoolId pool, std::int64_t bytes,
                             TensorCategory category) {
  plan_.tensors.push_back(Tensor{name, pool, bytes, category});
  return TensorId{plan_.tensors.size() - 1};
}

OpId PlanBuilder::op(Op op) {
  plan_.ops.push_back(std::move(op));
  return OpId{plan_.ops.size() - 1};
}

OpId PlanBuilder::new_op() {
  plan_.ops.emplace_back();
  return OpId{plan_.ops.size() - 1};
}

void PlanBuilder::reserve(std::size_t ops, std::size_t tensors) {
  plan_.ops.reserve(ops);
  plan_.tensors.reserve(tensors);
}

void PlanBuilder::initial(TensorId tensor) { plan_.initial_tensors.push_back(tensor); }

void PlanBuilder::metadata(const std::string& key, const std::string& value) {
  plan_.metadata.emplace_back(key, value);
}

std::optional<LaneId> PlanBuilder::find_lane(const std::string& name) const {
  auto it = lanes_.find(name);
  if (it == lanes_.end()) return std::nullopt;
  return it->second;
}

std::optional<ResourceId> PlanBuilder::find_resource(const std::string& name) const {
  auto it = resources_.find(name);
  if (it == resources_.end()) return std::nullopt;
  return it->second;
}

std::optional<PoolId> PlanBuilder::find_pool(const std::string& name) const {
  auto it = pools_.find(name);
  if (it == pools_.end()) return std::nullopt;
  return it->second;
}

Plan PlanBuilder::build() && { return std::move(plan_); }

// --- validation -------------------------------------------------------------------------------

namespace {

using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS>;

std::string op_label(const Plan& plan, std::size_t i) {
  return fmt::format("ops[{}] '{}'", i, plan.ops[i].name);
}

// Edges: each op's lane predecessor and each dep. Assumes ids were range-checked.
Graph dependency_graph(const Plan& plan) {
  Graph g(plan.ops.size());
  std::vector<std::uint32_t> last_on_lane(plan.lanes.size(), TaggedId<void>::kInvalidValue);
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    const Op& op = plan.ops[i];
    std::uint32_t& last = last_on_lane[op.lane.index()];
    if (last != TaggedId<void>::kInvalidValue) boost::add_edge(last, i, g);
    last = static_cast<std::uint32_t>(i);
    for (OpId dep : op.deps) boost::add_edge(dep.index(), i, g);
  }
  return g;
}

// Finds one cycle (after topological_sort said there is one) with an iterative DFS.
std::string describe_cycle(const Plan& plan, const Graph& g) {
  const std::size_t n = boost::num_vertices(g);
  std::vector<std::uint8_t> color(n, 0);  // 0 white, 1 on stack, 2 done
  std::vector<std::size_t> parent(n, n);
  for (std::size_t root = 0; root < n; ++root) {
    if (color[root] != 0) continue;
    std::vector<std::pair<std::size_t, Graph::adjacency_iterator>> stack;
    color[root] = 1;
    auto [b, e] = boost::adjacent_vertices(root, g);
    stack.emplace_back(root, b);
    while (!stack.empty()) {
      auto& [v, it] = stack.back();
      auto end = boost::adjacent_vertices(v, g).second;
      if (it == end) {
        color[v] = 2;
        stack.pop_back();
        continue;
      }
      const std::size_t w = *it++;
      if (color[w] == 1) {
        std::vector<std::size_t> cycle{w};
        for (std::size_t x = v; x != w; x = parent[x]) cycle.push_back(x);
        std::reverse(cycle.begin() + 1, cycle.end());
        std::string text;
        for (std::size_t x : cycle) text += op_label(plan, x) + " -> ";
        return text + op_label(plan, w);
      }
      if (color[w] == 0) {
        color[w] = 1;
        parent[w] = v;
        stack.emplace_back(w, boost::adjacent_vertices(w, g).first);
      }
    }
  }
  return "(cycle not located)";
}

bool finite_nonneg(double x) { return std::isfinite(x) && x >= 0.0; }

template <class Table>
Status check_unique_names(const Table& table, const char* what) {
  std::unordered_map<std::string_view, std::size_t> seen;
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (table[i].name.empty()) {
      return fail(ErrorCode::kInvalidInput, "{}[{}]: empty name", what, i);
    }
    auto [it, inserted] = seen.emplace(table[i].name, i);
    if (!inserted) {
      return fail(ErrorCode::kInvalidInput, "{}[{}]: name '{}' already used by {}[{}]", what, i,
                  table[i].name, what, it->second);
    }
  }
  return ok();
}

// Each p2p pair id names one send and at most one receive; a receive names a send that exists,
// depends on it and runs on the lane of the send's peer.
Status check_p2p_pairs(const Plan& plan) {
  std::map<std::int64_t, std::size_t> sends;
  std::map<std::int64_t, std::size_t> recvs;
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    const Op& op = plan.ops[i];
    if (op.kind != OpKind::kP2P || op.sizes.p2p_pair < 0) continue;
    auto& seen = op.sizes.p2p_role == P2PRole::kSend ? sends : recvs;
    auto [it, inserted] = seen.emplace(op.sizes.p2p_pair, i);
    if (!inserted) {
      return fail(ErrorCode::kInvalidInput, "{}: p2p pair {} already has a {} ({})",
                  op_label(plan, i), op.sizes.p2p_pair, to_string(op.sizes.p2p_role),
                  op_label(plan, it->second));
    }
  }
  for (const auto& [pair, r] : recvs) {
    auto s = sends.find(pair);
    if (s == sends.end()) {
      return fail(ErrorCode::kInvalidInput, "{}: receives p2p pair {}, which no op sends",
                  op_label(plan, r), pair);
    }
    const Op& recv = plan.ops[r];
    const Op& send = plan.ops[s->second];
    if (std::find(recv.deps.begin(), recv.deps.end(), OpId{s->second}) == recv.deps.end()) {
      return fail(ErrorCode::kInvalidInput, "{}: does not depend on its send {}", op_label(plan, r),
                  op_label(plan, s->second));
    }
    const int recv_rank = plan.lanes[recv.lane.index()].rank;
    const int send_rank = plan.lanes[send.lane.index()].rank;
    if (send.sizes.peer != recv_rank || recv.sizes.peer != send_rank) {
      return fail(ErrorCode::kInvalidInput,
                  "{}: receives on rank {} from rank {}, but its send {} runs on rank {} to "
                  "rank {}",
                  op_label(plan, r), recv_rank, recv.sizes.peer, op_label(plan, s->second),
                  send_rank, send.sizes.peer);
    }
  }
  return ok();
}

// Resources have positive finite rates; pools non-negative capacities.
Status check_resources_and_pools(const Plan& plan) {
  for (std::size_t i = 0; i < plan.resources.size(); ++i) {
    const double c = plan.resources[i].capacity;
    if (!(std::isfinite(c) && c > 0.0)) {
      return fail(ErrorCode::kInvalidInput,
                  "resources[{}] '{}': capacity {} is not a positive finite rate", i,
                  plan.resources[i].name, c);
    }
  }
  for (std::size_t i = 0; i < plan.pools.size(); ++i) {
    if (plan.pools[i].capacity_bytes < 0) {
      return fail(ErrorCode::kInvalidInput, "pools[{}] '{}': negative capacity {} bytes", i,
                  plan.pools[i].name, plan.pools[i].capacity_bytes);
    }
  }
  return ok();
}

// Tensors live in an existing pool and have a non-negative size.
Status check_tensors(const Plan& plan) {
  for (std::size_t i = 0; i < plan.tensors.size(); ++i) {
    const Tensor& t = plan.tensors[i];
    if (t.pool.index() >= plan.pools.size()) {
      return fail(ErrorCode::kInvalidInput,
                  "tensors[{}] '{}': unknown pool id {} (the plan has {} pools)", i, t.name,
                  t.pool.value(), plan.pools.size());
    }
    if (t.bytes < 0) {
      return fail(ErrorCode::kInvalidInput, "tensors[{}] '{}': negative size {} bytes", i, t.name,
                  t.bytes);
    }
  }
  return ok();
}

// Op `i` runs on an existing lane and depends on existing ops other than itself.
Status check_op_lane_and_deps(const Plan& plan, std::size_t i) {
  const Op& op = plan.ops[i];
  if (op.lane.index() >= plan.lanes.size()) {
    return fail(ErrorCode::kInvalidInput, "{}: unknown lane id {} (the plan has {} lanes)",
                op_label(plan, i), op.lane.value(), plan.lanes.size());
  }
  for (OpId dep : op.deps) {
    if (dep.index() >= plan.ops.size()) {
      return fail(ErrorCode::kInvalidInput,
                  "{}: dependency on op id {}, which does not exist (the plan has {} ops)",
                  op_label(plan, i), dep.value(), plan.ops.size());
    }
    if (dep.index() == i) {
      return fail(ErrorCode::kInvalidInput, "{}: depends on itself", op_label(plan, i));
    }
  }
  return ok();
}

// Op `i`'s cost: finite non-negative work, a positive rate cap, a non-negative latency, a
// multiplicity of at least 1 and finite non-negative uses of existing resources.
Status check_op_cost(const Plan& plan, std::size_t i) {
  const OpCost& c = plan.ops[i].cost;
  if (!finite_nonneg(c.work)) {
    return fail(ErrorCode::kInvalidInput, "{}: work {} is not a finite non-negative amount",
                op_label(plan, i), c.work);
  }
  if (std::isnan(c.max_rate) || !(c.max_rate > 0.0)) {
    return fail(ErrorCode::kInvalidInput, "{}: max_rate {} is not positive", op_label(plan, i),
                c.max_rate);
  }
  if (c.latency.count() < 0) {
    return fail(ErrorCode::kInvalidInput, "{}: negative latency {} ns", op_label(plan, i),
                c.latency.count());
  }
  if (c.multiplicity < 1) {
    return fail(ErrorCode::kInvalidInput, "{}: multiplicity {} is below 1", op_label(plan, i),
                c.multiplicity);
  }
  for (const ResourceUse& u : c.uses) {
    if (u.resource.index() >= plan.resources.size()) {
      return fail(ErrorCode::kInvalidInput,
                  "{}: uses resource id {}, which does not exist (the plan has {} resources)",
                  op_label(plan, i), u.resource.value(), plan.resources.size());
    }
    if (!finite_nonneg(u.per_unit)) {
      return fail(ErrorCode::kInvalidInput,
                  "{}: per_unit {} on resource '{}' is not finite and non-negative",
                  op_label(plan, i), u.per_unit, plan.resources[u.resource.index()].name);
    }
  }
  return ok();
}

// Op `i` allocates and frees existing tensors.
Status check_op_tensors(const Plan& plan, std::size_t i) {
  const Op& op = plan.ops[i];
  for (const auto* list : {&op.allocs, &op.frees}) {
    for (TensorId t : *list) {
      if (t.index() >= plan.tensors.size()) {
        return fail(ErrorCode::kInvalidInput,
                    "{}: {} tensor id {}, which does not exist (the plan has {} tensors)",
                    op_label(plan, i), list == &op.allocs ? "allocates" : "frees", t.value(),
                    plan.tensors.size());
      }
    }
  }
  return ok();
}

Status check_structure(const Plan& plan) {
  OFFSIM_RETURN_IF_ERROR(check_unique_names(plan.lanes, "lanes"));
  OFFSIM_RETURN_IF_ERROR(check_unique_names(plan.resources, "resources"));
  OFFSIM_RETURN_IF_ERROR(check_unique_names(plan.pools, "pools"));
  OFFSIM_RETURN_IF_ERROR(check_resources_and_pools(plan));
  OFFSIM_RETURN_IF_ERROR(check_tensors(plan));
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    OFFSIM_RETURN_IF_ERROR(check_op_lane_and_deps(plan, i));
    OFFSIM_RETURN_IF_ERROR(check_op_cost(plan, i));
    OFFSIM_RETURN_IF_ERROR(check_op_tensors(plan, i));
  }
  for (TensorId t : plan.initial_tensors) {
    if (t.index() >= plan.tensors.size()) {
      return fail(ErrorCode::kInvalidInput, "initial_tensors: tensor id {} does not exist",
                  t.value());
    }
  }
  return check_p2p_pairs(plan);
}

// Happens-before queries over lane order and deps: `a` happens before `f` when `f` is reachable
// from `a`. A backwards search from `f` is pruned by topological position and by lane order (an op
// on a's lane at or after a is reached through the lane), so typical queries touch few ops.
class Reachability {
 public:
  Reachability(const Plan& plan, const std::vector<OpId>& order)
      : plan_(plan),
        position_(plan.ops.size()),
        lane_index_(plan.ops.size()),
        lane_pred_(plan.ops.size(), kNone),
        stamp_(plan.ops.size(), 0) {
    for (std::size_t p = 0; p < order.size(); ++p) position_[order[p].index()] = p;
    std::vector<std::size_t> last(plan.lanes.size(), kNone);
    std::vector<std::size_t> count(plan.lanes.size(), 0);
    for (std::size_t i = 0; i < plan.ops.size(); ++i) {
      const std::size_t lane = plan.ops[i].lane.index();
      lane_pred_[i] = last[lane];
      lane_index_[i] = count[lane]++;
      last[lane] = i;
    }
  }

  std::size_t position(std::size_t op) const { return position_[op]; }

  // True when ordered; also true (unchecked) once the search budget is spent, since the engine
  // checks frees at run time as well.
  bool happens_before(std::size_t a, std::size_t f) {
    if (a == f) return true;
    if (position_[f] < position_[a]) return false;
    const std::size_t lane_a = plan_.ops[a].lane.index();
    auto reaches = [&](std::size_t x) {
      return x == a || (plan_.ops[x].lane.index() == lane_a && lane_index_[x] >= lane_index_[a]);
    };
    if (reaches(f)) return true;
    ++epoch_;
    stack_.assign(1, f);
    stamp_[f] = epoch_;
    while (!stack_.empty()) {
      const std::size_t x = stack_.back();
      stack_.pop_back();
      if (budget_ == 0) return true;
      --budget_;
      auto visit = [&](std::size_t p) {
        if (p == kNone || stamp_[p] == epoch_ || position_[p] < position_[a]) return false;
        if (reaches(p)) return true;
        stamp_[p] = epoch_;
        stack_.push_back(p);
        return false;
      };
      if (visit(lane_pred_[x])) return true;
      for (OpId d : plan_.ops[x].deps) {
        if (visit(d.index())) return true;
      }
    }
    return false;
  }

 private:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  const Plan& plan_;
  std::vector<std::size_t> position_;
  std::vector<std::size_t> lane_index_;
  std::vector<std::size_t> lane_pred_;
  std::vector<std::uint32_t> stamp_;
  std::vector<std::size_t> stack_;
  std::uint32_t epoch_ = 0;
  std::int64_t budget_ = 50'000'000;
};

// Every tensor is allocated at most once (initially or by one op) and freed at most once, by an
// op that its allocating op happens before (through lane order and deps).
Status check_memory_effects(const Plan& plan, const std::vector<OpId>& order) {
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  constexpr std::size_t kInitial = static_cast<std::size_t>(-2);
  Reachability reach(plan, order);
  std::vector<std::size_t> alloc_by(plan.tensors.size(), kNone);
  std::vector<std::size_t> free_by(plan.tensors.size(), kNone);
  auto alloc_label = [&](std::size_t who) {
    return who == kInitial ? std::string("initial_tensors") : op_label(plan, who);
  };
  for (TensorId t : plan.initial_tensors) {
    if (alloc_by[t.index()] != kNone) {
      return fail(ErrorCode::kInvalidInput, "initial_tensors: tensor '{}' listed twice",
                  plan.tensors[t.index()].name);
    }
    alloc_by[t.index()] = kInitial;
  }
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    for (TensorId t : plan.ops[i].allocs) {
      if (alloc_by[t.index()] != kNone) {
        return fail(ErrorCode::kInvalidInput,
                    "{}: double alloc of tensor '{}', already allocated by {}", op_label(plan, i),
                    plan.tensors[t.index()].name, alloc_label(alloc_by[t.index()]));
      }
      alloc_by[t.index()] = i;
    }
  }
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    for (TensorId t : plan.ops[i].frees) {
      const std::string& name = plan.tensors[t.index()].name;
      const std::size_t a = alloc_by[t.index()];
      if (a == kNone) {
        return fail(ErrorCode::kInvalidInput, "{}: frees tensor '{}', which is never allocated",
                    op_label(plan, i), name);
      }
      if (free_by[t.index()] != kNone) {
        return fail(ErrorCode::kInvalidInput, "{}: double free of tensor '{}', already freed by {}",
                    op_label(plan, i), name, op_label(plan, free_by[t.index()]));
      }
      if (a != kInitial && !reach.happens_before(a, i)) {
        return fail(ErrorCode::kInvalidInput,
                    "{}: frees tensor '{}' but is not ordered after {}, which allocates it (add a "
                    "dependency)",
                    op_label(plan, i), name, op_label(plan, a));
      }
      free_by[t.index()] = i;
    }
  }
  return ok();
}

}  // namespace

Result<std::vector<OpId>> topological_order(const Plan& plan) {
  OFFSIM_RETURN_IF_ERROR(check_structure(plan));
  Graph g = dependency_graph(plan);
  std::vector<std::size_t> reversed;
  reversed.reserve(plan.ops.size());
  try {
    boost::topological_sort(g, std::back_inserter(reversed));
  } catch (const boost::not_a_dag&) {
    return fail(ErrorCode::kInvalidInput, "the plan has a dependency cycle: {}",
                describe_cycle(plan, g));
  }
  std::vector<OpId> order;
  order.reserve(reversed.size());
  for (auto it = reversed.rbegin(); it != reversed.rend(); ++it) order.emplace_back(*it);
  return order;
}

Status validate(const Plan& plan) {
  OFFSIM_ASSIGN_OR_RETURN(std::vector<OpId> order, topological_order(plan));
  return check_memory_effects(plan, order);
}

}  // namespace offsim::sim
