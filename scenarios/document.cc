#include "scenarios/document.h"

#include <algorithm>

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/exceptions.h>
#include <yaml-cpp/parser.h>

#include <charconv>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "sim/core/file_io.h"

namespace offsim::scenarios {
namespace {

using sim::ErrorCode;

std::string format_mark(const std::string& source, const YAML::Mark& mark) {
  if (mark.is_null()) return source;
  return fmt::format("{}:{}:{}", source, mark.line + 1, mark.column + 1);
}

// Thrown inside the event handler and caught in parse_document; never leaves this file.
// Offset of the first byte that is not part of well-formed UTF-8, or npos.
std::size_t first_invalid_utf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::size_t len = 0;
    std::uint32_t min = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      min = 0x10000;
    } else {
      return i;
    }
    if (i + len > text.size()) return i;
    std::uint32_t code = c & (0x7F >> len);
    for (std::size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(text[i + k]);
      if ((cc & 0xC0) != 0x80) return i;
      code = (code << 6) | (cc & 0x3F);
    }
    if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

struct BuildError {
  ErrorCode code;
  std::string message;
};

class TreeBuilder : public YAML::EventHandler {
 public:
  TreeBuilder(const std::string& source, const DocumentLimits& limits)
      : source_(source), limits_(limits) {}

  std::optional<Node>& root() { return root_; }
  int documents() const { return documents_; }

