// gui_sample_files OUT_DIR: writes inputs for offsim-gui from the hand-built sample offload plan
// (sample_plan.h), all computed, none typed in:
//   predicted.json  the plan simulated by sim::simulate
//   measured.json   the plan replayed on the CPU device (scaled-down work), when built with
//                   backends/
//   sweep.jsonl     the plan simulated over prefetch depth x PCIe bandwidth, rows as
//                   `offsim sweep` writes them (HBM capacity 1.18 GB, so the deepest prefetch at
//                   high bandwidth runs out of memory)
// The README screenshots come from these files until the example scenarios run through the CLI.
#include <cstdio>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sim/core/file_io.h"
#include "sim/engine/simulator.h"
#include "sim/trace/timeline_json.h"
#include "tests/gui/sample_plan.h"
#if OFFSIM_GUI_SAMPLES_HAVE_BACKENDS
#include "backends/replay.h"
#endif

namespace {

using offsim::gui::testing::sample_offload_plan;
using offsim::gui::testing::SamplePlanOptions;
namespace sim = offsim::sim;

int fail(const std::string& message) {
  std::fprintf(stderr, "gui_sample_files: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return fail("usage: gui_sample_files OUT_DIR");
  const std::filesystem::path dir(argv[1]);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return fail(fmt::format("{}: {}", dir.string(), ec.message()));

  const sim::Plan plan = sample_offload_plan({.layers = 8, .prefetch_depth = 2});
  auto predicted = sim::simulate(plan);
  if (!predicted) return fail(predicted.error().message);
  if (auto s = sim::write_text_file_atomic((dir / "predicted.json").string(),
                                           sim::timeline_to_json(predicted->timeline).dump());
      !s) {
    return fail(s.error().message);
  }
#if OFFSIM_GUI_SAMPLES_HAVE_BACKENDS
  offsim::backends::ReplayOptions replay_options;
  replay_options.device = offsim::backends::DeviceKind::kCpu;
  auto measured = offsim::backends::replay(plan, replay_options);
  if (!measured) return fail(measured.error().message);
  if (auto s = sim::write_text_file_atomic((dir / "measured.json").string(),
                                           sim::timeline_to_json(measured->timeline).dump());
      !s) {
    return fail(s.error().message);
  }
#endif

  std::string rows;
  int index = 0;
  for (int depth : {1, 2, 3, 4, 0}) {
    for (double pcie_gb_s : {6.25, 12.5, 25.0, 50.0}) {
      const SamplePlanOptions options{.layers = 8,
                                      .prefetch_depth = depth,
                                      .pcie_bytes_per_s = pcie_gb_s * 1e9,
                                      .hbm_capacity_bytes = 1'180'000'000};
      auto result = sim::simulate(sample_offload_plan(options));
      nlohmann::json row;
      row["index"] = index++;
      row["scenario"] = "tests/gui/sample_plan.h";
      row["axes"] = {
          {"offload.prefetch_depth", depth == 0 ? std::string("all") : std::to_string(depth)},
          {"hardware.pcie_gb_s", pcie_gb_s}};
      if (!result) {
        row["error"] = result.error().message;
      } else {
        const sim::Timeline& t = result->timeline;
        std::int64_t peak = 0;
        for (const sim::PoolTrace& p : t.pools) {
          if (p.name.ends_with(".hbm")) peak = std::max(peak, p.peak_bytes);
        }
        // Out of memory: what the failing alloc would have needed.
        if (t.outcome.oom)
          peak = std::max(peak, t.outcome.oom->in_use_bytes + t.outcome.oom->requested_bytes);
        row["report"] = {{"step_time_s", sim::to_seconds(t.makespan)},
                         {"fits", t.outcome.kind == sim::OutcomeKind::kCompleted},
                         {"outcome", sim::to_string(t.outcome.kind)},
                         {"hbm_peak_bytes", peak}};
      }
      rows += row.dump() + "\n";
    }
  }
  if (auto s = sim::write_text_file_atomic((dir / "sweep.jsonl").string(), rows); !s) {
    return fail(s.error().message);
  }
  std::printf("wrote %s\n", dir.string().c_str());
  return 0;
}
