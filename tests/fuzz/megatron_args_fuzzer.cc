// Fuzzes the Megatron-LM import: the input is a launch script (`--flag value` tokens, quotes,
// bash arrays, list arguments, --moe-layer-freq patterns), written to a file as a user's would be.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "scenarios/importers/importer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace offsim;
  // One file per process, removed at exit.
  struct ScriptFile {
    std::string path = (std::filesystem::temp_directory_path() /
                        ("offsim_fuzz_megatron_" + std::to_string(::getpid()) + ".sh"))
                           .string();
    ~ScriptFile() {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  };
  static const ScriptFile file;
  const std::string& path = file.path;
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  scenarios::ImportOptions options;
  options.sets = {"hardware.system=dgx-h100"};
  options.gpus = 8;
  auto imported = scenarios::import_config(scenarios::Framework::kMegatron, {path}, options);
  if (imported) (void)scenarios::format_import(scenarios::Framework::kMegatron, {path}, *imported);
  return 0;
}
