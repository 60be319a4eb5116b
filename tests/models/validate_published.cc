// validate_published: reproduces the published results of shared/reference/published-results.md
// from the scenario files in scenarios/validation/ and writes docs/validation.md.
//
//   validate_published scenarios/validation docs/validation.md
//
// Each file is one table: `group`, `source`, `metric` and `cases`, each case a scenario (the
// sections of an offsim scenario) with the published figure and what was assumed where the
// source is silent. Metrics: hw_tflops_per_gpu (FLOPs incl. recompute: Megatron's own count),
// tflops_per_gpu (model FLOPs), tokens_per_s_per_gpu, slowdown (step time / the step time of
// the case named in `baseline`).
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "models/evaluate.h"
#include "sim/core/file_io.h"

namespace {

using namespace offsim;

[[noreturn]] void die(const std::string& message) {
  fmt::print(stderr, "validate_published: {}\n", message);
  std::exit(2);
}

template <class T>
T get(const YAML::Node& n, const char* key, const std::string& where) {
  if (!n[key]) die(fmt::format("{}: missing key '{}'", where, key));
  try {
    return n[key].as<T>();
  } catch (const YAML::Exception& e) {
    die(fmt::format("{}:{}: {}: {}", where, n[key].Mark().line + 1, key, e.what()));
  }
}

void check_keys(const YAML::Node& n, const std::vector<std::string>& allowed,
                const std::string& where) {
  for (const auto& kv : n) {
    const auto key = kv.first.as<std::string>();
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      die(fmt::format("{}:{}: unknown key '{}'", where, kv.first.Mark().line + 1, key));
    }
  }
}

models::Scenario read_scenario(const YAML::Node& n, const std::string& where) {
  check_keys(n, {"model", "hardware", "training", "parallelism", "recompute", "offload"}, where);
  models::Scenario s;
  const YAML::Node m = n["model"];
  if (m.IsScalar()) {
    auto arch = models::find_model(m.as<std::string>());
    if (!arch) die(where + ": " + arch.error().message);
    s.model = *arch;
  } else {
    check_keys(m, {"name", "layers", "attention"}, where + ".model");
    auto arch = models::find_model(get<std::string>(m, "name", where));
    if (!arch) die(where + ": " + arch.error().message);
    s.model = *arch;
    if (m["layers"]) s.model.layers = m["layers"].as<std::int64_t>();
    if (m["attention"]) {
      auto impl = models::attention_impl_from_string(m["attention"].as<std::string>());
      if (!impl) die(where + ": model.attention: expected flash or classic");
      s.model.attention = *impl;
    }
  }
  const YAML::Node h = n["hardware"];
  check_keys(h, {"system", "nodes"}, where + ".hardware");
  s.hardware.system = get<std::string>(h, "system", where);
  s.hardware.nodes = h["nodes"] ? h["nodes"].as<int>() : 1;
  const YAML::Node t = n["training"];
  check_keys(t, {"global_batch", "micro_batch", "seq_len", "dtype", "gradient_accumulation_fusion"},
             where + ".training");
  s.training.global_batch = get<std::int64_t>(t, "global_batch", where);
  s.training.micro_batch = get<std::int64_t>(t, "micro_batch", where);
  s.training.seq_len = get<std::int64_t>(t, "seq_len", where);
  auto dt = sim::dtype_from_string(get<std::string>(t, "dtype", where));
  if (!dt) die(where + ": training.dtype: expected fp32, bf16, fp16 or fp8");
  s.training.compute_dtype = *dt;
  if (t["gradient_accumulation_fusion"]) {
    s.training.gradient_accumulation_fusion = t["gradient_accumulation_fusion"].as<bool>();
  }
  const YAML::Node p = n["parallelism"];
  check_keys(p,
             {"dp", "tp", "pp", "sequence_parallel", "zero_stage", "fsdp", "schedule",
              "virtual_stages", "overlap_grad_reduce", "overlap_p2p_comm", "ep", "etp"},
             where + ".parallelism");
  s.parallelism.dp = get<int>(p, "dp", where);
  s.parallelism.tp = get<int>(p, "tp", where);
  s.parallelism.pp = get<int>(p, "pp", where);
  if (p["sequence_parallel"]) s.parallelism.sequence_parallel = p["sequence_parallel"].as<bool>();
  if (p["zero_stage"]) s.parallelism.zero_stage = p["zero_stage"].as<int>();
  if (p["fsdp"]) s.parallelism.fsdp = p["fsdp"].as<bool>();
  if (p["virtual_stages"]) s.parallelism.virtual_stages = p["virtual_stages"].as<int>();
  if (p["overlap_grad_reduce"]) {
    s.parallelism.overlap_grad_reduce = p["overlap_grad_reduce"].as<bool>();
  }
  if (p["overlap_p2p_comm"]) s.parallelism.overlap_p2p_comm = p["overlap_p2p_comm"].as<bool>();
  if (p["ep"]) s.parallelism.ep = p["ep"].as<int>();
  if (p["etp"]) s.parallelism.etp = p["etp"].as<int>();
  if (p["schedule"]) {
    auto sc = models::pipeline_schedule_from_string(p["schedule"].as<std::string>());
    if (!sc) die(where + ": parallelism.schedule: expected 1f1b or interleaved_1f1b");
    s.parallelism.schedule = *sc;
  }
  auto mode = models::recompute_mode_from_string(get<std::string>(n["recompute"], "mode", where));
  if (!mode) die(where + ": recompute.mode: expected none, selective or full");
  s.recompute.mode = *mode;
  if (n["offload"]) {
    const YAML::Node o = n["offload"];
    check_keys(o, {"preset", "fraction", "num_layers"}, where + ".offload");
    models::PresetOptions po;
    if (o["fraction"]) po.fraction = o["fraction"].as<double>();
    if (o["num_layers"]) po.num_layers = o["num_layers"].as<std::int64_t>();
    auto policy = models::offload_preset(get<std::string>(o, "preset", where), po);
    if (!policy) die(where + ": " + policy.error().message);
    s.offload = *policy;
  }
  return s;
}

