#include "gui/model/sweep_model.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sim/core/file_io.h"
#include "sim/core/json_reader.h"

namespace offsim::gui {
namespace {

constexpr std::size_t kCancelStride = 4096;

bool cancelled(const std::atomic<bool>* cancel) {
  return cancel != nullptr && cancel->load(std::memory_order_relaxed);
}

std::optional<double> parse_double(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r')) {
    text.remove_suffix(1);
  }
  if (text.empty()) return std::nullopt;
  if (text.front() == '+') text.remove_prefix(1);
  double value = 0.0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

std::string scalar_text(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  return value.dump();
}

std::size_t axis_slot(SweepTable& table, const std::string& path) {
  auto it = std::find(table.axes.begin(), table.axes.end(), path);
  if (it != table.axes.end()) return static_cast<std::size_t>(it - table.axes.begin());
  table.axes.push_back(path);
  return table.axes.size() - 1;
}

// Checks one report figure: finite and not negative.
sim::Status check_figure(const std::string& where, const char* key, double value) {
  if (!std::isfinite(value) || value < 0.0) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "{}: '{}' is {}; expected a number >= 0", where,
                     key, value);
  }
  return sim::ok();
}

sim::Status set_report_field(SweepRow& row, const std::string& where, const std::string& key,
                             double value) {
  if (key == "step_time_s") {
    OFFSIM_RETURN_IF_ERROR(check_figure(where, "step_time_s", value));
    row.step_time_s = value;
  } else if (key == "tokens_per_s") {
    OFFSIM_RETURN_IF_ERROR(check_figure(where, "tokens_per_s", value));
    row.tokens_per_s = value;
  } else if (key == "hbm_peak_bytes") {
    OFFSIM_RETURN_IF_ERROR(check_figure(where, "hbm_peak_bytes", value));
    if (value > 9.0e18) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "{}: 'hbm_peak_bytes' is {}; too large",
                       where, value);
    }
    row.hbm_peak_bytes = static_cast<std::int64_t>(std::llround(value));
  }
  row.metrics.emplace_back(key, value);
  return sim::ok();
}

// The error message of a failed point ("error" when it is empty).
std::string error_text(const nlohmann::json& error) {
  std::string text = error.is_string() ? error.get<std::string>() : error.dump();
  return text.empty() ? "error" : text;
}

// index, scenario and the nested axes object of a record.
sim::Status read_row_header(const nlohmann::json& line, SweepTable& table, const std::string& where,
                            SweepRow& row) {
  auto index = line.find("index");
  if (index == line.end() || !index->is_number_integer() || index->get<std::int64_t>() < 0 ||
      index->get<std::int64_t>() > std::numeric_limits<int>::max()) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "{}: 'index' missing or not a non-negative integer", where);
  }
  row.index = index->get<int>();
  if (auto s = line.find("scenario"); s != line.end() && !s->is_null()) {
    if (!s->is_string()) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "{}: 'scenario' is not a string", where);
    }
    row.scenario = s->get<std::string>();
  }
  if (auto axes = line.find("axes"); axes != line.end()) {
    if (!axes->is_object()) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "{}: 'axes' is not an object", where);
    }
    for (auto it = axes->begin(); it != axes->end(); ++it) {
      const std::size_t slot = axis_slot(table, it.key());
      if (row.axis_values.size() <= slot) row.axis_values.resize(slot + 1);
      row.axis_values[slot] = scalar_text(it.value());
    }
  }
  return sim::ok();
}

