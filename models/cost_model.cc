#include "models/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "sim/plan/shape_math.h"

namespace offsim::models {

using sim::OpCost;
using sim::ResourceId;
using sim::ResourceUse;
using sim::platform::CalibrationProfile;
using sim::platform::System;

const char* to_string(CollectiveAlgorithm algorithm) {
  switch (algorithm) {
    case CollectiveAlgorithm::kRing:
      return "ring";
    case CollectiveAlgorithm::kTree:
      return "tree";
    case CollectiveAlgorithm::kNvls:
      return "nvls";
    case CollectiveAlgorithm::kNvlsTree:
      return "nvls_tree";
    case CollectiveAlgorithm::kNone:
      return "none";
  }
  return "?";
}

const char* to_string(NcclProtocol protocol) {
  switch (protocol) {
    case NcclProtocol::kLL:
      return "LL";
    case NcclProtocol::kLL128:
      return "LL128";
    case NcclProtocol::kSimple:
      return "Simple";
  }
  return "?";
}

namespace {

// Resource names of one rank's GPU and host, as the topology names them.
std::string gpu_prefix(const System& s, int rank) {
  return fmt::format("node{}.gpu{}", s.node_of(rank), s.local_gpu(rank));
}
std::string socket_prefix(const System& s, int rank) {
  return fmt::format("node{}.socket{}", s.node_of(rank), s.socket_of(rank));
}
std::string nic_prefix(const System& s, int rank) {
  return fmt::format("node{}.nic{}", s.node_of(rank),
                     s.local_gpu(rank) * s.nics_per_node / s.gpus_per_node);
}

sim::Duration seconds(double s) { return sim::duration_from_seconds(s); }

using RouteHops = std::vector<sim::platform::RouteHop>;

// Host-link route of local GPU g in `node`: d = 0 DRAM to GPU, d = 1 GPU to DRAM.
RouteHops host_route(const System& system, const sim::platform::Topology& topo, int node, int g,
                     int d) {
  const auto gpu = topo.gpu(node, g);
  const auto dram = topo.dram(node, system.socket_of(g));
  auto route = d == 0 ? topo.route(dram, gpu) : topo.route(gpu, dram);
  OFFSIM_CHECK_MSG(route.has_value(), "{}", route.has_value() ? "" : route.error().message);
  return std::move(route->hops);
}

bool has_nvlink(const System& system, const CalibrationProfile& profile) {
  return system.nvlink_domain_gpus > 1 && profile.nvlink.bytes_per_s_per_gpu.value > 0;
}

// One simulated rank as the census saw it: its multiplicity and resolved stride, and the names
// of its host-link route hops.
struct RankDemand {
  SimRank rank;
  std::vector<std::string> h2d, d2h;
};

// The first pass of CostModel::create: the resources the simulated ranks use, by name, with
// capacities merged over ranks (the largest wins when two representatives name the same
// instance), in registration order so that ids are deterministic.
//
// A resource family ("the rank's switch uplink") has for each represented rank the instance it
// uses and the capacity of one instance. The representative registers it under its own name
// with capacity × (distinct instances), so k flows share it as the real ranks do.
class ResourceCensus {
 public:
  ResourceCensus(const System& system, const CalibrationProfile& profile,
                 const sim::platform::Topology& topology)
      : system_(system), profile_(profile), topology_(topology) {
    // The routes of each local GPU in node 0; nodes are identical, so hop j of a GPU's route in
    // any node is the same link of that node.
    for (int g = 0; g < system.gpus_per_node; ++g) {
      for (int d = 0; d < 2; ++d) local_routes_[d].push_back(host_route(system, topology, 0, g, d));
    }
  }

  // Checks one simulated rank and adds its resource families.
  sim::Status add(const SimRank& given) {
    OFFSIM_ASSIGN_OR_RETURN(SimRank sr, resolve(given));
    std::vector<int> represented;
    for (int i = 0; i < sr.multiplicity; ++i) represented.push_back(sr.rank + i * sr.stride);
    RankDemand p{.rank = sr};
    add_host_links(p, represented, true);
    add_host_links(p, represented, false);
    add_gpu_and_network(sr, represented);
    auto& hp = host_pools_[system_.node_of(sr.rank)];
    hp.first += sr.multiplicity;
    for (int r : represented) hp.second.insert(system_.node_of(r));
    ranks_.push_back(std::move(p));
    return sim::ok();
  }

  void register_in(sim::PlanBuilder& builder) const {
    for (const std::string& name : order_) builder.resource(name, capacity_.at(name));
  }

  const std::vector<RankDemand>& ranks() const { return ranks_; }

  // The pinned pool of a node holds what its representatives allocate, each allocation standing
  // for `multiplicity` GPUs spread over the nodes they span: the pool gets the host memory of
  // those nodes divided by the GPUs one allocation stands for (exact when all representatives on
  // the pool share one multiplicity).
  std::int64_t pinned_pool_bytes(int node) const {
    const auto& [k_sum, nodes] = host_pools_.at(node);
    const int reps =
        static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(), [&](const RankDemand& q) {
          return system_.node_of(q.rank.rank) == node;
        }));
    const double host = static_cast<double>(system_.host_memory_bytes_per_node) *
                        static_cast<double>(nodes.size()) * reps / k_sum;
    return static_cast<std::int64_t>(host);
  }

 private:
  // The rank with its stride resolved (0: spread evenly over the world), after checking that it
  // and every rank it stands for exist and that it is listed once.
  sim::Result<SimRank> resolve(const SimRank& sr) const {
    const int world = system_.gpu_count();
    if (sr.rank < 0 || sr.rank >= world) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "cost model for {}: rank {} out of range (the system has {} GPUs)",
                       system_.name, sr.rank, world);
    }
    if (sr.multiplicity < 1) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "cost model: rank {} has multiplicity {}; expected >= 1", sr.rank,
                       sr.multiplicity);
    }
    if (std::any_of(ranks_.begin(), ranks_.end(),
                    [&](const RankDemand& q) { return q.rank.rank == sr.rank; })) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "cost model: rank {} is listed twice",
                       sr.rank);
    }
    const int k = sr.multiplicity;
    const int stride = sr.stride > 0 ? sr.stride : std::max(1, world / k);
    const std::int64_t last = sr.rank + static_cast<std::int64_t>(k - 1) * stride;
    if (last >= world) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "cost model for {}: rank {} with multiplicity {} and stride {} stands for "
                       "rank {}, beyond the {} GPUs of the system",
                       system_.name, sr.rank, k, stride, last, world);
    }
    return SimRank{.rank = sr.rank, .multiplicity = k, .stride = stride};
  }

  void want(const std::string& name, double cap) {
    auto [it, inserted] = capacity_.emplace(name, cap);
    if (inserted) {
      order_.push_back(name);
    } else {
      it->second = std::max(it->second, cap);
    }
  }

  // A resource family with one instance per key (node, index): capacity × distinct instances.
  template <class KeyOf>
  void family(const std::string& name, const std::vector<int>& represented, KeyOf key_of,
              double cap) {
    std::set<std::pair<int, int>> inst;
    for (int r : represented) inst.insert(key_of(r));
    want(name, cap * static_cast<double>(inst.size()));
  }

  // Routed host-link families: hop j of every represented rank's route. Nodes are identical, so
  // a rank's route is its local GPU's route in node 0 with the node index changed.
  void add_host_links(RankDemand& p, const std::vector<int>& represented, bool h2d) {
    const int rank = p.rank.rank;
    const auto& routes = local_routes_[h2d ? 0 : 1];
    const auto& mine = routes[static_cast<std::size_t>(system_.local_gpu(rank))];
    std::vector<std::set<std::pair<int, std::string_view>>> instances(mine.size());
    for (int r : represented) {
      const auto& hops = routes[static_cast<std::size_t>(system_.local_gpu(r))];
      OFFSIM_CHECK(hops.size() == mine.size());
      for (std::size_t j = 0; j < hops.size(); ++j) {
        instances[j].emplace(system_.node_of(r), hops[j].resource);
      }
    }
    // The representative's own route names the links of its node.
    const auto own =
        host_route(system_, topology_, system_.node_of(rank), system_.local_gpu(rank), h2d ? 0 : 1);
    OFFSIM_CHECK(own.size() == mine.size());
    for (std::size_t j = 0; j < mine.size(); ++j) {
      const std::string& name = own[j].resource;
      want(name, mine[j].bytes_per_s * static_cast<double>(instances[j].size()));
      (h2d ? p.h2d : p.d2h).push_back(name);
    }
  }

  // The rank's SMs and HBM bandwidth, its socket's CPU cores and its NVLink and NIC ports.
  void add_gpu_and_network(const SimRank& sr, const std::vector<int>& represented) {
    const int k = sr.multiplicity;
    const std::string rp = fmt::format("rank{}", sr.rank);
    want(rp + ".sm", 1.0 * k);
    want(rp + ".hbm_bw", profile_.gpu.hbm_achievable_bytes_per_s.value * k);
    family(
        socket_prefix(system_, sr.rank) + ".cpu", represented,
        [&](int r) { return std::pair(system_.node_of(r), system_.socket_of(r)); },
        profile_.host.cores_per_socket.value * profile_.host.adam_bytes_per_s_per_core.value);
    if (has_nvlink(system_, profile_)) {
      const double bw = profile_.nvlink.bytes_per_s_per_gpu.value;
      want(gpu_prefix(system_, sr.rank) + ".nvlink.tx", bw * k);
      want(gpu_prefix(system_, sr.rank) + ".nvlink.rx", bw * k);
    }
    if (system_.nodes > 1) {
      const double bw = profile_.inter_node.nic_bytes_per_s_per_gpu.value *
                        static_cast<double>(system_.gpus_per_node) / system_.nics_per_node;
      auto nic_of = [&](int r) {
        return std::pair(system_.node_of(r),
                         system_.local_gpu(r) * system_.nics_per_node / system_.gpus_per_node);
      };
      family(nic_prefix(system_, sr.rank) + ".tx", represented, nic_of, bw);
      family(nic_prefix(system_, sr.rank) + ".rx", represented, nic_of, bw);
    }
  }

  const System& system_;
  const CalibrationProfile& profile_;
  const sim::platform::Topology& topology_;
  std::vector<RouteHops> local_routes_[2];  // by direction (0: h2d), then local GPU
  std::unordered_map<std::string, double> capacity_;
  std::vector<std::string> order_;  // registration order: deterministic ids
  std::vector<RankDemand> ranks_;
  std::map<int, std::pair<int, std::set<int>>> host_pools_;  // node -> (k sum, nodes spanned)
};

}  // namespace

