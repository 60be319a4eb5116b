// `offsim compare` (see commands.h): a predicted and a measured Timeline JSON of the same Plan.

#include <string>

#include <fmt/format.h>

#include "scenarios/cli/commands.h"
#include "scenarios/cli/common.h"
#include "sim/trace/compare.h"
#include "sim/trace/timeline_json.h"

namespace offsim::cli {

CLI::App* add_compare_command(CLI::App& app, CompareArgs& compare) {
  auto* cmd = app.add_subcommand(
      "compare",
      "Compare a predicted and a measured Timeline JSON of the same Plan.\n\nExamples:\n"
      "  offsim compare predicted.json measured.json\n"
      "  offsim compare predicted.json measured.json --format json");
  cmd->add_option("predicted", compare.predicted, "predicted Timeline JSON")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("measured", compare.measured, "measured Timeline JSON")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--format", compare.format, "text or json")
      ->check(CLI::IsMember({"text", "json"}));
  return cmd;
}

int cmd_compare(const CompareArgs& a) {
  auto predicted = sim::read_timeline_file(a.predicted);
  if (!predicted) return report(predicted.error());
  auto measured = sim::read_timeline_file(a.measured);
  if (!measured) return report(measured.error());
  auto cmp = sim::compare_timelines(*predicted, *measured);
  if (!cmp) return report(cmp.error());
  if (a.format == "json") {
    fmt::print("{}\n", sim::comparison_to_json(*cmp).dump(2));
  } else {
    fmt::print("{}", sim::comparison_to_text(*cmp));
  }
  return 0;
}

}  // namespace offsim::cli
