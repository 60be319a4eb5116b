// Whole-file reads and crash-safe writes.
//
// write_text_file_atomic writes to a temporary file beside the target, flushes it to disk and
// renames it into place: a killed process never leaves a truncated file under the final name.
//
//   OFFSIM_RETURN_IF_ERROR(sim::write_text_file_atomic("out/report.json", text));
//   OFFSIM_ASSIGN_OR_RETURN(std::string text, sim::read_text_file("scenario.yaml"));
#pragma once

#include <cstdint>
#include <string>

#include "sim/core/result.h"

namespace offsim::sim {

// Refuses files larger than `max_bytes` with kLimitExceeded.
Result<std::string> read_text_file(const std::string& path,
                                   std::int64_t max_bytes = std::int64_t{1} << 30);
Status write_text_file_atomic(const std::string& path, const std::string& contents);

}  // namespace offsim::sim