sim::Result<CostModel> CostModel::create(const System& system, const CalibrationProfile& profile,
                                         const std::vector<SimRank>& ranks,
                                         sim::PlanBuilder& builder) {
  OFFSIM_RETURN_IF_ERROR(sim::platform::validate(system));
  if (ranks.empty()) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "cost model for {}: no ranks to simulate",
                     system.name);
  }
  CostModel cm(system, profile, sim::platform::Topology::build(system, profile));
  ResourceCensus census(system, profile, cm.topology_);
  for (const SimRank& sr : ranks) OFFSIM_RETURN_IF_ERROR(census.add(sr));
  census.register_in(builder);

  auto id = [&](const std::string& name) {
    auto r = builder.find_resource(name);
    OFFSIM_CHECK_MSG(r.has_value(), "resource {} was not registered", name);
    return *r;
  };
  const auto hbm_bytes = static_cast<std::int64_t>(profile.gpu.hbm_usable_bytes.value);
  for (const RankDemand& p : census.ranks()) {
    const int r = p.rank.rank;
    RankResources rr{.multiplicity = p.rank.multiplicity};
    const std::string rp = fmt::format("rank{}", r);
    rr.sm = id(rp + ".sm");
    rr.hbm_bw = id(rp + ".hbm_bw");
    for (const auto& n : p.h2d) rr.h2d.push_back(id(n));
    for (const auto& n : p.d2h) rr.d2h.push_back(id(n));
    const std::string link =
        gpu_prefix(system, r) +
        (system.host_link == sim::platform::HostLinkKind::kNvlinkC2c ? ".c2c" : ".pcie");
    rr.link_h2d = id(link + ".h2d");
    rr.link_d2h = id(link + ".d2h");
    if (auto duplex = builder.find_resource(link + ".duplex")) rr.link_duplex = *duplex;
    rr.host_cpu = id(socket_prefix(system, r) + ".cpu");
    rr.host_dram = id(socket_prefix(system, r) + ".dram");
    if (has_nvlink(system, profile)) {
      rr.nvlink_tx = id(gpu_prefix(system, r) + ".nvlink.tx");
      rr.nvlink_rx = id(gpu_prefix(system, r) + ".nvlink.rx");
    }
    if (system.nodes > 1) {
      rr.nic_tx = id(nic_prefix(system, r) + ".tx");
      rr.nic_rx = id(nic_prefix(system, r) + ".rx");
    }
    rr.hbm_pool = builder.pool(rp + ".hbm", hbm_bytes, sim::PoolKind::kHbm, r);
    const int node = system.node_of(r);
    rr.host_pool = builder.pool(fmt::format("node{}.pinned", node), census.pinned_pool_bytes(node),
                                sim::PoolKind::kPinnedHost, node);
    cm.ranks_.emplace(r, std::move(rr));
  }
  const auto& resources = builder.peek().resources;
  cm.capacities_.resize(resources.size());
  for (std::size_t i = 0; i < resources.size(); ++i) cm.capacities_[i] = resources[i].capacity;
  return cm;
}

const CostModel::RankResources& CostModel::at(int rank) const {
  auto it = ranks_.find(rank);
  OFFSIM_CHECK_MSG(it != ranks_.end(), "rank {} is not a simulated rank of the cost model", rank);
  return it->second;
}

double CostModel::peak_flops(sim::DType dtype) const { return profile_.gpu.dense_flops(dtype); }

sim::PoolId CostModel::hbm_pool(int rank) const { return at(rank).hbm_pool; }
sim::PoolId CostModel::host_pool(int rank) const { return at(rank).host_pool; }

sim::Duration CostModel::alone(const OpCost& cost) const {
  double rate = cost.max_rate;
  for (const ResourceUse& u : cost.uses) {
    OFFSIM_CHECK(u.resource.index() < capacities_.size());
    if (u.per_unit > 0.0) {
      rate = std::min(rate, capacities_[u.resource.index()] /
                                (u.per_unit * static_cast<double>(cost.multiplicity)));
    }
  }
  if (cost.work <= 0.0) return cost.latency;
  OFFSIM_CHECK(rate > 0.0 && std::isfinite(rate));
  return cost.latency + sim::duration_from_seconds(cost.work / rate);
}

// A kernel: `flops` at `flops_per_s` on the SMs and `hbm_bytes` through HBM, a roofline through
// the two resources.
static OpCost kernel(const CostModel& cm, int multiplicity, ResourceId sm, ResourceId hbm,
                     double flops, double flops_per_s, double hbm_bytes) {
  OpCost c;
  c.multiplicity = multiplicity;
  c.latency = seconds(cm.profile().gpu.kernel_launch_s.value);
  if (flops <= 0.0) return c;
  c.work = flops;
  c.max_rate = flops_per_s;
  c.uses.reserve(2);  // one allocation for both uses
  c.uses.push_back({sm, 1.0 / flops_per_s});
  if (hbm_bytes > 0.0) c.uses.push_back({hbm, hbm_bytes / flops});
  return c;
}

namespace {

std::size_t mix(std::size_t h, std::uint64_t v) {
  // 64-bit multiply-xorshift (the finaliser of MurmurHash3) folded into the running hash.
  v ^= v >> 33;
  v *= 0xff51afd7ed558ccdULL;
  v ^= v >> 33;
  return (h ^ static_cast<std::size_t>(v)) * 0x9e3779b97f4a7c15ULL;
}

}  // namespace

std::size_t CostModel::KeyHash::operator()(const GemmKey& k) const {
  std::size_t h = mix(0, static_cast<std::uint64_t>(k.rank));
  h = mix(h, static_cast<std::uint64_t>(k.shape.m));
  h = mix(h, static_cast<std::uint64_t>(k.shape.n));
  h = mix(h, static_cast<std::uint64_t>(k.shape.k));
  h = mix(h, static_cast<std::uint64_t>(k.shape.batch));
  return mix(h, static_cast<std::uint64_t>(k.shape.dtype) * 2 + (k.shape.grouped ? 1 : 0));
}

std::size_t CostModel::KeyHash::operator()(const CollectiveArgs& k) const {
  std::size_t h = mix(0, static_cast<std::uint64_t>(k.rank));
  h = mix(h, static_cast<std::uint64_t>(k.kind));
  h = mix(h, static_cast<std::uint64_t>(k.bytes));
  for (int r : *k.group) h = mix(h, static_cast<std::uint64_t>(r));
  return h;
}

std::size_t CostModel::KeyHash::operator()(const CollectiveKey& k) const {
  return (*this)(CollectiveArgs{k.rank, k.kind, k.bytes, &k.group});
}

bool CostModel::KeyEqual::operator()(const CollectiveKey& a, const CollectiveArgs& b) const {
  return a.rank == b.rank && a.kind == b.kind && a.bytes == b.bytes && a.group == *b.group;
}

OpCost CostModel::gemm(int rank, const sim::GemmShape& shape) const {
  const GemmKey key{rank, shape};
  if (auto it = gemm_memo_.find(key); it != gemm_memo_.end()) return it->second;
  OpCost c = gemm_uncached(rank, shape);
  gemm_memo_.emplace(key, c);
  return c;
}