// A flat record: axes.<path> members, report columns, and error (null when it ran).
sim::Status read_flat_record(const nlohmann::json& line, SweepTable& table,
                             const std::string& where, SweepRow& row) {
  bool has_fits = false;
  for (auto it = line.begin(); it != line.end(); ++it) {
    const std::string& key = it.key();
    if (key.rfind("axes.", 0) == 0) {
      const std::size_t slot = axis_slot(table, key.substr(5));
      if (row.axis_values.size() <= slot) row.axis_values.resize(slot + 1);
      row.axis_values[slot] = scalar_text(it.value());
    } else if (key == "error") {
      if (!it.value().is_null()) row.error = error_text(it.value());
    } else if (key == "fits") {
      if (it.value().is_null()) continue;
      if (!it.value().is_boolean()) {
        return sim::fail(sim::ErrorCode::kInvalidInput, "{}: 'fits' is not a boolean", where);
      }
      row.fits = it.value().get<bool>();
      has_fits = true;
    } else if (key != "index" && it.value().is_number()) {
      OFFSIM_RETURN_IF_ERROR(set_report_field(row, where, key, it.value().get<double>()));
    }
  }
  if (!has_fits && row.error.empty()) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "{}: expected 'fits' (a point that ran) or 'error' (one that failed)", where);
  }
  return sim::ok();
}

// The nested form's report object.
sim::Status read_report_object(const nlohmann::json& report, const std::string& where,
                               SweepRow& row) {
  if (!report.is_object()) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "{}: 'report' is not an object", where);
  }
  for (auto it = report.begin(); it != report.end(); ++it) {
    if (it.key() == "fits") {
      if (!it.value().is_boolean()) {
        return sim::fail(sim::ErrorCode::kInvalidInput, "{}: 'report.fits' is not a boolean",
                         where);
      }
      row.fits = it.value().get<bool>();
    } else if (it.value().is_number()) {
      OFFSIM_RETURN_IF_ERROR(set_report_field(row, where, it.key(), it.value().get<double>()));
    }
  }
  return sim::ok();
}

sim::Result<SweepRow> row_from_json(const nlohmann::json& line, SweepTable& table,
                                    const std::string& where) {
  if (!line.is_object()) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "{}: expected a JSON object", where);
  }
  SweepRow row;
  OFFSIM_RETURN_IF_ERROR(read_row_header(line, table, where, row));
  auto error = line.find("error");
  auto report = line.find("report");
  if (line.find("axes") == line.end() && report == line.end()) {
    OFFSIM_RETURN_IF_ERROR(read_flat_record(line, table, where, row));
  } else if (error != line.end()) {
    row.error = error_text(*error);
  } else if (report != line.end()) {
    OFFSIM_RETURN_IF_ERROR(read_report_object(*report, where, row));
  } else {
    return sim::fail(sim::ErrorCode::kInvalidInput, "{}: expected 'report' or 'error'", where);
  }
  return row;
}

// Splits one CSV record (RFC 4180 quoting) starting at `pos`; advances `pos` past its newline.
sim::Result<std::vector<std::string>> csv_record(std::string_view text, std::size_t& pos,
                                                 const std::string& where) {
  std::vector<std::string> fields;
  std::string field;
  bool quoted = false;
  bool was_quoted = false;
  while (pos < text.size()) {
    const char c = text[pos++];
    if (quoted) {
      if (c == '"') {
        if (pos < text.size() && text[pos] == '"') {
          field += '"';
          ++pos;
        } else {
          quoted = false;
        }
      } else {
        field += c;
      }
    } else if (c == '"' && field.empty() && !was_quoted) {
      quoted = true;
      was_quoted = true;
    } else if (c == ',') {
      fields.push_back(std::move(field));
      field.clear();
      was_quoted = false;
    } else if (c == '\n') {
      fields.push_back(std::move(field));
      return fields;
    } else if (c != '\r') {
      field += c;
    }
  }
  if (quoted) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "{}: unterminated quoted field", where);
  }
  fields.push_back(std::move(field));
  return fields;
}

std::optional<bool> parse_bool(std::string_view text) {
  if (text == "true" || text == "1" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "0" || text == "False" || text == "FALSE") return false;
  return std::nullopt;
}

}  // namespace