struct Row {
  std::string id;
  double published = 0.0;
  double simulated = 0.0;
  bool ok = false;
  std::string note;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) die("usage: validate_published SCENARIO_DIR OUT.md");
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(argv[1])) {
    if (e.path().extension() == ".yaml") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::string md =
      "# Validation against published results\n\n"
      "Generated by `validate_published scenarios/validation docs/validation.md` (the "
      "`validate_published` target of tests/models); do not edit by hand. Every row is simulated "
      "from the scenario in `scenarios/validation/` with the default hardware profiles and no "
      "per-case constant. Error = (simulated − published) / published.\n\n";
  double total_s = 0.0;
  for (const auto& path : files) {
    const std::string where = path.filename().string();
    YAML::Node doc;
    try {
      doc = YAML::LoadFile(path.string());
    } catch (const YAML::Exception& e) {
      die(fmt::format("{}: {}", where, e.what()));
    }
    check_keys(doc, {"group", "source", "metric", "notes", "cases"}, where);
    const auto metric = get<std::string>(doc, "metric", where);
    md += fmt::format("## {}\n\nSource: {}. Compared: `{}`.\n\n",
                      get<std::string>(doc, "group", where), get<std::string>(doc, "source", where),
                      metric);
    md +=
        "| case | published | simulated | error | step (s) | MFU | assumed "
        "|\n|---|---|---|---|---|---|---|\n";
    std::map<std::string, double> step_of;
    std::vector<Row> rows;
    for (const YAML::Node& c : doc["cases"]) {
      const auto id = get<std::string>(c, "id", where);
      const std::string cw = where + ": " + id;
      check_keys(c, {"id", "published", "assumed", "baseline", "scenario"}, cw);
      models::Scenario s = read_scenario(c["scenario"], cw);
      s.name = id;
      const auto t0 = std::chrono::steady_clock::now();
      auto e = models::evaluate(s, {});
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      total_s += secs;
      Row row{.id = id, .published = get<double>(c, "published", cw)};
      const std::string assumed = c["assumed"] ? c["assumed"].as<std::string>() : "";
      if (!e) {
        md += fmt::format("| {} | {} | error: {} | | | | {} |\n", id, row.published,
                          e.error().message, assumed);
        continue;
      }
      const models::Report& r = e->report;
      step_of[id] = r.step_time_s;
      if (!r.fits) {
        md += fmt::format("| {} | {} | does not fit ({}) | | | | {} |\n", id, row.published,
                          r.oom ? r.oom->op : r.outcome, assumed);
        continue;
      }
      if (metric == "hw_tflops_per_gpu") {
        row.simulated = r.hw_tflops_per_gpu;
      } else if (metric == "tflops_per_gpu") {
        row.simulated = r.tflops_per_gpu;
      } else if (metric == "tokens_per_s_per_gpu") {
        row.simulated = r.tokens_per_s_per_gpu;
      } else if (metric == "slowdown") {
        const auto base = c["baseline"] ? c["baseline"].as<std::string>() : "";
        if (base.empty()) {
          row.simulated = 1.0;
        } else if (!step_of.count(base)) {
          die(cw + ": baseline '" + base + "' must be an earlier case");
        } else {
          row.simulated = r.step_time_s / step_of[base];
        }
      } else {
        die(where + ": metric '" + metric + "' is unknown");
      }
      row.ok = true;
      // A slowdown table's baseline (1 by definition) does not count towards the error.
      if (metric != "slowdown" || c["baseline"]) rows.push_back(row);
      const double err = (row.simulated - row.published) / row.published;
      md += fmt::format("| {} | {:.4g} | {:.4g} | {:+.1f}% | {:.3f} | {:.1f}% | {} |\n", id,
                        row.published, row.simulated, 100.0 * err, r.step_time_s, 100.0 * r.mfu,
                        assumed);
      fmt::print(stderr, "{}: published {:.4g} simulated {:.4g} ({:+.1f}%) in {:.2f} s, {} ops\n",
                 id, row.published, row.simulated, 100.0 * err, secs, r.plan_ops);
    }
    double mae = 0.0;
    for (const Row& r : rows) mae += std::fabs(r.simulated - r.published) / r.published;
    if (!rows.empty()) {
      md += fmt::format("\nMean absolute error over {} rows: **{:.1f}%**.\n", rows.size(),
                        100.0 * mae / static_cast<double>(rows.size()));
    }
    if (doc["notes"]) md += "\n" + doc["notes"].as<std::string>() + "\n";
    md += "\n";
  }
  md += fmt::format("Total simulation time of this report: {:.1f} s.\n", total_s);
  auto st = sim::write_text_file_atomic(argv[2], md);
  if (!st) die(st.error().message);
  return 0;
}
