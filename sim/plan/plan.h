// Plan: the operations of one training step as a DAG over in-order lanes.
//
// The one contract of offsim: models/ builds a Plan, the sim/ engine and the backends/ replay
// both execute it and both produce a Timeline (sim/trace/timeline.h).
//
// * A lane is an in-order queue with CUDA-stream semantics ("rank0.compute", "rank0.h2d").
//   Order within a lane is the order of `Plan::ops` (issue order). An op starts when it is the
//   head of its lane and every op in `deps` has ended. Lanes and pools carry their identity as
//   typed fields (rank, pipeline stage, role or kind, owner); names are for display only.
// * A point-to-point transfer is two ops: a send (P2PRole::kSend) on the sender's lane and a
//   receive (kRecv) on a lane of the peer, with the same `sizes.p2p_pair` and each other's rank
//   in `sizes.peer`. The receive lists its send in `deps` and costs nothing, so the engine ends
//   it when the data has arrived; the receiver's consumers depend on the receive. The replay
//   matches the two as one transfer (it does not wait for the send before posting the receive).
// * An op's cost is a flow: `work` units progressed at a rate that the engine shares max-min
//   fairly over the resources in `uses`, never above `max_rate`, after a fixed `latency`.
// * Memory effects: `allocs` are taken when the op starts, `frees` given back when it ends.
//   Tensors live in named pools with a capacity ("rank0.hbm", "host0.pinned").
// * `sizes` describes what the op really does (GEMM shape, bytes, collective) so the replay can
//   execute it; the engine reads only `cost`, `deps`, `allocs` and `frees`.
//
//   PlanBuilder b;
//   LaneId lane = b.lane("rank0.compute");
//   ResourceId sm = b.resource("rank0.sm", 1.0);
//   OpId op = b.op({.name = "fwd.l0.qkv", .lane = lane, .kind = OpKind::kGemm,
//                   .cost = {.work = 1e12, .max_rate = 7e14, .uses = {{sm, 1.0 / 7e14}}}});
//   Plan plan = std::move(b).build();
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sim/core/huge_page_allocator.h"
#include "sim/core/ids.h"
#include "sim/core/inline_string.h"
#include "sim/core/result.h"
#include "sim/core/small_vector.h"
#include "sim/core/time.h"

namespace offsim::sim {

enum class OpKind {
  kGemm,
  kAttention,
  kElementwise,  // memory-bound kernels: norms, activations, residuals, optimizer on GPU
  kCopy,         // H2D, D2H, D2D copies (copy engines)
  kCollective,   // all-reduce, all-gather, reduce-scatter, ...
  kP2P,          // point-to-point send/recv (pipeline parallel)
  kHostCompute,  // work on the CPU (CPU Adam)
  kAlloc,        // a pure memory effect with no work
  kFree,         // a pure memory effect with no work
  kMarker,       // an event with no work and no memory effect (ordering only)
};

enum class DType { kFp32, kBf16, kFp16, kFp8 };

enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kAllToAll };

enum class CopyDirection { kH2D, kD2H, kD2D, kH2H };

// What a lane is for on its rank.
enum class LaneRole { kOther, kCompute, kComm, kP2P, kRecv, kH2D, kD2H, kCpu };

// What memory a pool is.
enum class PoolKind { kOther, kHbm, kPinnedHost };

// Which end of a point-to-point transfer an op is.
enum class P2PRole { kSend, kRecv };

// The report bucket of an op, chosen by models/. Its name (to_string) is what JSON, traces and
// reports show: "" (none), "compute", "recompute", "comm", "offload", "optimizer",
// "cpu_optimizer".
enum class OpCategory { kNone, kCompute, kRecompute, kComm, kOffload, kOptimizer, kCpuOptimizer };

// What a tensor holds. Names: "" (none), "params", "grads", "optimizer", "activations",
// "buffers", "transients", "runtime", "workspace".
enum class TensorCategory {
  kNone,
  kParams,
  kGrads,
  kOptimizer,
  kActivations,
  kBuffers,
  kTransients,
  kRuntime,
  kWorkspace,
};

