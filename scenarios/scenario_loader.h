// Scenario loading: YAML/JSON scenario files (with `--set` overrides and an optional `sweep:`
// block) mapped strictly onto models::Scenario, and the effective scenario printed back.
//
// Every error names the place it comes from: "file.yaml:12:5: training.micro_batch: expected an
// integer >= 1, got "two"". Schema errors (unknown key, wrong type, value out of range) are input
// errors; `resolve_loaded` then runs the model's consistency checks (TP divides heads, batch
// divisible, GPUs available) and maps their key paths back to file positions.
//
//   OFFSIM_ASSIGN_OR_RETURN(scenarios::ScenarioFile file,
//                           scenarios::load_scenario_file("ex.yaml", {"training.micro_batch=2"}));
//   OFFSIM_ASSIGN_OR_RETURN(models::ResolvedScenario r,
//                           scenarios::resolve_document(file.base, file.base_dir));
//   fmt::print("{}", scenarios::emit_yaml(scenarios::scenario_to_document(r.scenario())));
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "models/resolve.h"
#include "models/scenario.h"
#include "scenarios/document.h"
#include "scenarios/sweep.h"
#include "sim/core/result.h"

namespace offsim::scenarios {

struct ScenarioFile {
  std::string path;      // as given
  std::string base_dir;  // directory relative paths inside the file are resolved against
  Node base;             // the document with overrides applied and without `sweep`
  std::optional<SweepSpec> sweep;
};

struct LoadOptions {
  DocumentLimits limits;
  std::int64_t max_sweep_points = 1'000'000;
};

// Reads `path`, applies `overrides` ("key.path=value", in order) and splits off the sweep block.
// An override of a key that the sweep also varies is an error.
sim::Result<ScenarioFile> load_scenario_file(const std::string& path,
                                             const std::vector<std::string>& overrides = {},
                                             const LoadOptions& options = {});

// Maps a document onto a Scenario: unknown keys, wrong types and out-of-range values are errors
// (kInvalidInput). Relative file paths (model.hf_config, hardware.profile) resolve against
// `base_dir`, or the working directory for values given with --set.
sim::Result<models::Scenario> scenario_from_document(const Node& doc, const std::string& base_dir);

// Resolves a scenario mapped from `doc` (models/resolve.h: the model's consistency checks, the
// GPU count of its system, the profile, host and overrides), with the key path in each message
// prefixed by its position in `doc`.
sim::Result<models::ResolvedScenario> resolve_loaded(const models::Scenario& scenario,
                                                     const Node& doc);
// resolve_loaded() for a caller that only needs to know that the scenario resolves.
sim::Status check_loaded(const models::Scenario& scenario, const Node& doc);
// scenario_from_document() and resolve_loaded(): a document to the scenario run, sweep, plan,
// replay, validate and the GUI evaluate, checked once.
sim::Result<models::ResolvedScenario> resolve_document(const Node& doc,
                                                       const std::string& base_dir);

// The effective scenario as a document: every field, defaults included, models inline.
Node scenario_to_document(const models::Scenario& scenario);

// Prefixes a message that starts with a key path ("parallelism.tp: ...") with the position of
// the deepest node of that path present in `doc`.
std::string locate_message(const std::string& message, const Node& doc);

}  // namespace offsim::scenarios