OpCost CostModel::gemm_uncached(int rank, const sim::GemmShape& shape) const {
  const RankResources& rr = at(rank);
  const double flops = sim::gemm_flops(shape);
  const double rate = profile_.gemm.efficiency(shape) * peak_flops(shape.dtype);
  // A, B read and C written once (what a well-tiled GEMM moves at least); an FP8 GEMM writes bf16.
  return kernel(*this, rr.multiplicity, rr.sm, rr.hbm_bw, flops, rate, sim::gemm_bytes(shape));
}

// Host figures of the framework's launch path, measured on bare-metal Linux with an RTX 3090
// and a Xeon host (jingyaogong/minimind pull request 837, comment of 2026-09-03, `bench_moe.py
// --mode sync-probe`): one eager PyTorch op costs 9.02 us of host time from Python to its
// launch, one device-to-host round trip (a .item()-style read that waits for the stream)
// 26.11 us. A backward node is charged as one eager op: assumption. The autograd engine runs the
// node in C++ (pytorch/pytorch issue 41383: about 1 us of C++ dispatch per op against 2 us from
// Python), but Megatron-Core's and Transformer Engine's layers are torch.autograd.Functions whose
// backward is Python code that issues the same kind of calls as their forward. Not fitted to any
// table.
constexpr double kEagerOpIssueS = 9.02e-6;
constexpr double kAutogradOpIssueS = kEagerOpIssueS;
constexpr double kDeviceToHostRoundTripS = 26.11e-6;

// What one simulated op costs a training framework's host thread, in units of the bare eager op
// above: FITTED, to the eager step of Megatron-Bridge's CUDA-graph measurement
// (skills/perf-techniques/cuda-graphs/card.yaml: Qwen3-30B-A3B, TP2 PP2 EP4 on two DGX H100
// nodes, 623 ms per step without graphs, 484 ms with Transformer Engine graphs of attn,
// moe_router and moe_preprocess; validation table 19), the one published pair that isolates host
// time: the graphs change no GPU work. A simulated op stands for a framework module call (a
// Transformer Engine linear, norm or attention module, an autograd Function's backward, with
// their hooks and checks), not for one bare PyTorch call; the bare figure left that step
// GPU-bound (502 ms). 3.47 x 9.02 = 31.3 us per op on x86 and 86.1 us on Grace, against the
// measured CPU time of one BF16 te.Linear forward: 99.66 us on GB200 and 99.66 / 2.75 = 36.2 us at
// the 8480C's speed (NVIDIA/TransformerEngine issue 2053): within 14% of a module call, which
// is what the fit says an op is. (3.64 until the all-to-all dispatcher's sort of the received
// tokens by local expert was priced as the copy it is, 2026-12-07: the same fit, redone.) Scored on
// every other table (docs/validation.md), not on 19.
constexpr double kFrameworkOpScale = 3.47;

// Host time of a grouped linear per local expert (Transformer Engine's Python and C++ work that
// scales with the expert count: per-expert weight and weight-gradient tensors, their allocation
// and release, quantizers and scale pointers, the GEMM launches). Measured by Transformer Engine's
// maintainers on one GB200 (NVIDIA/TransformerEngine issue 2897, 2026-04-16): the grouped MLP
// block (fc1, SwiGLU, fc2; MXFP8) with 64 experts and hidden size 128, i.e. with negligible GPU
// work, costs ~1.2 ms of CPU time forward and ~2.1 ms backward; itemised, the largest parts are
// the per-expert wgrad allocations (350 us), clear_tensor_data (200 us), scale pointers (>100 us)
// and weight quantizers (90 us). Divided evenly: per expert, a forward grouped GEMM (fc1 or fc2)
// 1.2 ms / (64 x 2) and a backward one (dgrad or wgrad of fc1 or fc2) 2.1 ms / (64 x 4). The
// block's few fixed calls (under 0.1 ms of the 1.2 ms) are charged again as eager ops: an
// overcount of under 8%. Assumptions: the figure holds for the unfused GroupedLinear the rows
// run (the issue asks for the same optimisations there; TE issue 1499 names its per-GEMM
// torch.split / torch.empty calls), for BF16 as for MXFP8 (the quantizer items, about 6% of the
// total, do not apply), and on x86 hosts as on Grace. Not fitted to any table.
constexpr double kGroupedMlpFwdHostS = 1.2e-3;
constexpr double kGroupedMlpBwdHostS = 2.1e-3;
constexpr double kGroupedMlpMeasuredExperts = 64.0;
constexpr double kExpertFwdIssueS = kGroupedMlpFwdHostS / (kGroupedMlpMeasuredExperts * 2.0);
constexpr double kExpertBwdIssueS = kGroupedMlpBwdHostS / (kGroupedMlpMeasuredExperts * 4.0);

// The host CPU sets the pace of the issue thread (one Python thread per rank, so one core's
// speed). The figures above come from two kinds of host: the per-op ones from an x86 Xeon, the
// per-expert one from GB200's Grace. The same PyTorch call costs Grace more host time: the
// average CPU time of one BF16 torch.nn.Linear forward (hidden 2048, 8192 tokens) is 37.08 us on
// GB200 and 33.17 us on GH200 against 13.48 us on a DGX H100's Xeon Platinum 8480C; Transformer
// Engine's te.Linear 99.66 us and 90.53 us on the two Grace systems (NVIDIA/TransformerEngine
// issue 2053, 2025-08-11, "High CPU overhead on Grace systems"). So a Grace host (every
// NVLink-C2C system) issues at kGraceIssueRatio = 37.08 / 13.48 times an x86 host's time, the
// GB200 measurement (GH200's gives 2.46: the spread of the figure), and the per-expert figure
// measured on GB200 is divided by it on x86 hosts. Assumption: every x86 host of the catalogue
// (Sapphire/Emerald Rapids, Granite Rapids, EPYC) and the minimind Xeon issue at the 8480C's
// speed. Not fitted to any table.
constexpr double kGraceLinearCpuS = 37.08e-6;
constexpr double kXeon8480cLinearCpuS = 13.48e-6;
constexpr double kGraceIssueRatio = kGraceLinearCpuS / kXeon8480cLinearCpuS;

double CostModel::host_issue_s(const HostOps& ops) const {
  const bool grace = system_.host_link == sim::platform::HostLinkKind::kNvlinkC2c;
  // Per-op figures measured on x86, the per-expert one on Grace.
  const double x86_figure = grace ? kGraceIssueRatio : 1.0;
  const double grace_figure = grace ? 1.0 : 1.0 / kGraceIssueRatio;
  const double per_expert = ops.autograd > 0.0 ? kExpertBwdIssueS : kExpertFwdIssueS;
  return x86_figure * kFrameworkOpScale *
             (ops.eager * kEagerOpIssueS + ops.autograd * kAutogradOpIssueS) +
         grace_figure * ops.launches * per_expert;
}

sim::Duration CostModel::host_sync_latency() const {
  return sim::duration_from_seconds(kDeviceToHostRoundTripS);
}

OpCost CostModel::grouped_gemm(int rank, const std::vector<sim::GemmShape>& groups,
                               int streams) const {
  const RankResources& rr = at(rank);
  double flops = 0.0;
  double seconds_total = 0.0;
  double bytes = 0.0;
  // Seconds of `count` GEMMs of shape g run `width` at a time.
  const auto seconds_of = [&](const sim::GemmShape& g, std::int64_t count, std::int64_t width) {
    sim::GemmShape w = g;
    w.batch = width;
    const double one = sim::gemm_flops(w) / static_cast<double>(width);
    return static_cast<double>(count) * one / (profile_.gemm.efficiency(w) * peak_flops(g.dtype));
  };
  std::int64_t experts = 0;
  for (const sim::GemmShape& g : groups) experts += std::max<std::int64_t>(g.batch, 0);
  const std::int64_t width = std::min<std::int64_t>(std::max(streams, 0), experts);
  // With streams: the last round's experts (the last group's last ones, in issue order).
  std::int64_t last_round = width > 0 ? experts % width : 0;
  for (auto it = groups.rbegin(); it != groups.rend(); ++it) {
    const sim::GemmShape& g = *it;
    if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0) continue;
    flops += sim::gemm_flops(g);
    bytes += sim::gemm_bytes(g);
    if (width == 0) {
      // One kernel over every expert's tiles: each group's waves as if all were of its shape.
      seconds_total += seconds_of(g, g.batch, experts);
      continue;
    }
    const std::int64_t tail = std::min(last_round, g.batch);
    if (tail > 0) seconds_total += seconds_of(g, tail, last_round);
    if (g.batch > tail) seconds_total += seconds_of(g, g.batch - tail, width);
    last_round = 0;
  }
  if (flops <= 0.0) return kernel(*this, rr.multiplicity, rr.sm, rr.hbm_bw, 0.0, 1.0, 0.0);
  OpCost c = kernel(*this, rr.multiplicity, rr.sm, rr.hbm_bw, flops, flops / seconds_total, bytes);
  // One kernel per expert: each stream runs ceil(experts / width) of them back to back, each
  // after the profile's gap between kernels in one stream.
  if (width > 0) c.latency = c.latency * ((experts + width - 1) / width);
  return c;
}

