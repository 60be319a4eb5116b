// offsim-examples-table: simulates every example scenario of a folder, checks each against the
// outcome it declares (`# expect: ...`) and writes the figures table of the folder's README.md
// between its generated-section markers.
//
//   offsim-examples-table scenarios/examples           # rewrite scenarios/examples/README.md
//   offsim-examples-table scenarios/examples --check   # exit 1 when the README is out of date
//
// Exit status: 0 done (or up to date), 1 an example misses its declared outcome or --check found
// a stale README, 2 bad input (a missing folder or README, an example that does not load).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "scenarios/examples_table.h"

namespace {

int usage() {
  fmt::print(stderr, "usage: offsim-examples-table DIR [--check]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  namespace sc = offsim::scenarios;
  std::string dir;
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--check") {
      check = true;
    } else if (arg == "--help" || arg == "-h") {
      fmt::print("usage: offsim-examples-table DIR [--check]\n");
      return 0;
    } else if (dir.empty() && !arg.starts_with("-")) {
      dir = arg;
    } else {
      fmt::print(stderr, "offsim-examples-table: unexpected argument '{}'\n", arg);
      return usage();
    }
  }
  if (dir.empty()) return usage();
  auto runs = sc::run_examples(dir);
  if (!runs) {
    fmt::print(stderr, "offsim-examples-table: {}\n", runs.error().message);
    return 2;
  }
  int status = 0;
  for (const sc::ExampleRun& run : *runs) {
    if (auto ok = sc::check_expectation(run); !ok) {
      fmt::print(stderr, "offsim-examples-table: {}\n", ok.error().message);
      status = 1;
    }
  }
  const std::string readme_path = (std::filesystem::path(dir) / "README.md").string();
  std::ifstream in(readme_path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) {
    fmt::print(stderr, "offsim-examples-table: {}: cannot read the file\n", readme_path);
    return 2;
  }
  auto updated = sc::replace_generated(text.str(), sc::examples_table(*runs), readme_path);
  if (!updated) {
    fmt::print(stderr, "offsim-examples-table: {}\n", updated.error().message);
    return 2;
  }
  if (check) {
    if (*updated != text.str()) {
      fmt::print(stderr,
                 "offsim-examples-table: {} differs from what the examples give; run "
                 "offsim-examples-table {} to rewrite it\n",
                 readme_path, dir);
      return 1;
    }
    return status;
  }
  if (*updated != text.str()) {
    const std::string tmp = readme_path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << *updated;
      if (!out) {
        fmt::print(stderr, "offsim-examples-table: {}: cannot write the file\n", tmp);
        return 2;
      }
    }
    std::error_code ec;
    std::filesystem::rename(tmp, readme_path, ec);
    if (ec) {
      fmt::print(stderr, "offsim-examples-table: {}: {}\n", readme_path, ec.message());
      return 2;
    }
  }
  return status;
}
