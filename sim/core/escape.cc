#include "sim/core/escape.h"

#include <cstdint>

#include <fmt/format.h>

namespace offsim::sim {

namespace {

// Code points that draw nothing or reorder text (Unicode "Default_Ignorable_Code_Point" and the
// bidirectional controls, plus C1 controls and separators that break lines).
bool invisible(std::uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || cp == 0xA0 || cp == 0xAD || cp == 0x34F || cp == 0x61C ||
         cp == 0x115F || cp == 0x1160 || cp == 0x17B4 || cp == 0x17B5 ||
         (cp >= 0x180B && cp <= 0x180F) || (cp >= 0x2000 && cp <= 0x200F) ||
         (cp >= 0x2028 && cp <= 0x202F) || (cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 ||
         cp == 0x3164 || (cp >= 0xFE00 && cp <= 0xFE0F) || cp == 0xFEFF || cp == 0xFFA0 ||
         (cp >= 0xFFF0 && cp <= 0xFFFB) || (cp >= 0x1D173 && cp <= 0x1D17A) ||
         (cp >= 0xE0000 && cp <= 0xE0FFF) || (cp >= 0xD800 && cp <= 0xDFFF);
}

// Length of the UTF-8 sequence at text[i] and its code point; 0 when it is not valid UTF-8.
std::size_t decode(std::string_view text, std::size_t i, std::uint32_t& cp) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char c = b(0);
  std::size_t len = 0;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + len > text.size()) return 0;
  for (std::size_t k = 1; k < len; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(k) & 0x3F);
  }
  // Overlong forms and code points above U+10FFFF are invalid.
  if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
  return len;
}

std::string escape(std::string_view text, bool keep_lines) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (c == '\n' && keep_lines) {
        out += '\n';
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c < 0x20 || c == 0x7F) {
        out += fmt::format("\\x{:02X}", c);
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    std::uint32_t cp = 0;
    const std::size_t len = decode(text, i, cp);
    if (len == 0) {
      out += fmt::format("\\x{:02X}", c);
      ++i;
    } else if (invisible(cp)) {
      out += cp > 0xFFFF ? fmt::format("\\U{:08X}", cp) : fmt::format("\\u{:04X}", cp);
      i += len;
    } else {
      out.append(text.substr(i, len));
      i += len;
    }
  }
  return out;
}

}  // namespace

std::string escape_for_message(std::string_view text) { return escape(text, false); }

std::string escape_message_keep_lines(std::string_view text) { return escape(text, true); }

}  // namespace offsim::sim
