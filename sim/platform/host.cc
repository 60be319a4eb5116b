#include "sim/platform/host.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sim/core/file_io.h"
#include "sim/core/json_reader.h"

namespace offsim::sim::platform {

namespace {

constexpr double kGB = 1e9;

Figure fig(double value, Origin origin, std::string source) {
  return Figure{.value = value, .origin = origin, .source = std::move(source)};
}

// Sources (short, stable strings).
constexpr const char* kSrc8480 =
    "Intel Xeon Platinum 8480C/8480+ (Sapphire Rapids): 56 cores on four 14-core tiles, two "
    "DDR5-4800 channels per tile = 8 channels, 80 PCIe 5.0 lanes, AVX-512 "
    "(servethehome.com Xeon Max 9480 deep dive; NVIDIA DGX H100 datasheet: 2x 8480C)";
constexpr const char* kSrc6900 =
    "Intel Xeon 6900P series (Granite Rapids-AP): 6980P 128 cores, 6960P 72 cores, 12 channels "
    "DDR5-6400 (MRDIMM 8800), 96 PCIe 5.0/CXL lanes, AVX-512 (hardwareluxx.de Xeon 6900P test "
    "table; techpowerup.com Granite Rapids-UCC: three compute tiles with 4 memory channels each)";
constexpr const char* kSrc6900Numa =
    "Intel's 2-socket Xeon 6 (Granite Rapids) measurement notes list NUMA 6 (SNC3: one NUMA node "
    "per compute tile)";
constexpr const char* kSrcGenoa =
    "AMD EPYC 9654 (Genoa, Zen 4): 96 cores, 12 channels DDR5-4800 = 460.8 GB/s per socket, 128 "
    "PCIe 5.0 lanes (160 per two-socket server), AVX-512 on a 256-bit datapath "
    "(tomshardware.fr / playcrazygame.com on AMD's EDAC patches and Genoa launch)";
constexpr const char* kSrcTurin =
    "AMD EPYC 9755 (Turin, Zen 5): 128 cores, 12 channels DDR5-6000, 128 PCIe 5.0 lanes (160 per "
    "two-socket server), full 512-bit AVX-512 datapath (AMD EPYC 9005 launch; hothardware.com: "
    "DDR5-6000 support)";
constexpr const char* kSrc7742 =
    "AMD EPYC 7742 (Rome, Zen 2): 64 cores, 8 channels DDR4-3200 = 204.8 GB/s, 128 PCIe 4.0 lanes, "
    "AVX2 (NVIDIA DGX A100 datasheet: 2x EPYC 7742)";
constexpr const char* kSrcGrace =
    "NVIDIA Grace: 72 Arm Neoverse V2 cores with 4x128-bit SVE2, LPDDR5X up to 480 GB and about "
    "500 GB/s per CPU (1 TB/s per 2-CPU superchip), NVLink-C2C 900 GB/s bidirectional to the GPU "
    "(NVIDIA Grace CPU Superchip architecture blog; hardwaretimes.com Grace announcement)";
constexpr const char* kSrcStreamFraction =
    "derived: achievable = peak x 290/307.2, the fraction of hardware.md's 8-channel DDR5-4800 "
    "socket (~280-300 GB/s of 307.2 GB/s peak)";
constexpr const char* kSrcRcScaled =
    "assumption: the root-complex DMA cap scales with PCIe lanes from the one measured host "
    "(2x Xeon 8480C, 80 lanes each: ~278 GB/s H2D per 8-GPU node, cuda-samples #357)";
constexpr const char* kSrcRc8480 =
    "hardware.md: one Gen5 8-GPU node capped at ~278 GB/s total H2D (host side, cuda-samples "
    "#357), split over its 2 sockets";
constexpr const char* kSrcC2c =
    "hardware.md: GH200 NVLink-C2C both directions at once about half each of ~360 H2D + ~297 D2H "
    "GB/s, Grace LPDDR5X bound (arXiv 2407.07850, nvbandwidth)";

const double kStreamFraction = 290.0 / 307.2;

// DeepSpeed CPU Adam on a 512-bit (AVX-512) core. DeepSpeed PR #735 (the CPU-Adam author):
// "reduces the optimizer time from 56 seconds to 8.2 seconds [for] an 11.6B parameter GPT2
// model" (one GPU, ZeRO-Offload, so one process with every core of the host). The host is taken
// to be the ZeRO-Offload paper's DGX-2: 2x Xeon Platinum 8168, 24 AVX-512 cores each (NVIDIA
// DGX-2 datasheet). The optimizer time is DeepSpeed's host step, which streams 42 bytes per
// parameter (models/step_offload.cc: unscale/clip 8, Adam 28, fp32 to 16-bit parameter copy 6;
// the gradient is widened and its norm taken on the GPU, in the 2021 stage2.py as in today's
// stage_1_and_2.py): 11.6e9 x 42 B / 8.2 s / 48 cores.
constexpr double kAdamParams = 11.6e9, kAdamSeconds = 8.2, kAdamCores = 48.0;
constexpr double kAdamBytesPerParam = 42.0;
const double kAdamBytesPerCore512 = kAdamParams * kAdamBytesPerParam / kAdamSeconds / kAdamCores;
constexpr const char* kSrcAdam =
    "published: DeepSpeed PR #735, CPU-Adam 8.2 s per step for an 11.6B-parameter GPT-2 "
    "(ZeRO-Offload, one GPU), host taken as DGX-2's 2x Xeon Platinum 8168 (48 AVX-512 cores, "
    "NVIDIA DGX-2 datasheet; the PR does not name it): 11.6e9 x 42 B / 8.2 s / 48 cores, "
    "scaled by vector width / 512 bits (DeepSpeed's AVX-512 and AVX2 kernels: 16 and 8 fp32 "
    "lanes); the step time may include the parameter H2D copy (then this rate is low)";
// DeepSpeed CPU-Adam on Grace, measured by the SuperOffload authors (Lian et al., arXiv
// 2509.21271; DeepSpeed blogs/deepspeed-superoffload/README.md, Figure 5, "Using GraceAdam for
// efficient Adam optimizer computation on GH200"): one optimizer step over 1, 2, 4 and 8 billion
// parameters takes 0.098, 0.198, 0.393 and 0.769 s with DeepSpeed's CPU-Adam (GraceAdam 0.082,
// 0.160, 0.316, 0.608 s; PyTorch's CPU Adam 0.289 ... 1.834 s). Time is linear in the parameter
// count (3.93-4.05 GB/s per core over the four rows), so it is a throughput, not an overhead.
// DeepSpeed's CPU-Adam step on fp32 buffers reads parameter, gradient and both moments and
// writes parameter and moments: 28 bytes per parameter. The figure does not state the cores;
// all 72 of the Grace CPU are taken. On aarch64 DeepSpeed's release builds its scalar loop
// (csrc/includes/simd.h has AVX-512/AVX2 paths only; -march=native lets the compiler
// vectorise it): the rate of what SuperOffload's released worker runs. GraceAdam (1.26x on
// the 8B row) is not in DeepSpeed's release, so it is not the default.
constexpr double kGraceAdamParams = 8e9, kGraceAdamSeconds = 0.769, kGraceCores = 72.0;
constexpr double kFp32AdamBytesPerParam = 28.0;
const double kGraceAdamBytesPerCore =
    kGraceAdamParams * kFp32AdamBytesPerParam / kGraceAdamSeconds / kGraceCores;
constexpr const char* kSrcGraceAdam =
    "published: SuperOffload (arXiv 2509.21271; DeepSpeed blogs/deepspeed-superoffload Figure 5): "
    "DeepSpeed CPU-Adam on GH200's Grace steps 8e9 parameters in 0.769 s (1e9 in 0.098 s; "
    "GraceAdam 0.608 s, PyTorch CPU Adam 1.834 s); 28 bytes per parameter (fp32 parameter, "
    "gradient, moments read; parameter, moments written) on all 72 cores (the cores are not "
    "stated): 8e9 x 28 B / 0.769 s / 72 = 4.05 GB/s per core";
constexpr const char* kSrcRemote =
    "assumption: a core streaming from the other socket's DRAM takes 1.6x as long per byte "
    "(cross-socket latency about 1.6x local on two-socket x86 servers, the order that "
    "arXiv 2204.03290 reports for EPYC Rome and Cascade Lake); not fitted to any table";
constexpr double kRemoteRatio = 1.6;

Host x86(std::string name, std::string description, HostLinkKind attach, double cores,
         double vector_bits, double channels, double mts, double lanes, double numa,
         const char* src, const char* numa_src) {
  Host h;
  h.name = std::move(name);
  h.description = std::move(description);
  h.attach = attach;
  h.cores_per_socket = fig(cores, Origin::kDatasheet, src);
  h.vector_bits = fig(vector_bits, Origin::kDatasheet, src);
  h.memory_channels_per_socket = fig(channels, Origin::kDatasheet, src);
  const double peak = channels * mts * 1e6 * 8.0;
  h.dram_peak_bytes_per_s_per_socket =
      fig(peak, Origin::kDatasheet,
          fmt::format("{}; {} channels x {} MT/s x 8 bytes", src, channels, mts));
  h.dram_bytes_per_s_per_socket =
      fig(peak * kStreamFraction, Origin::kAssumption, kSrcStreamFraction);
  h.pcie_lanes_per_socket = fig(lanes, Origin::kDatasheet, src);
  h.root_complex_bytes_per_s = fig(278 * kGB / 2 * lanes / 80.0, Origin::kAssumption, kSrcRcScaled);
  h.numa_nodes_per_socket = fig(numa, Origin::kDatasheet, numa_src);
  h.adam_bytes_per_s_per_core =
      fig(kAdamBytesPerCore512 * vector_bits / 512.0, Origin::kPublished, kSrcAdam);
  h.remote_dram_time_ratio = fig(kRemoteRatio, Origin::kAssumption, kSrcRemote);
  return h;
}

std::vector<Host> make_catalogue() {
  std::vector<Host> out;
  {
    Host h = x86("xeon-8480c",
                 "Intel Xeon Platinum 8480C: 56 cores, 8x DDR5-4800, 80 PCIe 5.0 "
                 "lanes (DGX/HGX H100 and H200 hosts)",
                 HostLinkKind::kPcieGen5, 56, 512, 8, 4800, 80, 1, kSrc8480,
                 "Sapphire Rapids default: sub-NUMA clustering off, one NUMA node per socket");
    // The one host with measurements: keep hardware.md's figures exactly.
    h.dram_bytes_per_s_per_socket =
        fig(290 * kGB, Origin::kAssumption,
            "hardware.md: 8 DDR5 channels per socket, ~280-300 GB/s per socket (derived); "
            "midpoint");
    h.root_complex_bytes_per_s = fig(278 * kGB / 2, Origin::kPublished, kSrcRc8480);
    out.push_back(h);
  }
  out.push_back(x86("xeon-6960p",
                    "Intel Xeon 6960P: 72 cores, 12x DDR5-6400, 96 PCIe 5.0 lanes, SNC3",
                    HostLinkKind::kPcieGen5, 72, 512, 12, 6400, 96, 3, kSrc6900, kSrc6900Numa));
  out.push_back(x86("xeon-6980p",
                    "Intel Xeon 6980P: 128 cores, 12x DDR5-6400, 96 PCIe 5.0 lanes, SNC3",
                    HostLinkKind::kPcieGen5, 128, 512, 12, 6400, 96, 3, kSrc6900, kSrc6900Numa));
  // Two-socket EPYC servers give 160 lanes in all for devices (3 xGMI links): 80 per socket.
  out.push_back(x86("epyc-9654",
                    "AMD EPYC 9654 (Genoa): 96 cores, 12x DDR5-4800, 128 PCIe 5.0 lanes (80 per "
                    "socket usable in two-socket servers), NPS1",
                    HostLinkKind::kPcieGen5, 96, 256, 12, 4800, 80, 1, kSrcGenoa,
                    "EPYC default NPS1: one NUMA node per socket (NPS2/NPS4 optional)"));
  out.push_back(x86("epyc-9755",
                    "AMD EPYC 9755 (Turin): 128 cores, 12x DDR5-6000, 128 PCIe 5.0 lanes (80 per "
                    "socket usable in two-socket servers), NPS1",
                    HostLinkKind::kPcieGen5, 128, 512, 12, 6000, 80, 1, kSrcTurin,
                    "EPYC default NPS1: one NUMA node per socket (NPS2/NPS4 optional)"));
  {
    Host h = x86("epyc-7742",
                 "AMD EPYC 7742 (Rome): 64 cores, 8x DDR4-3200, 128 PCIe 4.0 lanes (DGX A100 host)",
                 HostLinkKind::kPcieGen4, 64, 256, 8, 3200, 128, 1, kSrc7742,
                 "DGX A100 runs NPS4 (4 NUMA nodes per socket) per its user guide; EPYC default "
                 "NPS1 assumed here");
    h.numa_nodes_per_socket.origin = Origin::kAssumption;
    h.dram_bytes_per_s_per_socket =
        fig(190 * kGB, Origin::kAssumption,
            "DGX A100 sockets (AMD EPYC 7742): 8 DDR4-3200 channels = 204.8 GB/s peak, ~93% "
            "achievable as in hardware.md's DDR5 derivation");
    h.root_complex_bytes_per_s =
        fig(2 * 25 * kGB, Origin::kAssumption,
            "no host-side cap measured on DGX A100: the sum of a socket's two Gen4 switch uplinks");
    out.push_back(h);
  }
  out.push_back(x86("ryzen-9-7950x",
                    "AMD Ryzen 9 7950X (workstation): 16 cores, 2x DDR5-5200, 24 usable PCIe "
                    "5.0 lanes",
                    HostLinkKind::kPcieGen5, 16, 256, 2, 5200, 24, 1,
                    "AMD Ryzen 9 7950X specifications: 16 Zen 4 cores, dual-channel DDR5-5200, 28 "
                    "PCIe 5.0 lanes (24 usable, 4 to the chipset), AVX-512 on a 256-bit datapath",
                    "one NUMA node (single die set, one memory controller)"));
  {
    Host h;
    h.name = "grace";
    h.description = "NVIDIA Grace: 72 Neoverse V2 cores, LPDDR5X, NVLink-C2C to its GPU(s)";
    h.attach = HostLinkKind::kNvlinkC2c;
    h.cores_per_socket = fig(72, Origin::kDatasheet, kSrcGrace);
    h.vector_bits = fig(128, Origin::kDatasheet, kSrcGrace);
    h.memory_channels_per_socket =
        fig(16, Origin::kDatasheet, std::string(kSrcGrace) + "; 32 channels per 2-CPU superchip");
    h.dram_peak_bytes_per_s_per_socket = fig(500 * kGB, Origin::kDatasheet, kSrcGrace);
    h.dram_bytes_per_s_per_socket = fig((360 + 297) * kGB / 2, Origin::kPublished, kSrcC2c);
    h.pcie_lanes_per_socket = fig(0, Origin::kDatasheet, "GPUs attach over NVLink-C2C, not PCIe");
    h.root_complex_bytes_per_s = fig((360 + 297) * kGB / 2, Origin::kPublished, kSrcC2c);
    h.numa_nodes_per_socket =
        fig(1, Origin::kDatasheet, "one NUMA node per Grace CPU (the GPU's HBM is another)");
    // Measured on Grace itself (SuperOffload's Figure 5), not scaled from an x86 core.
    h.adam_bytes_per_s_per_core = fig(kGraceAdamBytesPerCore, Origin::kPublished, kSrcGraceAdam);
    h.remote_dram_time_ratio = fig(kRemoteRatio, Origin::kAssumption, kSrcRemote);
    out.push_back(h);
  }
  return out;
}

int pcie_generation(HostLinkKind kind) {
  switch (kind) {
    case HostLinkKind::kPcieGen4:
      return 4;
    case HostLinkKind::kPcieGen5:
      return 5;
    case HostLinkKind::kNvlinkC2c:
      return 0;
  }
  return 0;
}

// The figures of a profile that an override may name: every JSON object with a "value" key,
// by its dotted path.
void figure_paths(const nlohmann::json& j, const std::string& prefix,
                  std::vector<std::string>& out) {
  if (!j.is_object()) return;
  if (j.contains("value") && j.contains("origin")) {
    out.push_back(prefix);
    return;
  }
  for (const auto& [key, value] : j.items()) {
    figure_paths(value, prefix.empty() ? key : prefix + "." + key, out);
  }
}

struct SystemField {
  const char* name;
  int System::*member;
};
constexpr SystemField kSystemIntFields[] = {
    {"sockets_per_node", &System::sockets_per_node},
    {"gpus_per_pcie_switch", &System::gpus_per_pcie_switch},
    {"nvlink_domain_gpus", &System::nvlink_domain_gpus},
    {"nics_per_node", &System::nics_per_node},
};

}  // namespace

const std::vector<Host>& list_hosts() {
  static const std::vector<Host> catalogue = make_catalogue();
  return catalogue;
}

Result<Host> find_host(std::string_view name) {
  for (const Host& h : list_hosts()) {
    if (h.name == name) return h;
  }
  std::vector<std::string> names;
  for (const Host& h : list_hosts()) names.push_back(h.name);
  return fail(ErrorCode::kNotFound, "unknown host '{}' (expected one of: {})", name,
              fmt::join(names, ", "));
}

namespace {

using nlohmann::json;

// The figures of a host file, each with its plausible range: a figure outside it is a typo or a
// units mistake (bytes/s given in GB/s), not an unusual machine.
struct HostField {
  const char* key;
  Figure Host::*member;
  double lo;
  double hi;
  bool whole;
  const char* what;
};
constexpr HostField kHostFields[] = {
    {"cores_per_socket", &Host::cores_per_socket, 1, 4096, true, "cores"},
    {"vector_bits", &Host::vector_bits, 64, 2048, true, "SIMD width in bits"},
    {"memory_channels_per_socket", &Host::memory_channels_per_socket, 1, 256, true, "channels"},
    {"dram_peak_bytes_per_s_per_socket", &Host::dram_peak_bytes_per_s_per_socket, 1e9, 1e13, false,
     "bytes/s"},
    {"dram_bytes_per_s_per_socket", &Host::dram_bytes_per_s_per_socket, 1e9, 1e13, false,
     "bytes/s"},
    {"pcie_lanes_per_socket", &Host::pcie_lanes_per_socket, 0, 1024, true, "PCIe lanes"},
    {"root_complex_bytes_per_s", &Host::root_complex_bytes_per_s, 1e9, 1e13, false, "bytes/s"},
    {"numa_nodes_per_socket", &Host::numa_nodes_per_socket, 1, 64, true, "NUMA nodes"},
    {"adam_bytes_per_s_per_core", &Host::adam_bytes_per_s_per_core, 1e7, 1e12, false,
     "bytes/s per core"},
    {"remote_dram_time_ratio", &Host::remote_dram_time_ratio, 1, 100, false,
     "remote/local time per byte"},
};
constexpr HostLinkKind kAttachKinds[] = {HostLinkKind::kPcieGen4, HostLinkKind::kPcieGen5,
                                         HostLinkKind::kNvlinkC2c};
constexpr const char* kHostFormat = "offsim-host";

Result<Figure> host_figure(const JsonReader& r, const json& value, const HostField& f) {
  const std::string p = std::string("$.") + f.key;
  if (!value.is_object()) {
    return r.error(p,
                   fmt::format("expected an object {{\"value\", \"origin\", \"source\"}}, got {}",
                               json_type_name(value)));
  }
  OFFSIM_RETURN_IF_ERROR(r.only_keys(value, {"value", "origin", "source"}, p));
  Figure out;
  OFFSIM_ASSIGN_OR_RETURN(out.value, r.number(value, "value", p));
  const bool whole_ok = !f.whole || out.value == std::floor(out.value);
  if (!std::isfinite(out.value) || out.value < f.lo || out.value > f.hi || !whole_ok) {
    return r.error(p + ".value", fmt::format("expected {} in [{}, {}] ({}), got {}",
                                             f.whole ? "a whole number" : "a number", f.lo, f.hi,
                                             f.what, out.value));
  }
  OFFSIM_ASSIGN_OR_RETURN(std::string origin, r.string(value, "origin", p));
  const auto o = origin_from_string(origin);
  if (!o) {
    return r.error(p + ".origin", fmt::format("unknown origin '{}' (expected datasheet, published, "
                                              "assumption or measured)",
                                              origin));
  }
  out.origin = *o;
  OFFSIM_ASSIGN_OR_RETURN(out.source, r.string(value, "source", p));
  if (out.source.empty()) return r.error(p + ".source", "expected where the figure comes from");
  return out;
}

Status check_host_header(const JsonReader& r, const json& j) {
  if (!j.is_object()) {
    return r.error("$",
                   fmt::format("expected a host file (a JSON object), got {}", json_type_name(j)));
  }
  OFFSIM_ASSIGN_OR_RETURN(std::string format, r.string(j, "format", "$"));
  if (format != kHostFormat) {
    return r.error("$.format", fmt::format("expected \"{}\", got \"{}\"", kHostFormat, format));
  }
  if (j.contains("format_version")) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t version, r.integer(j, "format_version", "$"));
    if (version != 1) {
      return r.error("$.format_version", fmt::format("expected 1, got {}", version));
    }
  }
  std::vector<std::string> allowed = {"format",      "format_version", "name",
                                      "description", "base",           "attach"};
  for (const HostField& f : kHostFields) allowed.emplace_back(f.key);
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find(allowed.begin(), allowed.end(), it.key()) == allowed.end()) {
      return r.error("$", fmt::format("unknown key '{}' (expected one of: {})", it.key(),
                                      fmt::join(allowed, ", ")));
    }
  }
  return ok();
}