double CostModel::attention_flops(const sim::AttentionShape& a) {
  // QK^T and PV: 2 GEMMs of 2·seq_q·seq_kv·head_dim per head; causal masking skips half.
  double fwd = 4.0 * static_cast<double>(a.batch) * static_cast<double>(a.heads) *
               static_cast<double>(a.seq_q) * static_cast<double>(a.seq_kv) *
               static_cast<double>(a.head_dim);
  if (a.causal) fwd *= 0.5;
  // Backward: dV, dP, dQ, dK (4 GEMMs) plus recomputing QK^T (flash): 5 GEMMs = 2.5 × forward.
  return a.backward ? 2.5 * fwd : fwd;
}

OpCost CostModel::attention(int rank, const sim::AttentionShape& a, ModelArch::AttentionImpl impl,
                            bool dropout) const {
  const RankResources& rr = at(rank);
  if (impl == ModelArch::AttentionImpl::kClassic) return classic_attention(rr, a, dropout);
  const auto& e = profile_.attention;
  const double seq = static_cast<double>(a.seq_kv);
  const double eff = impl == ModelArch::AttentionImpl::kFlash2 ? e.flash2(a.backward, seq)
                                                               : e.flash(a.backward, seq);
  const double rate = eff * peak_flops(a.dtype);
  const double esize = static_cast<double>(sim::dtype_bytes(a.dtype));
  const double b = static_cast<double>(a.batch);
  const double q_elems = b * static_cast<double>(a.heads * a.seq_q * a.head_dim);
  const double kv_elems = b * static_cast<double>(a.kv_heads * a.seq_kv * a.head_dim);
  // Forward reads Q, K, V and writes O; backward reads Q, K, V, O, dO and writes dQ, dK, dV.
  const double bytes = a.backward ? (4.0 * q_elems + 4.0 * kv_elems) * esize
                                  : (2.0 * q_elems + 2.0 * kv_elems) * esize;
  return kernel(*this, rr.multiplicity, rr.sm, rr.hbm_bw, attention_flops(a), rate, bytes);
}

ClassicAttentionTime CostModel::classic_attention_time(const sim::AttentionShape& a,
                                                       bool dropout) const {
  ClassicAttentionTime out;
  const double esize = static_cast<double>(sim::dtype_bytes(a.dtype));
  const double peak = peak_flops(a.dtype);
  const double hbm = profile_.gpu.hbm_peak_bytes_per_s.value;
  const std::int64_t bh = std::max<std::int64_t>(a.batch, 1) * a.heads;
  const double cap =
      a.backward ? profile_.attention.classic_bwd.value : profile_.attention.classic_fwd.value;
  // One batched GEMM (torch.baddbmm / bmm over batch·heads): at the GEMM surface's efficiency for
  // its shape (capped by the profile's classic-attention figure), or at the memory-bound rate of
  // its operands when they dominate.
  const auto bmm = [&](std::int64_t m, std::int64_t n, std::int64_t k) {
    const sim::GemmShape g{.m = m, .n = n, .k = k, .batch = bh, .dtype = a.dtype};
    const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) *
                         static_cast<double>(k) * static_cast<double>(bh);
    const double io = static_cast<double>(m * k + k * n + m * n) * static_cast<double>(bh) * esize;
    const double eff = std::min(cap, profile_.gemm.efficiency(g));
    out.flops += flops;
    out.bytes += io;
    out.seconds +=
        std::max(flops / (eff * peak), io / (profile_.memory_bound_efficiency(io) * hbm));
    ++out.kernels;
  };
  // One memory-bound pass over the score matrix (or another tensor) of `bytes`.
  const auto pass = [&](double bytes) {
    out.bytes += bytes;
    out.seconds += bytes / (profile_.memory_bound_efficiency(bytes) * hbm);
    ++out.kernels;
  };
  const std::int64_t sq = a.seq_q;
  const std::int64_t skv = a.seq_kv;
  const std::int64_t d = a.head_dim;
  // The whole s_q × s_kv product is computed: the causal mask is applied to the scores, nothing
  // is skipped.
  const double scores =
      static_cast<double>(bh) * static_cast<double>(sq) * static_cast<double>(skv) * esize;
  const double mask = scores / esize;  // one byte per score
  // The context's [b·heads, s, d] -> [s, b, heads·d] copy (permute + contiguous), and its
  // gradient's in the backward: read and written once.
  const double context = 2.0 * static_cast<double>(bh * sq * d) * esize;
  if (!a.backward) {
    bmm(sq, skv, d);                         // S = Q K^T
    pass(2.0 * scores);                      // fused scale + mask + softmax: read S, write P
    if (dropout) pass(2.0 * scores + mask);  // read P, write dropped P and its mask
    bmm(sq, d, skv);                         // O = P V
    pass(context);
  } else {
    pass(context);
    bmm(skv, d, sq);                         // dV = P^T dO
    bmm(sq, skv, d);                         // dP = dO V^T
    if (dropout) pass(2.0 * scores + mask);  // read dP and the mask, write the gradient
    pass(3.0 * scores);                      // softmax backward: read dP and P, write dS
    bmm(sq, d, skv);                         // dQ = dS K
    bmm(skv, d, sq);                         // dK = dS^T Q
  }
  return out;
}

OpCost CostModel::classic_attention(const RankResources& rr, const sim::AttentionShape& a,
                                    bool dropout) const {
  const ClassicAttentionTime t = classic_attention_time(a, dropout);
  // The kernels run one after another: one flow at the average rate, holding the SMs throughout
  // and moving all the bytes through HBM; each kernel after the first adds a launch gap.
  OpCost c =
      kernel(*this, rr.multiplicity, rr.sm, rr.hbm_bw, t.flops, t.flops / t.seconds, t.bytes);
  c.latency += seconds(profile_.gpu.kernel_launch_s.value * (t.kernels - 1));
  return c;
}

OpCost CostModel::memory_bound(int rank, std::int64_t hbm_bytes, double flops) const {
  const RankResources& rr = at(rank);
  OpCost c;
  c.multiplicity = rr.multiplicity;
  c.latency = seconds(profile_.gpu.kernel_launch_s.value);
  if (hbm_bytes <= 0) {
    if (flops <= 0.0) return c;
    // Pure arithmetic with no traffic: at the fp32 rate.
    return kernel(*this, rr.multiplicity, rr.sm, rr.hbm_bw, flops, peak_flops(sim::DType::kFp32),
                  0.0);
  }
  const double bytes = static_cast<double>(hbm_bytes);
  double rate = profile_.memory_bound_efficiency(bytes) * profile_.gpu.hbm_peak_bytes_per_s.value;
  if (flops > 0.0) rate = std::min(rate, peak_flops(sim::DType::kFp32) * bytes / flops);
  c.work = bytes;
  c.max_rate = rate;
  c.uses.push_back({rr.sm, 1.0 / rate});
  c.uses.push_back({rr.hbm_bw, 1.0});
  return c;
}

OpCost CostModel::copy(int rank, sim::CopyDirection dir, std::int64_t bytes, bool pinned) const {
  const RankResources& rr = at(rank);
  const auto& hl = profile_.host_link;
  OpCost c;
  c.multiplicity = rr.multiplicity;
  c.latency = seconds(hl.submit_overhead_s.value + hl.latency_s.value);
  if (bytes <= 0) return c;
  c.work = static_cast<double>(bytes);
  switch (dir) {
    case sim::CopyDirection::kH2D:
    case sim::CopyDirection::kD2H: {
      const bool h2d = dir == sim::CopyDirection::kH2D;
      c.max_rate = pinned ? (h2d ? hl.h2d_bytes_per_s.value : hl.d2h_bytes_per_s.value)
                          : hl.pageable_bytes_per_s.value;
      for (ResourceId id : h2d ? rr.h2d : rr.d2h) c.uses.push_back({id, 1.0});
      c.uses.push_back({rr.hbm_bw, profile_.interference.copy_hbm_bytes_per_byte.value});
      break;
    }
    case sim::CopyDirection::kD2D:
      // Read and write in HBM by the copy engine.
      c.max_rate = profile_.gpu.hbm_achievable_bytes_per_s.value / 2.0;
      c.uses.push_back({rr.hbm_bw, 2.0});
      break;
    case sim::CopyDirection::kH2H:
      c.max_rate = profile_.host.dram_bytes_per_s_per_socket.value / 2.0;
      c.uses.push_back({rr.host_dram, 2.0});
      break;
  }
  return c;
}

