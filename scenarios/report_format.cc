#include "scenarios/report_format.h"

#include <algorithm>
#include <span>

#include <fmt/format.h>

#include "scenarios/results_file.h"
#include "scenarios/sweep_runner.h"

namespace offsim::scenarios {
namespace {

std::string percent(double part, double whole) {
  return whole > 0 ? fmt::format("{:.1f}%", 100.0 * part / whole) : "-";
}

std::string seconds(double s) {
  if (s >= 100) return fmt::format("{:.1f} s", s);
  if (s >= 1) return fmt::format("{:.3f} s", s);
  return fmt::format("{:.1f} ms", s * 1e3);
}

std::string with_thousands(double v) {
  std::string digits = fmt::format("{:.0f}", v);
  std::string out;
  const std::size_t start = digits.front() == '-' ? 1 : 0;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > start && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

struct Row {
  std::string label;
  std::vector<std::string> cells;
};

// The JSON of a report with every optional part present: where the flat columns come from.
const nlohmann::json& report_schema() {
  static const nlohmann::json kSchema = [] {
    models::Report every_part;
    every_part.oom = models::OomReport{};
    return models::report_to_json(every_part);
  }();
  return kSchema;
}

}  // namespace

std::string format_bytes(std::int64_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / static_cast<double>(1LL << 30));
}

std::string limiting_factor(const models::Report& r) {
  if (!r.fits) {
    if (r.oom) return fmt::format("capacity: out of memory in {}", r.oom->pool);
    return "capacity: does not fit";
  }
  struct Cause {
    double seconds;
    const char* name;
  };
  const Cause causes[] = {{r.time.exposed_offload_s, "exposed transfer"},
                          {r.time.cpu_optimizer_s, "CPU update"},
                          {r.time.exposed_comm_s, "communication"},
                          {r.time.bubble_s, "pipeline bubble"}};
  const Cause* worst =
      std::max_element(std::begin(causes), std::end(causes),
                       [](const Cause& a, const Cause& b) { return a.seconds < b.seconds; });
  std::string out;
  // Exposed time under 2% of the step is noise next to compute.
  if (worst->seconds > 0.02 * r.step_time_s) {
    out = fmt::format("{} {}", worst->name, seconds(worst->seconds));
  } else {
    out = "compute";
  }
  if (r.hbm_capacity_bytes > 0 &&
      static_cast<double>(r.hbm_peak_bytes) > 0.95 * static_cast<double>(r.hbm_capacity_bytes)) {
    out += fmt::format("; capacity (HBM {} of {})", format_bytes(r.hbm_peak_bytes),
                       format_bytes(r.hbm_capacity_bytes));
  }
  return out;
}

namespace {

using R = models::Report;

// The table's rows, one cell per report, in the order added.
class Table {
 public:
  explicit Table(const std::vector<NamedReport>& reports) : reports_(reports) {}

  template <class Cell>
  void add(const std::string& label, Cell cell) {
    Row row{label, {}};
    for (const NamedReport& nr : reports_) row.cells.push_back(cell(nr.report));
    rows_.push_back(std::move(row));
  }

  const std::vector<NamedReport>& reports() const { return reports_; }
  std::vector<Row> take_rows() { return std::move(rows_); }

