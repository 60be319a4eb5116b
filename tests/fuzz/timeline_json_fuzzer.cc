// Fuzzes the Timeline JSON reader and the Chrome trace writer on what it accepts.
#include <cstddef>
#include <cstdint>
#include <string>

#include "sim/trace/timeline_json.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto timeline = offsim::sim::timeline_from_json_text(text, "fuzz.json");
  if (!timeline) return 0;
  const std::string trace = offsim::sim::chrome_trace_json({&*timeline});
  (void)trace;
  return 0;
}
