// Fuzzes the scenario language: the input's first line is a `--set` override, the rest a YAML
// scenario. Accepted scenarios go through the model checks and, when small, the whole pipeline.
#include <cstddef>
#include <cstdint>
#include <string>

#include "models/evaluate.h"
#include "scenarios/document.h"
#include "scenarios/scenario_loader.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace offsim;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t newline = input.find('\n');
  const std::string override_text = newline == std::string::npos ? "" : input.substr(0, newline);
  const std::string yaml = newline == std::string::npos ? input : input.substr(newline + 1);
  auto doc = scenarios::parse_document(yaml, "fuzz.yaml");
  if (!doc) return 0;
  if (!override_text.empty()) {
    if (!scenarios::apply_override(*doc, override_text)) return 0;
  }
  auto scenario = scenarios::scenario_from_document(*doc, ".");
  if (!scenario) return 0;
  if (!scenarios::check_loaded(*scenario, *doc)) return 0;
  // Keep each execution short: only small models and batches are simulated.
  if (scenario->model.layers > 4 || scenario->training.global_batch > 8) return 0;
  models::EvalOptions options;
  auto evaluation = models::evaluate(*scenario, options);
  (void)evaluation;
  return 0;
}
