// Strict reading of JSON documents with errors that name the source and the JSON path.
//
//   sim::JsonReader r("plan.json");
//   OFFSIM_ASSIGN_OR_RETURN(const nlohmann::json* ops, r.array(root, "ops", "$"));
//   OFFSIM_ASSIGN_OR_RETURN(std::int64_t bytes, r.integer(tensor, "bytes", "$.tensors[3]"));
//   OFFSIM_RETURN_IF_ERROR(r.only_keys(tensor, {"name", "pool", "bytes"}, "$.tensors[3]"));
//   OFFSIM_ASSIGN_OR_RETURN(std::optional<PoolKind> kind,
//                           r.optional_enum(pool, "kind", "$.pools[0]", pool_kind_from_string,
//                                           "pool kind", " (expected other, hbm or pinned_host)"));
//   // errors read: "plan.json: $.tensors[3].bytes: expected an integer, got string"
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sim/core/result.h"

namespace offsim::sim {

class JsonReader {
 public:
  explicit JsonReader(std::string source) : source_(std::move(source)) {}

  const std::string& source() const { return source_; }

  // An error "source: path: message".
  Unexpected error(const std::string& path, const std::string& message) const;

  Result<const nlohmann::json*> member(const nlohmann::json& object, const char* key,
                                       const std::string& path) const;
  // nullptr when the key is absent (optional members).
  Result<const nlohmann::json*> optional_member(const nlohmann::json& object, const char* key,
                                                const std::string& path) const;
  Result<std::string> string(const nlohmann::json& object, const char* key,
                             const std::string& path) const;
  Result<std::int64_t> integer(const nlohmann::json& object, const char* key,
                               const std::string& path) const;
  Result<double> number(const nlohmann::json& object, const char* key,
                        const std::string& path) const;
  Result<bool> boolean(const nlohmann::json& object, const char* key,
                       const std::string& path) const;
  Result<const nlohmann::json*> array(const nlohmann::json& object, const char* key,
                                      const std::string& path) const;
  Result<const nlohmann::json*> object(const nlohmann::json& object, const char* key,
                                       const std::string& path) const;

  Result<std::int64_t> as_integer(const nlohmann::json& value, const std::string& path) const;
  Result<double> as_number(const nlohmann::json& value, const std::string& path) const;
  Result<std::string> as_string(const nlohmann::json& value, const std::string& path) const;

  // The optional member `key` of `object`, an enum given by its name: nothing when the key is
  // absent; "unknown <what> '<name>'<expected>" at path.key when from_string does not know it.
  template <class E>
  Result<std::optional<E>> optional_enum(const nlohmann::json& object, const char* key,
                                         const std::string& path,
                                         std::optional<E> (*from_string)(std::string_view),
                                         std::string_view what,
                                         std::string_view expected = {}) const {
    OFFSIM_ASSIGN_OR_RETURN(const nlohmann::json* member, optional_member(object, key, path));
    if (member == nullptr) return std::optional<E>{};
    const std::string at = path + "." + key;
    OFFSIM_ASSIGN_OR_RETURN(std::string name, as_string(*member, at));
    std::optional<E> parsed = from_string(name);
    if (!parsed) return error(at, fmt::format("unknown {} '{}'{}", what, name, expected));
    return parsed;
  }

  // Rejects keys outside `allowed` (catches typos instead of ignoring them).
  Status only_keys(const nlohmann::json& object, std::initializer_list<std::string_view> allowed,
                   const std::string& path) const;

 private:
  std::string source_;
};

const char* json_type_name(const nlohmann::json& value);

// What an offsim JSON document is, from its "format" key or its shape, for messages that say
// which file was given where another was expected: "a Plan JSON (offsim run --plan-out)",
// "a Chrome/Perfetto trace (offsim run --trace)", ...; "" when it is none of offsim's formats.
std::string json_document_kind(const nlohmann::json& root);

// Parses text strictly: on a syntax error names the source and byte offset; a duplicate key of
// any object is an error naming the key, its line and the JSON path of the object.
Result<nlohmann::json> parse_json_text(const std::string& text, const std::string& source);

}  // namespace offsim::sim
