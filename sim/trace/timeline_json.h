// Timeline ⇄ JSON (offsim's own lossless format, integer nanoseconds) and the Chrome trace-event
// export that opens in Perfetto / chrome://tracing.
//
//   sim::write_text_file_atomic("t.json", sim::timeline_to_json(t).dump());
//   sim::Result<sim::Timeline> back = sim::timeline_from_json_text(text, "t.json");
//   std::string trace = sim::chrome_trace_json({&predicted, &measured});
//
// Chrome trace: one process per timeline source, one `tid` per lane with `M` thread_name
// metadata (args: the name and, when the timeline has lane identity, rank, stage and role),
// `X` slices in µs with 3 decimals, `C` counters per pool (bytes in use) each with an `M`
// "offsim_pool" event (args: name, kind, owner) that viewers skip, and an `s`/`f` flow pair per
// cross-lane dependency (an arrow from the producer's end to the consumer's start).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/core/result.h"
#include "sim/trace/timeline.h"

namespace offsim::sim {

inline constexpr int kTimelineFormatVersion = 1;

nlohmann::json timeline_to_json(const Timeline& timeline);
Result<Timeline> timeline_from_json(const nlohmann::json& json, const std::string& source);
Result<Timeline> timeline_from_json_text(const std::string& text, const std::string& source);
Result<Timeline> read_timeline_file(const std::string& path);

// Several timelines (e.g. predicted and measured) side by side, one process each.
std::string chrome_trace_json(const std::vector<const Timeline*>& timelines);

}  // namespace offsim::sim
