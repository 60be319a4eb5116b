#include "sim/core/json_reader.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sim/core/escape.h"

namespace offsim::sim {

const char* json_type_name(const nlohmann::json& value) {
  if (value.is_number_integer() || value.is_number_unsigned()) return "integer";
  if (value.is_number_float()) return "number";
  return value.type_name();
}

Unexpected JsonReader::error(const std::string& path, const std::string& message) const {
  return fail(ErrorCode::kInvalidInput, "{}: {}: {}", source_, path, message);
}

Result<const nlohmann::json*> JsonReader::member(const nlohmann::json& object, const char* key,
                                                 const std::string& path) const {
  if (!object.is_object()) {
    return error(path, fmt::format("expected an object, got {}", json_type_name(object)));
  }
  auto it = object.find(key);
  if (it == object.end()) return error(path, fmt::format("missing key '{}'", key));
  return &*it;
}

Result<const nlohmann::json*> JsonReader::optional_member(const nlohmann::json& object,
                                                          const char* key,
                                                          const std::string& path) const {
  if (!object.is_object()) {
    return error(path, fmt::format("expected an object, got {}", json_type_name(object)));
  }
  auto it = object.find(key);
  if (it == object.end()) return static_cast<const nlohmann::json*>(nullptr);
  return &*it;
}

Result<std::string> JsonReader::as_string(const nlohmann::json& value,
                                          const std::string& path) const {
  if (!value.is_string()) {
    return error(path, fmt::format("expected a string, got {}", json_type_name(value)));
  }
  return value.get<std::string>();
}

Result<std::int64_t> JsonReader::as_integer(const nlohmann::json& value,
                                            const std::string& path) const {
  if (value.is_number_unsigned()) {
    const auto u = value.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      return error(path, fmt::format("integer {} is too large", u));
    }
    return static_cast<std::int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<std::int64_t>();
  return error(path, fmt::format("expected an integer, got {}", json_type_name(value)));
}

Result<double> JsonReader::as_number(const nlohmann::json& value, const std::string& path) const {
  if (!value.is_number()) {
    return error(path, fmt::format("expected a number, got {}", json_type_name(value)));
  }
  const double x = value.get<double>();
  if (!std::isfinite(x)) return error(path, "expected a finite number");
  return x;
}

Result<std::string> JsonReader::string(const nlohmann::json& object, const char* key,
                                       const std::string& path) const {
  OFFSIM_ASSIGN_OR_RETURN(const nlohmann::json* v, member(object, key, path));
  return as_string(*v, path + "." + key);
}

Result<std::int64_t> JsonReader::integer(const nlohmann::json& object, const char* key,
                                         const std::string& path) const {
  OFFSIM_ASSIGN_OR_RETURN(const nlohmann::json* v, member(object, key, path));
  return as_integer(*v, path + "." + key);
}

Result<double> JsonReader::number(const nlohmann::json& object, const char* key,
                                  const std::string& path) const {
  OFFSIM_ASSIGN_OR_RETURN(const nlohmann::json* v, member(object, key, path));
  return as_number(*v, path + "." + key);
}

Result<bool> JsonReader::boolean(const nlohmann::json& object, const char* key,
                                 const std::string& path) const {
  OFFSIM_ASSIGN_OR_RETURN(const nlohmann::json* v, member(object, key, path));
  if (!v->is_boolean()) {
    return error(path + "." + key,
                 fmt::format("expected true or false, got {}", json_type_name(*v)));
  }
  return v->get<bool>();
}

Result<const nlohmann::json*> JsonReader::array(const nlohmann::json& object, const char* key,
                                                const std::string& path) const {
  OFFSIM_ASSIGN_OR_RETURN(const nlohmann::json* v, member(object, key, path));
  if (!v->is_array()) {
    return error(path + "." + key, fmt::format("expected an array, got {}", json_type_name(*v)));
  }
  return v;
}

Result<const nlohmann::json*> JsonReader::object(const nlohmann::json& object, const char* key,
                                                 const std::string& path) const {
  OFFSIM_ASSIGN_OR_RETURN(const nlohmann::json* v, member(object, key, path));
  if (!v->is_object()) {
    return error(path + "." + key, fmt::format("expected an object, got {}", json_type_name(*v)));
  }
  return v;
}

Status JsonReader::only_keys(const nlohmann::json& object,
                             std::initializer_list<std::string_view> allowed,
                             const std::string& path) const {
  if (!object.is_object()) {
    return error(path, fmt::format("expected an object, got {}", json_type_name(object)));
  }
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool known = false;
    for (std::string_view a : allowed) known = known || it.key() == a;
    if (!known) {
      std::string list;
      for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      return error(path, fmt::format("unknown key '{}' (expected one of: {})",
                                     escape_for_message(it.key()), list));
    }
  }
  return ok();
}