Result<HostLinkKind> host_attach(const JsonReader& r, const json& j) {
  OFFSIM_ASSIGN_OR_RETURN(std::string name, r.string(j, "attach", "$"));
  for (HostLinkKind k : kAttachKinds) {
    if (name == to_string(k)) return k;
  }
  return r.error(
      "$.attach",
      fmt::format("unknown attach '{}' (expected pcie-gen4, pcie-gen5 or nvlink-c2c)", name));
}

}  // namespace

bool is_host_file(std::string_view name) { return name.ends_with(".json"); }

Result<Host> host_from_json(const json& j, const std::string& source) {
  const JsonReader r(source);
  OFFSIM_RETURN_IF_ERROR(check_host_header(r, j));
  Host h;
  const bool has_base = j.contains("base");
  if (has_base) {
    OFFSIM_ASSIGN_OR_RETURN(std::string base, r.string(j, "base", "$"));
    auto found = find_host(base);
    if (!found) return r.error("$.base", found.error().message);
    h = *found;
  }
  h.name = source;
  if (j.contains("name")) {
    OFFSIM_ASSIGN_OR_RETURN(h.name, r.string(j, "name", "$"));
  }
  if (j.contains("description")) {
    OFFSIM_ASSIGN_OR_RETURN(h.description, r.string(j, "description", "$"));
  }
  if (j.contains("attach")) {
    OFFSIM_ASSIGN_OR_RETURN(h.attach, host_attach(r, j));
  } else if (!has_base) {
    return r.error("$",
                   "missing key 'attach' (pcie-gen4, pcie-gen5 or nvlink-c2c; or give "
                   "\"base\": a catalogue host)");
  }
  for (const HostField& f : kHostFields) {
    if (!j.contains(f.key)) {
      if (has_base) continue;
      return r.error("$", fmt::format("missing key '{}' (every figure is needed without \"base\": "
                                      "a catalogue host)",
                                      f.key));
    }
    OFFSIM_ASSIGN_OR_RETURN(h.*(f.member), host_figure(r, j.at(f.key), f));
  }
  return h;
}

