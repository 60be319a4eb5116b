// Framework config import: MaxText, Megatron-LM / NeMo / Megatron-Bridge, DeepSpeed and torchtitan
// configurations turned into an offsim scenario document that `offsim run` can run.
//
// Every framework key is accounted for: mapped onto a scenario key (listed in `mapped`, with the
// framework value's file position), ignored because it cannot change step time or memory
// (learning rate, paths, logging; listed in `ignored`), or not mapped (`unmapped`: a key offsim
// does not model, or one the importer does not know). Values the framework itself rejects are
// errors naming the file position and the key. With `strict`, any unmapped key is an error.
//
//   scenarios::ImportOptions opt{.sets = {"hardware.system=dgx-h100"}, .gpus = 8};
//   OFFSIM_ASSIGN_OR_RETURN(scenarios::ImportResult r,
//       scenarios::import_config(scenarios::Framework::kMaxText, {"base.yml", "llama.yml"}, opt));
//   for (const auto& u : r.unmapped) fmt::print(stderr, "{}: {}: {}\n", u.origin, u.key, u.reason);
//   fmt::print("{}", scenarios::emit_yaml(r.scenario));
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "scenarios/document.h"
#include "sim/core/result.h"

namespace offsim::scenarios {

enum class Framework { kMaxText, kMegatron, kDeepSpeed, kTorchtitan };
const char* to_string(Framework f);
std::optional<Framework> framework_from_string(std::string_view s);

// One framework key and what became of it.
struct ImportField {
  std::string key;     // the framework's key: "ici_fsdp_parallelism", "--micro-batch-size"
  std::string origin;  // "base.yml:12:1", "train.sh:7:3", "--set ..." or "maxtext default"
  std::string value;   // the framework value as written
  std::string target;  // mapped: the scenario key paths it set; otherwise empty
  std::string reason;  // ignored / unmapped: why
};

struct ImportResult {
  Node scenario;  // a complete scenario document (check_loaded has accepted it)
  std::vector<ImportField> mapped;
  std::vector<ImportField> ignored;
  std::vector<ImportField> unmapped;
};

struct ImportOptions {
  // "key.path=value" overrides of the scenario, applied after the mapping (e.g. the hardware,
  // which no framework config states).
  std::vector<std::string> sets;
  // MaxText command-line overrides ("per_device_batch_size=4"), applied after the files.
  std::vector<std::string> framework_overrides;
  // The job's GPU count when the config does not give it (MaxText/torchtitan -1 degrees,
  // DeepSpeed without train_batch_size); 0 = not given.
  int gpus = 0;
  bool strict = false;  // any unmapped key is an error
};

// Reads `files` (MaxText: base.yml then the model config; Megatron: a launch script or argument
// file, or a Megatron-Bridge recipe .yaml; DeepSpeed: ds_config.json; torchtitan: a .toml) and
// maps them. Errors are kInvalidInput (bad value, strict and unmapped keys, missing hardware) or
// kNotFound (a missing file).
sim::Result<ImportResult> import_config(Framework framework, const std::vector<std::string>& files,
                                        const ImportOptions& options);

// The import as YAML: a comment header (source files, every mapped, ignored and unmapped key)
// and the scenario document.
std::string format_import(Framework framework, const std::vector<std::string>& files,
                          const ImportResult& result);

}  // namespace offsim::scenarios