namespace {

// One pass over the text, before and after nlohmann's parser: the nesting depth (so that hostile
// input cannot exhaust the parser's stack) and the first duplicate key of any object, with its
// line and JSON path (nlohmann keeps the last of duplicate keys silently).
struct ScanResult {
  bool too_deep = false;
  std::string duplicate_key;  // empty: none
  std::string duplicate_path;
  std::size_t duplicate_line = 0;
  std::size_t first_line = 0;
};

constexpr int kMaxJsonDepth = 256;

// Keys are views into the text (or into `decoded_` for keys with escapes); objects with few keys
// are searched linearly, larger ones through a hash map, so that the scan stays linear.
class JsonScanner {
 public:
  explicit JsonScanner(const std::string& text) : text_(text) {}

  ScanResult run() {
    for (std::size_t i = 0; i < text_.size(); ++i) {
      const char c = text_[i];
      if (c == '\n') {
        ++line_;
        continue;
      }
      if (c == '"') {
        const std::size_t begin = i;
        bool has_escape = false;
        i = skip_string(i, has_escape);
        if (!stack_.empty() && stack_.back().is_object && stack_.back().expect_key) {
          on_key(begin, i, has_escape);
        }
        continue;
      }
      if (!on_structural(c)) {
        out_.too_deep = true;
        return out_;
      }
    }
    return out_;
  }

 private:
  static constexpr std::size_t kLinearKeys = 16;

  struct Level {
    bool is_object = false;
    bool expect_key = false;
    std::string_view last_key;
    std::size_t index = 0;
    std::vector<std::pair<std::string_view, std::size_t>> keys;  // key, line
    std::unordered_map<std::string_view, std::size_t> many;
  };

  // From the opening quote at `i` to its closing quote (or the end of the text); counts lines.
  std::size_t skip_string(std::size_t i, bool& has_escape) {
    bool escaped = false;
    for (++i; i < text_.size(); ++i) {
      if (escaped) {
        escaped = false;
      } else if (text_[i] == '\\') {
        escaped = has_escape = true;
      } else if (text_[i] == '"') {
        break;
      } else if (text_[i] == '\n') {
        ++line_;
      }
    }
    return i;
  }

  // Records the key, on this line, in the object; returns the line of an earlier equal key.
  static std::optional<std::size_t> remember(Level& top, std::string_view key, std::size_t line) {
    std::optional<std::size_t> first;
    if (top.keys.size() < kLinearKeys) {
      for (const auto& [k, l] : top.keys) {
        if (k == key) first = l;
      }
      if (!first) top.keys.emplace_back(key, line);
      if (top.keys.size() == kLinearKeys && top.many.empty()) {
        for (const auto& [k, l] : top.keys) top.many.emplace(k, l);
      }
    } else {
      const auto [it, inserted] = top.many.emplace(key, line);
      if (!inserted) first = it->second;
    }
    return first;
  }