  void OnDocumentStart(const YAML::Mark&) override { ++documents_; }
  void OnDocumentEnd() override {}

  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    Node node;
    node.origin = format_mark(source_, mark);
    complete(std::move(node), anchor, 1, mark);
  }

  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    if (++aliases_ > limits_.max_aliases) {
      throw BuildError{ErrorCode::kLimitExceeded,
                       fmt::format("{}: more than {} alias references; refusing the document",
                                   format_mark(source_, mark), limits_.max_aliases)};
    }
    auto it = anchors_.find(anchor);
    if (it == anchors_.end()) {
      throw BuildError{ErrorCode::kInvalidInput,
                       fmt::format("{}: alias to an unknown anchor", format_mark(source_, mark))};
    }
    count_nodes(it->second.second, mark);
    complete(Node(it->second.first), 0, it->second.second, mark);
  }

  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    Node node;
    node.kind = NodeKind::kScalar;
    node.scalar = value;
    node.origin = format_mark(source_, mark);
    // Escapes such as "\xff" can decode to bytes that are not UTF-8; refuse them here so every
    // string downstream (names in reports, JSON output) is valid text.
    if (first_invalid_utf8(value) != std::string_view::npos) {
      throw BuildError{ErrorCode::kInvalidInput,
                       fmt::format("{}: the string decodes to bytes that are not UTF-8; expected "
                                   "UTF-8 text",
                                   node.origin)};
    }
    if (tag == "!" || tag == "tag:yaml.org,2002:str") {
      node.quoted = true;
    } else if (tag != "?") {
      throw BuildError{ErrorCode::kInvalidInput,
                       fmt::format("{}: YAML tag '{}' is not supported; write the plain value",
                                   node.origin, tag)};
    }
    count_nodes(1, mark);
    complete(std::move(node), anchor, 1, mark);
  }

  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(NodeKind::kSequence, mark, anchor);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(NodeKind::kMap, mark, anchor);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Frame {
    Node node;
    YAML::anchor_t anchor = 0;
    std::int64_t nodes_before = 0;  // total count when this collection opened
    std::optional<std::string> pending_key;
    YAML::Mark mark;
  };

  void count_nodes(std::int64_t n, const YAML::Mark& mark) {
    nodes_ += n;
    if (nodes_ > limits_.max_nodes) {
      throw BuildError{ErrorCode::kLimitExceeded,
                       fmt::format("{}: document expands to more than {} nodes (alias bomb or huge "
                                   "file); refusing it",
                                   format_mark(source_, mark), limits_.max_nodes)};
    }
  }

  void open(NodeKind kind, const YAML::Mark& mark, YAML::anchor_t anchor) {
    if (static_cast<int>(stack_.size()) >= limits_.max_depth) {
      throw BuildError{ErrorCode::kLimitExceeded,
                       fmt::format("{}: nesting deeper than {} levels; refusing the document",
                                   format_mark(source_, mark), limits_.max_depth)};
    }
    count_nodes(1, mark);
    Frame frame;
    frame.node.kind = kind;
    frame.node.origin = format_mark(source_, mark);
    frame.anchor = anchor;
    frame.nodes_before = nodes_ - 1;
    frame.mark = mark;
    stack_.push_back(std::move(frame));
  }

  void close() {
    Frame frame = std::move(stack_.back());
    stack_.pop_back();
    if (frame.pending_key) {
      throw BuildError{
          ErrorCode::kInvalidInput,
          fmt::format("{}: key '{}' has no value", frame.node.origin, *frame.pending_key)};
    }
    complete(std::move(frame.node), frame.anchor, nodes_ - frame.nodes_before, frame.mark);
  }

  void complete(Node node, YAML::anchor_t anchor, std::int64_t subtree_nodes,
                const YAML::Mark& mark) {
    if (anchor != 0) anchors_[anchor] = {node, subtree_nodes};
    if (stack_.empty()) {
      if (root_) {
        throw BuildError{ErrorCode::kInvalidInput,
                         fmt::format("{}: more than one document; expected exactly one",
                                     format_mark(source_, mark))};
      }
      root_ = std::move(node);
      return;
    }
    Frame& top = stack_.back();
    if (top.node.kind == NodeKind::kSequence) {
      top.node.items.push_back(std::move(node));
      return;
    }
    if (!top.pending_key) {
      if (node.kind != NodeKind::kScalar) {
        throw BuildError{
            ErrorCode::kInvalidInput,
            fmt::format("{}: expected a plain string key, got {}", node.origin, node.describe())};
      }
      if (node.scalar == "<<" && !node.quoted) {
        throw BuildError{ErrorCode::kInvalidInput,
                         fmt::format("{}: YAML merge keys ('<<') are not supported; write the "
                                     "keys out",
                                     node.origin)};
      }
      if (top.node.find(node.scalar) != nullptr) {
        throw BuildError{ErrorCode::kInvalidInput,
                         fmt::format("{}: duplicate key '{}' (first at {})", node.origin,
                                     node.scalar, top.node.find(node.scalar)->origin)};
      }
      top.pending_key = std::move(node.scalar);
      return;
    }
    top.node.entries.emplace_back(std::move(*top.pending_key), std::move(node));
    top.pending_key.reset();
  }

  const std::string& source_;
  const DocumentLimits& limits_;
  std::vector<Frame> stack_;
  std::optional<Node> root_;
  std::map<YAML::anchor_t, std::pair<Node, std::int64_t>> anchors_;
  std::int64_t nodes_ = 0;
  std::int64_t aliases_ = 0;
  int documents_ = 0;
};

bool looks_like_null(std::string_view s) {
  return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL";
}

bool looks_like_bool(std::string_view s) {
  return s == "true" || s == "True" || s == "TRUE" || s == "false" || s == "False" ||
         s == "FALSE" || s == "yes" || s == "no" || s == "on" || s == "off" || s == "Yes" ||
         s == "No" || s == "On" || s == "Off" || s == "YES" || s == "NO" || s == "ON" || s == "OFF";
}

bool looks_numeric(std::string_view s) {
  if (s.empty()) return false;
  if (s == ".inf" || s == "-.inf" || s == "+.inf" || s == ".nan" || s == ".NaN" || s == ".Inf")
    return true;
  const char c = s.front();
  return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.';
}

bool needs_quotes(std::string_view s) {
  if (looks_like_null(s) || looks_like_bool(s) || looks_numeric(s)) return true;
  if (s.front() == ' ' || s.back() == ' ') return true;
  static constexpr std::string_view kSpecialFirst = "-?:,[]{}#&*!|>'\"%@`";
  if (kSpecialFirst.find(s.front()) != std::string_view::npos) return true;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return true;
    if (c == '#' && i > 0 && s[i - 1] == ' ') return true;
    if (c == ':' && (i + 1 == s.size() || s[i + 1] == ' ')) return true;
    if (c == ',' || c == '[' || c == ']' || c == '{' || c == '}') return true;
  }
  return false;
}