namespace {

// NCCL's own cost model of a collective, with the default constants of its tuner (NVIDIA/nccl
// src/graph/tuning.cc, 2.2x releases: baseLat, hwLat, the per-protocol bandwidth refinements of
// ncclTopoTuneModel and ncclTopoGetAlgoTime). Each (algorithm, protocol) costs
//   latency = base + Σ steps × per-step latency of the link the step crosses
//   time    = latency + bytes / (protocol share × algorithm bandwidth)
// and NCCL runs the one of least time. Microseconds. The per-channel caps (llMaxBws,
// perChMax*Bws) depend on the channel count NCCL's topology search finds and are not modelled;
// the profile's measured large-message bus bandwidth stands for Simple's.
struct NcclProtocolModel {
  NcclProtocol protocol;
  double ring_base_us;     // baseLat[Ring]
  double tree_base_us;     // baseLat[Tree]
  double ring_step_us[3];  // hwLat[link][Ring], link = NVLink, PCI, network
  double tree_step_us[3];  // hwLat[link][Tree]
  double ring_share;       // ring busBw × 0.5 (LL), × 0.92 (LL128: 120 of 128 bytes)
  double tree_share;       // tree busBw × 1/3.8 (LL), × 120/128 (LL128 across nodes)
};
constexpr int kNvlinkStep = 0;
constexpr int kPciStep = 1;
constexpr int kNetStep = 2;
constexpr NcclProtocolModel kNcclProtocols[] = {
    {NcclProtocol::kLL, 6.6, 6.8, {0.6, 1.0, 2.7}, {0.6, 1.0, 5.0}, 0.5, 1.0 / 3.8},
    {NcclProtocol::kLL128, 14.0, 14.0, {1.9, 2.5, 4.0}, {1.25, 1.9, 8.5}, 0.92, 120.0 / 128.0},
    {NcclProtocol::kSimple, 8.4, 8.4, {3.4, 5.7, 14.0}, {4.0, 4.0, 14.0}, 1.0, 1.0}};
// NVLink SHARP: one step through the switch (hwLat[NVLink][NVLS], Simple only, baseLat 0).
constexpr double kNcclNvlsStepUs = 25.0;
// NVLink SHARP inside each domain and a tree across them (NVLSTree, all-reduce only, Simple):
// baseLat 0, the NVLink step 25 us, then 2 · log2(units) network steps of hwLat[NET][NVLSTree]
// = 20.9 us.
constexpr double kNcclNvlsTreeNetStepUs = 20.9;
// Tree all-reduce bus bandwidth: busBw × 0.92; the tree's algorithm bandwidth is half of it.
constexpr double kNcclTreeAllReduceShare = 0.92;
// Inter-node rings launch each step through the network proxy: at least getNetOverhead's
// default 1 µs per step (x86 Intel and other hosts; 3 µs for Simple).
constexpr double kNcclNetOverheadUs = 1.0;
// Ring Simple all-reduce across nodes: latency × 1.4 on compute capability 8.0 and newer
// ("plateau effect of ring").
constexpr double kNcclRingPlateau = 1.4;
// Tree all-reduce bandwidth correction by message size (treeCorrectionFactor; powers of two
// of bytes/64, from 64 B to 256 MiB) for LL, LL128 and Simple.
constexpr double kNcclTreeCorrection[3][23] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7,  .7,  .7,  .6, .5,
     .4,  .4,  .5,  .6,  .7, .8, .9, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7,  .6, .6,
     .6,  .6,  .6,  .6,  .8,  .9, .9, .9, .9, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9}};

int floor_log2(double x) { return x < 1.0 ? -1 : static_cast<int>(std::floor(std::log2(x))); }

double tree_correction(NcclProtocol protocol, double bytes) {
  const int log_size = floor_log2(std::floor(bytes / 64.0));
  if (log_size < 0 || log_size >= 23) return 1.0;
  return kNcclTreeCorrection[static_cast<int>(protocol)][log_size];
}

// The collective's shape as the tuner sees it.
struct CollectiveShape {
  bool all_reduce = false;
  int ranks = 0;
  int units = 1;  // NVLink domains (or nodes) the group spans
  int intra_step = kNvlinkStep;
  double bytes = 0.0;
  double floor_s = 0.0;  // the profile's small-message latency
};

// Keeps the (algorithm, protocol) of least latency + bytes / bandwidth.
class FastestPlan {
 public:
  FastestPlan(CollectivePlan& plan, const CollectiveShape& shape) : plan_(plan), shape_(shape) {}
  void consider(CollectiveAlgorithm algorithm, NcclProtocol protocol, double latency_us,
                double alg_bytes_per_s) {
    if (alg_bytes_per_s <= 0.0) return;
    const double lat = std::max(shape_.floor_s, latency_us * 1e-6);
    const double t = lat + shape_.bytes / alg_bytes_per_s;
    if (best_ >= 0.0 && t >= best_) return;
    best_ = t;
    plan_.algorithm = algorithm;
    plan_.protocol = protocol;
    plan_.alg_bytes_per_s = alg_bytes_per_s;
    plan_.latency = seconds(lat);
  }

 private:
  CollectivePlan& plan_;
  const CollectiveShape& shape_;
  double best_ = -1.0;
};

// Inside one NVLink domain (or one node's PCIe): ring LL / LL128 / Simple, and NVLink SHARP for
// all-reduce when `nvls_alg` > 0.
void plan_in_domain(CollectivePlan& plan, const CollectiveShape& s, double ring_alg,
                    double nvls_alg) {
  FastestPlan best(plan, s);
  const double steps = (s.all_reduce ? 2.0 : 1.0) * (s.ranks - 1);
  for (const NcclProtocolModel& p : kNcclProtocols) {
    best.consider(CollectiveAlgorithm::kRing, p.protocol,
                  p.ring_base_us + steps * p.ring_step_us[s.intra_step], p.ring_share * ring_alg);
  }
  if (nvls_alg > 0.0) {
    best.consider(CollectiveAlgorithm::kNvls, NcclProtocol::kSimple, kNcclNvlsStepUs, nvls_alg);
  }
}

// Across domains: a ring whose 2(m-1) (all-reduce) or m-1 steps cross the network, and for
// all-reduce a tree (a chain inside each domain, a binary tree across them, up and down) and,
// when `nvls_tree_bus` > 0, NVLSTree at that bus bandwidth.
void plan_across_domains(CollectivePlan& plan, const CollectiveShape& s, double inter_bus,
                         double nvls_tree_bus) {
  FastestPlan best(plan, s);
  const int ppn = std::max(1, s.ranks / s.units);
  const double steps = (s.all_reduce ? 2.0 : 1.0) * (s.ranks - 1);
  const double inter_steps = (s.all_reduce ? 2.0 : 1.0) * (s.units - 1);
  const double ring_alg = inter_bus / plan.bus_bytes_per_byte;
  for (const NcclProtocolModel& p : kNcclProtocols) {
    const bool simple = p.protocol == NcclProtocol::kSimple;
    const double intra =
        std::max(p.ring_step_us[s.intra_step], kNcclNetOverheadUs * (simple ? 3.0 : 1.0));
    // With one rank per domain every step is exposed: the tree's network latency.
    const double inter = ppn == 1 ? p.tree_step_us[kNetStep] : p.ring_step_us[kNetStep];
    double lat = p.ring_base_us + (steps - inter_steps) * intra + inter_steps * inter;
    if (s.all_reduce && simple) lat *= kNcclRingPlateau;
    best.consider(CollectiveAlgorithm::kRing, p.protocol, lat, p.ring_share * ring_alg);
  }
  if (!s.all_reduce) return;
  const double levels = floor_log2(static_cast<double>(s.units));
  if (nvls_tree_bus > 0.0) {
    // NCCL converts NVLSTree's bus bandwidth to algorithm bandwidth as a ring's: n / (2(n-1)).
    best.consider(CollectiveAlgorithm::kNvlsTree, NcclProtocol::kSimple,
                  kNcclNvlsStepUs + 2.0 * levels * kNcclNvlsTreeNetStepUs,
                  nvls_tree_bus / plan.bus_bytes_per_byte);
  }
  for (const NcclProtocolModel& p : kNcclProtocols) {
    const double lat = p.tree_base_us + 2.0 * ((ppn - 1) * p.tree_step_us[s.intra_step] +
                                               levels * p.tree_step_us[kNetStep]);
    const double alg = 0.5 * kNcclTreeAllReduceShare * p.tree_share * inter_bus *
                       tree_correction(p.protocol, s.bytes);
    best.consider(CollectiveAlgorithm::kTree, p.protocol, lat, alg);
  }
}

}  // namespace

std::map<int, int> CostModel::ranks_by_unit(const std::vector<int>& group) const {
  const bool nvlink = has_nvlink(system_, profile_);
  std::map<int, int> out;
  for (int r : group) ++out[nvlink ? system_.nvlink_domain_of(r) : system_.node_of(r)];
  return out;
}