  // The key between the quotes at `begin` and `end`.
  void on_key(std::size_t begin, std::size_t end, bool has_escape) {
    Level& top = stack_.back();
    top.expect_key = false;
    std::string_view key(text_.data() + begin + 1, std::min(end, text_.size()) - begin - 1);
    if (has_escape) {
      // Decode escapes so that "a" and "\u0061" are the same key.
      const auto value = nlohmann::json::parse(text_.substr(begin, end - begin + 1), nullptr,
                                               /*allow_exceptions=*/false);
      if (value.is_string()) key = decoded_.emplace_back(value.get<std::string>());
    }
    const std::optional<std::size_t> first = remember(top, key, line_);
    if (first && out_.duplicate_key.empty()) {
      out_.duplicate_key = std::string(key);
      out_.duplicate_path = path();
      out_.duplicate_line = line_;
      out_.first_line = *first;
    }
    top.last_key = key;
  }

  // Brackets and commas; false when an opening bracket would exceed the depth limit.
  bool on_structural(char c) {
    if (c == '{' || c == '[') {
      if (static_cast<int>(stack_.size()) >= kMaxJsonDepth) return false;
      Level& next = stack_.emplace_back();
      next.is_object = c == '{';
      next.expect_key = next.is_object;
    } else if (c == '}' || c == ']') {
      if (!stack_.empty()) stack_.pop_back();
    } else if (c == ',' && !stack_.empty()) {
      if (stack_.back().is_object) {
        stack_.back().expect_key = true;
      } else {
        ++stack_.back().index;
      }
    }
    return true;
  }

  // The JSON path of the innermost container, built only for a message.
  std::string path() const {
    std::string path = "$";
    for (std::size_t d = 0; d + 1 < stack_.size(); ++d) {
      path += stack_[d].is_object ? fmt::format(".{}", stack_[d].last_key)
                                  : fmt::format("[{}]", stack_[d].index);
    }
    return path;
  }

  const std::string& text_;
  ScanResult out_;
  std::vector<Level> stack_;
  std::deque<std::string> decoded_;
  std::size_t line_ = 1;
};

ScanResult scan_json(const std::string& text) { return JsonScanner(text).run(); }

}  // namespace

std::string json_document_kind(const nlohmann::json& root) {
  if (!root.is_object()) return {};
  const auto format = root.find("format");
  const std::string f =
      format != root.end() && format->is_string() ? format->get<std::string>() : "";
  if (f == "offsim-plan") return "a Plan JSON (offsim run --plan-out)";
  if (f == "offsim-timeline") return "a Timeline JSON (offsim run --timeline-out, replay --out)";
  if (f == "offsim-profile") return "a calibration profile (offsim calibrate --out)";
  if (root.contains("traceEvents")) return "a Chrome/Perfetto trace (offsim run --trace)";
  if (root.contains("model_type") || root.contains("num_hidden_layers")) {
    return "a Hugging Face config.json";
  }
  if (root.contains("step_time_s") || root.contains("scenario")) return "an offsim report";
  return {};
}

Result<nlohmann::json> parse_json_text(const std::string& text, const std::string& source) {
  const ScanResult scan = scan_json(text);
  if (scan.too_deep) {
    return fail(ErrorCode::kInvalidInput, "{}: JSON nested deeper than {} levels", source,
                kMaxJsonDepth);
  }
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    // Re-parse with exceptions only to obtain the position for the message.
    try {
      const nlohmann::json reparsed = nlohmann::json::parse(text);
      (void)reparsed;
    } catch (const nlohmann::json::parse_error& e) {
      return fail(ErrorCode::kInvalidInput, "{}: not valid JSON at byte {}: {}", source, e.byte,
                  escape_for_message(e.what()));
    } catch (const nlohmann::json::exception& e) {
      // e.g. out_of_range 406: a number too large for a double.
      return fail(ErrorCode::kInvalidInput, "{}: not valid JSON: {}", source,
                  escape_for_message(e.what()));
    }
    return fail(ErrorCode::kInvalidInput, "{}: not valid JSON", source);
  }
  if (!scan.duplicate_key.empty()) {
    return fail(ErrorCode::kInvalidInput,
                "{}: line {}: {}: duplicate key '{}' (first on line {}); each key may appear "
                "only once",
                source, scan.duplicate_line, scan.duplicate_path,
                escape_for_message(scan.duplicate_key), scan.first_line);
  }
  return json;
}

}  // namespace offsim::sim