// JSON string quoting; bytes that are not UTF-8 (from YAML escapes such as "\xff") print as
// U+FFFD instead of throwing.
std::string quote(std::string_view s) {
  return nlohmann::json(std::string(s))
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string emit_scalar(const Node& node) {
  if (node.kind == NodeKind::kNull) return "null";
  if (node.quoted || needs_quotes(node.scalar)) {
    if (!node.quoted && !looks_like_null(node.scalar) && (scalar_bool(node) || scalar_double(node)))
      return node.scalar;  // a real number or bool written plainly stays plain
    return quote(node.scalar);
  }
  return node.scalar;
}

std::string emit_key(const std::string& key) { return needs_quotes(key) ? quote(key) : key; }

bool is_simple(const Node& node) {
  if (node.kind == NodeKind::kNull || node.kind == NodeKind::kScalar) return true;
  if (node.kind == NodeKind::kSequence) {
    for (const Node& item : node.items)
      if (item.kind == NodeKind::kSequence || item.kind == NodeKind::kMap) return false;
    return true;
  }
  return node.entries.empty();
}

void emit_block(const Node& node, int indent, std::string& out) {
  const std::string pad(static_cast<std::size_t>(indent), ' ');
  if (node.kind == NodeKind::kMap) {
    for (const auto& [key, value] : node.entries) {
      out += pad + emit_key(key) + ":";
      if (is_simple(value)) {
        out += " " + emit_flow(value) + "\n";
      } else {
        out += "\n";
        emit_block(value, indent + 2, out);
      }
    }
    return;
  }
  if (node.kind == NodeKind::kSequence) {
    for (const Node& item : node.items) {
      if (is_simple(item)) {
        out += pad + "- " + emit_flow(item) + "\n";
      } else {
        std::string inner;
        emit_block(item, indent + 2, inner);
        // Put the first line of the item after the dash.
        out += pad + "- " + inner.substr(static_cast<std::size_t>(indent) + 2);
      }
    }
    return;
  }
  out += pad + emit_scalar(node) + "\n";
}

void set_origin(Node& node, const std::string& origin) {
  node.origin = origin;
  for (Node& item : node.items) set_origin(item, origin);
  for (auto& entry : node.entries) set_origin(entry.second, origin);
}

bool is_index(std::string_view s) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

}  // namespace

const char* to_string(NodeKind kind) {
  switch (kind) {
    case NodeKind::kNull:
      return "null";
    case NodeKind::kScalar:
      return "scalar";
    case NodeKind::kSequence:
      return "list";
    case NodeKind::kMap:
      return "map";
  }
  return "?";
}

Node::Node() = default;
Node::Node(const Node&) = default;
Node::Node(Node&&) noexcept = default;
Node& Node::operator=(const Node&) = default;
Node& Node::operator=(Node&&) noexcept = default;
Node::~Node() = default;

const Node* Node::find(std::string_view key) const {
  for (const auto& entry : entries)
    if (entry.first == key) return &entry.second;
  return nullptr;
}

Node* Node::find(std::string_view key) {
  for (auto& entry : entries)
    if (entry.first == key) return &entry.second;
  return nullptr;
}

std::string Node::describe() const {
  switch (kind) {
    case NodeKind::kNull:
      return "null";
    case NodeKind::kSequence:
      return fmt::format("a list of {}", items.size());
    case NodeKind::kMap:
      return "a map";
    case NodeKind::kScalar: {
      std::string shown = scalar.size() > 60 ? scalar.substr(0, 57) + "..." : scalar;
      if (quoted || !(scalar_double(*this) || scalar_bool(*this))) return quote(shown);
      return shown;
    }
  }
  return "?";
}

