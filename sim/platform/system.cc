#include "sim/platform/system.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sim/platform/profile.h"

namespace offsim::sim::platform {

namespace {

constexpr std::int64_t kGiB = std::int64_t{1} << 30;
constexpr std::int64_t kGB = 1'000'000'000;

// An 8-GPU NVSwitch node with two sockets and a NIC per GPU.
System dgx(std::string name, std::string gpu, HostLinkKind link, int per_switch,
           std::int64_t host_bytes, std::string description) {
  return System{.name = std::move(name),
                .description = std::move(description),
                .gpu = std::move(gpu),
                .gpus_per_node = 8,
                .nodes = 1,
                .sockets_per_node = 2,
                .gpus_per_pcie_switch = per_switch,
                .host_link = link,
                .nvlink_domain_gpus = 8,
                .nics_per_node = 8,
                .host_memory_bytes_per_node = host_bytes};
}

// One GPU of the 8-GPU systems with its share (1/8) of the node's host memory: the machines
// of single-GPU examples.
System one_gpu_of(const System& base, std::string name) {
  System s = base;
  s.name = std::move(name);
  s.description = "One GPU of a " + base.name + " with 1/8 of its host memory";
  s.gpus_per_node = 1;
  s.sockets_per_node = 1;
  s.gpus_per_pcie_switch = 1;
  s.nvlink_domain_gpus = 1;
  s.nics_per_node = 1;
  s.host_memory_bytes_per_node = base.host_memory_bytes_per_node / 8;
  return s;
}

// A PCIe machine without NVLink: one GPU in a workstation, or several in a server.
System pcie(std::string name, std::string gpu, HostLinkKind link, int gpus, int sockets,
            int per_switch, std::int64_t host_bytes, std::string host, std::string description) {
  return System{.name = std::move(name),
                .description = std::move(description),
                .gpu = std::move(gpu),
                .gpus_per_node = gpus,
                .nodes = 1,
                .sockets_per_node = sockets,
                .gpus_per_pcie_switch = per_switch,
                .host_link = link,
                .nvlink_domain_gpus = 1,
                .nics_per_node = 0,
                .host_memory_bytes_per_node = host_bytes,
                .host = std::move(host)};
}

// A copy of the system of that name, which is in `systems`.
System named(const std::vector<System>& systems, const char* n) {
  return *std::find_if(systems.begin(), systems.end(),
                       [&](const System& s) { return s.name == n; });
}

void add_nvlink_systems(std::vector<System>& out) {
  out.push_back(dgx("dgx-a100-40gb", "a100-40gb", HostLinkKind::kPcieGen4, 2, 1024 * kGiB,
                    "DGX A100 320GB: 8x A100-SXM4-40GB, NVSwitch, 2 GPUs per PCIe Gen4 switch, 4 "
                    "per socket, 2 sockets, 1 TB DDR4 (hardware.md; DGX A100 datasheet)"));
  out.push_back(dgx("dgx-a100-80gb", "a100-80gb", HostLinkKind::kPcieGen4, 2, 2048 * kGiB,
                    "DGX A100 640GB: 8x A100-SXM4-80GB, NVSwitch, 2 GPUs per PCIe Gen4 switch, 4 "
                    "per socket, 2 sockets, 2 TB DDR4 (hardware.md; DGX A100 datasheet)"));
  out.push_back(dgx("dgx-h100", "h100-sxm", HostLinkKind::kPcieGen5, 1, 2048 * kGiB,
                    "DGX H100: 8x H100-SXM5-80GB, NVSwitch (NVLink4), a Gen5 x16 path per GPU, 4 "
                    "GPUs per socket, 2 sockets, 2 TB DDR5 (hardware.md)"));
  out.push_back(
      dgx("hgx-h800", "h800", HostLinkKind::kPcieGen5, 1, 2048 * kGiB,
          "HGX H800: 8x H800-SXM5-80GB, NVSwitch with NVLink at 400 GB/s per GPU, a Gen5 "
          "x16 path per GPU and a 400 Gb/s NIC per GPU, 4 GPUs per socket, 2 sockets, 2 TB "
          "DDR5 (host and memory assumed as DGX H100)"));
  out.push_back(dgx("hgx-h200", "h200", HostLinkKind::kPcieGen5, 1, 2048 * kGiB,
                    "HGX H200: 8x H200-141GB, NVSwitch (NVLink4), a Gen5 x16 path per GPU, 4 GPUs "
                    "per socket, 2 sockets, 2 TB DDR5 (hardware.md, as DGX H100)"));
  {
    System s = dgx("h100-pcie", "h100-pcie", HostLinkKind::kPcieGen5, 2, 2048 * kGiB,
                   "Server with 8x H100 PCIe, 2 GPUs per PCIe Gen5 switch, 4 per socket, 2 "
                   "sockets, no NVLink (collectives over PCIe), 2 TB DDR5 (assumed as DGX H100)");
    s.nvlink_domain_gpus = 1;
    out.push_back(s);
  }
  out.push_back(System{.name = "gh200",
                       .description = "GH200 superchip: one H100-class GPU (96 GB HBM3) on "
                                      "NVLink-C2C to a 72-core Grace with 480 GB LPDDR5X",
                       .gpu = "gh200",
                       .gpus_per_node = 1,
                       .nodes = 1,
                       .sockets_per_node = 1,
                       .gpus_per_pcie_switch = 1,
                       .host_link = HostLinkKind::kNvlinkC2c,
                       .nvlink_domain_gpus = 1,
                       .nics_per_node = 1,
                       .host_memory_bytes_per_node = 480 * kGB});
  out.push_back(System{.name = "gb200-nvl72",
                       .description = "GB200 NVL72 rack: 18 trays of 4 Blackwell GPUs + 2 Grace "
                                      "(C2C per superchip), one 72-GPU NVLink domain, 480 GB "
                                      "LPDDR5X per Grace",
                       .gpu = "gb200",
                       .gpus_per_node = 4,
                       .nodes = 18,
                       .sockets_per_node = 2,
                       .gpus_per_pcie_switch = 1,
                       .host_link = HostLinkKind::kNvlinkC2c,
                       .nvlink_domain_gpus = 72,
                       .nics_per_node = 4,
                       .host_memory_bytes_per_node = 2 * 480 * kGB});
  out.push_back(dgx("dgx-b200", "b200", HostLinkKind::kPcieGen5, 1, 2048 * kGiB,
                    "DGX B200: 8x B200, NVSwitch (NVLink5), a Gen5 x16 path per GPU (assumed), 4 "
                    "GPUs per socket, 2 sockets, 2 TB DDR5"));
}

// The CPU of each system's sockets (host.h). HGX H200 and DGX B200 hosts are taken as DGX
// H100's 8480C, as the profiles' host figures always were (DGX B200 ships Xeon 8570).
void set_hosts(std::vector<System>& out) {
  for (System& s : out) {
    if (s.host_link == HostLinkKind::kNvlinkC2c) {
      s.host = "grace";
    } else if (s.host_link == HostLinkKind::kPcieGen4) {
      s.host = "epyc-7742";
    } else {
      s.host = "xeon-8480c";
    }
  }
}

// Xeon 6 and Blackwell Ultra systems, whose hosts are named.
void add_newer_systems(std::vector<System>& out) {
  {
    System s = named(out, "hgx-h200");
    s.name = "hgx-h200-xeon6";
    s.host = "xeon-6960p";
    s.description =
        "HGX H200 with two Intel Xeon 6960P (72 cores, 12x DDR5-6400, 96 PCIe 5.0 lanes each): "
        "8x H200-141GB, NVSwitch, a Gen5 x16 path per GPU, 4 GPUs per socket, 2 TB DDR5 "
        "(assumed)";
    out.push_back(s);
  }
  // Blackwell Ultra.
  {
    System s = dgx("hgx-b300", "b300", HostLinkKind::kPcieGen5, 1, 2048 * kGiB,
                   "HGX B300: 8x B300-288GB, NVSwitch (NVLink5), a Gen5 x16 host path per GPU "
                   "(ConnectX-8 switches; the CPUs are Gen5), 4 GPUs per socket, 2 sockets of Xeon "
                   "6960P, 2 TB DDR5 (host and memory assumed)");
    s.host = "xeon-6960p";
    out.push_back(s);
  }
  {
    System s = named(out, "gb200-nvl72");
    s.name = "gb300-nvl72";
    s.gpu = "gb300";
    s.description =
        "GB300 NVL72 rack: 18 trays of 4 Blackwell Ultra GPUs (288 GB HBM3e) + 2 Grace (C2C), "
        "one 72-GPU NVLink domain, 480 GB LPDDR5X per Grace";
    s.host = "grace";
    out.push_back(s);
  }
}

void add_pcie_systems(std::vector<System>& out) {
  constexpr auto kGen4 = HostLinkKind::kPcieGen4;
  constexpr auto kGen5 = HostLinkKind::kPcieGen5;
  const std::vector<System> pcie_systems = {
      pcie("l4-1gpu", "l4", kGen4, 1, 1, 1, 192 * kGiB, "epyc-9654",
           "One L4 (24 GB, PCIe Gen4 x16) in a one-socket EPYC 9654 server, 192 GiB DDR5 "
           "(host memory assumed)"),
      pcie("l4-8gpu", "l4", kGen4, 8, 2, 2, 768 * kGiB, "epyc-9654",
           "8x L4 in a two-socket EPYC 9654 server, 2 GPUs per PCIe switch, 768 GiB DDR5 (layout "
           "and memory assumed, as in 8x L4 cloud instances)"),
      pcie("l40s-8gpu", "l40s", kGen4, 8, 2, 2, 1024 * kGiB, "xeon-8480c",
           "8x L40S in a two-socket Xeon 8480C server, 2 GPUs per PCIe switch, 1 TiB DDR5 "
           "(layout and memory assumed)"),
      pcie("rtx4090-1gpu", "rtx4090", kGen4, 1, 1, 1, 128 * kGiB, "ryzen-9-7950x",
           "Workstation: one GeForce RTX 4090 on a Ryzen 9 7950X, 128 GiB DDR5 (assumed)"),
      pcie("rtx4090-8gpu", "rtx4090", kGen4, 8, 2, 2, 1024 * kGiB, "epyc-9654",
           "8x GeForce RTX 4090 in a two-socket EPYC 9654 server, 2 GPUs per PCIe switch, 1 TiB "
           "DDR5 (layout and memory assumed)"),
      pcie("rtx5090-1gpu", "rtx5090", kGen5, 1, 1, 1, 128 * kGiB, "ryzen-9-7950x",
           "Workstation: one GeForce RTX 5090 (PCIe Gen5 x16) on a Ryzen 9 7950X, 128 GiB DDR5 "
           "(assumed)"),
      pcie("rtx5090-8gpu", "rtx5090", kGen5, 8, 2, 2, 1024 * kGiB, "epyc-9755",
           "8x GeForce RTX 5090 in a two-socket EPYC 9755 server, 2 GPUs per PCIe Gen5 switch, 1 "
           "TiB DDR5 (layout and memory assumed)"),
      pcie("rtx6000ada-1gpu", "rtx6000ada", kGen4, 1, 1, 1, 256 * kGiB, "xeon-8480c",
           "Workstation: one RTX 6000 Ada on a Xeon 8480C-class socket, 256 GiB DDR5 (assumed)"),
      pcie("rtx6000ada-4gpu", "rtx6000ada", kGen4, 4, 1, 1, 512 * kGiB, "epyc-9654",
           "Workstation: 4x RTX 6000 Ada, each on its own Gen4 x16, one EPYC 9654 socket, 512 GiB "
           "DDR5 (assumed)"),
  };
  out.insert(out.end(), pcie_systems.begin(), pcie_systems.end());
}

std::vector<System> make_catalogue() {
  std::vector<System> out;
  add_nvlink_systems(out);
  set_hosts(out);
  add_newer_systems(out);
  add_pcie_systems(out);
  out.push_back(one_gpu_of(named(out, "dgx-a100-40gb"), "a100-40gb-1gpu"));
  out.push_back(one_gpu_of(named(out, "dgx-a100-80gb"), "a100-80gb-1gpu"));
  out.push_back(one_gpu_of(named(out, "dgx-h100"), "h100-1gpu"));
  out.push_back(one_gpu_of(named(out, "hgx-h200"), "h200-1gpu"));
  out.push_back(one_gpu_of(named(out, "dgx-b200"), "b200-1gpu"));
  return out;
}

}  // namespace

const char* to_string(HostLinkKind kind) {
  switch (kind) {
    case HostLinkKind::kPcieGen4:
      return "pcie-gen4";
    case HostLinkKind::kPcieGen5:
      return "pcie-gen5";
    case HostLinkKind::kNvlinkC2c:
      return "nvlink-c2c";
  }
  return "?";
}

System System::with_nodes(int count) const {
  System s = *this;
  s.nodes = count;
  if (count > 1 && s.nics_per_node == 0) s.nics_per_node = s.gpus_per_node;
  return s;
}

Status validate(const System& s) {
  auto bad = [&](const std::string& what) {
    return fail(ErrorCode::kInvalidInput, "system '{}': {}", s.name, what);
  };
  if (s.gpus_per_node < 1) return bad("gpus_per_node must be >= 1");
  if (s.nodes < 1) return bad("nodes must be >= 1");
  if (s.sockets_per_node < 1 || s.gpus_per_node % s.sockets_per_node != 0) {
    return bad(fmt::format("{} GPUs per node do not divide over {} sockets", s.gpus_per_node,
                           s.sockets_per_node));
  }
  if (s.gpus_per_pcie_switch < 1 || s.gpus_per_socket() % s.gpus_per_pcie_switch != 0) {
    return bad(fmt::format("{} GPUs per socket do not divide over switches of {}",
                           s.gpus_per_socket(), s.gpus_per_pcie_switch));
  }
  if (s.nvlink_domain_gpus < 1 || (s.nvlink_domain_gpus % s.gpus_per_node != 0 &&
                                   s.gpus_per_node % s.nvlink_domain_gpus != 0)) {
    return bad(fmt::format("an NVLink domain of {} GPUs does not align with nodes of {}",
                           s.nvlink_domain_gpus, s.gpus_per_node));
  }
  if (s.nodes > 1 && s.nics_per_node < 1) return bad("a multi-node system needs NICs");
  if (s.nics_per_node < 0 || (s.nics_per_node > 0 && s.gpus_per_node % s.nics_per_node != 0 &&
                              s.nics_per_node % s.gpus_per_node != 0)) {
    return bad(fmt::format("{} NICs do not align with {} GPUs per node", s.nics_per_node,
                           s.gpus_per_node));
  }
  if (s.host_memory_bytes_per_node <= 0) return bad("host memory must be > 0 bytes");
  const auto kinds = known_gpu_kinds();
  if (std::find(kinds.begin(), kinds.end(), s.gpu) == kinds.end()) {
    return bad(
        fmt::format("unknown GPU kind '{}' (expected one of: {})", s.gpu, fmt::join(kinds, ", ")));
  }
  return ok();
}

const std::vector<System>& list_systems() {
  static const std::vector<System> catalogue = make_catalogue();
  return catalogue;
}

Result<System> find_system(std::string_view name) {
  for (const System& s : list_systems()) {
    if (s.name == name) return s;
  }
  std::vector<std::string> names;
  for (const System& s : list_systems()) names.push_back(s.name);
  return fail(ErrorCode::kNotFound, "unknown system '{}' (expected one of: {})", name,
              fmt::join(names, ", "));
}

}  // namespace offsim::sim::platform
