#include "gui/model/scenario_runner.h"

#if OFFSIM_GUI_HAVE_SCENARIOS
#include "models/evaluate.h"
#include "models/report.h"
#include "scenarios/resource_limits.h"
#include "scenarios/scenario_loader.h"
#include "scenarios/sweep.h"
#endif

namespace offsim::gui {

#if OFFSIM_GUI_HAVE_SCENARIOS

bool scenarios_available() { return true; }

sim::Result<ScenarioRun> run_scenario(const std::string& path,
                                      const std::vector<std::string>& overrides,
                                      std::optional<std::int64_t> sweep_point,
                                      const std::atomic<bool>* cancel, const ProgressFn& progress) {
  if (progress) progress(0.0);
  OFFSIM_ASSIGN_OR_RETURN(scenarios::ScenarioFile file,
                          scenarios::load_scenario_file(path, overrides));
  scenarios::Node doc = file.base;
  if (sweep_point) {
    if (!file.sweep) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "{}: has no sweep block, so no point {}",
                       path, *sweep_point);
    }
    if (*sweep_point < 0 || *sweep_point >= file.sweep->size()) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "{}: sweep point {} is outside [0, {})", path,
                       *sweep_point, file.sweep->size());
    }
    OFFSIM_ASSIGN_OR_RETURN(doc,
                            scenarios::apply_point(file.base, file.sweep->point(*sweep_point)));
  }
  OFFSIM_ASSIGN_OR_RETURN(models::ResolvedScenario resolved,
                          scenarios::resolve_document(doc, file.base_dir));
  OFFSIM_RETURN_IF_ERROR(scenarios::check_plan_size(resolved, {}, {.with_memory_samples = true}));
  if (progress) progress(0.1);
  models::EvalOptions options;
  options.keep_timeline = true;
  options.cancel = cancel;
  OFFSIM_ASSIGN_OR_RETURN(models::Evaluation evaluation, models::evaluate(resolved, options));
  if (progress) progress(1.0);
  ScenarioRun run;
  run.report_json = models::report_to_json(evaluation.report).dump(2);
  run.timeline = std::move(evaluation.timeline);
  return run;
}

#else

bool scenarios_available() { return false; }

sim::Result<ScenarioRun> run_scenario(const std::string& path, const std::vector<std::string>&,
                                      std::optional<std::int64_t>, const std::atomic<bool>*,
                                      const ProgressFn&) {
  return sim::fail(sim::ErrorCode::kUnsupported,
                   "{}: offsim-gui was built without the scenarios library (offsim_scenarios); "
                   "run it with `offsim run {} --timeline-out t.json` and open t.json",
                   path, path);
}

#endif

}  // namespace offsim::gui