sim::Result<Node> parse_document(std::string_view text, const std::string& source,
                                 const DocumentLimits& limits) {
  if (static_cast<std::int64_t>(text.size()) > limits.max_bytes) {
    return sim::fail(ErrorCode::kLimitExceeded, "{}: {} bytes, more than the limit of {} bytes",
                     source, text.size(), limits.max_bytes);
  }
  if (const std::size_t bad = first_invalid_utf8(text); bad != std::string_view::npos) {
    const std::string_view before = text.substr(0, bad);
    const std::size_t line =
        static_cast<std::size_t>(std::count(before.begin(), before.end(), '\n'));
    const std::size_t line_start = before.rfind('\n');
    const std::size_t column = line_start == std::string_view::npos ? bad : bad - line_start - 1;
    return sim::fail(
        ErrorCode::kInvalidInput, "{}:{}:{}: byte 0x{:02x} is not valid UTF-8; expected UTF-8 text",
        source, line + 1, column + 1, static_cast<unsigned>(static_cast<unsigned char>(text[bad])));
  }
  std::istringstream stream{std::string(text)};
  TreeBuilder builder(source, limits);
  try {
    YAML::Parser parser(stream);
    while (parser.HandleNextDocument(builder)) {
      if (builder.documents() > 1) {
        return sim::fail(ErrorCode::kInvalidInput,
                         "{}: more than one YAML document ('---'); expected exactly one", source);
      }
    }
  } catch (const BuildError& e) {
    return sim::fail(e.code, "{}", e.message);
  } catch (const YAML::DeepRecursion& e) {
    return sim::fail(ErrorCode::kLimitExceeded, "{}: nesting too deep: {}",
                     format_mark(source, e.mark), e.msg);
  } catch (const YAML::Exception& e) {
    return sim::fail(ErrorCode::kInvalidInput, "{}: YAML syntax error: {}",
                     format_mark(source, e.mark), e.msg);
  }
  if (!builder.root()) {
    Node empty;
    empty.origin = source;
    return empty;
  }
  return std::move(*builder.root());
}

sim::Result<Node> load_document_file(const std::string& path, const DocumentLimits& limits) {
  OFFSIM_ASSIGN_OR_RETURN(
      std::string text,
      sim::read_input_file(path, sim::InputKind{sim::kScenarioInput.what, limits.max_bytes}));
  const bool is_json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  if (is_json) {
    try {
      // accept() builds no tree; parse() runs only to get the message of a failure.
      if (!nlohmann::json::accept(text)) nlohmann::json::parse(text).is_null();
    } catch (const nlohmann::json::parse_error& e) {
      // nlohmann reports "... at line L, column C: ..."; keep its text after the prefix.
      std::string what = e.what();
      const auto pos = what.find("] ");
      if (pos != std::string::npos) what = what.substr(pos + 2);
      return sim::fail(ErrorCode::kInvalidInput, "{}: JSON syntax error: {}", path, what);
    }
  }
  return parse_document(text, path, limits);
}

sim::Result<std::vector<std::string>> split_path(std::string_view path) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    const std::string_view part =
        path.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (part.empty()) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "key path '{}': expected dot-separated names like 'training.micro_batch'",
                       path);
    }
    parts.emplace_back(part);
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return parts;
}

const Node* find_path(const Node& root, std::string_view path) {
  auto parts = split_path(path);
  if (!parts) return nullptr;
  const Node* node = &root;
  for (const std::string& part : *parts) {
    if (node->kind == NodeKind::kMap) {
      node = node->find(part);
    } else if (node->kind == NodeKind::kSequence && is_index(part)) {
      const std::size_t i = std::stoul(part);
      node = i < node->items.size() ? &node->items[i] : nullptr;
    } else {
      return nullptr;
    }
    if (node == nullptr) return nullptr;
  }
  return node;
}

