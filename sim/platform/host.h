// Host: the CPU side of a machine as a component — the CPU model of each socket with its cores,
// vector width, memory channels and DRAM bandwidth, PCIe lanes and the DMA limit of its root
// complex, and its NUMA layout — and the catalogue of known hosts. Every figure carries its
// source (datasheet, published measurement or assumption).
//
// resolve_hardware() puts a system, its calibration profile, a host and figure overrides
// together: the host's figures replace the profile's host figures, then each override
// ("profile.host.cores_per_socket", "system.host_memory_bytes_per_node", ...) replaces one
// figure. A host that cannot attach the system's GPUs, an unknown host and an override of a
// figure that does not exist are input errors naming the valid choices.
//
//   auto host = sim::platform::find_host("xeon-6960p");          // Result<Host>
//   auto hw = sim::platform::resolve_hardware(*find_system("hgx-h200"), *builtin_profile("h200"),
//                                             "xeon-6960p", {{"profile.host.cores_per_socket",
//                                             32}});
//   if (!hw) { ... hw.error().message names the key and the valid choices ... }
//   double cores = hw->profile.host.cores_per_socket.value;      // 32
//
// A host file (hardware.host: a path ending in ".json") describes a host in JSON, each figure
// as {"value", "origin", "source"}; with "base" it names a catalogue host and replaces only the
// figures it lists:
//   {"format": "offsim-host", "base": "xeon-8480c", "name": "lab-node",
//    "cores_per_socket": {"value": 32, "origin": "measured", "source": "lscpu on lab-node"}}
//   auto h = sim::platform::find_or_read_host("hosts/lab-node.json");  // errors name the key
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/core/result.h"
#include "sim/platform/profile.h"
#include "sim/platform/system.h"

namespace offsim::sim::platform {

struct Host {
  std::string name;                               // "xeon-8480c"
  std::string description;                        // one line: the CPU, its memory and I/O
  HostLinkKind attach = HostLinkKind::kPcieGen5;  // the fastest GPU link its sockets offer
  Figure cores_per_socket;
  Figure vector_bits;  // SIMD datapath width of one core (AVX-512 512, AVX2 256, SVE2 128)
  Figure memory_channels_per_socket;
  Figure dram_peak_bytes_per_s_per_socket;  // channels x transfer rate x 8 bytes
  Figure dram_bytes_per_s_per_socket;       // achievable (STREAM-class streaming)
  Figure pcie_lanes_per_socket;             // usable for devices in a two-socket server
  Figure root_complex_bytes_per_s;          // per socket and direction, all its GPUs' DMA
  Figure numa_nodes_per_socket;             // default BIOS setting (SNC / NPS)
  // DeepSpeed CPU Adam's host step (gradient conversion, norm, clipping, Adam, parameter
  // conversion) in bytes streamed per second per core. x86: the published rate of a 512-bit
  // core scaled by this core's vector width (DeepSpeed compiles its AVX-512 or its AVX2 kernel);
  // Grace: DeepSpeed CPU-Adam measured on a GH200 (SuperOffload, arXiv 2509.21271).
  Figure adam_bytes_per_s_per_core;
  // Time per byte a thread takes on data in another socket's DRAM, over local DRAM.
  Figure remote_dram_time_ratio;
  bool operator==(const Host&) const = default;
};

const std::vector<Host>& list_hosts();
// Exact name from list_hosts(); the error lists the known names.
Result<Host> find_host(std::string_view name);

// True when `name` is a host file path (ends in ".json") rather than a catalogue name.
bool is_host_file(std::string_view name);

// A host file's document; `source` names it in errors ("lab.json: $.cores_per_socket.value:
// expected a whole number in [1, 4096], got 0"). Unknown keys, wrong types, absurd figures and,
// without "base", missing figures are errors.
Result<Host> host_from_json(const nlohmann::json& json, const std::string& source);
Result<Host> read_host_file(const std::string& path);

// The document of `host`: every figure, or with `base` the base's name and only the figures
// that differ from it.
nlohmann::json host_to_json(const Host& host, const Host* base = nullptr);

// A catalogue name (find_host) or a host file (read_host_file).
Result<Host> find_or_read_host(const std::string& name_or_path);

// OK when `host` can attach the GPUs of `system`: the same kind of GPU link (NVLink-C2C systems
// need a Grace host, PCIe systems an x86 host of at least the link's PCIe generation) and
// enough PCIe lanes per socket for one x16 link per GPU or PCIe switch.
Status check_attach(const Host& host, const System& system);

// The profile's host figures replaced by the host's (cores, DRAM bandwidth, root complex, CPU
// Adam rate, remote-DRAM ratio).
// With `keep_measured`, figures that the profile measured stay.
void apply_host(const Host& host, CalibrationProfile& profile, bool keep_measured);

struct ResolvedHardware {
  System system;
  CalibrationProfile profile;
  std::string host;  // the host applied ("" when none)
};

// `host_name` empty: the system's own host (when it has one), whose figures replace only the
// profile's non-measured figures. `overrides`: (path, value) pairs, path "system.<field>" or
// "profile.<json path of a figure>" as in profile JSON (e.g. "profile.host_link.h2d_bytes_per_s").
Result<ResolvedHardware> resolve_hardware(
    const System& system, const CalibrationProfile& profile, const std::string& host_name,
    const std::vector<std::pair<std::string, double>>& overrides);

// Every path an override may name for this system and profile, sorted.
std::vector<std::string> override_paths(const System& system, const CalibrationProfile& profile);

}  // namespace offsim::sim::platform
