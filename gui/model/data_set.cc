#include "gui/model/data_set.h"

#include <algorithm>

#include "gui/model/chrome_trace.h"
#include "sim/core/file_io.h"
#include "sim/trace/timeline_json.h"

namespace offsim::gui {
namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_cancelled(const std::atomic<bool>* cancel) {
  return cancel != nullptr && cancel->load(std::memory_order_relaxed);
}

}  // namespace

FileKind file_kind(const std::string& path) {
  if (ends_with(path, ".jsonl") || ends_with(path, ".csv")) return FileKind::kSweep;
  if (ends_with(path, ".yaml") || ends_with(path, ".yml")) return FileKind::kScenario;
  return FileKind::kTimeline;
}

sim::Result<DataSet> data_set_from_timelines(std::vector<sim::Timeline> timelines,
                                             const std::atomic<bool>* cancel,
                                             const ProgressFn& progress) {
  DataSet data;
  if (timelines.empty()) return data;
  OFFSIM_ASSIGN_OR_RETURN(TimelineModel model,
                          TimelineModel::build(std::move(timelines), cancel, progress));
  auto shared = std::make_shared<const TimelineModel>(std::move(model));
  for (std::size_t i = 0; i < shared->timelines().size(); ++i) {
    data.memory.push_back(MemoryModel::build(shared->timelines()[i], static_cast<int>(i)));
  }
  data.timeline = std::move(shared);
  return data;
}

sim::Result<DataSet> load_data_set(const std::vector<std::string>& paths,
                                   const std::atomic<bool>* cancel, const ProgressFn& progress) {
  std::vector<sim::Timeline> timelines;
  std::shared_ptr<const SweepTable> sweep;
  std::vector<std::string> warnings;
  const double files = static_cast<double>(std::max<std::size_t>(paths.size(), 1));
  // Reading takes the first half of the progress bar, shaping the second.
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const std::string& path = paths[i];
    auto file_progress = [&](double f) {
      if (progress) progress(0.5 * (static_cast<double>(i) + f) / files);
    };
    file_progress(0.0);
    switch (file_kind(path)) {
      case FileKind::kSweep: {
        if (sweep) {
          return sim::fail(sim::ErrorCode::kInvalidInput,
                           "{}: only one sweep file can be open at a time", path);
        }
        OFFSIM_ASSIGN_OR_RETURN(SweepTable table, read_sweep_file(path, cancel, file_progress));
        for (const std::string& w : table.warnings) warnings.push_back(w);
        sweep = std::make_shared<const SweepTable>(std::move(table));
        break;
      }
      case FileKind::kScenario:
        return sim::fail(sim::ErrorCode::kInvalidInput,
                         "{}: a scenario file; open it in the Scenario view to run it", path);
      case FileKind::kTimeline: {
        OFFSIM_ASSIGN_OR_RETURN(std::string text, sim::read_text_file(path));
        if (is_chrome_trace(text)) {
          // `offsim run --trace` writes a Chrome trace: one timeline per process in it.
          OFFSIM_ASSIGN_OR_RETURN(std::vector<sim::Timeline> traced,
                                  timelines_from_chrome_trace(text, path));
          for (sim::Timeline& t : traced) timelines.push_back(std::move(t));
          warnings.push_back(trace_limits(path));
        } else {
          OFFSIM_ASSIGN_OR_RETURN(sim::Timeline timeline, sim::timeline_from_json_text(text, path));
          timelines.push_back(std::move(timeline));
        }
        break;
      }
    }
    if (is_cancelled(cancel)) return sim::fail(sim::ErrorCode::kCancelled, "loading cancelled");
  }
  auto shaping = [&](double f) {
    if (progress) progress(0.5 + 0.5 * f);
  };
  OFFSIM_ASSIGN_OR_RETURN(DataSet data,
                          data_set_from_timelines(std::move(timelines), cancel, shaping));
  data.sweep = std::move(sweep);
  data.warnings = std::move(warnings);
  if (progress) progress(1.0);
  return data;
}

}  // namespace offsim::gui
