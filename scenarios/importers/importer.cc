// Framework config import: dispatch and the YAML form of an import (see importer.h).

#include "scenarios/importers/importer.h"

#include <fmt/format.h>

#include "scenarios/importers/import_common.h"

namespace offsim::scenarios {

const char* to_string(Framework f) {
  switch (f) {
    case Framework::kMaxText:
      return "maxtext";
    case Framework::kMegatron:
      return "megatron";
    case Framework::kDeepSpeed:
      return "deepspeed";
    case Framework::kTorchtitan:
      return "torchtitan";
  }
  return "?";
}

std::optional<Framework> framework_from_string(std::string_view s) {
  for (Framework f :
       {Framework::kMaxText, Framework::kMegatron, Framework::kDeepSpeed, Framework::kTorchtitan}) {
    if (s == to_string(f)) return f;
  }
  if (s == "nemo" || s == "megatron-bridge") return Framework::kMegatron;
  return std::nullopt;
}

sim::Result<ImportResult> import_config(Framework framework, const std::vector<std::string>& files,
                                        const ImportOptions& options) {
  if (files.empty()) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "import --from {}: no config file given",
                     to_string(framework));
  }
  switch (framework) {
    case Framework::kMaxText:
      return detail::import_maxtext(files, options);
    case Framework::kMegatron:
      return detail::import_megatron(files, options);
    case Framework::kDeepSpeed:
      return detail::import_deepspeed(files, options);
    case Framework::kTorchtitan:
      return detail::import_torchtitan(files, options);
  }
  return sim::fail(sim::ErrorCode::kInternal, "unknown framework");
}

std::string format_import(Framework framework, const std::vector<std::string>& files,
                          const ImportResult& result) {
  std::string out = fmt::format("# Imported by `offsim import --from {}` from {}.\n",
                                to_string(framework), fmt::join(files, ", "));
  const auto section = [&](const char* title, const std::vector<ImportField>& fields, bool target) {
    if (fields.empty()) return;
    out += fmt::format("# {}:\n", title);
    for (const ImportField& f : fields) {
      out += fmt::format("#   {} = {}  ({}) -> {}\n", f.key, f.value, f.origin,
                         target ? f.target : f.reason);
    }
  };
  section("mapped", result.mapped, true);
  section("not mapped", result.unmapped, false);
  section("ignored (no effect on step time or memory)", result.ignored, false);
  return out + emit_yaml(result.scenario);
}

}  // namespace offsim::scenarios
