// `offsim import` (see import_command.h).

#include "scenarios/cli/import_command.h"

#include <filesystem>

#include <fmt/format.h>

#include "scenarios/importers/importer.h"
#include "scenarios/output_paths.h"
#include "sim/core/file_io.h"

namespace offsim::cli {

CLI::App* add_import_command(CLI::App& app, ImportArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "import",
      "Turn a framework's training config into an offsim scenario (YAML on stdout or --out).\n"
      "Every framework key is listed as mapped, not mapped (a warning; an error with --strict)\n"
      "or ignored (no effect on step time or memory). Framework configs do not name the\n"
      "hardware: give it with --set hardware.system=NAME.\n\nExamples:\n"
      "  offsim import --from maxtext base.yml llama3-8b.yml per_device_batch_size=4 \\\n"
      "      --gpus 8 --set hardware.system=dgx-h100 --out llama.yaml\n"
      "  offsim import --from megatron pretrain_gpt.sh --set hardware.system=dgx-h100\n"
      "  offsim import --from deepspeed ds_config.json --set model=llama3-8b \\\n"
      "      --set training.seq_len=4096 --set hardware.system=h100-1gpu --strict\n"
      "  offsim import --from torchtitan llama3_8b.toml --gpus 8 --set hardware.system=dgx-h100");
  cmd->add_option("--from", a.from,
                  "maxtext, megatron (also nemo, megatron-bridge), deepspeed "
                  "or torchtitan")
      ->required()
      ->check(CLI::IsMember(
          {"maxtext", "megatron", "nemo", "megatron-bridge", "deepspeed", "torchtitan"}));
  cmd->add_option("config", a.inputs,
                  "config files (MaxText: base.yml, then the model config; Megatron: a launch "
                  "script or a Megatron-Bridge recipe .yaml); MaxText key=value overrides")
      ->required();
  cmd->add_option("--set", a.sets, "override a scenario key after the import: key.path=value");
  cmd->add_option("--gpus", a.gpus,
                  "the job's GPU count, where the config leaves it to the "
                  "launcher (-1 degrees, DeepSpeed without train_batch_size)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--strict", a.strict, "fail when a framework key cannot be mapped");
  cmd->add_option("--out", a.out, "write the scenario here instead of stdout");
  return cmd;
}

int cmd_import(const ImportArgs& a) {
  const auto framework = scenarios::framework_from_string(a.from);
  scenarios::ImportOptions options{.sets = a.sets, .gpus = a.gpus, .strict = a.strict};
  std::vector<std::string> files;
  for (const std::string& in : a.inputs) {
    const bool is_override = *framework == scenarios::Framework::kMaxText &&
                             in.find('=') != std::string::npos && !std::filesystem::exists(in);
    if (is_override) {
      options.framework_overrides.push_back(in);
    } else {
      files.push_back(in);
    }
  }
  auto result = scenarios::import_config(*framework, files, options);
  if (!result) {
    fmt::print(stderr, "offsim: error: {}\n", result.error().message);
    return result.error().code == sim::ErrorCode::kInvalidInput ||
                   result.error().code == sim::ErrorCode::kNotFound ||
                   result.error().code == sim::ErrorCode::kLimitExceeded
               ? 2
               : 1;
  }
  for (const scenarios::ImportField& u : result->unmapped) {
    fmt::print(stderr, "offsim: warning: {}: {}: not mapped: {}\n", u.origin, u.key, u.reason);
  }
  const std::string text = scenarios::format_import(*framework, files, *result);
  if (a.out.empty()) {
    fmt::print("{}", text);
    return 0;
  }
  // The output is checked like every command's (never one of the inputs, a directory or a
  // device) and written through a temporary renamed into place.
  scenarios::OutputFiles outputs(files);
  if (auto st = outputs.reserve("--out", a.out, {".yaml", ".yml"}); !st) {
    fmt::print(stderr, "offsim: error: {}\n", st.error().message);
    return 2;
  }
  if (auto st = outputs.write(a.out, text); !st) {
    fmt::print(stderr, "offsim: error: {}\n", st.error().message);
    return 1;
  }
  if (auto st = outputs.commit(); !st) {
    fmt::print(stderr, "offsim: error: {}\n", st.error().message);
    return 1;
  }
  fmt::print(stderr, "offsim: wrote {} ({} keys mapped, {} not mapped, {} ignored)\n", a.out,
             result->mapped.size(), result->unmapped.size(), result->ignored.size());
  return 0;
}

}  // namespace offsim::cli
