#include "scenarios/results_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "sim/core/file_io.h"
#include "sim/core/json_reader.h"

namespace offsim::scenarios {
namespace {

using sim::ErrorCode;

sim::Status write_all(int fd, const std::string& data, const std::string& path) {
  const char* p = data.data();
  std::size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return sim::fail(ErrorCode::kIo, "{}: write failed: {}", path, std::strerror(errno));
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  return sim::ok();
}

sim::Status sync(int fd, const std::string& path) {
  if (::fdatasync(fd) != 0) {
    return sim::fail(ErrorCode::kIo, "{}: fdatasync failed: {}", path, std::strerror(errno));
  }
  return sim::ok();
}

// Makes the directory entry of a newly created file durable.
void sync_parent_dir(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace

ResultsFile::ResultsFile(ResultsFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), rows_done_(other.rows_done_) {
  other.fd_ = -1;
}

ResultsFile& ResultsFile::operator=(ResultsFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    rows_done_ = other.rows_done_;
    other.fd_ = -1;
  }
  return *this;
}

ResultsFile::~ResultsFile() {
  if (fd_ >= 0) ::close(fd_);
}

sim::Result<ResultsFile> ResultsFile::open(const Spec& spec, OpenMode mode) {
  struct stat st {};
  const bool exists = ::stat(spec.path.c_str(), &st) == 0;
  if (exists && mode == OpenMode::kCreate) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: already exists; pass --resume to continue it or --overwrite to replace "
                     "it",
                     spec.path);
  }
  std::int64_t rows_done = 0;
  std::int64_t keep_bytes = 0;
  bool write_header = !spec.header.empty();
  if (exists && mode == OpenMode::kResume) {
    // Sweep files hold one short line per point; 4 GiB is far beyond any sweep we accept.
    OFFSIM_ASSIGN_OR_RETURN(std::string text,
                            sim::read_input_file(spec.path, sim::kSweepResultsInput));
    std::size_t pos = 0;
    std::int64_t line_no = 0;
    while (pos < text.size()) {
      const std::size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) break;  // a partial last line: cut below
      const std::string line = text.substr(pos, nl - pos);
      ++line_no;
      if (write_header) {
        if (line != spec.header) {
          return sim::fail(ErrorCode::kInvalidInput,
                           "{}:1: header does not match this sweep; expected '{}', got '{}'",
                           spec.path, spec.header, line.substr(0, 200));
        }
        write_header = false;
      } else {
        if (rows_done >= spec.expected_rows) {
          return sim::fail(ErrorCode::kInvalidInput,
                           "{}:{}: more rows than the {} points of this sweep", spec.path, line_no,
                           spec.expected_rows);
        }
        const std::string want = spec.expected_key(rows_done);
        const std::string got = spec.row_key(line);
        if (want != got) {
          return sim::fail(ErrorCode::kInvalidInput,
                           "{}:{}: row does not belong to this sweep at this place; expected key "
                           "'{}', got '{}'",
                           spec.path, line_no, want, got.substr(0, 200));
        }
        ++rows_done;
      }
      pos = nl + 1;
    }
    keep_bytes = static_cast<std::int64_t>(pos);
  }

  int flags = O_WRONLY | O_CREAT | O_CLOEXEC;
  if (!(exists && mode == OpenMode::kResume)) flags |= O_TRUNC;
  const int fd = ::open(spec.path.c_str(), flags, 0644);
  if (fd < 0) {
    return sim::fail(ErrorCode::kIo, "{}: cannot open for writing: {}", spec.path,
                     std::strerror(errno));
  }
  ResultsFile file(spec.path, fd, rows_done);
  if (exists && mode == OpenMode::kResume) {
    if (::ftruncate(fd, keep_bytes) != 0) {
      return sim::fail(ErrorCode::kIo, "{}: cannot cut the partial last line: {}", spec.path,
                       std::strerror(errno));
    }
    OFFSIM_RETURN_IF_ERROR(sync(fd, spec.path));
  } else {
    sync_parent_dir(spec.path);
  }
  if (::lseek(fd, 0, SEEK_END) < 0) {
    return sim::fail(ErrorCode::kIo, "{}: seek failed: {}", spec.path, std::strerror(errno));
  }
  if (write_header) {
    OFFSIM_RETURN_IF_ERROR(write_all(fd, spec.header + "\n", spec.path));
    OFFSIM_RETURN_IF_ERROR(sync(fd, spec.path));
  }
  return file;
}

