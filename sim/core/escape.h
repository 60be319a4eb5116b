// Escaping of user text quoted in messages: control characters, invalid UTF-8 and invisible
// code points (zero-width spaces and joiners, bidirectional overrides, the byte-order mark, ...)
// are written as escapes, so that what a message quotes can be seen and retyped.
//
//   sim::escape_for_message("micro\u200bbatch")  // -> "micro\u200Bbatch" (a visible escape)
//   fail(ErrorCode::kInvalidInput, "unknown key '{}'", sim::escape_for_message(key));
#pragma once

#include <string>
#include <string_view>

namespace offsim::sim {

// Visible text: printable ASCII and visible UTF-8 pass through; '\n' and '\t' become "\n" and
// "\t", other control bytes and invalid UTF-8 bytes "\xNN", invisible or format code points
// "\uXXXX" (or "\UXXXXXXXX"). A backslash is kept as it is.
std::string escape_for_message(std::string_view text);

// As escape_for_message, but line breaks stay line breaks (for whole multi-line messages).
std::string escape_message_keep_lines(std::string_view text);

}  // namespace offsim::sim
