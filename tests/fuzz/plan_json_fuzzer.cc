// Fuzzes the Plan JSON reader, and simulates every plan it accepts (validated plans must never
// crash or hang the engine; the event limit bounds each run).
#include <cstddef>
#include <cstdint>
#include <string>

#include "sim/engine/simulator.h"
#include "sim/plan/plan_json.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto plan = offsim::sim::plan_from_json_text(text, "fuzz.json");
  if (!plan) return 0;
  if (plan->ops.size() > 2000) return 0;
  offsim::sim::SimOptions options;
  options.max_events = 100000;
  auto result = offsim::sim::simulate(*plan, options);
  (void)result;
  // A plan that parsed must serialize back to text that parses to the same plan.
  auto again = offsim::sim::plan_from_json(offsim::sim::plan_to_json(*plan), "again.json");
  if (!again || !(*again == *plan)) __builtin_trap();
  return 0;
}
