// Golden reports: every scenario in scenarios/examples/ (each sweep point) and every row of
// scenarios/validation/ is evaluated, and each report's JSON (models::report_to_json, dumped with
// two-space indent) must equal, byte for byte, the file recorded under tests/golden/reports/.
// A refactor must leave them unchanged; a deliberate model change re-records them:
//
//   OFFSIM_UPDATE_GOLDEN=1 build/ci/tests/models/models_golden_report_test
//
// (run from any directory) and commit the changed files with the change that explains them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/evaluate.h"
#include "models/report.h"
#include "scenarios/document.h"
#include "scenarios/scenario_loader.h"
#include "scenarios/sweep.h"

namespace offsim::models {
namespace {

namespace fs = std::filesystem;

const fs::path kSource = fs::path(OFFSIM_SOURCE_DIR);
const fs::path kGolden = kSource / "tests/golden/reports";

bool updating() {
  const char* v = std::getenv("OFFSIM_UPDATE_GOLDEN");
  return v != nullptr && std::string(v) == "1";
}

std::vector<fs::path> yaml_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The reports of one file as one document: {"<label>": report, ...} in evaluation order.
std::string render(const std::vector<std::pair<std::string, Report>>& reports) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::object();
  for (const auto& [label, report] : reports) {
    doc[label] = nlohmann::ordered_json::parse(report_to_json(report).dump());
  }
  return doc.dump(2) + "\n";
}

void check_or_record(const std::string& name, const std::string& text) {
  const fs::path path = kGolden / (name + ".json");
  if (updating()) {
    fs::create_directories(kGolden);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    ASSERT_TRUE(out.good()) << "cannot write " << path;
    return;
  }
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in.good()) << path << " is missing: record it with OFFSIM_UPDATE_GOLDEN=1";
  std::stringstream recorded;
  recorded << in.rdbuf();
  // EXPECT_EQ on two long strings prints both; point at the first difference instead.
  const std::string want = recorded.str();
  if (want != text) {
    const auto at = static_cast<std::size_t>(
        std::mismatch(want.begin(), want.end(), text.begin(), text.end()).first - want.begin());
    const std::size_t from = at < 200 ? 0 : at - 200;
    ADD_FAILURE() << name << ": the report differs from " << path << " at byte " << at
                  << "\nrecorded: ..." << want.substr(from, 400) << "\nnow:      ..."
                  << text.substr(from, 400);
  }
}

Report evaluate_or_fail(const Scenario& s, const std::string& what) {
  auto e = evaluate(s, EvalOptions{});
  EXPECT_TRUE(e) << what << ": " << (e ? "" : e.error().message);
  return e ? e->report : Report{};
}

TEST(GoldenReports, EveryExampleAndSweepPoint) {
  const auto files = yaml_files(kSource / "scenarios/examples");
  ASSERT_GE(files.size(), 10u);
  int points = 0;
  for (const auto& path : files) {
    auto file = scenarios::load_scenario_file(path.string());
    ASSERT_TRUE(file) << file.error().message;
    std::vector<std::pair<std::string, Report>> reports;
    if (file->sweep) {
      for (std::int64_t i = 0; i < file->sweep->size(); ++i) {
        auto doc = scenarios::apply_point(file->base, file->sweep->point(i));
        ASSERT_TRUE(doc) << doc.error().message;
        auto s = scenarios::scenario_from_document(*doc, file->base_dir);
        ASSERT_TRUE(s) << s.error().message;
        const std::string label = "point " + std::to_string(i);
        reports.emplace_back(label, evaluate_or_fail(*s, path.filename().string() + " " + label));
      }
    } else {
      auto s = scenarios::scenario_from_document(file->base, file->base_dir);
      ASSERT_TRUE(s) << s.error().message;
      reports.emplace_back("report", evaluate_or_fail(*s, path.filename().string()));
    }
    points += static_cast<int>(reports.size());
    check_or_record("example." + path.stem().string(), render(reports));
  }
  EXPECT_GE(points, 40);
}

TEST(GoldenReports, EveryValidationRow) {
  const auto files = yaml_files(kSource / "scenarios/validation");
  ASSERT_GE(files.size(), 5u);
  int rows = 0;
  for (const auto& path : files) {
    auto doc = scenarios::load_document_file(path.string());
    ASSERT_TRUE(doc) << doc.error().message;
    const scenarios::Node* cases = doc->find("cases");
    ASSERT_TRUE(cases != nullptr && cases->kind == scenarios::NodeKind::kSequence) << path;
    // A GEMM kernel table has no scenario rows (validate_published prices its GEMMs alone).
    if (const scenarios::Node* metric = doc->find("metric");
        metric != nullptr && metric->scalar == "gemm_tflops") {
      continue;
    }
    std::vector<std::pair<std::string, Report>> reports;
    for (const scenarios::Node& c : cases->items) {
      const scenarios::Node* id = c.find("id");
      const scenarios::Node* scenario = c.find("scenario");
      ASSERT_TRUE(id != nullptr && scenario != nullptr) << c.origin;
      // Each row is a scenario file of the CLI's language, relative to the table file.
      const std::string row_file = (path.parent_path() / scenario->scalar).string();
      auto loaded = scenarios::load_scenario_file(row_file);
      ASSERT_TRUE(loaded) << loaded.error().message;
      auto s = scenarios::scenario_from_document(loaded->base, loaded->base_dir);
      ASSERT_TRUE(s) << s.error().message;
      s->name = id->scalar;  // as validate_published names each row
      reports.emplace_back(id->scalar, evaluate_or_fail(*s, id->scalar));
    }
    rows += static_cast<int>(reports.size());
    check_or_record("validation." + path.stem().string(), render(reports));
  }
  EXPECT_GE(rows, 15);
}

}  // namespace
}  // namespace offsim::models