sim::Result<SweepTable> parse_sweep_jsonl(std::string_view text, const std::string& source,
                                          const std::atomic<bool>* cancel,
                                          const ProgressFn& progress) {
  SweepTable table;
  table.source = source;
  std::size_t pos = 0;
  int line_number = 0;
  while (pos < text.size()) {
    const std::size_t newline = text.find('\n', pos);
    const bool last = newline == std::string_view::npos;
    const std::string_view line = text.substr(pos, last ? std::string_view::npos : newline - pos);
    pos = last ? text.size() : newline + 1;
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = fmt::format("{}:{}", source, line_number);
    // Strict JSON (a duplicate key is an error, not "last one wins").
    auto parsed = sim::parse_json_text(std::string(line), where);
    if (!parsed) {
      // A sweep being written may end in a partial line: skip it, say so.
      if (last) {
        table.warnings.push_back(fmt::format("{}: incomplete last line skipped", where));
        break;
      }
      return sim::fail(parsed.error());
    }
    nlohmann::json json = std::move(*parsed);
    OFFSIM_ASSIGN_OR_RETURN(SweepRow row, row_from_json(json, table, where));
    table.rows.push_back(std::move(row));
    if (table.rows.size() % kCancelStride == 0) {
      if (cancelled(cancel)) return sim::fail(sim::ErrorCode::kCancelled, "loading cancelled");
      if (progress) progress(static_cast<double>(pos) / static_cast<double>(text.size()));
    }
  }
  for (SweepRow& row : table.rows) row.axis_values.resize(table.axes.size());
  if (progress) progress(1.0);
  return table;
}

namespace {

// Where each kind of column is in a sweep CSV header.
struct CsvColumns {
  std::size_t index = 0;
  std::optional<std::size_t> scenario;
  std::optional<std::size_t> error;
  std::vector<std::size_t> axes;
  std::vector<std::size_t> report;
};

// The header's columns; the axis names go to `table`. Flat files name axes "axes.<path>";
// the older layout has them between index and step_time_s.
sim::Result<CsvColumns> csv_columns(const std::vector<std::string>& header,
                                    const std::string& source, SweepTable& table) {
  auto column = [&](std::string_view name) -> std::optional<std::size_t> {
    auto it = std::find(header.begin(), header.end(), name);
    if (it == header.end()) return std::nullopt;
    return static_cast<std::size_t>(it - header.begin());
  };
  const auto index_col = column("index");
  const auto step_col = column("step_time_s");
  if (!index_col || !step_col || *step_col < *index_col) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "{}:1: expected a header 'index,axes.<path>...,step_time_s,...'", source);
  }
  CsvColumns cols;
  cols.index = *index_col;
  cols.scenario = column("scenario");
  cols.error = column("error");
  const bool flat = std::any_of(header.begin(), header.end(),
                                [](const std::string& h) { return h.rfind("axes.", 0) == 0; });
  for (std::size_t c = 0; c < header.size(); ++c) {
    if (c == cols.index || (cols.scenario && c == *cols.scenario) ||
        (cols.error && c == *cols.error)) {
      continue;
    }
    if (flat ? header[c].rfind("axes.", 0) == 0 : (c > *index_col && c < *step_col)) {
      cols.axes.push_back(c);
      table.axes.push_back(flat ? header[c].substr(5) : header[c]);
    } else if (flat || c >= *step_col) {
      cols.report.push_back(c);
    }
  }
  return cols;
}

// One report column's field into the row; text columns (e.g. an outcome name) are skipped.
sim::Status set_csv_field(SweepRow& row, const std::string& where, const std::string& name,
                          const std::string& field) {
  if (field.empty()) return sim::ok();
  if (name == "fits") {
    const auto fits = parse_bool(field);
    if (!fits) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "{}: fits '{}' is not true or false", where,
                       field);
    }
    row.fits = *fits;
    return sim::ok();
  }
  const auto value = parse_double(field);
  if (!value) {
    if (name == "step_time_s" || name == "hbm_peak_bytes" || name == "tokens_per_s") {
      return sim::fail(sim::ErrorCode::kInvalidInput, "{}: {} '{}' is not a number", where, name,
                       field);
    }
    return sim::ok();
  }
  return set_report_field(row, where, name, *value);
}

