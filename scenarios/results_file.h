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
// JSONL: the "index" and "axes" members, re-serialised; "" when the line is not a JSON object.
std::function<std::string(const std::string&)> jsonl_row_key();

// Quotes a CSV field when it holds a comma, quote, CR or LF (RFC 4180).
std::string csv_field(const std::string& text);

}  // namespace offsim::scenarios
