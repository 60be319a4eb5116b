// Check macros for programmer errors (broken invariants): print file:line and abort.
//
// Expected failures (bad input, missing GPU) use Result<T> instead; see result.h.
//
//   OFFSIM_CHECK(flow.remaining >= 0.0);
//   OFFSIM_CHECK_MSG(lane.valid(), "op {} has no lane", op.name);
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

namespace offsim::sim::detail {

[[noreturn]] inline void check_failed(const char* file, int line, const char* expr,
                                      const std::string& message) {
  std::fprintf(stderr, "%s:%d: check failed: %s%s%s\n", file, line, expr,
               message.empty() ? "" : ": ", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace offsim::sim::detail

#define OFFSIM_CHECK(cond)                                                \
  do {                                                                    \
    if (!(cond)) [[unlikely]] {                                           \
      ::offsim::sim::detail::check_failed(__FILE__, __LINE__, #cond, {}); \
    }                                                                     \
  } while (false)

#define OFFSIM_CHECK_MSG(cond, ...)                                                               \
  do {                                                                                            \
    if (!(cond)) [[unlikely]] {                                                                   \
      ::offsim::sim::detail::check_failed(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__)); \
    }                                                                                             \
  } while (false)
