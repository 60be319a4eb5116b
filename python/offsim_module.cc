// offsim._offsim: the C++ side of the `offsim` Python package (python/offsim/__init__.py).
//
// Scenarios arrive as text (a file's contents, a dict dumped as JSON, or a YAML string) with a
// source name for messages and a base directory for relative paths; results leave as JSON text
// that the package turns into dicts. Every call that simulates releases the GIL, so Python
// threads evaluate scenarios in parallel. Errors raise offsim.errors classes chosen by the error
// code, carrying the same message (file:line:col: key.path: ...) as the CLI.
//
//   import offsim._offsim as c
//   report_json, timeline_json = c.run(text, "s.yaml", ".", ["training.micro_batch=2"], False)

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/evaluate.h"
#include "models/report.h"
#include "scenarios/importers/importer.h"
#include "scenarios/policy_search.h"
#include "scenarios/resource_limits.h"
#include "scenarios/scenario_loader.h"
#include "scenarios/sweep_runner.h"
#include "sim/trace/timeline_json.h"

namespace py = pybind11;

namespace offsim::python {
namespace {

// An offsim error on its way to Python.
struct OffsimError {
  sim::ErrorCode code;
  std::string message;
};

[[noreturn]] void raise(const sim::Error& e) { throw OffsimError{e.code, e.message}; }

template <class T>
T value_or_raise(sim::Result<T> r) {
  if (!r) raise(r.error());
  return std::move(*r);
}

void check(const sim::Status& s) {
  if (!s) raise(s.error());
}

const char* error_class(sim::ErrorCode code) {
  switch (code) {
    case sim::ErrorCode::kInvalidInput:
      return "InputError";
    case sim::ErrorCode::kNotFound:
      return "NotFoundError";
    case sim::ErrorCode::kLimitExceeded:
      return "LimitError";
    case sim::ErrorCode::kUnsupported:
      return "UnsupportedError";
    case sim::ErrorCode::kCancelled:
      return "CancelledError";
    case sim::ErrorCode::kIo:
      return "IoError";
    default:
      return "Error";
  }
}

// Mirrors load_scenario_file for text: `model: NAME` widened when an override edits the model,
// overrides applied in order, the sweep block split off and checked against the overrides.
scenarios::ScenarioFile load_text(const std::string& text, const std::string& source,
                                  const std::string& base_dir,
                                  const std::vector<std::string>& sets) {
  scenarios::ScenarioFile file;
  file.path = source;
  file.base_dir = base_dir;
  scenarios::Node doc = value_or_raise(scenarios::parse_document(text, source));
  if (doc.kind != scenarios::NodeKind::kMap) {
    raise({sim::ErrorCode::kInvalidInput,
           fmt::format("{}: expected a map with model, hardware, training, ... at the top, got {}",
                       doc.origin, doc.describe())});
  }
  const bool overrides_model = std::any_of(sets.begin(), sets.end(), [](const auto& a) {
    return a.rfind("model.", 0) == 0 && a.rfind("model.base=", 0) != 0;
  });
  if (scenarios::Node* model = doc.find("model");
      overrides_model && model != nullptr && model->kind == scenarios::NodeKind::kScalar) {
    scenarios::Node base = *model;
    *model = scenarios::make_map(base.origin);
    model->entries.emplace_back("base", std::move(base));
  }
  for (const std::string& s : sets) check(scenarios::apply_override(doc, s));
  auto& entries = doc.entries;
  const auto sweep = std::find_if(entries.begin(), entries.end(),
                                  [](const auto& e) { return e.first == "sweep"; });
  if (sweep != entries.end()) {
    if (!scenarios::is_null_scalar(sweep->second)) {
      file.sweep = value_or_raise(scenarios::parse_sweep(sweep->second));
      for (const std::string& s : sets) {
        const std::string key = s.substr(0, s.find('='));
        for (const std::string& axis : file.sweep->axis_paths()) {
          if (axis == key || axis.rfind(key + ".", 0) == 0 || key.rfind(axis + ".", 0) == 0) {
            raise({sim::ErrorCode::kInvalidInput,
                   fmt::format("--set {}: the sweep also varies '{}'; remove the axis or the "
                               "override",
                               s, axis)});
          }
        }
      }
    }
    entries.erase(sweep);
  }
  file.base = std::move(doc);
  return file;
}

models::ResolvedScenario checked(const scenarios::ScenarioFile& file) {
  return value_or_raise(scenarios::resolve_document(file.base, file.base_dir));
}

// Node -> JSON with scalars typed as the loader reads them.
nlohmann::ordered_json to_json(const scenarios::Node& n) {
  using scenarios::NodeKind;
  switch (n.kind) {
    case NodeKind::kNull:
      return nullptr;
    case NodeKind::kScalar: {
      if (!n.quoted) {
        if (scenarios::is_null_scalar(n)) return nullptr;
        if (auto b = scenarios::scalar_bool(n)) return *b;
        if (auto i = scenarios::scalar_int(n)) return *i;
        if (auto d = scenarios::scalar_double(n)) return *d;
      }
      return n.scalar;
    }
    case NodeKind::kSequence: {
      auto a = nlohmann::ordered_json::array();
      for (const auto& item : n.items) a.push_back(to_json(item));
      return a;
    }
    case NodeKind::kMap: {
      auto o = nlohmann::ordered_json::object();
      for (const auto& [k, v] : n.entries) o[k] = to_json(v);
      return o;
    }
  }
  return nullptr;
}

// The effective scenario (every field, defaults applied) as YAML and as JSON.
std::tuple<std::string, std::string> resolve(const std::string& text, const std::string& source,
                                             const std::string& base_dir,
                                             const std::vector<std::string>& sets) {
  const scenarios::ScenarioFile file = load_text(text, source, base_dir, sets);
  const scenarios::Node doc = scenarios::scenario_to_document(checked(file).scenario());
  return {scenarios::emit_yaml(doc), to_json(doc).dump()};
}

// Report JSON (the keys of `offsim run --format json`) and, when asked, the Timeline JSON.
// The CLI's --max-plan-ops, --max-memory and --time-limit; 0 keeps the default (none for time).
scenarios::ResourceLimits limits_of(std::int64_t max_plan_ops, std::int64_t max_memory_bytes,
                                    double time_limit_s) {
  scenarios::ResourceLimits limits;
  if (max_plan_ops > 0) limits.max_plan_ops = max_plan_ops;
  limits.max_memory_bytes = std::max<std::int64_t>(0, max_memory_bytes);
  limits.time_limit_s = std::max(0.0, time_limit_s);
  return limits;
}

std::tuple<std::string, std::string> run(const std::string& text, const std::string& source,
                                         const std::string& base_dir,
                                         const std::vector<std::string>& sets, bool timeline,
                                         std::int64_t max_plan_ops, std::int64_t max_memory_bytes,
                                         double time_limit_s) {
  const scenarios::ScenarioFile file = load_text(text, source, base_dir, sets);
  const models::ResolvedScenario resolved = checked(file);
  const scenarios::ResourceLimits limits = limits_of(max_plan_ops, max_memory_bytes, time_limit_s);
  models::EvalOptions options;
  options.keep_timeline = timeline;
  std::string report, trace;
  {
    py::gil_scoped_release release;
    check(scenarios::check_plan_size(resolved, limits, {.with_memory_samples = timeline}));
    std::atomic<bool> cancel{false};
    scenarios::Watchdog watchdog(limits.time_limit_s, cancel);
    options.cancel = &cancel;
    auto eval = models::evaluate(resolved, options);
    if (!eval && watchdog.fired()) {
      raise(scenarios::time_limit_error(limits.time_limit_s, "simulating " + source));
    }
    if (!eval) {
      raise({eval.error().code, fmt::format("{}: {}", source, eval.error().message)});
    }
    report = models::report_to_json(eval->report).dump();
    if (timeline) trace = sim::timeline_to_json(*eval->timeline).dump();
  }
  return {report, trace};
}

// Runs the sweep with the CLI's runner into `out_path` (CSV: index, axes, report columns).
std::tuple<std::int64_t, std::int64_t, double> sweep(
    const std::string& text, const std::string& source, const std::string& base_dir,
    const std::vector<std::string>& sets, const std::string& out_path, int jobs,
    std::int64_t max_plan_ops, std::int64_t max_memory_bytes, double time_limit_s) {
  const scenarios::ScenarioFile file = load_text(text, source, base_dir, sets);
  scenarios::SweepRunOptions options{
      .out_path = out_path, .jobs = jobs, .overwrite = true, .progress = false};
  options.limits = limits_of(max_plan_ops, max_memory_bytes, time_limit_s);
  py::gil_scoped_release release;
  const scenarios::SweepSummary sum = value_or_raise(scenarios::run_sweep(file, options));
  return {sum.evaluated, sum.errors, sum.wall_s};
}

// The policy search (`offsim plan`): the best candidates as JSON rows.
std::string plan(const std::string& text, const std::string& source, const std::string& base_dir,
                 const std::vector<std::string>& sets, int top, bool exhaustive,
                 const std::vector<std::int64_t>& micro_batches, bool search_recompute,
                 bool search_a2a_overlap, int jobs) {
  const scenarios::ScenarioFile file = load_text(text, source, base_dir, sets);
  const models::ResolvedScenario s = checked(file);
  scenarios::SearchOptions o;
  o.top_k = top;
  o.jobs = jobs;
  o.method = exhaustive ? scenarios::SearchMethod::kExhaustive : scenarios::SearchMethod::kPruned;
  o.space.micro_batches = micro_batches;
  if (search_recompute) {
    o.space.recompute = {models::RecomputeConfig::Mode::kNone,
                         models::RecomputeConfig::Mode::kSelective,
                         models::RecomputeConfig::Mode::kFull};
  }
  if (search_a2a_overlap) o.space.a2a_overlap = {false, true};
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  {
    py::gil_scoped_release release;
    const scenarios::SearchResult r = value_or_raise(scenarios::search_policies(s, o));
    for (std::size_t i = 0; i < r.best.size(); ++i) {
      const auto& c = r.best[i];
      rows.push_back({{"rank", i + 1},
                      {"policy", c.policy},
                      {"micro_batch", c.candidate.micro_batch},
                      {"recompute", models::to_string(c.candidate.recompute)},
                      {"optimizer_on_cpu", c.candidate.optimizer_on_cpu},
                      {"moe_a2a_overlap", c.scenario.parallelism.moe_a2a_overlap},
                      {"step_time_s", c.report.step_time_s},
                      {"tokens_per_s", c.report.tokens_per_s},
                      {"mfu", c.report.mfu},
                      {"hbm_peak_bytes", c.report.hbm_peak_bytes},
                      {"host_peak_bytes", c.report.host_peak_bytes},
                      {"fits", c.report.fits},
                      {"limit", c.limit}});
    }
  }
  return rows.dump();
}

py::dict fields_dict(const std::vector<scenarios::ImportField>& fields) {
  py::dict out;
  py::list rows;
  for (const auto& f : fields) {
    py::dict d;
    d["key"] = f.key;
    d["origin"] = f.origin;
    d["value"] = f.value;
    d["target"] = f.target;
    d["reason"] = f.reason;
    rows.append(d);
  }
  out["rows"] = rows;
  return out;
}

py::dict import_config(const std::string& framework, const std::vector<std::string>& files,
                       const std::vector<std::string>& sets,
                       const std::vector<std::string>& overrides, int gpus, bool strict) {
  const auto f = scenarios::framework_from_string(framework);
  if (!f) {
    raise({sim::ErrorCode::kInvalidInput,
           fmt::format("framework '{}': expected maxtext, megatron, deepspeed or torchtitan",
                       framework)});
  }
  scenarios::ImportOptions options{
      .sets = sets, .framework_overrides = overrides, .gpus = gpus, .strict = strict};
  const scenarios::ImportResult r = value_or_raise(scenarios::import_config(*f, files, options));
  py::dict out;
  out["yaml"] = scenarios::format_import(*f, files, r);
  out["scenario_json"] = to_json(r.scenario).dump();
  out["mapped"] = fields_dict(r.mapped)["rows"];
  out["unmapped"] = fields_dict(r.unmapped)["rows"];
  out["ignored"] = fields_dict(r.ignored)["rows"];
  return out;
}

}  // namespace
}  // namespace offsim::python

