// Document: a YAML/JSON tree that remembers where every node came from, with hard input limits.
//
// Scenario files are read into a Document before they are mapped onto models/ structs, so every
// error can say "file:line:col: key.path: expected ..., got ...". `--set key.path=value` edits
// the tree, and nodes it creates remember the override text as their origin.
//
//   auto doc = scenarios::parse_document(text, "llama.yaml");
//   if (!doc) return doc.error();
//   OFFSIM_RETURN_IF_ERROR(scenarios::apply_override(*doc, "training.micro_batch=2"));
//   const scenarios::Node* mb = scenarios::find_path(*doc, "training.micro_batch");
//   fmt::print("{}\n", scenarios::emit_yaml(*doc));
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sim/core/result.h"

namespace offsim::scenarios {

enum class NodeKind { kNull, kScalar, kSequence, kMap };
const char* to_string(NodeKind kind);

struct Node {
  // Out of line: `entries` holds pairs with Node, complete only after this definition.
  Node();
  Node(const Node&);
  Node(Node&&) noexcept;
  Node& operator=(const Node&);
  Node& operator=(Node&&) noexcept;
  ~Node();

  NodeKind kind = NodeKind::kNull;
  std::string scalar;       // kScalar: the text as written (without quotes)
  bool quoted = false;      // kScalar: written in quotes, so always a string
  std::vector<Node> items;  // kSequence
  std::vector<std::pair<std::string, Node>> entries;  // kMap, in file order, keys unique
  std::string origin;                                 // "file.yaml:3:7" (1-based) or "--set a.b=1"

  const Node* find(std::string_view key) const;
  Node* find(std::string_view key);
  // Short description for "got ...": `a map`, `a list`, `null`, `"abc"`, `12`.
  std::string describe() const;
};

// Limits on what a document may cost to read; exceeding one is a kLimitExceeded error.
struct DocumentLimits {
  std::int64_t max_bytes = 4 << 20;  // file size
  int max_depth = 64;                // nesting of maps and lists
  std::int64_t max_nodes = 200'000;  // nodes after alias expansion (alias bombs)
  std::int64_t max_aliases = 1'000;  // alias references
};

// Parses one YAML (or JSON) document. `source` names the input in messages. A document with
// duplicate keys, non-scalar keys, merge keys or several documents is an error.
sim::Result<Node> parse_document(std::string_view text, const std::string& source,
                                 const DocumentLimits& limits = {});

// Reads and parses a file; `.json` files are checked as strict JSON first for clearer messages.
sim::Result<Node> load_document_file(const std::string& path, const DocumentLimits& limits = {});

// Splits "a.b.0.c" into segments; empty segments are an error.
sim::Result<std::vector<std::string>> split_path(std::string_view path);

const Node* find_path(const Node& root, std::string_view path);

// Sets `path` to `value`, creating intermediate maps. A numeric segment indexes a list (which
// must already hold that index). Nodes created or replaced take `value`'s origin.
sim::Status set_path(Node& root, std::string_view path, Node value);

// Applies "key.path=value", where value is a YAML/JSON scalar or flow collection.
sim::Status apply_override(Node& root, std::string_view assignment);

// Block-style YAML; scalars quoted where they would otherwise change type.
std::string emit_yaml(const Node& node);
// Flow-style YAML on one line ("[1, 2]", "{a: 1}"), for sweep axis values.
std::string emit_flow(const Node& node);

// Typed scalar views. They return nullopt when the node is not that type.
std::optional<std::int64_t> scalar_int(const Node& node);
std::optional<double> scalar_double(const Node& node);
std::optional<bool> scalar_bool(const Node& node);
bool is_null_scalar(const Node& node);

// Convenience constructors.
Node make_scalar(std::string text, std::string origin = {}, bool quoted = false);
Node make_map(std::string origin = {});
Node make_sequence(std::string origin = {});

}  // namespace offsim::scenarios