sim::Status ResultsFile::append(const std::vector<std::string>& rows) {
  if (rows.empty()) return sim::ok();
  std::string data;
  for (const std::string& row : rows) {
    OFFSIM_CHECK_MSG(row.find('\n') == std::string::npos, "row holds a newline: {}", row);
    data += row;
    data += '\n';
  }
  OFFSIM_RETURN_IF_ERROR(write_all(fd_, data, path_));
  OFFSIM_RETURN_IF_ERROR(sync(fd_, path_));
  rows_done_ += static_cast<std::int64_t>(rows.size());
  return sim::ok();
}

std::function<std::string(const std::string&)> csv_row_key(std::size_t key_fields) {
  return [key_fields](const std::string& line) {
    std::size_t fields = 0;
    bool in_quotes = false;
    for (std::size_t i = 0; i < line.size(); ++i) {
      const char c = line[i];
      if (c == '"') in_quotes = !in_quotes;
      if (c == ',' && !in_quotes && ++fields == key_fields) return line.substr(0, i);
    }
    return fields + 1 == key_fields ? line : std::string();
  };
}

std::function<std::string(const std::string&)> jsonl_row_key() {
  return [](const std::string& line) -> std::string {
    const auto j = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return {};
    // Strict JSON: a row with a duplicate key is not one this sweep wrote (the parse above keeps
    // the last of the duplicates silently). What is wrong is shown in place of the key.
    if (auto strict = sim::parse_json_text(line, "row"); !strict) {
      return "<" + strict.error().message + ">";
    }
    if (!j.is_object() || !j.contains("index")) return {};
    auto key = nlohmann::ordered_json::object();
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "index" || it.key().rfind("axes.", 0) == 0) key[it.key()] = it.value();
    }
    return key.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  };
}

std::vector<std::string> flat_columns(const nlohmann::json& schema, const std::string& prefix) {
  std::vector<std::string> out;
  if (!schema.is_object() || schema.empty()) return {prefix};
  for (auto it = schema.begin(); it != schema.end(); ++it) {
    const std::string name = prefix.empty() ? it.key() : prefix + "." + it.key();
    for (std::string& c : flat_columns(it.value(), name)) out.push_back(std::move(c));
  }
  return out;
}

void flatten_json(const nlohmann::json& schema, const nlohmann::json& value,
                  const std::string& prefix, nlohmann::ordered_json& out) {
  if (!schema.is_object() || schema.empty()) {
    if (value.is_array() || value.is_object()) {
      out[prefix] = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    } else {
      out[prefix] = value;
    }
    return;
  }
  static const nlohmann::json kNull;
  for (auto it = schema.begin(); it != schema.end(); ++it) {
    const std::string name = prefix.empty() ? it.key() : prefix + "." + it.key();
    const auto member = value.is_object() ? value.find(it.key()) : value.end();
    flatten_json(it.value(), value.is_object() && member != value.end() ? *member : kNull, name,
                 out);
  }
}

std::string csv_cell(const nlohmann::ordered_json& cell) {
  if (cell.is_null()) return {};
  if (cell.is_string()) {
    // Rows are lines: a line break inside a text cell becomes a space.
    std::string text = cell.get<std::string>();
    for (char& c : text) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    return csv_field(text);
  }
  return csv_field(cell.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
}

std::string csv_row(const nlohmann::ordered_json& record) {
  std::string out;
  bool first = true;
  for (const auto& cell : record) {
    if (!first) out += ',';
    out += csv_cell(cell);
    first = false;
  }
  return out;
}

std::string json_line(const nlohmann::ordered_json& record) {
  return record.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace offsim::scenarios
