// System: a machine (one or more identical nodes) and the catalogue of known systems.
//
// A System says how many GPUs a node has and how they hang off PCIe switches, CPU sockets,
// NVLink and NICs; topology.h turns it into a graph and routes.
//
//   auto sys = sim::platform::find_system("dgx-a100-80gb");   // Result<System>
//   if (!sys) { ... sys.error().message lists the known names ... }
//   sim::platform::System four = sys->with_nodes(4);           // 32 GPUs over InfiniBand
//   int rank_node = four.node_of(17);                          // 2
//   for (const auto& s : sim::platform::list_systems()) fmt::print("{}\n", s.name);
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sim/core/result.h"

namespace offsim::sim::platform {

enum class HostLinkKind { kPcieGen4, kPcieGen5, kNvlinkC2c };

const char* to_string(HostLinkKind kind);

struct System {
  std::string name;         // "dgx-a100-80gb"
  std::string description;  // one line, with the source of the layout
  std::string gpu;          // GPU kind, the profile name: "a100-80gb", "h100-sxm", ...
  int gpus_per_node = 1;
  int nodes = 1;
  int sockets_per_node = 1;      // CPU sockets (Grace chips on GH200/GB200)
  int gpus_per_pcie_switch = 1;  // GPUs sharing one switch uplink; 1 = a dedicated path
  HostLinkKind host_link = HostLinkKind::kPcieGen4;
  int nvlink_domain_gpus = 1;  // GPUs in one NVLink/NVSwitch domain; 1 = no NVLink peers
  int nics_per_node = 0;       // InfiniBand NICs, one per GPU where equal to gpus_per_node
  std::int64_t host_memory_bytes_per_node = 0;
  std::string host;  // the CPU of its sockets, a name of host.h's catalogue; "" = unspecified

  int gpu_count() const { return gpus_per_node * nodes; }
  int gpus_per_socket() const { return gpus_per_node / sockets_per_node; }
  int node_of(int rank) const { return rank / gpus_per_node; }
  int local_gpu(int rank) const { return rank % gpus_per_node; }
  int socket_of(int rank) const { return local_gpu(rank) / gpus_per_socket(); }
  int pcie_switch_of(int rank) const { return local_gpu(rank) / gpus_per_pcie_switch; }
  int nvlink_domain_of(int rank) const { return rank / nvlink_domain_gpus; }
  bool same_nvlink_domain(int a, int b) const {
    return nvlink_domain_gpus > 1 && nvlink_domain_of(a) == nvlink_domain_of(b);
  }
  // A copy with `nodes` nodes; nodes > 1 connect through one InfiniBand NIC per GPU.
  System with_nodes(int count) const;
  bool operator==(const System&) const = default;
};

// Checks internal consistency (divisibility of GPUs by sockets and switches, positive counts).
Status validate(const System& system);

const std::vector<System>& list_systems();
// Exact name from list_systems(); the error lists the known names.
Result<System> find_system(std::string_view name);

}  // namespace offsim::sim::platform
