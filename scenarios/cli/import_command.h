// `offsim import`: a framework config (MaxText, Megatron/NeMo/Megatron-Bridge, DeepSpeed,
// torchtitan) turned into an offsim scenario (scenarios/importers/importer.h).
//
//   cli::ImportArgs import_args;
//   CLI::App* import_cmd = cli::add_import_command(app, import_args);
//   app.parse(argc, argv);
//   if (import_cmd->parsed()) return cli::cmd_import(import_args);
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace offsim::cli {

struct ImportArgs {
  std::string from;
  std::vector<std::string> inputs;  // files, and MaxText key=value overrides
  std::vector<std::string> sets;
  int gpus = 0;
  bool strict = false;
  std::string out;
};

CLI::App* add_import_command(CLI::App& app, ImportArgs& args);

// Exit status: 0 ok, 2 input errors (including unmapped keys under --strict).
int cmd_import(const ImportArgs& args);

}  // namespace offsim::cli