const char* to_string(OpKind kind);
const char* to_string(DType dtype);
const char* to_string(CollectiveKind kind);
const char* to_string(CopyDirection direction);
const char* to_string(LaneRole role);
const char* to_string(PoolKind kind);
const char* to_string(P2PRole role);
const char* to_string(OpCategory category);
const char* to_string(TensorCategory category);
std::optional<OpKind> op_kind_from_string(std::string_view name);
std::optional<DType> dtype_from_string(std::string_view name);
std::optional<CollectiveKind> collective_kind_from_string(std::string_view name);
std::optional<CopyDirection> copy_direction_from_string(std::string_view name);
std::optional<LaneRole> lane_role_from_string(std::string_view name);
std::optional<PoolKind> pool_kind_from_string(std::string_view name);
std::optional<P2PRole> p2p_role_from_string(std::string_view name);
std::optional<OpCategory> op_category_from_string(std::string_view name);
std::optional<TensorCategory> tensor_category_from_string(std::string_view name);
// The valid names, quoted and comma-separated, for error messages: "\"\", \"compute\", ...".
std::string op_category_names();
std::string tensor_category_names();
std::int64_t dtype_bytes(DType dtype);

// C[m×n] = A[m×k] · B[k×n], `batch` independent products.
struct GemmShape {
  std::int64_t m = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  std::int64_t batch = 1;
  DType dtype = DType::kBf16;
  // A grouped GEMM (one kernel over `batch` problems of different row counts, e.g. an MoE
  // layer's experts): m is then the mean row count.
  bool grouped = false;
  bool operator==(const GemmShape&) const = default;
};

struct AttentionShape {
  std::int64_t batch = 0;
  std::int64_t heads = 0;     // query heads on this rank
  std::int64_t kv_heads = 0;  // key/value heads on this rank (GQA when < heads)
  std::int64_t seq_q = 0;
  std::int64_t seq_kv = 0;
  std::int64_t head_dim = 0;
  bool causal = true;
  bool backward = false;
  DType dtype = DType::kBf16;
  bool operator==(const AttentionShape&) const = default;
};

struct CollectiveSpec {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  std::vector<int> group;  // global ranks taking part, in ring order
  bool operator==(const CollectiveSpec&) const = default;
};

// What an op really does, for the replay and for display. Only the fields of its kind matter.
struct OpSizes {
  double flops = 0.0;         // useful floating-point operations
  std::int64_t bytes = 0;     // bytes moved: copy/p2p size, collective buffer, kernel traffic
  GemmShape gemm;             // kGemm
  AttentionShape attention;   // kAttention
  CollectiveSpec collective;  // kCollective
  CopyDirection copy_direction = CopyDirection::kD2D;  // kCopy
  int peer = -1;                                       // kP2P: the other global rank
  P2PRole p2p_role = P2PRole::kSend;                   // kP2P: this end of the transfer
  std::int64_t p2p_pair = -1;  // kP2P: the same value on a send and its receive, -1 when unpaired
  bool operator==(const OpSizes&) const = default;
};

// One resource an op's flow uses: `per_unit` resource units consumed per unit of work.
struct ResourceUse {
  ResourceId resource;
  double per_unit = 1.0;
  bool operator==(const ResourceUse&) const = default;
};

// The flow an op is for the engine. Its time alone on idle resources is
//   latency + work / min(max_rate, min over uses of capacity / per_unit).
struct OpCost {
  double work = 0.0;                                          // units (bytes, flops, ...)
  double max_rate = std::numeric_limits<double>::infinity();  // work units per second
  SmallVector<ResourceUse, 3> uses;  // inline up to three: 99.8% of ops use two or three
  Duration latency{0};               // fixed term before the flow starts (launch, link latency)
  int multiplicity = 1;              // this flow stands for k identical flows on its resources
  bool operator==(const OpCost&) const = default;
};

struct Op {
  InlineString name;  // nearly every op's name fits inline: no heap block per op
  LaneId lane;
  OpKind kind = OpKind::kMarker;
  OpCategory category = OpCategory::kNone;  // report bucket chosen by models/
  int layer = -1;                           // transformer layer, -1 when none
  OpSizes sizes;
  OpCost cost;
  // Inline up to four dependencies and two tensors each (most ops have fewer): no heap block
  // per op when a plan of 10^5 ops is built and destroyed.
  SmallVector<OpId, 4> deps;        // cross-lane dependencies: ops that must end first
  SmallVector<TensorId, 2> allocs;  // taken at start
  SmallVector<TensorId, 2> frees;   // given back at end
  bool operator==(const Op&) const = default;
};

struct Lane {
  std::string name;  // "rank0.compute", for display
  int rank = -1;     // global rank whose stream this is, -1 for none (runs on the first rank)
  int stage = -1;    // pipeline stage of that rank, -1 when unknown
  LaneRole role = LaneRole::kOther;
  bool operator==(const Lane&) const = default;
};