CollectivePlan CostModel::plan_collective(sim::CollectiveKind kind, const std::vector<int>& group,
                                          std::int64_t bytes) const {
  CollectivePlan plan;
  const int n = static_cast<int>(group.size());
  if (n <= 1 || bytes <= 0) return plan;
  const auto& nv = profile_.nvlink;
  const bool has_nvlink = models::has_nvlink(system_, profile_);
  const std::map<int, int> ranks_of_unit = ranks_by_unit(group);
  const int spans = static_cast<int>(ranks_of_unit.size());
  plan.crosses_nodes = spans > 1;
  const double nd = static_cast<double>(n);

  double bus = 0.0;  // achievable bus bandwidth of a ring inside a unit
  switch (kind) {
    case sim::CollectiveKind::kAllReduce:
      plan.bus_bytes_per_byte = 2.0 * (nd - 1.0) / nd;
      bus = nv.ring_all_reduce_bus_bytes_per_s.value;
      break;
    case sim::CollectiveKind::kAllGather:
      plan.bus_bytes_per_byte = (nd - 1.0) / nd;
      bus = nv.ring_all_gather_bus_bytes_per_s.value;
      break;
    case sim::CollectiveKind::kReduceScatter:
      plan.bus_bytes_per_byte = (nd - 1.0) / nd;
      bus = nv.ring_reduce_scatter_bus_bytes_per_s.value;
      break;
    case sim::CollectiveKind::kBroadcast:
      // A pipelined ring broadcast sends the buffer once per rank.
      plan.bus_bytes_per_byte = 1.0;
      bus = nv.ring_all_gather_bus_bytes_per_s.value;
      break;
    case sim::CollectiveKind::kAllToAll:
      plan.bus_bytes_per_byte = (nd - 1.0) / nd;
      bus = nv.ring_all_gather_bus_bytes_per_s.value;
      break;
  }
  const bool all_reduce = kind == sim::CollectiveKind::kAllReduce;
  const CollectiveShape shape{.all_reduce = all_reduce,
                              .ranks = n,
                              .units = spans,
                              .intra_step = has_nvlink ? kNvlinkStep : kPciStep,
                              .bytes = static_cast<double>(bytes),
                              .floor_s = nv.latency_s.value};
  const double nvls = nv.nvls_all_reduce_bus_bytes_per_s.value;
  if (!plan.crosses_nodes) {
    // NVLink SHARP: the switch reduces; nccl-tests report its bus bandwidth with the ring
    // factor 2(n-1)/n, so algorithm bandwidth = busbw · n / (2(n-1)).
    const bool sharp = all_reduce && has_nvlink && nvls > 0.0 && n > 2;
    plan_in_domain(plan, shape, bus / plan.bus_bytes_per_byte,
                   sharp ? nvls / plan.bus_bytes_per_byte : 0.0);
    return plan;
  }
  // Across units: NCCL builds one ring per channel and lets the channels leave a unit through
  // different NICs (each ring exits through the NIC nearest its last GPU in the unit), so the
  // ring's bus bandwidth is the per-GPU NIC rate × efficiency × the group's ranks in a unit
  // (their share of the unit's NICs, however many GPUs share a NIC), capped by the ring inside
  // the unit; the unit with the fewest ranks bounds the ring. NVIDIA's measurements: DGX A100,
  // 8 × 200 Gb/s HDR, 192 GB/s all-reduce busbw (NVIDIA/nccl #812); "on 3+ nodes ...
  // reflecting the total NIC bandwidth ... 24 [GB/s per NIC] on perfect setups"
  // (NVIDIA/nccl-tests #160). An all-to-all sends each rank's off-unit share through the rank's
  // own NIC (see below).
  const double nic =
      profile_.inter_node.nic_bytes_per_s_per_gpu.value * profile_.inter_node.efficiency.value;
  int fewest = n;
  for (const auto& [unit, count] : ranks_of_unit) fewest = std::min(fewest, count);
  const bool spread = kind != sim::CollectiveKind::kAllToAll;
  plan.ranks_per_unit = spread ? fewest : 1;
  plan.nic_bytes_per_byte = plan.bus_bytes_per_byte / plan.ranks_per_unit;
  double inter = nic * plan.ranks_per_unit;
  if (!spread) {
    // An all-to-all: of its buffer, a rank sends (n - m)/n off its unit (m: the group's ranks
    // there) through its own NIC while the rest crosses NVLink, and the network part sets the
    // time; nccl-tests' bus bandwidth, algbw × (n-1)/n, is then the NIC rate × (n-1)/(n-m): "the
    // portion that's going through the network will determine the global time ... On 2 nodes,
    // 50% of the traffic is inter-node so you should see BusBW = 2x network bandwidth per GPU
    // ... N/(N-1)x the bandwidth per GPU, N being the number of nodes" (sjeaugey, NVIDIA/nccl-tests
    // issue 130). The unit with the fewest of the group's ranks sends the largest share.
    plan.nic_bytes_per_byte = (nd - fewest) / nd;
    inter = nic * plan.bus_bytes_per_byte / plan.nic_bytes_per_byte;
  }
  // NVLSTree (all-reduce, NCCL 2.18 and later on NVLink SHARP systems): NVLink SHARP reduces
  // inside each domain, a tree of NIC channels joins the domains. NCCL's tuner
  // (src/graph/tuning.cc) takes per channel min(NVLS intra bandwidth, inter bandwidth × 2 when
  // there are at most 2 nodes); here the intra part is the profile's measured single-domain
  // NVLS busbw, the inter part the NICs of the group's ranks, as for the ring. Like NVLS inside
  // a domain, it needs more than 2 ranks per domain.
  const bool nvls_tree = all_reduce && has_nvlink && nvls > 0.0 && plan.ranks_per_unit > 2;
  const double nvls_tree_bus = nvls_tree ? std::min(nvls, inter * (spans <= 2 ? 2.0 : 1.0)) : 0.0;
  plan_across_domains(plan, shape, bus > 0.0 ? std::min(bus, inter) : inter, nvls_tree_bus);
  // Between two nodes the tree's NICs carry half a ring's bytes (NCCL's factor 2 above).
  if (plan.algorithm == CollectiveAlgorithm::kNvlsTree && spans <= 2) plan.nic_bytes_per_byte /= 2;
  return plan;
}

OpCost CostModel::collective(int rank, sim::CollectiveKind kind, const std::vector<int>& group,
                             std::int64_t bytes) const {
  const CollectiveArgs args{rank, kind, bytes, &group};
  if (auto it = collective_memo_.find(args); it != collective_memo_.end()) return it->second;
  OpCost c = collective_uncached(rank, kind, group, bytes);
  collective_memo_.emplace(CollectiveKey{rank, kind, bytes, group}, c);
  return c;
}

OpCost CostModel::collective_uncached(int rank, sim::CollectiveKind kind,
                                      const std::vector<int>& group, std::int64_t bytes) const {
  const RankResources& rr = at(rank);
  const CollectivePlan plan = plan_collective(kind, group, bytes);
  OpCost c;
  c.multiplicity = rr.multiplicity;
  if (plan.algorithm == CollectiveAlgorithm::kNone) return c;
  c.work = static_cast<double>(bytes);
  c.max_rate = plan.alg_bytes_per_s;
  c.latency = plan.latency;
  const bool switch_reduces = plan.algorithm == CollectiveAlgorithm::kNvls ||
                              plan.algorithm == CollectiveAlgorithm::kNvlsTree;
  const double per_unit = switch_reduces ? 1.0 : plan.bus_bytes_per_byte;
  if (rr.nvlink_tx.valid()) {
    c.uses.push_back({rr.nvlink_tx, per_unit});
    c.uses.push_back({rr.nvlink_rx, per_unit});
  } else if (!plan.crosses_nodes) {
    // No NVLink: the ring runs over the GPU's host link (PCIe), against offload copies.
    c.uses.push_back({rr.link_d2h, per_unit});
    c.uses.push_back({rr.link_h2d, per_unit});
    if (rr.link_duplex.valid()) c.uses.push_back({rr.link_duplex, 2.0 * per_unit});
  }
  if (plan.crosses_nodes && rr.nic_tx.valid()) {
    c.uses.push_back({rr.nic_tx, plan.nic_bytes_per_byte});
    c.uses.push_back({rr.nic_rx, plan.nic_bytes_per_byte});
  }
  // SM-based NCCL kernels take a share of the SMs while they run at full speed.
  c.uses.push_back({rr.sm, profile_.interference.nccl_compute_slowdown.value / c.max_rate});
  return c;
}