sim::Result<SweepRow> row_from_csv(const std::vector<std::string>& fields,
                                   const std::vector<std::string>& header, const CsvColumns& cols,
                                   const std::string& where) {
  SweepRow row;
  const auto index = parse_double(fields[cols.index]);
  if (!index || *index < 0 || *index != std::floor(*index) ||
      *index > std::numeric_limits<int>::max()) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "{}: index '{}' is not a non-negative integer",
                     where, fields[cols.index]);
  }
  row.index = static_cast<int>(*index);
  if (cols.scenario) row.scenario = fields[*cols.scenario];
  for (std::size_t c : cols.axes) row.axis_values.push_back(fields[c]);
  if (cols.error && !fields[*cols.error].empty()) row.error = fields[*cols.error];
  for (std::size_t c : cols.report) {
    OFFSIM_RETURN_IF_ERROR(set_csv_field(row, where, header[c], fields[c]));
  }
  return row;
}

}  // namespace

sim::Result<SweepTable> parse_sweep_csv(std::string_view text, const std::string& source,
                                        const std::atomic<bool>* cancel,
                                        const ProgressFn& progress) {
  SweepTable table;
  table.source = source;
  std::size_t pos = 0;
  OFFSIM_ASSIGN_OR_RETURN(std::vector<std::string> header,
                          csv_record(text, pos, fmt::format("{}:1", source)));
  OFFSIM_ASSIGN_OR_RETURN(const CsvColumns cols, csv_columns(header, source, table));
  int line_number = 1;
  while (pos < text.size()) {
    ++line_number;
    const std::string where = fmt::format("{}:{}", source, line_number);
    OFFSIM_ASSIGN_OR_RETURN(std::vector<std::string> fields, csv_record(text, pos, where));
    const bool last = pos >= text.size() && text.back() != '\n';
    if (fields.size() == 1 && fields[0].find_first_not_of(" \t\r") == std::string::npos) continue;
    if (fields.size() != header.size()) {
      if (last) {
        table.warnings.push_back(fmt::format("{}: incomplete last line skipped", where));
        break;
      }
      return sim::fail(sim::ErrorCode::kInvalidInput, "{}: {} fields; the header has {}", where,
                       fields.size(), header.size());
    }
    OFFSIM_ASSIGN_OR_RETURN(SweepRow row, row_from_csv(fields, header, cols, where));
    table.rows.push_back(std::move(row));
    if (table.rows.size() % kCancelStride == 0) {
      if (cancelled(cancel)) return sim::fail(sim::ErrorCode::kCancelled, "loading cancelled");
      if (progress) progress(static_cast<double>(pos) / static_cast<double>(text.size()));
    }
  }
  if (progress) progress(1.0);
  return table;
}

sim::Result<SweepTable> read_sweep_file(const std::string& path, const std::atomic<bool>* cancel,
                                        const ProgressFn& progress) {
  OFFSIM_ASSIGN_OR_RETURN(std::string text, sim::read_input_file(path, sim::kSweepResultsInput));
  if (path.size() >= 4 && path.compare(path.size() - 4, 4, ".csv") == 0) {
    return parse_sweep_csv(text, path, cancel, progress);
  }
  return parse_sweep_jsonl(text, path, cancel, progress);
}

std::vector<PlotPoint> plot_points(const SweepTable& table, SweepMetric metric) {
  auto figure = [metric](const SweepRow& row) {
    return metric == SweepMetric::kStepTime ? row.step_time_s : row.tokens_per_s;
  };
  // The slow end of the step-time axis.
  std::optional<double> slowest_fit;
  std::optional<double> slowest_any;
  for (const SweepRow& row : table.rows) {
    if (!row.error.empty() || !row.step_time_s) continue;
    slowest_any = std::max(slowest_any.value_or(0.0), *row.step_time_s);
    if (row.fits) slowest_fit = std::max(slowest_fit.value_or(0.0), *row.step_time_s);
  }
  const double slow_end = 1.05 * slowest_fit.value_or(slowest_any.value_or(1.0 / 1.05));
  std::vector<PlotPoint> out;
  for (std::size_t i = 0; i < table.rows.size(); ++i) {
    const SweepRow& row = table.rows[i];
    if (!row.error.empty() || !row.hbm_peak_bytes) continue;
    const auto hbm = static_cast<double>(*row.hbm_peak_bytes);
    if (row.fits) {
      if (auto y = figure(row)) out.push_back({i, hbm, *y, true});
    } else {
      out.push_back({i, hbm, metric == SweepMetric::kStepTime ? slow_end : 0.0, false});
    }
  }
  return out;
}