struct Resource {
  std::string name;       // "rank0.pcie.h2d", "socket0.dram"
  double capacity = 0.0;  // units per second (bytes/s, flop/s, or 1.0 for a shared unit)
  bool operator==(const Resource&) const = default;
};

struct Pool {
  std::string name;                 // "rank0.hbm", "node0.pinned", for display
  std::int64_t capacity_bytes = 0;  // 0 would refuse any alloc; use a large value for unbounded
  PoolKind kind = PoolKind::kOther;
  int owner = -1;  // kHbm: the global rank; kPinnedHost: the node; -1 when none
  bool operator==(const Pool&) const = default;
};

struct Tensor {
  InlineString name;  // "l3.act.mlpwi"
  PoolId pool;
  std::int64_t bytes = 0;
  TensorCategory category = TensorCategory::kNone;
  bool operator==(const Tensor&) const = default;
};

// A simulated rank that stands for `multiplicity` identical ranks: rank, rank + stride, ...
// (data- and tensor-parallel peers). Their ops, lanes and HBM are copies of its own with the
// ranks shifted by the same offset (see expand_representatives()).
struct Representative {
  int rank = 0;
  int multiplicity = 1;
  int stride = 1;
  bool operator==(const Representative&) const = default;
};

struct Plan {
  std::vector<Lane> lanes;
  std::vector<Resource> resources;
  std::vector<Pool> pools;
  std::vector<Tensor> tensors;
  std::vector<Op, HugePageAllocator<Op>> ops;
  // Tensors live before the step starts (weights, optimizer state): allocated at time zero.
  std::vector<TensorId> initial_tensors;
  // Free-form provenance ("model": "llama3-70b", ...), carried into the timeline.
  std::vector<std::pair<std::string, std::string>> metadata;
  // Ranks that stand for others; empty when every rank of the plan is its own.
  std::vector<Representative> representatives;
  bool operator==(const Plan&) const = default;
};

// Validates structure: ids in range, no cycles (Boost.Graph topological sort over lane order and
// deps), frees match allocs, no double alloc/free, positive capacities, finite costs.
Status validate(const Plan& plan);

// The ops in an order that respects lane order and deps (the one validate() checked).
Result<std::vector<OpId>> topological_order(const Plan& plan);

// Identity of a lane when it is created (PlanBuilder::lane).
struct LaneIdentity {
  int rank = -1;
  int stage = -1;
  LaneRole role = LaneRole::kOther;
  bool operator==(const LaneIdentity&) const = default;
};

// The plan with every represented rank made explicit: for a representative R of multiplicity k
// and stride d, member R + i·d (i = 1..k-1) gets copies of R's lanes, HBM pool, tensors and ops,
// with p2p peers shifted to the same member offset of the peer's representative, p2p pair ids
// made unique, and collective groups unchanged (they list global ranks). Lanes without a rank and
// host pools are shared. Fails when a peer is not a representative of the same multiplicity.
Result<Plan> expand_representatives(const Plan& plan);

// Builds a Plan with names interned to ids. Lanes, resources and pools are created on first use
// of a name (with the identity given then) and reused after.
class PlanBuilder {
 public:
  LaneId lane(const std::string& name, LaneIdentity identity = {});
  ResourceId resource(const std::string& name, double capacity);
  PoolId pool(const std::string& name, std::int64_t capacity_bytes,
              PoolKind kind = PoolKind::kOther, int owner = -1);
  TensorId tensor(const std::string& name, PoolId pool, std::int64_t bytes,
                  TensorCategory category);
  OpId op(Op op);
  // Appends a default op and returns its id; fill it through op_at() (no copy of the op).
  OpId new_op();
  // Room for this many ops and tensors (e.g. models::estimate_plan_size's), so the plan grows
  // without moving what it holds.
  void reserve(std::size_t ops, std::size_t tensors);
  void initial(TensorId tensor);
  void metadata(const std::string& key, const std::string& value);
  void representative(Representative r) { plan_.representatives.push_back(r); }

  std::optional<LaneId> find_lane(const std::string& name) const;
  std::optional<ResourceId> find_resource(const std::string& name) const;
  std::optional<PoolId> find_pool(const std::string& name) const;
  Op& op_at(OpId id) { return plan_.ops[id.index()]; }
  const Plan& peek() const { return plan_; }

  Plan build() &&;

 private:
  Plan plan_;
  std::unordered_map<std::string, LaneId> lanes_;
  std::unordered_map<std::string, ResourceId> resources_;
  std::unordered_map<std::string, PoolId> pools_;
};

}  // namespace offsim::sim
