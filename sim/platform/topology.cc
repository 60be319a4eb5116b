#include "sim/platform/topology.h"

#include <algorithm>
#include <unordered_map>

#include <fmt/format.h>

namespace offsim::sim::platform {

const char* to_string(VertexKind kind) {
  switch (kind) {
    case VertexKind::kGpu:
      return "gpu";
    case VertexKind::kNvSwitch:
      return "nvswitch";
    case VertexKind::kPcieSwitch:
      return "pcie_switch";
    case VertexKind::kSocket:
      return "socket";
    case VertexKind::kDram:
      return "dram";
    case VertexKind::kNic:
      return "nic";
    case VertexKind::kFabric:
      return "fabric";
  }
  return "?";
}

const char* to_string(LinkKind kind) {
  switch (kind) {
    case LinkKind::kPcie:
      return "pcie";
    case LinkKind::kC2c:
      return "c2c";
    case LinkKind::kSwitchUplink:
      return "switch_uplink";
    case LinkKind::kMemory:
      return "memory";
    case LinkKind::kNvlink:
      return "nvlink";
    case LinkKind::kNicAttach:
      return "nic_attach";
    case LinkKind::kInfiniband:
      return "infiniband";
  }
  return "?";
}

namespace {

VertexId add_vertex(TopoGraph& g, VertexKind kind, std::string name, int node, int index,
                    std::string resource = {}, double bytes_per_s = 0.0) {
  return boost::add_vertex(TopoVertex{.kind = kind,
                                      .name = std::move(name),
                                      .node = node,
                                      .index = index,
                                      .resource = std::move(resource),
                                      .bytes_per_s = bytes_per_s},
                           g);
}

// A link with per-direction resources "<name>.<down_suffix>" / "<name>.<up_suffix>".
void add_link(TopoGraph& g, VertexId near, VertexId far, LinkKind kind, const std::string& name,
              const char* down_suffix, const char* up_suffix, double down_bytes_per_s,
              double up_bytes_per_s, double duplex_bytes_per_s) {
  TopoLink link{.kind = kind,
                .near_vertex = near,
                .name = name,
                .down_resource = name + "." + down_suffix,
                .up_resource = name + "." + up_suffix,
                .duplex_resource = duplex_bytes_per_s > 0.0 ? name + ".duplex" : std::string(),
                .down_bytes_per_s = down_bytes_per_s,
                .up_bytes_per_s = up_bytes_per_s,
                .duplex_bytes_per_s = duplex_bytes_per_s};
  boost::add_edge(near, far, link, g);
}

// One resource for both directions (DRAM bandwidth is shared by reads and writes).
void add_shared_link(TopoGraph& g, VertexId near, VertexId far, LinkKind kind,
                     const std::string& name, double bytes_per_s) {
  TopoLink link{.kind = kind,
                .near_vertex = near,
                .name = name,
                .down_resource = name,
                .up_resource = name,
                .down_bytes_per_s = bytes_per_s,
                .up_bytes_per_s = bytes_per_s,
                .shared_directions = true};
  boost::add_edge(near, far, link, g);
}

// Vertex order is part of the contract of gpu()/socket()/dram(): per node, GPUs first, then
// sockets, then DRAM; switches, NICs and shared vertices follow.
void add_node_vertices(TopoGraph& g, const System& system, const HostLinkFigures& hl) {
  for (int n = 0; n < system.nodes; ++n) {
    for (int i = 0; i < system.gpus_per_node; ++i) {
      add_vertex(g, VertexKind::kGpu, fmt::format("node{}.gpu{}", n, i), n, i);
    }
    for (int s = 0; s < system.sockets_per_node; ++s) {
      const std::string name = fmt::format("node{}.socket{}", n, s);
      add_vertex(g, VertexKind::kSocket, name, n, s, name + ".rc",
                 hl.root_complex_bytes_per_s.value);
    }
    for (int s = 0; s < system.sockets_per_node; ++s) {
      add_vertex(g, VertexKind::kDram, fmt::format("node{}.dram{}", n, s), n, s);
    }
  }
}

// Node n's memory links, PCIe switches (with their uplinks) and GPU host links (PCIe, or C2C to
// the socket); returns the switches.
std::vector<VertexId> add_host_paths(TopoGraph& g, const Topology& t, const System& system,
                                     const CalibrationProfile& profile, int n) {
  const HostLinkFigures& hl = profile.host_link;
  const bool c2c = system.host_link == HostLinkKind::kNvlinkC2c;
  const int per_socket = system.gpus_per_socket();
  for (int s = 0; s < system.sockets_per_node; ++s) {
    add_shared_link(g, t.socket(n, s), t.dram(n, s), LinkKind::kMemory,
                    fmt::format("node{}.socket{}.dram", n, s),
                    profile.host.dram_bytes_per_s_per_socket.value);
  }
  std::vector<VertexId> switches;
  if (!c2c) {
    const int count = system.gpus_per_node / system.gpus_per_pcie_switch;
    for (int w = 0; w < count; ++w) {
      const std::string name = fmt::format("node{}.pcie_sw{}", n, w);
      const VertexId sw = add_vertex(g, VertexKind::kPcieSwitch, name, n, w);
      switches.push_back(sw);
      const int socket = (w * system.gpus_per_pcie_switch) / per_socket;
      add_link(g, sw, t.socket(n, socket), LinkKind::kSwitchUplink, name + ".up", "h2d", "d2h",
               hl.switch_uplink_bytes_per_s.value, hl.switch_uplink_bytes_per_s.value, 0.0);
    }
  }
  for (int i = 0; i < system.gpus_per_node; ++i) {
    const VertexId gpu = t.gpu(n, i);
    if (c2c) {
      add_link(g, gpu, t.socket(n, i / per_socket), LinkKind::kC2c,
               fmt::format("node{}.gpu{}.c2c", n, i), "h2d", "d2h", hl.h2d_bytes_per_s.value,
               hl.d2h_bytes_per_s.value, hl.duplex_bytes_per_s.value);
    } else {
      add_link(g, gpu, switches[static_cast<std::size_t>(i / system.gpus_per_pcie_switch)],
               LinkKind::kPcie, fmt::format("node{}.gpu{}.pcie", n, i), "h2d", "d2h",
               hl.h2d_bytes_per_s.value, hl.d2h_bytes_per_s.value, hl.duplex_bytes_per_s.value);
    }
  }
  return switches;
}

// One NVSwitch vertex per NVLink domain, each GPU linked to its domain's.
void add_nvlink(TopoGraph& g, const Topology& t, const System& system,
                const CalibrationProfile& profile) {
  const int domains =
      (system.gpu_count() + system.nvlink_domain_gpus - 1) / system.nvlink_domain_gpus;
  std::vector<VertexId> nvswitches;
  for (int d = 0; d < domains; ++d) {
    nvswitches.push_back(add_vertex(g, VertexKind::kNvSwitch, fmt::format("nvswitch{}", d), -1, d));
  }
  const double bw = profile.nvlink.bytes_per_s_per_gpu.value;
  for (int r = 0; r < system.gpu_count(); ++r) {
    const int n = system.node_of(r);
    const int i = system.local_gpu(r);
    add_link(g, t.gpu(n, i), nvswitches[static_cast<std::size_t>(system.nvlink_domain_of(r))],
             LinkKind::kNvlink, fmt::format("node{}.gpu{}.nvlink", n, i), "rx", "tx", bw, bw, 0.0);
  }
}

// The NICs of every node and the fabric between them.
void add_network(TopoGraph& g, const Topology& t, const System& system,
                 const CalibrationProfile& profile,
                 const std::vector<std::vector<VertexId>>& all_switches) {
  const bool c2c = system.host_link == HostLinkKind::kNvlinkC2c;
  const int gpn = system.gpus_per_node;
  const int per_socket = system.gpus_per_socket();
  const VertexId fabric = add_vertex(g, VertexKind::kFabric, "fabric", -1, 0);
  const double bw = profile.inter_node.nic_bytes_per_s_per_gpu.value * static_cast<double>(gpn) /
                    system.nics_per_node;
  for (int n = 0; n < system.nodes; ++n) {
    for (int k = 0; k < system.nics_per_node; ++k) {
      const std::string name = fmt::format("node{}.nic{}", n, k);
      const VertexId nic = add_vertex(g, VertexKind::kNic, name, n, k);
      // A NIC sits beside the GPUs it serves: on their PCIe switch, or on the socket (C2C).
      const int first_gpu = k * gpn / system.nics_per_node;
      const std::string attach = fmt::format("{}.attach", name);
      if (c2c) {
        add_link(g, nic, t.socket(n, first_gpu / per_socket), LinkKind::kNicAttach, attach, "in",
                 "out", bw, bw, 0.0);
      } else {
        const auto& node_switches = all_switches[static_cast<std::size_t>(n)];
        add_link(g, nic,
                 node_switches[static_cast<std::size_t>(first_gpu / system.gpus_per_pcie_switch)],
                 LinkKind::kNicAttach, attach, "in", "out", bw, bw, 0.0);
      }
      add_link(g, nic, fabric, LinkKind::kInfiniband, name, "rx", "tx", bw, bw, 0.0);
    }
  }
}

}  // namespace

Topology Topology::build(const System& system, const CalibrationProfile& profile) {
  OFFSIM_CHECK_MSG(validate(system).has_value(), "invalid system {}", system.name);
  Topology t;
  t.system_ = system;
  auto graph = std::make_shared<TopoGraph>();
  TopoGraph& g = *graph;
  t.graph_ = graph;
  add_node_vertices(g, system, profile.host_link);
  std::vector<std::vector<VertexId>> all_switches;
  for (int n = 0; n < system.nodes; ++n) {
    all_switches.push_back(add_host_paths(g, t, system, profile, n));
  }
  if (system.nvlink_domain_gpus > 1 && profile.nvlink.bytes_per_s_per_gpu.value > 0.0) {
    add_nvlink(g, t, system, profile);
  }
  if (system.nodes > 1) add_network(g, t, system, profile, all_switches);
  return t;
}

VertexId Topology::gpu(int node, int local_gpu) const {
  OFFSIM_CHECK(node >= 0 && node < system_.nodes);
  OFFSIM_CHECK(local_gpu >= 0 && local_gpu < system_.gpus_per_node);
  const int per_node = system_.gpus_per_node + 2 * system_.sockets_per_node;
  const int index = node * per_node + local_gpu;
  return static_cast<VertexId>(index);
}

VertexId Topology::socket(int node, int socket) const {
  OFFSIM_CHECK(node >= 0 && node < system_.nodes);
  OFFSIM_CHECK(socket >= 0 && socket < system_.sockets_per_node);
  const int per_node = system_.gpus_per_node + 2 * system_.sockets_per_node;
  const int index = node * per_node + system_.gpus_per_node + socket;
  return static_cast<VertexId>(index);
}

VertexId Topology::dram(int node, int socket) const {
  return this->socket(node, socket) + static_cast<VertexId>(system_.sockets_per_node);
}

std::optional<VertexId> Topology::nic(int node, int index) const {
  return find(fmt::format("node{}.nic{}", node, index));
}

std::optional<VertexId> Topology::find(const std::string& name) const {
  for (VertexId v = 0; v < boost::num_vertices(*graph_); ++v) {
    if ((*graph_)[v].name == name) return v;
  }
  return std::nullopt;
}

Result<Route> Topology::route(VertexId from, VertexId to) const {
  const std::size_t n = boost::num_vertices(*graph_);
  OFFSIM_CHECK(from < n && to < n);
  // Breadth-first search that stops at the destination: routes stay local even in big systems.
  std::unordered_map<VertexId, VertexId> pred = {{from, from}};
  std::vector<VertexId> queue = {from};
  for (std::size_t head = 0; head < queue.size() && !pred.contains(to); ++head) {
    for (auto [it, end] = boost::adjacent_vertices(queue[head], *graph_); it != end; ++it) {
      if (pred.emplace(*it, queue[head]).second) queue.push_back(*it);
    }
  }
  if (!pred.contains(to)) {
    return fail(ErrorCode::kNotFound, "{}: no path from {} to {}", system_.name,
                (*graph_)[from].name, (*graph_)[to].name);
  }
  Route r;
  for (VertexId v = to;; v = pred.at(v)) {
    r.vertices.push_back(v);
    if (v == from) break;
  }
  std::reverse(r.vertices.begin(), r.vertices.end());
  for (std::size_t i = 0; i + 1 < r.vertices.size(); ++i) {
    const VertexId u = r.vertices[i];
    const VertexId v = r.vertices[i + 1];
    if (i > 0 && !(*graph_)[u].resource.empty()) {
      r.hops.push_back({(*graph_)[u].resource, (*graph_)[u].bytes_per_s});
    }
    const auto [edge, found] = boost::edge(u, v, *graph_);
    OFFSIM_CHECK(found);
    const TopoLink& link = (*graph_)[edge];
    const bool toward_near = link.near_vertex == v;  // moving toward the GPU end: "down"
    if (toward_near) {
      r.hops.push_back({link.down_resource, link.down_bytes_per_s});
    } else {
      r.hops.push_back({link.up_resource, link.up_bytes_per_s});
    }
    if (!link.duplex_resource.empty()) {
      r.hops.push_back({link.duplex_resource, link.duplex_bytes_per_s});
    }
  }
  return r;
}

}  // namespace offsim::sim::platform
