// Topology: a System as a Boost.Graph graph of GPUs, NVSwitches, PCIe switches, CPU sockets,
// host DRAM and NICs, and routes between them as lists of engine resources.
//
// Every link has a bandwidth per direction ("down" = toward the GPU, "up" = away from it) and
// optionally a combined duplex cap; a socket vertex has a root-complex cap. route(a, b) walks
// the shortest path and names one resource per link direction crossed, e.g. an H2D copy on
// dgx-a100-80gb GPU 3: node0.socket0.dram, node0.socket0.rc, node0.pcie_sw1.up.h2d,
// node0.gpu3.pcie.h2d, node0.gpu3.pcie.duplex.
//
//   auto topo = sim::platform::Topology::build(system, profile);
//   auto r = topo.route(topo.dram(0, 0), topo.gpu(0, 3));   // Result<Route>
//   for (const auto& hop : r->hops) fmt::print("{} {}\n", hop.resource, hop.bytes_per_s);
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/graph/adjacency_list.hpp>

#include "sim/core/result.h"
#include "sim/platform/profile.h"
#include "sim/platform/system.h"

namespace offsim::sim::platform {

enum class VertexKind { kGpu, kNvSwitch, kPcieSwitch, kSocket, kDram, kNic, kFabric };
enum class LinkKind { kPcie, kC2c, kSwitchUplink, kMemory, kNvlink, kNicAttach, kInfiniband };

const char* to_string(VertexKind kind);
const char* to_string(LinkKind kind);

struct TopoVertex {
  VertexKind kind = VertexKind::kGpu;
  std::string name;      // "node0.gpu3", "node0.pcie_sw1", "node0.socket0", "nvswitch0", "fabric"
  int node = -1;         // -1 for vertices shared by nodes (an NVLink domain switch, the fabric)
  int index = 0;         // GPU, switch, socket or NIC number within the node
  std::string resource;  // vertex cap (socket root complex "node0.socket0.rc"), or ""
  double bytes_per_s = 0.0;  // capacity of `resource`
};

// An undirected edge; `a` is the endpoint nearer the GPU (or the GPU itself).
struct TopoLink {
  LinkKind kind = LinkKind::kPcie;
  std::size_t near_vertex = 0;  // the endpoint nearer the GPU (a VertexId)
  std::string name;             // "node0.gpu3.pcie"
  std::string down_resource;    // toward the GPU: "node0.gpu3.pcie.h2d"
  std::string up_resource;      // away from the GPU: "node0.gpu3.pcie.d2h"
  std::string duplex_resource;  // "node0.gpu3.pcie.duplex" or "" when none
  double down_bytes_per_s = 0.0;
  double up_bytes_per_s = 0.0;
  double duplex_bytes_per_s = 0.0;
  bool shared_directions = false;  // one resource for both directions (DRAM): up == down name
};

using TopoGraph =
    boost::adjacency_list<boost::vecS, boost::vecS, boost::undirectedS, TopoVertex, TopoLink>;
using VertexId = TopoGraph::vertex_descriptor;

// One resource a transfer crosses, with its capacity in bytes/s.
struct RouteHop {
  std::string resource;
  double bytes_per_s = 0.0;
  bool operator==(const RouteHop&) const = default;
};

struct Route {
  std::vector<VertexId> vertices;  // from source to destination
  std::vector<RouteHop> hops;      // in path order; vertex caps between the links they join
};

class Topology {
 public:
  // The system must pass validate(); nodes > 1 adds one NIC per GPU and an InfiniBand fabric.
  static Topology build(const System& system, const CalibrationProfile& profile);

  const TopoGraph& graph() const { return *graph_; }
  const System& system() const { return system_; }

  VertexId gpu(int node, int local_gpu) const;
  VertexId socket(int node, int socket) const;
  VertexId dram(int node, int socket) const;
  std::optional<VertexId> nic(int node, int index) const;
  std::optional<VertexId> find(const std::string& name) const;

  // Shortest path (fewest links); kNotFound when the vertices are not connected.
  Result<Route> route(VertexId from, VertexId to) const;

 private:
  System system_;
  // Immutable once built and shared by copies (Boost 1.74's adjacency_list has no move).
  std::shared_ptr<const TopoGraph> graph_;
};

}  // namespace offsim::sim::platform