Result<Host> read_host_file(const std::string& path) {
  // A host file is about 2 KiB; 1 MiB is plenty.
  constexpr InputKind kHostInput{"a host file (JSON)", std::int64_t{1} << 20};
  OFFSIM_ASSIGN_OR_RETURN(std::string text, read_input_file(path, kHostInput));
  OFFSIM_ASSIGN_OR_RETURN(json j, parse_json_text(text, path));
  return host_from_json(j, path);
}

json host_to_json(const Host& host, const Host* base) {
  json j{{"format", kHostFormat}, {"format_version", 1}, {"name", host.name}};
  if (!host.description.empty()) j["description"] = host.description;
  if (base != nullptr) j["base"] = base->name;
  if (base == nullptr || base->attach != host.attach) j["attach"] = to_string(host.attach);
  for (const HostField& f : kHostFields) {
    const Figure& fig = host.*(f.member);
    if (base != nullptr && fig == (*base).*(f.member)) continue;
    j[f.key] =
        json{{"value", fig.value}, {"origin", to_string(fig.origin)}, {"source", fig.source}};
  }
  return j;
}

Result<Host> find_or_read_host(const std::string& name_or_path) {
  if (is_host_file(name_or_path)) return read_host_file(name_or_path);
  return find_host(name_or_path);
}