OpCost CostModel::p2p(int src_rank, int dst_rank, std::int64_t bytes) const {
  const RankResources& src = at(src_rank);
  const RankResources* dst = simulated(dst_rank) ? &at(dst_rank) : nullptr;
  OpCost c;
  c.multiplicity = src.multiplicity;
  if (bytes <= 0 || src_rank == dst_rank) return c;
  c.work = static_cast<double>(bytes);
  const auto& nv = profile_.nvlink;
  if (system_.same_nvlink_domain(src_rank, dst_rank) && src.nvlink_tx.valid()) {
    // One send at about the ring bus bandwidth (a ring step is exactly such a send).
    c.max_rate = nv.ring_all_gather_bus_bytes_per_s.value;
    c.latency = seconds(nv.latency_s.value);
    c.uses.push_back({src.nvlink_tx, 1.0});
    if (dst != nullptr) c.uses.push_back({dst->nvlink_rx, 1.0});
  } else if (system_.node_of(src_rank) == system_.node_of(dst_rank)) {
    // Through PCIe: out of the source's link, into the destination's.
    c.max_rate = std::min(profile_.host_link.d2h_bytes_per_s.value,
                          profile_.host_link.h2d_bytes_per_s.value);
    c.latency = seconds(nv.latency_s.value);
    c.uses.push_back({src.link_d2h, 1.0});
    if (dst != nullptr) c.uses.push_back({dst->link_h2d, 1.0});
  } else {
    c.max_rate =
        profile_.inter_node.nic_bytes_per_s_per_gpu.value * profile_.inter_node.efficiency.value;
    c.latency = seconds(nv.latency_s.value + profile_.inter_node.hop_latency_s.value);
    if (src.nic_tx.valid()) c.uses.push_back({src.nic_tx, 1.0});
    if (dst != nullptr && dst->nic_rx.valid()) c.uses.push_back({dst->nic_rx, 1.0});
  }
  return c;
}

namespace {

// C(n - x, k) / C(n, k): the chance that k distinct picks among n items miss x given ones.
double misses_all(std::int64_t n, std::int64_t x, std::int64_t k) {
  double q = 1.0;
  for (std::int64_t i = 0; i < k; ++i) {
    const auto left = static_cast<double>(n - x - i);
    if (left <= 0.0) return 0.0;
    q *= left / static_cast<double>(n - i);
  }
  return q;
}

// ln C(n, k).
double log_choose(std::int64_t n, std::int64_t k) {
  return std::lgamma(static_cast<double>(n) + 1.0) - std::lgamma(static_cast<double>(k) + 1.0) -
         std::lgamma(static_cast<double>(n - k) + 1.0);
}

}  // namespace

double expert_range_miss_probability(const ExpertRouting& routing, std::int64_t first,
                                     std::int64_t count) {
  const std::int64_t e = routing.experts;
  const std::int64_t groups = routing.groups > 0 ? routing.groups : 1;
  const std::int64_t chosen = routing.groups > 0 ? routing.group_topk : 1;
  const std::int64_t per_group = e / groups;
  // The range's experts in each group it touches.
  std::vector<std::int64_t> overlap;
  for (std::int64_t g = first / per_group; g * per_group < first + count; ++g) {
    overlap.push_back(std::min((g + 1) * per_group, first + count) -
                      std::max(g * per_group, first));
  }
  const auto touched = static_cast<std::int64_t>(overlap.size());
  // ways[c][x]: subsets of c touched groups holding x of the range's experts.
  std::vector<std::map<std::int64_t, double>> ways(static_cast<std::size_t>(touched) + 1);
  ways[0][0] = 1.0;
  for (const std::int64_t o : overlap) {
    for (std::size_t c = ways.size() - 1; c > 0; --c) {
      for (const auto& [x, w] : ways[c - 1]) ways[c][x + o] += w;
    }
  }
  // A token draws `chosen` of the groups uniformly, then top_k among their experts uniformly.
  double miss = 0.0;
  const double all = log_choose(groups, chosen);
  for (std::int64_t c = 0; c <= std::min(touched, chosen); ++c) {
    if (chosen - c > groups - touched) continue;
    const double rest = std::exp(log_choose(groups - touched, chosen - c) - all);
    for (const auto& [x, w] : ways[static_cast<std::size_t>(c)]) {
      miss += w * rest * misses_all(chosen * per_group, x, routing.top_k);
    }
  }
  return std::clamp(miss, 0.0, 1.0);
}

CostModel::DeepEpTraffic CostModel::deepep_traffic(const std::vector<int>& group,
                                                   const ExpertRouting& routing) const {
  DeepEpTraffic t;
  const auto n = static_cast<std::int64_t>(group.size());
  if (n <= 1 || routing.experts <= 0 || routing.top_k <= 0) return t;
  const auto units = static_cast<std::int64_t>(ranks_by_unit(group).size());
  t.remote_units = static_cast<int>(units - 1);
  // The first rank's experts and those of the first unit (experts spread evenly, in rank order).
  const double p_rank = 1.0 - expert_range_miss_probability(routing, 0, routing.experts / n);
  const double p_unit =
      1.0 - expert_range_miss_probability(routing, 0, routing.experts * (n / units) / n);
  t.nvlink_bytes_per_byte = p_rank * static_cast<double>(n - units);
  t.nic_bytes_per_byte = p_unit * static_cast<double>(units - 1);
  return t;
}

double CostModel::ep_rdma_efficiency(EpKernels kernels, int remote_units) const {
  constexpr double kMany = 0.87;
  const double one = kernels == EpKernels::kHybridEp ? 0.673 : 0.43;
  double e = kMany;
  if (remote_units <= 1) {
    e = one;
  } else if (remote_units == 2) {
    e = 0.5 * (one + kMany);
  }
  return std::min(e, profile_.inter_node.efficiency.value);
}

double CostModel::ep_nvlink_bytes_per_s() const {
  constexpr double kShare = 0.68;
  const auto& nv = profile_.nvlink;
  return std::min(nv.ring_all_gather_bus_bytes_per_s.value, kShare * nv.bytes_per_s_per_gpu.value);
}

OpCost CostModel::deepep(int rank, const DeepEpTraffic& t, std::int64_t tokens,
                         std::int64_t token_bytes, EpKernels kernels) const {
  const RankResources& rr = at(rank);
  OpCost c;
  c.multiplicity = rr.multiplicity;
  if (tokens <= 0 || token_bytes <= 0 || t.nvlink_bytes_per_byte + t.nic_bytes_per_byte <= 0.0) {
    return c;
  }
  const auto& nv = profile_.nvlink;
  c.work = static_cast<double>(tokens) * static_cast<double>(token_bytes);
  c.max_rate = std::numeric_limits<double>::infinity();
  if (t.nvlink_bytes_per_byte > 0.0) {
    if (rr.nvlink_tx.valid()) {
      c.max_rate = std::min(c.max_rate, ep_nvlink_bytes_per_s() / t.nvlink_bytes_per_byte);
      c.uses.push_back({rr.nvlink_tx, t.nvlink_bytes_per_byte});
      c.uses.push_back({rr.nvlink_rx, t.nvlink_bytes_per_byte});
    } else {
      // No NVLink: the ranks of a node exchange through their host links (PCIe).
      const auto& hl = profile_.host_link;
      c.max_rate =
          std::min(c.max_rate, std::min(hl.d2h_bytes_per_s.value, hl.h2d_bytes_per_s.value) /
                                   t.nvlink_bytes_per_byte);
      c.uses.push_back({rr.link_d2h, t.nvlink_bytes_per_byte});
      c.uses.push_back({rr.link_h2d, t.nvlink_bytes_per_byte});
      if (rr.link_duplex.valid()) c.uses.push_back({rr.link_duplex, 2.0 * t.nvlink_bytes_per_byte});
    }
  }
  double latency = nv.latency_s.value;
  if (t.nic_bytes_per_byte > 0.0) {
    const double nic = profile_.inter_node.nic_bytes_per_s_per_gpu.value *
                       ep_rdma_efficiency(kernels, t.remote_units);
    c.max_rate = std::min(c.max_rate, nic / t.nic_bytes_per_byte);
    latency += profile_.inter_node.hop_latency_s.value;
    if (rr.nic_tx.valid()) {
      c.uses.push_back({rr.nic_tx, t.nic_bytes_per_byte});
      c.uses.push_back({rr.nic_rx, t.nic_bytes_per_byte});
    }
  }
  c.latency = seconds(latency);
  // DeepEP's kernels run on SMs of their own (Megatron-Core --moe-deepep-num-sms), taking the
  // same share of the GPU as an SM-based NCCL collective of that rate.
  c.uses.push_back({rr.sm, profile_.interference.nccl_compute_slowdown.value / c.max_rate});
  return c;
}