 private:
  const std::vector<NamedReport>& reports_;
  std::vector<Row> rows_;
};

// Rates and time splits exist only for a step that ran to the end; an out-of-memory run stops
// part-way, so its partial figures would mislead.
template <class Cell>
auto timed(Cell cell) {
  return [cell](const R& r) { return r.fits ? cell(r) : std::string("-"); };
}

// A pool over capacity was run to the step's end unbounded: its peak is what the step needs.
std::string peak_of(std::int64_t peak, std::int64_t capacity) {
  if (capacity > 0 && peak > capacity) {
    return fmt::format("needs {} of {} (over by {})", format_bytes(peak), format_bytes(capacity),
                       format_bytes(peak - capacity));
  }
  return fmt::format("{} of {}", format_bytes(peak), format_bytes(capacity));
}

// Outcome, size, step time and rates.
void add_summary_rows(Table& t) {
  if (t.reports().size() == 1) t.add("scenario", [&](const R& r) { return r.scenario; });
  t.add("outcome", [](const R& r) {
    return fmt::format("{}{}", r.outcome, r.fits ? ", fits" : ", DOES NOT FIT");
  });
  t.add("GPUs", [](const R& r) { return std::to_string(r.gpus); });
  t.add("step time", timed([](const R& r) { return seconds(r.step_time_s); }));
  t.add("tokens/s", timed([](const R& r) {
          return fmt::format("{} ({} per GPU)", with_thousands(r.tokens_per_s),
                             with_thousands(r.tokens_per_s_per_gpu));
        }));
  t.add("TFLOP/s per GPU", timed([](const R& r) {
          return fmt::format("{:.1f} model, {:.1f} hw", r.tflops_per_gpu, r.hw_tflops_per_gpu);
        }));
  t.add("MFU / HFU", timed([](const R& r) {
          return fmt::format("{:.1f}% / {:.1f}%", 100 * r.mfu, 100 * r.hfu);
        }));
}

// HBM peak (reserved when any run reserves), its parts, the pinned host peak.
void add_memory_rows(Table& t) {
  t.add("HBM peak", [&](const R& r) {
    return fmt::format("{} ({})", peak_of(r.hbm_peak_bytes, r.hbm_capacity_bytes), r.worst_rank);
  });
  bool any_reserved = false;
  for (const NamedReport& nr : t.reports()) any_reserved |= nr.report.hbm_reserved_bytes > 0;
  if (any_reserved) {
    // hardware.runtime: what the framework holds from the driver (allocator cache, context).
    t.add("HBM reserved",
          [&](const R& r) { return peak_of(r.hbm_reserved_bytes, r.hbm_capacity_bytes); });
  }
  t.add("  params", [](const R& r) { return format_bytes(r.memory.params_bytes); });
  t.add("  grads", [](const R& r) { return format_bytes(r.memory.grads_bytes); });
  t.add("  optimizer", [](const R& r) { return format_bytes(r.memory.optimizer_bytes); });
  t.add("  activations", [](const R& r) { return format_bytes(r.memory.activations_bytes); });
  t.add("  buffers", [](const R& r) { return format_bytes(r.memory.buffers_bytes); });
  t.add("  workspace", [](const R& r) { return format_bytes(r.memory.workspace_bytes); });
  t.add("  transients", [](const R& r) { return format_bytes(r.memory.transient_bytes); });
  t.add("  runtime", [](const R& r) { return format_bytes(r.memory.runtime_bytes); });
  t.add("host pinned peak",
        [&](const R& r) { return peak_of(r.host_peak_bytes, r.host_capacity_bytes); });
}

using TimePart = std::pair<const char*, double models::TimeSplit::*>;

// One row per part of the step time: seconds and share of the step.
void add_time_parts(Table& t, std::span<const TimePart> parts) {
  for (const auto& [label, member] : parts) {
    t.add(label, timed([member = member](const R& r) {
            return fmt::format("{} ({})", seconds(r.time.*member),
                               percent(r.time.*member, r.step_time_s));
          }));
  }
}

// The split of the step time; the MoE parts when any run has experts.
void add_time_rows(Table& t) {
  t.add("time: compute", timed([](const R& r) {
          return fmt::format("{} ({})", seconds(r.time.compute_s),
                             percent(r.time.compute_s, r.step_time_s));
        }));
  static constexpr TimePart kParts[] = {
      {"  recompute", &models::TimeSplit::recompute_s},
      {"  exposed comm", &models::TimeSplit::exposed_comm_s},
      {"  exposed offload", &models::TimeSplit::exposed_offload_s},
      {"  pipeline bubble", &models::TimeSplit::bubble_s},
      {"  CPU optimizer", &models::TimeSplit::cpu_optimizer_s},
      {"  other", &models::TimeSplit::other_s}};
  add_time_parts(t, kParts);
  const bool moe = std::any_of(t.reports().begin(), t.reports().end(), [](const NamedReport& nr) {
    return nr.report.time.moe_alltoall_s > 0.0 || nr.report.time.grouped_gemm_s > 0.0;
  });
  if (moe) {
    static constexpr TimePart kMoeParts[] = {
        {"  of which MoE all-to-all", &models::TimeSplit::moe_alltoall_s},
        {"  of which grouped GEMMs", &models::TimeSplit::grouped_gemm_s}};
    add_time_parts(t, kMoeParts);
  }
}

// What limits the step, the model's flags and where memory ran out.
void add_diagnosis_rows(Table& t) {
  t.add("limited by", [](const R& r) { return limiting_factor(r); });
  std::size_t max_flags = 0;
  for (const NamedReport& nr : t.reports()) {
    max_flags = std::max(max_flags, nr.report.flags.size());
  }
  for (std::size_t i = 0; i < max_flags; ++i) {
    t.add(i == 0 ? "flags" : "",
          [i](const R& r) { return i < r.flags.size() ? r.flags[i] : std::string(); });
  }
  bool any_oom = false;
  for (const NamedReport& nr : t.reports()) any_oom = any_oom || nr.report.oom.has_value();
  if (any_oom) {
    t.add("out of memory at", [](const R& r) {
      if (!r.oom) return std::string("-");
      return fmt::format("{} on {} at {}: +{} with {} of {} in use", r.oom->op, r.oom->pool,
                         seconds(r.oom->time_s), format_bytes(r.oom->requested_bytes),
                         format_bytes(r.oom->in_use_bytes), format_bytes(r.oom->capacity_bytes));
    });
  }
}

// Header line with each report's name, then aligned columns (one report: no header, its
// scenario row names it).
std::string render(std::vector<Row> rows, const std::vector<NamedReport>& reports) {
  Row header{"", {}};
  for (const NamedReport& nr : reports) header.cells.push_back(nr.name);
  rows.insert(rows.begin(), header);
  std::size_t label_width = 0;
  std::vector<std::size_t> widths(reports.size(), 0);
  for (const Row& row : rows) {
    label_width = std::max(label_width, row.label.size());
    for (std::size_t c = 0; c < row.cells.size(); ++c)
      widths[c] = std::max(widths[c], row.cells[c].size());
  }
  std::string out;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    if (reports.size() == 1 && i == 0) continue;  // one report: its scenario row names it
    std::string line = fmt::format("{:<{}}", row.label, label_width);
    for (std::size_t c = 0; c < row.cells.size(); ++c) {
      line += "  ";
      line +=
          c + 1 == row.cells.size() ? row.cells[c] : fmt::format("{:<{}}", row.cells[c], widths[c]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
    if (i == 0) {
      std::size_t total = label_width;
      for (std::size_t w : widths) total += 2 + w;
      out += std::string(total, '-') + "\n";
    }
  }
  return out;
}

}  // namespace

std::string format_table(const std::vector<NamedReport>& reports) {
  Table table(reports);
  add_summary_rows(table);
  add_memory_rows(table);
  add_time_rows(table);
  add_diagnosis_rows(table);
  return render(table.take_rows(), reports);
}

const std::vector<std::string>& report_columns() {
  static const std::vector<std::string> kColumns = [] {
    const std::vector<std::string> flat = flat_columns(report_schema());
    const std::vector<std::string> leading = {
        "scenario", "outcome",       "fits",         "limited_by",
        "gpus",     "step_time_s",   "tokens_per_s", "tokens_per_s_per_gpu",
        "mfu",      "hbm_peak_bytes"};
    std::vector<std::string> columns;
    for (const std::string& c : leading) {
      if (c == "limited_by" || std::find(flat.begin(), flat.end(), c) != flat.end()) {
        columns.push_back(c);
      }
    }
    for (const std::string& c : flat) {
      if (std::find(columns.begin(), columns.end(), c) == columns.end()) columns.push_back(c);
    }
    return columns;
  }();
  return kColumns;
}

nlohmann::ordered_json flat_report(const models::Report& report) {
  nlohmann::ordered_json flat = nlohmann::ordered_json::object();
  flatten_json(report_schema(), models::report_to_json(report), "", flat);
  flat["limited_by"] = limiting_factor(report);
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const std::string& c : report_columns()) out[c] = flat[c];
  return out;
}

nlohmann::ordered_json format_json(const std::vector<NamedReport>& reports) {
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  for (const NamedReport& nr : reports) all.push_back(flat_report(nr.report));
  return all;
}

std::string format_jsonl(const std::vector<NamedReport>& reports) {
  std::string out;
  for (const NamedReport& nr : reports) out += json_line(flat_report(nr.report)) + "\n";
  return out;
}

std::string format_csv(const std::vector<NamedReport>& reports) {
  std::string out;
  for (const std::string& c : report_columns()) out += (out.empty() ? "" : ",") + csv_field(c);
  out += "\n";
  for (const NamedReport& nr : reports) out += csv_row(flat_report(nr.report)) + "\n";
  return out;
}

}  // namespace offsim::scenarios
