// `offsim list` (see commands.h): the model, system, host, preset, policy and device catalogues.

#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backends/gpu_plugin.h"
#include "backends/replay.h"
#include "models/evaluate.h"
#include "scenarios/cli/commands.h"
#include "scenarios/cli/common.h"
#include "scenarios/report_format.h"
#include "sim/platform/host.h"
#include "sim/platform/system.h"

namespace offsim::cli {
namespace {

void list_models() {
  for (const auto& m : models::list_models()) {
    auto arch = models::find_model(m.name);
    fmt::print("{:<22} {:>8.1f}B  {}\n", m.name,
               arch ? static_cast<double>(models::parameter_count(*arch)) / 1e9 : 0.0, m.source);
  }
}

void list_systems() {
  for (const auto& s : sim::platform::list_systems()) {
    fmt::print("{:<18} {} × {}, host {}  {}\n", s.name, s.gpus_per_node, s.gpu, s.host,
               s.description);
  }
}

void print_host(const sim::platform::Host& h) {
  fmt::print("{:<12} {}; {:.0f} GB/s DRAM per socket achievable, root complex {:.0f} GB/s\n",
             h.name, h.description, h.dram_bytes_per_s_per_socket.value / 1e9,
             h.root_complex_bytes_per_s.value / 1e9);
}

// The catalogue, then each host file (hardware.host: FILE.json) as a scenario would read it:
// a file that does not read is an input error naming the file and key.
int list_hosts(const std::vector<std::string>& files) {
  for (const auto& h : sim::platform::list_hosts()) print_host(h);
  for (const std::string& f : files) {
    auto h = sim::platform::read_host_file(f);
    if (!h) return report(h.error());
    fmt::print("host file {}:\n", f);
    print_host(*h);
    fmt::print("{:<12} {} cores per socket ({}), CPU Adam {:.2f} GB/s per core ({})\n", "",
               h->cores_per_socket.value, sim::platform::to_string(h->cores_per_socket.origin),
               h->adam_bytes_per_s_per_core.value / 1e9,
               sim::platform::to_string(h->adam_bytes_per_s_per_core.origin));
  }
  return 0;
}

void list_presets() {
  for (const auto& p : models::list_presets()) fmt::print("{:<38} {}\n", p.name, p.description);
}

void list_policies() {
  fmt::print(
      "offload rules (offload.rules[]), each a map:\n"
      "  tensor:           params | grads | optimizer_states | master_weights | activations |\n"
      "                    named_activation (with name:) | an activation name directly\n"
      "  name:             {}\n"
      "  layers:           all | [0, 1, ...] | {{fraction: 0.5}} | {{first: 20}}\n"
      "                    | {{stage_fraction: 0.25}} (the first 25% of each pipeline stage's)\n"
      "  where:            host | hbm\n"
      "  prefetch_layers:  H2D this many layers ahead of use (default 1)\n"
      "  chunk_bytes:      split copies into chunks of at most this size (0 = whole)\n"
      "offload.optimizer:  gpu | cpu (CPU update of host-resident optimizer state)\n"
      "or a preset: offload: <preset> or offload: {{preset: <name>, num_layers:, fraction:,\n"
      "prefetch_layers:, names: [...]}} — see `offsim list presets`.\n",
      fmt::join(models::activation_names(), ", "));
}

int list_devices() {
  int gpus = 0;
  for (const auto& d : backends::list_devices()) {
    const bool unbounded = d.memory_bytes == std::numeric_limits<std::int64_t>::max();
    fmt::print(
        "{:<5} {}  {} rank(s), {} each{}\n", backends::to_string(d.kind), d.name, d.ranks,
        unbounded ? std::string("unbounded memory") : scenarios::format_bytes(d.memory_bytes),
        d.note.empty() ? "" : "  " + d.note);
    gpus += d.kind == backends::DeviceKind::kCuda ? 1 : 0;
  }
  if (gpus > 0) return 0;
  // No GPU listed: say why instead of listing nothing. A module path set explicitly
  // (OFFSIM_GPU_PLUGIN) that does not load is an input error.
  const char* env = std::getenv("OFFSIM_GPU_PLUGIN");
  const bool explicit_path = env != nullptr && *env != '\0';
  auto gpu = backends::load_gpu_plugin();
  if (!gpu && explicit_path) {
    return report(sim::Error{sim::ErrorCode::kInvalidInput,
                             fmt::format("OFFSIM_GPU_PLUGIN={}: {}", env, gpu.error().message)});
  }
  fmt::print(
      "{:<5} none: {}\n", "gpu",
      gpu ? std::string("the GPU module loaded, but no CUDA GPU is visible") : gpu.error().message);
  return 0;
}

}  // namespace

CLI::App* add_list_command(CLI::App& app, ListArgs& list) {
  auto* cmd = app.add_subcommand(
      "list",
      "List catalogues.\n\nExamples:\n  offsim list models\n  offsim list systems\n"
      "  offsim list hosts\n  offsim list hosts --file lab.json\n  offsim list presets\n  offsim "
      "list policies\n  offsim list devices");
  cmd->add_option("what", list.what, "models, systems, hosts, policies, presets or devices")
      ->required();
  cmd->add_option("--file", list.files,
                  "with hosts: also read and list these host files (the JSON of hardware.host)");
  return cmd;
}

int cmd_list(const ListArgs& a) {
  const std::string& what = a.what;
  if (!a.files.empty() && what != "hosts") {
    return usage_error(
        fmt::format("list {} --file: --file lists host files, with list hosts", what));
  }
  if (what == "models") {
    list_models();
  } else if (what == "systems") {
    list_systems();
  } else if (what == "hosts") {
    return list_hosts(a.files);
  } else if (what == "presets") {
    list_presets();
  } else if (what == "policies") {
    list_policies();
  } else if (what == "devices") {
    return list_devices();
  } else {
    return usage_error(fmt::format(
        "list {}: expected models, systems, hosts, policies, presets or devices", what));
  }
  return 0;
}

}  // namespace offsim::cli
