#include "scenarios/examples_table.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "models/evaluate.h"
#include "scenarios/report_format.h"
#include "scenarios/scenario_loader.h"

namespace offsim::scenarios {

namespace {

using sim::ErrorCode;

constexpr std::string_view kExpectPrefix = "# expect:";

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

// 14200.4 -> "14,200".
std::string with_thousands(double v) {
  std::string digits = fmt::format("{:.0f}", std::round(v));
  std::string out;
  const std::size_t n = digits.size();
  for (std::size_t i = 0; i < n; ++i) {
    out += digits[i];
    if (digits[i] != '-' && (n - i - 1) % 3 == 0 && i + 1 < n) out += ',';
  }
  return out;
}

std::string describe_outcome(const models::Report& r) {
  if (r.fits) return "fits";
  if (r.oom) return fmt::format("out of memory in {}", r.oom->pool);
  return r.outcome;
}

}  // namespace

const char* to_string(ExpectedOutcome outcome) {
  switch (outcome) {
    case ExpectedOutcome::kFits:
      return "fits";
    case ExpectedOutcome::kOutOfHbm:
      return "out_of_memory in hbm";
    case ExpectedOutcome::kOutOfHostMemory:
      return "out_of_memory in pinned";
  }
  return "?";
}

sim::Result<ExpectedOutcome> parse_expectation(const std::string& text, const std::string& source) {
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  int found_line = 0;
  ExpectedOutcome found = ExpectedOutcome::kFits;
  for (; std::getline(in, line);) {
    ++line_no;
    if (line.rfind(kExpectPrefix, 0) != 0) continue;
    if (found_line != 0) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "{}:{}: a second '# expect:' line (the first is on line {})", source,
                       line_no, found_line);
    }
    const std::string value = trim(std::string_view(line).substr(kExpectPrefix.size()));
    bool known = false;
    for (ExpectedOutcome o :
         {ExpectedOutcome::kFits, ExpectedOutcome::kOutOfHbm, ExpectedOutcome::kOutOfHostMemory}) {
      if (value == to_string(o)) {
        found = o;
        known = true;
      }
    }
    if (!known) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "{}:{}: '# expect:' must be followed by one of: fits, out_of_memory in "
                       "hbm, out_of_memory in pinned; got '{}'",
                       source, line_no, value);
    }
    found_line = line_no;
  }
  if (found_line == 0) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: no '# expect: fits' (or 'out_of_memory in hbm|pinned') line saying "
                     "which outcome the example shows",
                     source);
  }
  return found;
}

sim::Result<std::vector<ExampleRun>> run_examples(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return sim::fail(ErrorCode::kNotFound, "{}: not a directory of example scenarios", dir);
  }
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  }
  if (ec) return sim::fail(ErrorCode::kIo, "{}: {}", dir, ec.message());
  std::sort(files.begin(), files.end());
  std::vector<ExampleRun> runs;
  for (const fs::path& path : files) {
    const std::string name = path.string();
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) return sim::fail(ErrorCode::kIo, "{}: cannot read the file", name);
    OFFSIM_ASSIGN_OR_RETURN(ExpectedOutcome expected, parse_expectation(text.str(), name));
    OFFSIM_ASSIGN_OR_RETURN(ScenarioFile file, load_scenario_file(name));
    OFFSIM_ASSIGN_OR_RETURN(models::ResolvedScenario scenario,
                            resolve_document(file.base, file.base_dir));
    auto eval = models::evaluate(scenario);
    if (!eval) return sim::fail(eval.error().code, "{}: {}", name, eval.error().message);
    runs.push_back(
        ExampleRun{.file = path.filename().string(), .expected = expected, .report = eval->report});
  }
  return runs;
}

sim::Status check_expectation(const ExampleRun& run) {
  const models::Report& r = run.report;
  bool ok = false;
  switch (run.expected) {
    case ExpectedOutcome::kFits:
      ok = r.fits;
      break;
    case ExpectedOutcome::kOutOfHbm:
      ok = !r.fits && r.oom && r.oom->pool_kind == sim::PoolKind::kHbm;
      break;
    case ExpectedOutcome::kOutOfHostMemory:
      ok = !r.fits && r.oom && r.oom->pool_kind == sim::PoolKind::kPinnedHost;
      break;
  }
  if (ok) return sim::ok();
  return sim::fail(ErrorCode::kInvalidInput, "{}: declares '# expect: {}' but {}", run.file,
                   to_string(run.expected), describe_outcome(r));
}

std::string examples_table(const std::vector<ExampleRun>& runs) {
  std::string out =
      "| file | outcome | step time | tokens/s per GPU | HBM peak per GPU | pinned host peak | "
      "limited by |\n|---|---|---|---|---|---|---|\n";
  for (const ExampleRun& run : runs) {
    const models::Report& r = run.report;
    const bool ran = r.fits;
    out += fmt::format("| `{}` | {} | {} | {} | {} of {} | {} of {} | {} |\n", run.file,
                       describe_outcome(r), ran ? fmt::format("{:.3f} s", r.step_time_s) : "-",
                       ran ? with_thousands(r.tokens_per_s_per_gpu) : "-",
                       format_bytes(r.hbm_peak_bytes), format_bytes(r.hbm_capacity_bytes),
                       format_bytes(r.host_peak_bytes), format_bytes(r.host_capacity_bytes),
                       limiting_factor(r));
  }
  return out;
}

sim::Result<std::string> replace_generated(const std::string& readme, const std::string& table,
                                           const std::string& source) {
  const std::size_t begin = readme.find(kGeneratedBegin);
  const std::size_t end = readme.find(kGeneratedEnd);
  if (begin == std::string::npos || end == std::string::npos || end < begin) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: expected a line '{}' followed later by a line '{}' around the generated "
                     "figures",
                     source, kGeneratedBegin, kGeneratedEnd);
  }
  const std::size_t body = begin + std::string_view(kGeneratedBegin).size();
  return readme.substr(0, body) + "\n" + table + readme.substr(end);
}

}  // namespace offsim::scenarios
