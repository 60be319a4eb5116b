// Fuzzes the calibration profile reader; an accepted profile must survive a JSON round trip.
#include <cstddef>
#include <cstdint>
#include <string>

#include "sim/platform/profile.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace offsim::sim::platform;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto profile = profile_from_json_text(text, "profile.json");
  if (!profile) return 0;
  auto again = profile_from_json(profile_to_json(*profile), "again.json");
  if (!again) __builtin_trap();
  return 0;
}