PYBIND11_MODULE(_offsim, m) {
  using namespace offsim::python;
  m.doc() = "offsim's C++ core; use the `offsim` package";
  // pybind11's ExceptionTranslator is a function pointer taking the pointer by value.
  // NOLINTNEXTLINE(performance-unnecessary-value-param)
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const OffsimError& e) {
      py::object cls = py::module_::import("offsim.errors").attr(error_class(e.code));
      py::object exc = cls(e.message);
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });
  m.def("resolve", &resolve, py::arg("text"), py::arg("source"), py::arg("base_dir"),
        py::arg("sets"));
  m.def("run", &run, py::arg("text"), py::arg("source"), py::arg("base_dir"), py::arg("sets"),
        py::arg("timeline"), py::arg("max_plan_ops") = 0, py::arg("max_memory_bytes") = 0,
        py::arg("time_limit_s") = 0.0);
  m.def("sweep", &sweep, py::arg("text"), py::arg("source"), py::arg("base_dir"), py::arg("sets"),
        py::arg("out_path"), py::arg("jobs"), py::arg("max_plan_ops") = 0,
        py::arg("max_memory_bytes") = 0, py::arg("time_limit_s") = 0.0);
  m.def("plan", &plan, py::arg("text"), py::arg("source"), py::arg("base_dir"), py::arg("sets"),
        py::arg("top"), py::arg("exhaustive"), py::arg("micro_batches"),
        py::arg("search_recompute"), py::arg("search_a2a_overlap"), py::arg("jobs"));
  m.def("import_config", &import_config, py::arg("framework"), py::arg("files"), py::arg("sets"),
        py::arg("overrides"), py::arg("gpus"), py::arg("strict"));
  m.attr("version") = OFFSIM_VERSION;
}