std::vector<std::size_t> pareto_front(const SweepTable& table) {
  std::vector<std::size_t> feasible;
  for (std::size_t i = 0; i < table.rows.size(); ++i) {
    if (table.rows[i].feasible()) feasible.push_back(i);
  }
  // By peak HBM, then step time: a point is on the front when its step time is below every
  // earlier point's (or equals the current front point's at the same HBM).
  std::sort(feasible.begin(), feasible.end(), [&](std::size_t a, std::size_t b) {
    const SweepRow& ra = table.rows[a];
    const SweepRow& rb = table.rows[b];
    return std::tie(*ra.hbm_peak_bytes, *ra.step_time_s, a) <
           std::tie(*rb.hbm_peak_bytes, *rb.step_time_s, b);
  });
  std::vector<std::size_t> front;
  double best_time = std::numeric_limits<double>::infinity();
  for (std::size_t i : feasible) {
    const SweepRow& row = table.rows[i];
    if (*row.step_time_s < best_time) {
      front.push_back(i);
      best_time = *row.step_time_s;
    } else if (!front.empty() && *row.step_time_s == best_time &&
               *row.hbm_peak_bytes == *table.rows[front.back()].hbm_peak_bytes) {
      front.push_back(i);  // an exact duplicate of the last front point
    }
  }
  return front;
}

sim::Result<AxisColouring> colour_by_axis(const SweepTable& table, const std::string& axis) {
  auto it = std::find(table.axes.begin(), table.axes.end(), axis);
  if (it == table.axes.end()) {
    std::string known;
    for (const std::string& a : table.axes) known += (known.empty() ? "" : ", ") + a;
    return sim::fail(sim::ErrorCode::kNotFound, "{}: no sweep axis '{}' (axes: {})", table.source,
                     axis, known.empty() ? "none" : known);
  }
  const auto slot = static_cast<std::size_t>(it - table.axes.begin());
  AxisColouring out;
  out.value.assign(table.rows.size(), -1.0);
  std::vector<std::optional<double>> numbers(table.rows.size());
  bool all_numeric = true;
  bool any = false;
  for (std::size_t i = 0; i < table.rows.size(); ++i) {
    const std::string& v = table.rows[i].axis_values[slot];
    if (v.empty()) continue;
    any = true;
    numbers[i] = parse_double(v);
    if (!numbers[i]) all_numeric = false;
  }
  out.numeric = any && all_numeric;
  if (out.numeric) {
    out.min = std::numeric_limits<double>::infinity();
    out.max = -std::numeric_limits<double>::infinity();
    for (const auto& n : numbers) {
      if (!n) continue;
      out.min = std::min(out.min, *n);
      out.max = std::max(out.max, *n);
    }
    for (std::size_t i = 0; i < numbers.size(); ++i) {
      if (!numbers[i]) continue;
      out.value[i] = out.max > out.min ? (*numbers[i] - out.min) / (out.max - out.min) : 0.5;
    }
    return out;
  }
  for (std::size_t i = 0; i < table.rows.size(); ++i) {
    const std::string& v = table.rows[i].axis_values[slot];
    if (v.empty()) continue;
    auto c = std::find(out.categories.begin(), out.categories.end(), v);
    if (c == out.categories.end()) {
      out.categories.push_back(v);
      c = std::prev(out.categories.end());
    }
    out.value[i] = static_cast<double>(c - out.categories.begin());
  }
  return out;
}

}  // namespace offsim::gui