OpCost CostModel::host_compute(int rank, std::int64_t dram_bytes, double flops,
                               const CpuThreads& threads) const {
  const RankResources& rr = at(rank);
  const auto& h = profile_.host;
  OpCost c;
  c.multiplicity = rr.multiplicity;
  // The rank's process gets the node's physical cores divided among the job's ranks on the node
  // (DeepSpeed's --bind_cores_to_rank splits them so; unbound OpenMP teams of every logical CPU
  // time-share the cores to the same share), or `threads` cores when fewer.
  const int sockets = std::max(1, system_.sockets_per_node);
  const int local = threads.local_ranks > 0 ? std::min(threads.local_ranks, system_.gpus_per_node)
                                            : system_.gpus_per_node;
  const double per_socket = std::max(1.0, h.cores_per_socket.value);
  double cores = std::max(1.0, std::floor(per_socket * sockets / std::max(1, local)));
  if (threads.core_fraction < 1.0) cores = std::max(1.0, std::floor(cores * threads.core_fraction));
  if (threads.threads > 0) cores = std::min(cores, static_cast<double>(threads.threads));
  // Sockets the rank's threads run on: its bound cores' sockets, or every socket when unbound.
  const double spanned =
      threads.bind_cores ? std::min<double>(sockets, std::ceil(cores / per_socket)) : sockets;
  const double numa =
      1.0 + (spanned - 1.0) / spanned * (std::max(1.0, h.remote_dram_time_ratio.value) - 1.0);
  const double per_core_bytes =
      h.adam_bytes_per_s_per_core.value / numa / std::max(1.0, threads.time_factor);
  const double per_core_flops = h.flops_per_s_per_core.value;
  if (dram_bytes <= 0) {
    if (flops <= 0.0) return c;
    // Arithmetic only: measured in core-seconds on the socket's cores.
    c.work = flops;
    c.max_rate = cores * per_core_flops;
    return c;
  }
  const double bytes = static_cast<double>(dram_bytes);
  // Core time per byte: the streaming cost, or the arithmetic when it needs more.
  const double cpu_per_byte =
      std::max(1.0, flops > 0.0 ? (flops / bytes) * per_core_bytes / per_core_flops : 0.0);
  c.work = bytes;
  c.max_rate = cores * per_core_bytes / cpu_per_byte;
  // The cores are the rank's own share (above), so only the socket's DRAM is shared; an
  // implementation slower per byte (time_factor) is taken to stream that much more (the
  // for-loop's separate passes).
  c.uses.push_back({rr.host_dram, std::max(1.0, threads.time_factor)});
  return c;
}

// DeepSpeed's CPU Adam against PyTorch's on the same host: SuperOffload's Figure 5 (DeepSpeed
// blogs/deepspeed-superoffload, arXiv 2509.21271) steps 8e9 parameters on a GH200's Grace in
// 0.769 s with DeepSpeed's CPU-Adam and 1.834 s with PyTorch's CPU Adam (the implementation is
// not named: taken as torch.optim's default for CPU tensors, the single-tensor for-loop of
// elementwise ops), 2.38x; the same ratio is assumed on x86 hosts. torch.optim.AdamW(fused=True)
// updates each tensor in one vectorized pass as DeepSpeed's kernel does: taken at DeepSpeed's
// rate (no side-by-side measurement was found).
double CostModel::cpu_adam_time_factor(OffloadPolicy::CpuAdam adam) {
  switch (adam) {
    case OffloadPolicy::CpuAdam::kDeepSpeed:
    case OffloadPolicy::CpuAdam::kTorchFused:
      return 1.0;
    case OffloadPolicy::CpuAdam::kTorch:
      return 1.834 / 0.769;
  }
  return 1.0;
}

bool fp8_supported(int compute_capability_x10) { return compute_capability_x10 >= 89; }

bool fp8_non_tn_gemm(int compute_capability_x10) {
  return (compute_capability_x10 >= 100 && compute_capability_x10 < 120) ||
         compute_capability_x10 >= 130;
}

bool mxfp8_supported(int compute_capability_x10) {
  return compute_capability_x10 >= 100 && compute_capability_x10 < 120;
}

TrainingConfig::Fp8Recipe default_fp8_recipe(int compute_capability_x10) {
  if (mxfp8_supported(compute_capability_x10)) return TrainingConfig::Fp8Recipe::kMxfp8;
  if (compute_capability_x10 >= 120) return TrainingConfig::Fp8Recipe::kCurrent;
  return TrainingConfig::Fp8Recipe::kDelayed;
}

std::int64_t fp8_quantize_bytes(TrainingConfig::Fp8Recipe recipe, bool non_tn, bool from_norm,
                                std::int64_t elements) {
  const std::int64_t transpose = non_tn ? 0 : 1;  // column-wise copy of a per-tensor scaling
  switch (recipe) {
    case TrainingConfig::Fp8Recipe::kDelayed:
      if (from_norm) return 2 * transpose * elements;
      return (2 + 1 + transpose) * elements;
    case TrainingConfig::Fp8Recipe::kCurrent:
      return (from_norm ? 0 : 2 * elements) + (2 + 1 + transpose) * elements;
    case TrainingConfig::Fp8Recipe::kMxfp8:
      // 2 read, 1 + 1 written, one E8M0 scale byte per 32 values each way.
      return 4 * elements + 2 * ((elements + 31) / 32);
    case TrainingConfig::Fp8Recipe::kBlockwise:
      // 2 read, 1 + 1 written, one fp32 scale per 128 values each way.
      return 4 * elements + 2 * 4 * ((elements + 127) / 128);
  }
  return 4 * elements;
}

// Transformer Engine's GEMM profiling guide (NVIDIA/TransformerEngine docs/examples/
// gemm_profiling/gemm_profiling.rst, 2026-05; benchmarks/gemm/benchmark_gemm.py: te.Linear under
// autocast, or tex.generic_gemm on pre-quantized inputs, CUDA events over 100 iterations) times
// the 12 GEMMs of one layer (hidden 4096, FFN 16384, 32 heads, 31 x 512 tokens) per recipe:
// * B300, kernels alone (pre-quantized): per-tensor current scaling 6.812 ms per layer, MXFP8
//   7.161 ms: the MXFP8 kernels take 7.161 / 6.812 = 1.051 times as long (published, no model).
// * H200 NVL, with quantization (autocast): current scaling 20.285 ms, blockwise (Float8Block-
//   Scaling, 1x128 / 128x128 fp32 scales, cuBLAS's block-scaled GEMMs) 22.882 ms; current
//   scaling's kernels alone 16.785 ms, so its quantization took 3.500 ms. The blockwise
//   quantization is not timed alone there (Hopper's cuBLAS has no 2D-by-2D pre-quantized path);
//   taken at offsim's ratio of the two recipes' quantization bytes on that layer
//   (fp8_quantize_bytes on the h200 profile: 2.370 / 3.489 = 0.679), 2.378 ms, the blockwise
//   kernels took 22.882 - 2.378 = 20.504 ms: 20.504 / 16.785 = 1.22 times the per-tensor ones.
//   FITTED to that guide's table through offsim's quantization model; scored on validation
//   table 15 (Megatron-LM's H100 FP8-blockwise recipe), not on the guide.
// Delayed and current scaling run the per-tensor kernels the FP8 surface measures.
constexpr double kMxfp8GemmTimeScale = 7.161 / 6.812;
constexpr double kHopperBlockwiseGemmTimeScale = 20.504 / 16.785;

double fp8_recipe_gemm_time_scale(TrainingConfig::Fp8Recipe recipe, int compute_capability_x10) {
  switch (recipe) {
    case TrainingConfig::Fp8Recipe::kDelayed:
    case TrainingConfig::Fp8Recipe::kCurrent:
      return 1.0;
    case TrainingConfig::Fp8Recipe::kMxfp8:
      return kMxfp8GemmTimeScale;
    case TrainingConfig::Fp8Recipe::kBlockwise:
      // Blackwell runs Float8BlockScaling's GEMMs as MXFP8 (TransformerEngine PR 2157).
      return compute_capability_x10 >= 100 ? kMxfp8GemmTimeScale : kHopperBlockwiseGemmTimeScale;
  }
  return 1.0;
}

OpCost CostModel::scale_kernel_time(int rank, OpCost c, double scale) const {
  if (scale == 1.0 || c.work <= 0.0) return c;
  c.max_rate /= scale;
  const ResourceId sm = at(rank).sm;
  for (sim::ResourceUse& u : c.uses) {
    if (u.resource == sm) u.per_unit *= scale;
  }
  return c;
}

std::int64_t fp8_weight_copy_bytes(TrainingConfig::Fp8Recipe recipe, bool non_tn,
                                   std::int64_t elements) {
  switch (recipe) {
    case TrainingConfig::Fp8Recipe::kDelayed:
    case TrainingConfig::Fp8Recipe::kCurrent:
      return (non_tn ? 1 : 2) * elements;
    case TrainingConfig::Fp8Recipe::kMxfp8:
      return 2 * elements + 2 * ((elements + 31) / 32);
    case TrainingConfig::Fp8Recipe::kBlockwise:
      return 2 * elements + 2 * 4 * ((elements + 128 * 128 - 1) / (128 * 128));
  }
  return 2 * elements;
}

}  // namespace offsim::models
