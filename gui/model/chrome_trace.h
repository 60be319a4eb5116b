// Chrome trace-event JSON (what `offsim run --trace` writes, for Perfetto) read back into
// Timelines, so the GUI opens a trace as it opens an offsim Timeline JSON.
//
//   if (gui::is_chrome_trace(text)) {
//     sim::Result<std::vector<sim::Timeline>> t = gui::timelines_from_chrome_trace(text, path);
//   }
//
// One Timeline per process (`pid`, named by its `process_name` metadata: "predicted",
// "measured"), in pid order; one lane per thread (`tid`, named by `thread_name`: "rank0.compute"),
// in tid order, with the rank, stage and role offsim writes into thread_name's args as the lane
// identity (a trace without them: no identity; names are never parsed); each counter's pool
// kind and owner from offsim's "offsim_pool" metadata; one op and span per `X` slice (`ts`/`dur` in
// µs, op kind, category, FLOPs and bytes from its args); one pool per `C` counter name with its
// `bytes_in_use` samples. Other events (flow arrows, instants) are skipped. A trace does not carry
// pool capacities, recorded live sets, op layers or plan dependencies: those stay empty
// (trace_limits() says so).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "sim/core/result.h"
#include "sim/trace/timeline.h"

namespace offsim::gui {

// True when `text` is a JSON object whose first member is `displayTimeUnit` or `traceEvents`
// (both writers of Chrome traces start so); an offsim Timeline JSON starts otherwise.
bool is_chrome_trace(std::string_view text);

// Errors name `source`, the event (`traceEvents[12]`) and the key, and say what was expected.
sim::Result<std::vector<sim::Timeline>> timelines_from_chrome_trace(std::string_view text,
                                                                    const std::string& source);

// What a Chrome trace lacks compared with `offsim run --timeline-out`, for a note in the GUI.
std::string trace_limits(const std::string& source);

}  // namespace offsim::gui