Status check_attach(const Host& host, const System& s) {
  const bool c2c = s.host_link == HostLinkKind::kNvlinkC2c;
  if (c2c != (host.attach == HostLinkKind::kNvlinkC2c)) {
    return fail(ErrorCode::kInvalidInput,
                "host '{}' attaches GPUs over {}, but system '{}' connects its GPUs over {}; "
                "choose a {} host",
                host.name, to_string(host.attach), s.name, to_string(s.host_link),
                c2c ? "Grace (NVLink-C2C)" : "PCIe (x86)");
  }
  if (c2c) return ok();
  if (pcie_generation(host.attach) < pcie_generation(s.host_link)) {
    return fail(ErrorCode::kInvalidInput,
                "host '{}' has {} root ports, but system '{}' needs {} for its GPUs' host links",
                host.name, to_string(host.attach), s.name, to_string(s.host_link));
  }
  // One x16 link per GPU, or per PCIe switch uplink when GPUs share switches.
  const int links = s.gpus_per_socket() / std::max(1, s.gpus_per_pcie_switch);
  const int lanes = 16 * links;
  if (lanes > host.pcie_lanes_per_socket.value) {
    return fail(ErrorCode::kInvalidInput,
                "host '{}' has {} PCIe lanes per socket, but system '{}' needs {} ({} x16 links "
                "per socket)",
                host.name, host.pcie_lanes_per_socket.value, s.name, lanes, links);
  }
  return ok();
}

