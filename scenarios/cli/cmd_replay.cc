// `offsim replay` (see commands.h): a scenario's Plan executed on a device (CUDA/NCCL or the CPU
// device) and its measured timeline compared with the forecast.

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "backends/mpi_replay.h"
#include "backends/replay.h"
#include "models/evaluate.h"
#include "scenarios/cli/commands.h"
#include "scenarios/cli/common.h"
#include "scenarios/output_paths.h"
#include "scenarios/resource_limits.h"
#include "sim/trace/compare.h"
#include "sim/trace/timeline_json.h"

namespace offsim::cli {
namespace {

// --device: cpu, cuda, or auto (CUDA when a GPU is visible, else the CPU device with a note).
backends::DeviceKind replay_device(const std::string& device) {
  if (device == "cpu") return backends::DeviceKind::kCpu;
  if (device == "cuda") return backends::DeviceKind::kCuda;
  for (const auto& d : backends::list_devices())
    if (d.kind == backends::DeviceKind::kCuda) return backends::DeviceKind::kCuda;
  fmt::print(stderr,
             "offsim: note: no GPU visible; replaying on the CPU device (its times "
             "are not comparable with the GPU forecast)\n");
  return backends::DeviceKind::kCpu;
}

// Writes the measured and predicted timelines and the trace asked for, and replaces their
// destinations.
// The overrides of a replay: the user's, --layers and --profile. A scenario with a pipeline
// layout gets it scaled to the --layers it keeps (models::scale_layout).
sim::Result<std::vector<std::string>> replay_sets(const ReplayArgs& a) {
  std::vector<std::string> sets = a.sets;
  if (!a.profile.empty()) sets.push_back(fmt::format("hardware.profile={}", a.profile));
  if (a.layers <= 0) return sets;
  OFFSIM_ASSIGN_OR_RETURN(const Loaded full, load_checked(a.scenario, sets));
  const models::ParallelConfig& p = full.scenario().parallelism;
  sets.push_back(fmt::format("model.layers={}", a.layers));
  if (!p.layout.empty()) {
    models::ParallelConfig scaled = p;
    scaled.layout = models::scale_layout(p.layout, a.layers);
    sets.push_back(fmt::format("parallelism.layout={}", models::layout_string(scaled)));
  }
  return sets;
}

sim::Status write_outputs(const ReplayArgs& a, const sim::Timeline& predicted,
                          const sim::Timeline& measured, scenarios::OutputFiles& outputs) {
  if (!a.out.empty()) {
    OFFSIM_RETURN_IF_ERROR(outputs.write(a.out, sim::timeline_to_json(measured).dump()));
  }
  if (!a.predicted_out.empty()) {
    OFFSIM_RETURN_IF_ERROR(outputs.write(a.predicted_out, sim::timeline_to_json(predicted).dump()));
  }
  if (!a.trace.empty()) {
    const std::vector<const sim::Timeline*> both = {&predicted, &measured};
    OFFSIM_RETURN_IF_ERROR(outputs.write(a.trace, sim::chrome_trace_json(both)));
  }
  return outputs.commit();
}

// `mpirun -np N offsim replay --mpi ...` (backends/mpi_replay.h): every process loads and
// forecasts the scenario, replays its rank, and rank 0 writes the outputs and the comparison.
// An input error is reported once (by the lowest rank that hit it) with exit code 2; a failure
// during the replay ends every process (MPI_Abort) with a message naming the rank.
int cmd_replay_mpi(const ReplayArgs& a) {
  auto session = backends::MpiSession::start();
  if (!session) return report(session.error());
  const backends::MpiSession& mpi = **session;
  const bool root = mpi.rank() == 0;
  // Exit status after a step every process took: -1 to go on.
  auto agree = [&](const sim::Status& st) -> int {
    const int failed = mpi.first_failed(st.has_value());
    if (failed < 0) return -1;
    if (failed == mpi.rank()) return report(st.error());
    return st ? 2 : exit_code(st.error());
  };
  auto sets = replay_sets(a);
  auto l = sets ? load_checked(a.scenario, *sets) : sim::Result<Loaded>(sim::fail(sets.error()));
  if (int rc = agree(l ? sim::ok() : sim::fail(l.error())); rc >= 0) return rc;
  std::vector<std::string> inputs = l->read_files();
  inputs.push_back(a.scenario);
  scenarios::OutputFiles outputs(inputs);
  sim::Status st = sim::ok();
  if (root) {
    for (const auto& [flag, path] :
         {std::pair("--out", &a.out), std::pair("--predicted-out", &a.predicted_out),
          std::pair("--trace", &a.trace)}) {
      if (st) st = outputs.reserve(flag, *path, {".json"});
    }
  }
  if (int rc = agree(st); rc >= 0) return rc;
  models::EvalOptions eo;
  eo.keep_plan = true;
  eo.keep_timeline = true;
  st = scenarios::check_plan_size(l->resolved, a.limits, {.with_memory_samples = true});
  if (!st) st = sim::fail(eval_error(st.error(), a.scenario));
  if (int rc = agree(st); rc >= 0) return rc;
  auto eval = models::evaluate(l->resolved, eo);
  if (int rc = agree(eval ? sim::ok() : sim::fail(eval_error(eval.error(), a.scenario))); rc >= 0)
    return rc;
  backends::ReplayOptions ro;
  ro.measured_steps = a.steps;
  ro.warmup_steps = a.warmup;
  ro.device = a.device == "cuda" ? backends::DeviceKind::kCuda : backends::DeviceKind::kCpu;
  ro.forecast = &*eval->timeline;
  if (a.all_ranks) {
    return agree(sim::fail(sim::ErrorCode::kInvalidInput,
                           "replay: --mpi runs one rank per process; drop --all-ranks"));
  }
  auto measured = backends::replay_mpi(mpi, *eval->plan, ro);
  if (!measured) mpi.abort(measured.error());
  if (!root) return 0;
  const sim::Timeline& timeline = measured->merged.timeline;
  if (st = write_outputs(a, *eval->timeline, timeline, outputs); !st) return report(st.error());
  auto cmp = sim::compare_timelines(*eval->timeline, timeline);
  if (!cmp) return report(cmp.error());
  fmt::print("replayed {} on {} ({} measured steps)\nmpi: {}\n{}", l->scenario().name,
             measured->merged.device.name, a.steps, measured->note, sim::comparison_to_text(*cmp));
  return 0;
}

}  // namespace

CLI::App* add_replay_command(CLI::App& app, ReplayArgs& replay) {
  auto* cmd = app.add_subcommand(
      "replay",
      "Execute a scenario's Plan for real (CUDA/NCCL, or the CPU device) and compare the\n"
      "measured timeline with the forecast.\n\nExamples:\n"
      "  offsim replay ex.yaml --layers 4 --out measured.json --predicted-out predicted.json\n"
      "  offsim replay ex.yaml --device cpu --steps 2\n"
      "  mpirun -np 2 offsim replay ex.yaml --mpi --device cpu --steps 2");
  cmd->add_option("scenario", replay.scenario, "scenario file")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", replay.sets, "override a key: key.path=value (repeatable)");
  cmd->add_option("--profile", replay.profile, "calibration profile JSON");
  // Layers: the scenario's own bound on model.layers (2^16). Steps: each replays a whole step,
  // so 10 000 is hours on any device.
  cmd->add_option("--layers", replay.layers, "keep every layer shape, but only N layers")
      ->check(in_range(1, 65536, true, ""));
  cmd->add_option("--steps", replay.steps, "measured steps")->check(in_range(1, 10000, true, ""));
  cmd->add_option("--warmup", replay.warmup, "warm-up steps")->check(in_range(0, 10000, true, ""));
  cmd->add_option("--device", replay.device, "auto, cuda or cpu")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  cmd->add_option("--out", replay.out, "write the measured Timeline JSON here");
  cmd->add_option("--predicted-out", replay.predicted_out,
                  "write the predicted Timeline JSON here");
  cmd->add_option("--trace", replay.trace, "Chrome trace with predicted and measured");
  cmd->add_flag("--all-ranks", replay.all_ranks,
                "run every rank the simulated ones stand for (data/tensor-parallel peers)");
  cmd->add_flag("--mpi", replay.mpi,
                "one rank per MPI process (mpirun -np N offsim replay --mpi ...); rank 0 "
                "writes the outputs and the comparison");
  add_limit_options(cmd, replay.limits, nullptr);
  return cmd;
}

int cmd_replay(const ReplayArgs& a) {
  if (a.mpi) return cmd_replay_mpi(a);
  auto sets = replay_sets(a);
  if (!sets) return report(sets.error());
  auto l = load_checked(a.scenario, *sets);
  if (!l) return report(l.error());
  std::vector<std::string> inputs = l->read_files();
  inputs.push_back(a.scenario);
  scenarios::OutputFiles outputs(inputs);
  for (const auto& [flag, path] :
       {std::pair("--out", &a.out), std::pair("--predicted-out", &a.predicted_out),
        std::pair("--trace", &a.trace)}) {
    if (auto st = outputs.reserve(flag, *path, {".json"}); !st) return report(st.error());
  }
  models::EvalOptions eo;
  eo.keep_plan = true;
  eo.keep_timeline = true;
  if (auto st = scenarios::check_plan_size(l->resolved, a.limits, {.with_memory_samples = true});
      !st) {
    return report(eval_error(st.error(), a.scenario));
  }
  auto eval = models::evaluate(l->resolved, eo);
  if (!eval) return report(eval_error(eval.error(), a.scenario));
  backends::ReplayOptions ro;
  ro.measured_steps = a.steps;
  ro.warmup_steps = a.warmup;
  ro.all_ranks = a.all_ranks;
  ro.device = replay_device(a.device);
  ro.forecast = &*eval->timeline;  // the watchdog scales with it; memory shows its peaks
  auto measured = backends::replay(*eval->plan, ro);
  if (!measured) return report(measured.error());
  if (auto st = write_outputs(a, *eval->timeline, measured->timeline, outputs); !st) {
    return report(st.error());
  }
  auto cmp = sim::compare_timelines(*eval->timeline, measured->timeline);
  if (!cmp) return report(cmp.error());
  fmt::print("replayed {} on {} ({} measured steps)\n{}", l->scenario().name, measured->device.name,
             a.steps, sim::comparison_to_text(*cmp));
  fmt::print("{}", backends::replay_report_text(*measured));
  return 0;
}

}  // namespace offsim::cli
