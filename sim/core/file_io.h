// Bounded whole-file reads and crash-safe writes.
//
// Every input file goes through read_input_file: only regular files are read (a device, FIFO,
// socket or directory is refused by name before any byte is read), the size is checked against
// the limit of its kind first, and the read itself stops at the limit even when the file grows
// while it is being read. write_text_file_atomic writes to a temporary file beside the target,
// flushes it to disk and renames it into place: a killed process never leaves a truncated file
// under the final name.
//
//   OFFSIM_ASSIGN_OR_RETURN(std::string text,
//                           sim::read_input_file("scenario.yaml", sim::kScenarioInput));
//   OFFSIM_RETURN_IF_ERROR(sim::write_text_file_atomic("out/report.json", text));
#pragma once

#include <cstdint>
#include <string>

#include "sim/core/result.h"

namespace offsim::sim {

// What an input file is (for messages) and the most bytes offsim reads of it.
struct InputKind {
  const char* what;  // "a scenario (YAML or JSON)"
  std::int64_t max_bytes;
};

// A scenario is hand-written YAML: the largest example is 3 KiB; 4 MiB is 1000 times that and
// keeps the YAML parser's memory (about 20 bytes per input byte) under 100 MB. The scenario
// loader's DocumentLimits::max_bytes carries the same default.
inline constexpr InputKind kScenarioInput{"a scenario file (YAML or JSON)", std::int64_t{4} << 20};
// A Hugging Face config.json is about 1 KiB (Llama 3 405B: 1.3 KiB); 1 MiB is plenty.
inline constexpr InputKind kHfConfigInput{"a Hugging Face config.json", std::int64_t{1} << 20};
// A calibration profile is about 30 KiB with its GEMM points; 16 MiB allows 500 times more points.
inline constexpr InputKind kProfileInput{"a calibration profile (JSON)", std::int64_t{16} << 20};
// Timelines and plans scale with the step: about 250 bytes of JSON per op, so 1 GiB is about
// 4 M ops, the size that --max-plan-ops and --max-memory already admit by default on a 16 GiB
// machine. Parsing costs about 10 bytes of memory per byte of JSON.
inline constexpr InputKind kTimelineInput{"a Timeline JSON", std::int64_t{1} << 30};
inline constexpr InputKind kPlanInput{"a Plan JSON", std::int64_t{1} << 30};
// A sweep result file holds one row (under 2 KiB) per point; --max-points defaults to 1 M points,
// so 4 GiB is twice the largest file a default sweep writes.
inline constexpr InputKind kSweepResultsInput{"a sweep result file (CSV or JSONL)",
                                              std::int64_t{4} << 30};

// What a file that is not a regular file is, for messages: "a directory", "a character device",
// "a block device", "a pipe (FIFO)", "a socket" (st_mode of stat()).
const char* file_type_name(unsigned int st_mode);

// Reads a regular file of at most kind.max_bytes bytes. Errors name the path and what was
// expected: kNotFound (missing), kLimitExceeded (too large), kInvalidInput (not a regular file,
// or unreadable: an input the user named that cannot be read is an input error).
Result<std::string> read_input_file(const std::string& path, const InputKind& kind);

// read_input_file with a generic kind; refuses files larger than `max_bytes`.
Result<std::string> read_text_file(const std::string& path,
                                   std::int64_t max_bytes = std::int64_t{1} << 30);

Status write_text_file_atomic(const std::string& path, const std::string& contents);

}  // namespace offsim::sim
