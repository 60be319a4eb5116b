#include "sim/core/json_reader.h"

#include <cmath>
#include <limits>

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
      return error(path, fmt::format("unknown key '{}' (expected one of: {})", it.key(), list));
    }
  }
  return ok();
}

Result<nlohmann::json> parse_json_text(const std::string& text, const std::string& source) {
  // Depth-limited by nlohmann's recursive parser only through the input size; reject absurd
  // nesting first so hostile input cannot exhaust the stack.
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '[' || c == '{') {
      if (++depth > 256) {
        return fail(ErrorCode::kInvalidInput, "{}: JSON nested deeper than 256 levels", source);
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    // Re-parse with exceptions only to obtain the position for the message.
    try {
      const nlohmann::json reparsed = nlohmann::json::parse(text);
      (void)reparsed;
    } catch (const nlohmann::json::parse_error& e) {
      return fail(ErrorCode::kInvalidInput, "{}: not valid JSON at byte {}: {}", source, e.byte,
                  e.what());
    } catch (const nlohmann::json::exception& e) {
      // e.g. out_of_range 406: a number too large for a double.
      return fail(ErrorCode::kInvalidInput, "{}: not valid JSON: {}", source, e.what());
    }
    return fail(ErrorCode::kInvalidInput, "{}: not valid JSON", source);
  }
  return json;
}

}  // namespace offsim::sim
