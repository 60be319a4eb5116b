// ResultsFile: the append-only, crash-safe file a sweep writes its rows to (CSV or JSON lines).
//
// Rows are appended in point order; each batch of rows is written with one write() and made
// durable with fdatasync() before the call returns, so a process killed at any moment (kill -9)
// leaves a prefix of complete rows and at most one partial line. Opening with `resume` reads the
// existing file, cuts a partial last line, checks that the header and the keys of every complete
// row match what this sweep would write (`row_key`), and reports how many rows are done.
//
//   ResultsFile::Spec spec{.path = "out.csv", .header = "index,tp,step_time_s",
//                          .expected_key = [&](std::int64_t row) { return keys[row]; },
//                          .row_key = csv_row_key(2)};
//   OFFSIM_ASSIGN_OR_RETURN(ResultsFile f, ResultsFile::open(spec, OpenMode::kResume));
//   for (std::int64_t i = f.rows_done(); i < n; ++i) OFFSIM_RETURN_IF_ERROR(f.append({row(i)}));
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/core/result.h"

namespace offsim::scenarios {

enum class OpenMode {
  kCreate,     // the file must not exist
  kOverwrite,  // replace any existing file
  kResume,     // continue an existing file (or start one when there is none)
};

class ResultsFile {
 public:
  struct Spec {
    std::string path;
    std::string header;  // first line without '\n'; empty for formats without a header (JSONL)
    std::int64_t expected_rows = 0;  // rows the finished file will hold
    // The key row `i` must carry (e.g. "3,tp=2"); compared with row_key(line) on resume.
    std::function<std::string(std::int64_t row)> expected_key;
    std::function<std::string(const std::string& line)> row_key;
  };

  static sim::Result<ResultsFile> open(const Spec& spec, OpenMode mode);

  ResultsFile(ResultsFile&& other) noexcept;
  ResultsFile& operator=(ResultsFile&& other) noexcept;
  ResultsFile(const ResultsFile&) = delete;
  ResultsFile& operator=(const ResultsFile&) = delete;
  ~ResultsFile();

  std::int64_t rows_done() const { return rows_done_; }
  // Appends complete rows (without their '\n') durably.
  sim::Status append(const std::vector<std::string>& rows);

 private:
  ResultsFile(std::string path, int fd, std::int64_t rows_done)
      : path_(std::move(path)), fd_(fd), rows_done_(rows_done) {}

  std::string path_;
  int fd_ = -1;
  std::int64_t rows_done_ = 0;
};

// Key functions for the two row formats.
// CSV: the first `key_fields` fields of a line, as written (quotes included).
std::function<std::string(const std::string&)> csv_row_key(std::size_t key_fields);
// JSONL: the "index" member and every "axes.*" member, in line order, re-serialised; "" when the
// line is not a JSON object with an "index".
std::function<std::string(const std::string&)> jsonl_row_key();

// Quotes a CSV field when it holds a comma, quote, CR or LF (RFC 4180).
std::string csv_field(const std::string& text);

// Flat records: one level of dotted column names ("memory.params_bytes") for CSV, JSON lines and
// pandas. `schema` says where the columns are: every member of a non-empty object in `schema` is
// followed into, and anything else there (a scalar, null, a list, an empty object) is one column.
//
//   nlohmann::json schema = {{"fits", false}, {"time", {{"compute_s", 0.0}}}, {"flags", {}}};
//   flat_columns(schema);                // {"fits", "flags", "time.compute_s"}
//   nlohmann::ordered_json row;
//   flatten_json(schema, value, "", row);  // row["time.compute_s"] = value["time"]["compute_s"]
std::vector<std::string> flat_columns(const nlohmann::json& schema, const std::string& prefix = "");
// Adds `value`'s cell for each column of `schema` to `out`, in flat_columns() order: null when
// `value` lacks the path (or a step of it is not an object), a scalar as it is, a list or an
// object as its JSON text (one cell, so per-rank entries and live sets stay in one row).
void flatten_json(const nlohmann::json& schema, const nlohmann::json& value,
                  const std::string& prefix, nlohmann::ordered_json& out);
// A flat cell as CSV text: null -> "" (an empty cell), true/false, numbers as JSON writes them
// (shortest round trip), strings quoted when needed (csv_field) with line breaks as spaces.
std::string csv_cell(const nlohmann::ordered_json& cell);
// A flat record as a CSV row and as one JSON line (invalid UTF-8 replaced, no newline).
std::string csv_row(const nlohmann::ordered_json& record);
std::string json_line(const nlohmann::ordered_json& record);

}  // namespace offsim::scenarios