void apply_host(const Host& host, CalibrationProfile& p, bool keep_measured) {
  auto set = [&](Figure& target, const Figure& value) {
    if (keep_measured && target.origin == Origin::kMeasured) return;
    target = value;
  };
  set(p.host.cores_per_socket, host.cores_per_socket);
  set(p.host.dram_bytes_per_s_per_socket, host.dram_bytes_per_s_per_socket);
  set(p.host_link.root_complex_bytes_per_s, host.root_complex_bytes_per_s);
  set(p.host.adam_bytes_per_s_per_core, host.adam_bytes_per_s_per_core);
  set(p.host.remote_dram_time_ratio, host.remote_dram_time_ratio);
}

std::vector<std::string> override_paths(const System& system, const CalibrationProfile& profile) {
  std::vector<std::string> out;
  for (const SystemField& f : kSystemIntFields) out.push_back(std::string("system.") + f.name);
  out.push_back("system.host_memory_bytes_per_node");
  std::vector<std::string> figures;
  figure_paths(profile_to_json(profile), "", figures);
  for (const std::string& f : figures) out.push_back("profile." + f);
  (void)system;
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

Status apply_override(const std::string& path, double value, System& system,
                      CalibrationProfile& profile) {
  const std::string key = "hardware.overrides." + path;
  auto unknown = [&]() {
    const auto paths = override_paths(system, profile);
    return fail(ErrorCode::kInvalidInput, "{}: unknown figure '{}'; expected one of: {}", key, path,
                fmt::join(paths, ", "));
  };
  if (!std::isfinite(value)) {
    return fail(ErrorCode::kInvalidInput, "{}: expected a finite number", key);
  }
  if (path.starts_with("system.")) {
    const std::string field = path.substr(7);
    if (field == "host_memory_bytes_per_node") {
      if (value <= 0) {
        return fail(ErrorCode::kInvalidInput, "{}: expected a number of bytes > 0, got {}", key,
                    value);
      }
      system.host_memory_bytes_per_node = static_cast<std::int64_t>(value);
      return ok();
    }
    for (const SystemField& f : kSystemIntFields) {
      if (field != f.name) continue;
      if (value != std::floor(value) || value < 0 || value > 1e6) {
        return fail(ErrorCode::kInvalidInput, "{}: expected a whole number in 0..1000000, got {}",
                    key, value);
      }
      system.*(f.member) = static_cast<int>(value);
      return ok();
    }
    return unknown();
  }
  if (!path.starts_with("profile.")) return unknown();
  nlohmann::json j = profile_to_json(profile);
  nlohmann::json* at = &j;
  std::size_t start = 8;
  while (start <= path.size()) {
    const std::size_t dot = path.find('.', start);
    const std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!at->is_object() || !at->contains(part)) return unknown();
    at = &(*at)[part];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (!at->is_object() || !at->contains("value") || !at->contains("origin")) return unknown();
  (*at)["value"] = value;
  (*at)["origin"] = to_string(Origin::kAssumption);
  (*at)["source"] = "scenario override " + key;
  auto back = profile_from_json(j, key);
  if (!back) return fail(ErrorCode::kInvalidInput, "{}", back.error().message);
  profile = std::move(*back);
  return ok();
}

}  // namespace

Result<ResolvedHardware> resolve_hardware(
    const System& system, const CalibrationProfile& profile, const std::string& host_name,
    const std::vector<std::pair<std::string, double>>& overrides) {
  ResolvedHardware out{.system = system, .profile = profile, .host = {}};
  const std::string name = host_name.empty() ? system.host : host_name;
  if (!name.empty()) {
    auto host = find_or_read_host(name);
    if (!host) {
      return fail(ErrorCode::kInvalidInput, "hardware.host: {}", host.error().message);
    }
    if (auto attached = check_attach(*host, system); !attached) {
      return fail(ErrorCode::kInvalidInput, "hardware.host: {}", attached.error().message);
    }
    apply_host(*host, out.profile, /*keep_measured=*/host_name.empty());
    out.host = name;
  }
  for (const auto& [path, value] : overrides) {
    OFFSIM_RETURN_IF_ERROR(apply_override(path, value, out.system, out.profile));
  }
  if (auto valid = validate(out.system); !valid) {
    return fail(ErrorCode::kInvalidInput, "hardware.overrides: {}", valid.error().message);
  }
  return out;
}

}  // namespace offsim::sim::platform