sim::Status set_path(Node& root, std::string_view path, Node value) {
  OFFSIM_ASSIGN_OR_RETURN(std::vector<std::string> parts, split_path(path));
  Node* node = &root;
  std::string walked;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    if (node->kind == NodeKind::kNull) {
      node->kind = NodeKind::kMap;
      node->origin = value.origin;
    }
    if (node->kind == NodeKind::kSequence) {
      if (!is_index(part) || std::stoul(part) >= node->items.size()) {
        return sim::fail(ErrorCode::kInvalidInput,
                         "{}: {}: '{}' is a list of {}; expected an index below {}, got '{}'",
                         value.origin, path, walked, node->items.size(), node->items.size(), part);
      }
      node = &node->items[std::stoul(part)];
    } else if (node->kind == NodeKind::kMap) {
      Node* child = node->find(part);
      if (child == nullptr) {
        Node created;
        created.origin = value.origin;
        node->entries.emplace_back(part, std::move(created));
        child = &node->entries.back().second;
      }
      node = child;
    } else {
      return sim::fail(ErrorCode::kInvalidInput, "{}: {}: '{}' is {}, expected a map to hold '{}'",
                       value.origin, path, walked, node->describe(), part);
    }
    walked += (walked.empty() ? "" : ".") + part;
  }
  if (!parts.empty()) *node = std::move(value);
  return sim::ok();
}

sim::Status apply_override(Node& root, std::string_view assignment) {
  const std::string origin = fmt::format("--set {}", assignment);
  const std::size_t eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    return sim::fail(ErrorCode::kInvalidInput, "{}: expected key.path=value", origin);
  }
  const std::string_view key = assignment.substr(0, eq);
  const std::string_view text = assignment.substr(eq + 1);
  if (text.empty()) {
    return sim::fail(ErrorCode::kInvalidInput, "{}: expected a value after '='", origin);
  }
  DocumentLimits limits;
  limits.max_bytes = 1 << 16;
  OFFSIM_ASSIGN_OR_RETURN(Node value, parse_document(text, origin, limits));
  set_origin(value, origin);
  return set_path(root, key, std::move(value));
}

std::string emit_yaml(const Node& node) {
  std::string out;
  emit_block(node, 0, out);
  return out;
}

std::string emit_flow(const Node& node) {
  switch (node.kind) {
    case NodeKind::kNull:
    case NodeKind::kScalar:
      return emit_scalar(node);
    case NodeKind::kSequence: {
      std::string out = "[";
      for (std::size_t i = 0; i < node.items.size(); ++i)
        out += (i ? ", " : "") + emit_flow(node.items[i]);
      return out + "]";
    }
    case NodeKind::kMap: {
      std::string out = "{";
      for (std::size_t i = 0; i < node.entries.size(); ++i)
        out += (i ? ", " : "") + emit_key(node.entries[i].first) + ": " +
               emit_flow(node.entries[i].second);
      return out + "}";
    }
  }
  return {};
}

std::optional<std::int64_t> scalar_int(const Node& node) {
  if (node.kind != NodeKind::kScalar || node.quoted) return std::nullopt;
  std::string_view s = node.scalar;
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  std::int64_t value = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec == std::errc() && ptr == s.data() + s.size() && !s.empty()) return value;
  // Integral values written in exponent form ("1e6") are integers too.
  const auto d = scalar_double(node);
  if (d && std::floor(*d) == *d && std::fabs(*d) < 9.0e18) return static_cast<std::int64_t>(*d);
  return std::nullopt;
}

std::optional<double> scalar_double(const Node& node) {
  if (node.kind != NodeKind::kScalar || node.quoted) return std::nullopt;
  std::string_view s = node.scalar;
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return std::nullopt;
  double value = 0.0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<bool> scalar_bool(const Node& node) {
  if (node.kind != NodeKind::kScalar || node.quoted) return std::nullopt;
  const std::string& s = node.scalar;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  return std::nullopt;
}

bool is_null_scalar(const Node& node) {
  return node.kind == NodeKind::kNull ||
         (node.kind == NodeKind::kScalar && !node.quoted && looks_like_null(node.scalar));
}

Node make_scalar(std::string text, std::string origin, bool quoted) {
  Node node;
  node.kind = NodeKind::kScalar;
  node.scalar = std::move(text);
  node.quoted = quoted;
  node.origin = std::move(origin);
  return node;
}

Node make_map(std::string origin) {
  Node node;
  node.kind = NodeKind::kMap;
  node.origin = std::move(origin);
  return node;
}

Node make_sequence(std::string origin) {
  Node node;
  node.kind = NodeKind::kSequence;
  node.origin = std::move(origin);
  return node;
}

}  // namespace offsim::scenarios
