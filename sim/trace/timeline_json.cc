#include "sim/trace/timeline_json.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "sim/core/file_io.h"
#include "sim/core/json_reader.h"
#include "sim/trace/memory_ledger.h"

namespace offsim::sim {

using nlohmann::json;

namespace {

constexpr const char* kTimelineFormat = "offsim-timeline";

json live_to_json(const std::vector<LiveTensor>& live) {
  json j = json::array();
  for (const LiveTensor& t : live) {
    j.push_back({{"name", t.name}, {"category", to_string(t.category)}, {"bytes", t.bytes}});
  }
  return j;
}

std::int64_t ns(TimePoint t) { return t.time_since_epoch().count(); }
TimePoint at_ns(std::int64_t value) { return TimePoint{Duration{value}}; }

}  // namespace

json timeline_to_json(const Timeline& timeline) {
  json j;
  j["format"] = kTimelineFormat;
  j["format_version"] = kTimelineFormatVersion;
  j["source"] = timeline.source;
  json meta = json::array();
  for (const auto& [k, v] : timeline.metadata) meta.push_back(json::array({k, v}));
  j["metadata"] = std::move(meta);
  j["lanes"] = timeline.lanes;
  if (!timeline.lane_identity.empty()) {
    json ids = json::array();
    for (const LaneIdentity& l : timeline.lane_identity) {
      ids.push_back({{"rank", l.rank}, {"stage", l.stage}, {"role", to_string(l.role)}});
    }
    j["lane_identity"] = std::move(ids);
  }
  json ops = json::array();
  for (const OpInfo& op : timeline.ops) {
    json o = {
        {"name", op.name},   {"kind", to_string(op.kind)}, {"category", to_string(op.category)},
        {"layer", op.layer}, {"flops", op.flops},          {"bytes", op.bytes}};
    if (!op.deps.empty()) {
      json deps = json::array();
      for (OpId d : op.deps) deps.push_back(d.value());
      o["deps"] = std::move(deps);
    }
    ops.push_back(std::move(o));
  }
  j["ops"] = std::move(ops);
  json spans = json::array();
  for (const Span& s : timeline.spans) {
    spans.push_back({{"op", s.op.value()},
                     {"lane", s.lane.value()},
                     {"start_ns", ns(s.start)},
                     {"end_ns", ns(s.end)}});
  }
  j["spans"] = std::move(spans);
  json pools = json::array();
  for (const PoolTrace& p : timeline.pools) {
    json samples = json::array();
    for (const MemorySample& m : p.samples)
      samples.push_back(json::array({ns(m.time), m.bytes_in_use}));
    json o = {{"name", p.name},
              {"capacity_bytes", p.capacity_bytes},
              {"samples", std::move(samples)},
              {"peak_bytes", p.peak_bytes},
              {"peak_time_ns", ns(p.peak_time)},
              {"live_at_peak", live_to_json(p.live_at_peak)}};
    if (p.kind != PoolKind::kOther || p.owner >= 0) {
      o["kind"] = to_string(p.kind);
      o["owner"] = p.owner;
    }
    pools.push_back(std::move(o));
  }
  j["pools"] = std::move(pools);
  if (!timeline.tensors.empty()) {
    json tensors = json::array();
    for (const TensorInfo& t : timeline.tensors) {
      tensors.push_back({{"name", t.name},
                         {"category", to_string(t.category)},
                         {"bytes", t.bytes},
                         {"pool", t.pool.value()}});
    }
    j["tensors"] = std::move(tensors);
  }
  if (!timeline.memory_events.empty()) {
    json events = json::array();
    for (const MemoryEvent& e : timeline.memory_events) {
      events.push_back(json::array({ns(e.time), e.tensor.value(), e.delta_bytes}));
    }
    j["memory_events"] = std::move(events);
  }
  j["makespan_ns"] = ns(timeline.makespan);
  const Outcome& o = timeline.outcome;
  json outcome = {{"kind", to_string(o.kind)}, {"message", o.message}};
  if (o.oom) {
    const OutOfMemory& m = *o.oom;
    outcome["oom"] = {
        {"op", m.op.valid() ? static_cast<std::int64_t>(m.op.value()) : -1},
        {"op_name", m.op_name},
        {"pool", m.pool},
        {"pool_kind", to_string(m.pool_kind)},
        {"pool_id", m.pool_id.valid() ? static_cast<std::int64_t>(m.pool_id.value()) : -1},
        {"time_ns", ns(m.time)},
        {"requested_bytes", m.requested_bytes},
        {"in_use_bytes", m.in_use_bytes},
        {"capacity_bytes", m.capacity_bytes},
        {"live", live_to_json(m.live)}};
  }
  if (o.deadlock) {
    outcome["deadlock"] = {{"time_ns", ns(o.deadlock->time)}, {"stuck_ops", o.deadlock->stuck_ops}};
  }
  j["outcome"] = std::move(outcome);
  return j;
}

namespace {

std::optional<OutcomeKind> outcome_kind_from_string(std::string_view name) {
  for (OutcomeKind k : {OutcomeKind::kCompleted, OutcomeKind::kOutOfMemory, OutcomeKind::kDeadlock,
                        OutcomeKind::kLimitExceeded}) {
    if (name == to_string(k)) return k;
  }
  return std::nullopt;
}

class TimelineParser {
 public:
  explicit TimelineParser(const std::string& source) : r_(source) {}

  Result<Timeline> parse(const json& root) {
    // Another of offsim's files given where a timeline is expected: say which.
    const std::string kind = json_document_kind(root);
    if (!kind.empty() && kind.rfind("a Timeline JSON", 0) != 0) {
      return r_.error("$", fmt::format("this is {}, expected a Timeline JSON (write one with "
                                       "offsim run --timeline-out or replay --out)",
                                       kind));
    }
    OFFSIM_RETURN_IF_ERROR(r_.only_keys(
        root,
        {"format", "format_version", "source", "metadata", "lanes", "lane_identity", "ops", "spans",
         "pools", "tensors", "memory_events", "makespan_ns", "outcome"},
        "$"));
    OFFSIM_ASSIGN_OR_RETURN(std::string format, r_.string(root, "format", "$"));
    if (format != kTimelineFormat) {
      return r_.error("$.format",
                      fmt::format("expected \"{}\", got \"{}\"", kTimelineFormat, format));
    }
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t version, r_.integer(root, "format_version", "$"));
    if (version != kTimelineFormatVersion) {
      return r_.error("$.format_version", fmt::format("this offsim reads version {}, got {}",
                                                      kTimelineFormatVersion, version));
    }
    OFFSIM_ASSIGN_OR_RETURN(t_.source, r_.string(root, "source", "$"));
    OFFSIM_RETURN_IF_ERROR(parse_metadata(root));
    OFFSIM_RETURN_IF_ERROR(parse_lanes(root));
    OFFSIM_RETURN_IF_ERROR(parse_lane_identity(root));
    OFFSIM_RETURN_IF_ERROR(parse_ops(root));
    OFFSIM_RETURN_IF_ERROR(parse_spans(root));
    OFFSIM_RETURN_IF_ERROR(parse_pools(root));
    OFFSIM_RETURN_IF_ERROR(parse_tensors(root));
    OFFSIM_RETURN_IF_ERROR(parse_memory_events(root));
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t makespan, r_.integer(root, "makespan_ns", "$"));
    if (makespan < 0) {
      return r_.error("$.makespan_ns", fmt::format("expected a time >= 0 ns, got {}", makespan));
    }
    // The makespan is the end of the step: every span ends by then.
    for (std::size_t i = 0; i < t_.spans.size(); ++i) {
      if (t_.spans[i].end > at_ns(makespan)) {
        return r_.error("$.makespan_ns",
                        fmt::format("makespan {} ns precedes the end of $.spans[{}] ({} ns); "
                                    "expected the makespan to be at or after every span's end",
                                    makespan, i, ns(t_.spans[i].end)));
      }
    }
    t_.makespan = at_ns(makespan);
    OFFSIM_RETURN_IF_ERROR(parse_outcome(root));
    return std::move(t_);
  }

 private:
  Status parse_metadata(const json& root) {
    OFFSIM_ASSIGN_OR_RETURN(const json* meta, r_.array(root, "metadata", "$"));
    for (std::size_t i = 0; i < meta->size(); ++i) {
      const json& kv = (*meta)[i];
      if (!kv.is_array() || kv.size() != 2 || !kv[0].is_string() || !kv[1].is_string()) {
        return r_.error(fmt::format("$.metadata[{}]", i), "expected [key, value] strings");
      }
      t_.metadata.emplace_back(kv[0].get<std::string>(), kv[1].get<std::string>());
    }
    return ok();
  }

  Status parse_lanes(const json& root) {
    OFFSIM_ASSIGN_OR_RETURN(const json* lanes, r_.array(root, "lanes", "$"));
    for (std::size_t i = 0; i < lanes->size(); ++i) {
      OFFSIM_ASSIGN_OR_RETURN(std::string name,
                              r_.as_string((*lanes)[i], fmt::format("$.lanes[{}]", i)));
      t_.lanes.push_back(std::move(name));
    }
    return ok();
  }

  Status parse_ops(const json& root) {
    OFFSIM_ASSIGN_OR_RETURN(const json* ops, r_.array(root, "ops", "$"));
    t_.ops.reserve(ops->size());
    for (std::size_t i = 0; i < ops->size(); ++i) {
      const std::string path = fmt::format("$.ops[{}]", i);
      const json& o = (*ops)[i];
      OFFSIM_RETURN_IF_ERROR(
          r_.only_keys(o, {"name", "kind", "category", "layer", "flops", "bytes", "deps"}, path));
      OpInfo info;
      OFFSIM_ASSIGN_OR_RETURN(info.name, r_.string(o, "name", path));
      OFFSIM_ASSIGN_OR_RETURN(std::string kind, r_.string(o, "kind", path));
      std::optional<OpKind> k = op_kind_from_string(kind);
      if (!k) return r_.error(path + ".kind", fmt::format("unknown op kind \"{}\"", kind));
      info.kind = *k;
      OFFSIM_ASSIGN_OR_RETURN(info.category, op_category(o, path));
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t layer, r_.integer(o, "layer", path));
      if (layer < -1 || layer > std::numeric_limits<int>::max()) {
        return r_.error(path + ".layer",
                        fmt::format("expected -1 or a layer index, got {}", layer));
      }
      info.layer = static_cast<int>(layer);
      OFFSIM_ASSIGN_OR_RETURN(info.flops, r_.number(o, "flops", path));
      if (info.flops < 0.0) {
        return r_.error(path + ".flops", fmt::format("expected a count >= 0, got {}", info.flops));
      }
      OFFSIM_ASSIGN_OR_RETURN(info.bytes, r_.integer(o, "bytes", path));
      if (info.bytes < 0) {
        return r_.error(path + ".bytes", fmt::format("expected a count >= 0, got {}", info.bytes));
      }
      OFFSIM_ASSIGN_OR_RETURN(const json* deps, r_.optional_member(o, "deps", path));
      if (deps) {
        if (!deps->is_array()) return r_.error(path + ".deps", "expected an array of op indices");
        for (std::size_t k = 0; k < deps->size(); ++k) {
          const std::string dp = fmt::format("{}.deps[{}]", path, k);
          OFFSIM_ASSIGN_OR_RETURN(std::int64_t d, r_.as_integer((*deps)[k], dp));
          if (d < 0 || d >= static_cast<std::int64_t>(ops->size())) {
            return r_.error(dp, fmt::format("op index {} is out of range (the timeline has {} ops)",
                                            d, ops->size()));
          }
          info.deps.push_back(OpId{static_cast<std::size_t>(d)});
        }
      }
      t_.ops.push_back(std::move(info));
    }
    return ok();
  }

  // Optional: [{"rank", "stage", "role"}, ...], one per lane.
  Status parse_lane_identity(const json& root) {
    OFFSIM_ASSIGN_OR_RETURN(const json* list, r_.optional_member(root, "lane_identity", "$"));
    if (!list) return ok();
    if (!list->is_array() || list->size() != t_.lanes.size()) {
      return r_.error(
          "$.lane_identity",
          fmt::format("expected an array with one entry per lane ({})", t_.lanes.size()));
    }
    for (std::size_t i = 0; i < list->size(); ++i) {
      const std::string path = fmt::format("$.lane_identity[{}]", i);
      const json& item = (*list)[i];
      OFFSIM_RETURN_IF_ERROR(r_.only_keys(item, {"rank", "stage", "role"}, path));
      LaneIdentity id;
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t rank, r_.integer(item, "rank", path));
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t stage, r_.integer(item, "stage", path));
      if (rank < -1 || rank > (1 << 24)) return r_.error(path + ".rank", "out of range");
      if (stage < -1 || stage > (1 << 24)) return r_.error(path + ".stage", "out of range");
      id.rank = static_cast<int>(rank);
      id.stage = static_cast<int>(stage);
      OFFSIM_ASSIGN_OR_RETURN(std::string role, r_.string(item, "role", path));
      auto parsed = lane_role_from_string(role);
      if (!parsed) return r_.error(path + ".role", fmt::format("unknown lane role '{}'", role));
      id.role = *parsed;
      t_.lane_identity.push_back(id);
    }
    return ok();
  }

  Result<std::uint32_t> index(const json& o, const char* key, const std::string& path,
                              std::size_t size, const char* what) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, r_.integer(o, key, path));
    if (v < 0 || static_cast<std::size_t>(v) >= size) {
      return r_.error(path + "." + key,
                      fmt::format("{} index {} is out of range (the timeline has {} {}s)", what, v,
                                  size, what));
    }
    return static_cast<std::uint32_t>(v);
  }

  Status parse_spans(const json& root) {
    OFFSIM_ASSIGN_OR_RETURN(const json* spans, r_.array(root, "spans", "$"));
    t_.spans.reserve(spans->size());
    for (std::size_t i = 0; i < spans->size(); ++i) {
      const std::string path = fmt::format("$.spans[{}]", i);
      const json& s = (*spans)[i];
      OFFSIM_RETURN_IF_ERROR(r_.only_keys(s, {"op", "lane", "start_ns", "end_ns"}, path));
      Span span;
      OFFSIM_ASSIGN_OR_RETURN(std::uint32_t op, index(s, "op", path, t_.ops.size(), "op"));
      OFFSIM_ASSIGN_OR_RETURN(std::uint32_t lane, index(s, "lane", path, t_.lanes.size(), "lane"));
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t start, r_.integer(s, "start_ns", path));
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t end, r_.integer(s, "end_ns", path));
      if (start < 0) {
        return r_.error(path + ".start_ns", fmt::format("expected a time >= 0 ns, got {}", start));
      }
      if (end < start) {
        return r_.error(path + ".end_ns",
                        fmt::format("end {} ns is before start {} ns", end, start));
      }
      span.op = OpId{op};
      span.lane = LaneId{lane};
      span.start = at_ns(start);
      span.end = at_ns(end);
      t_.spans.push_back(span);
    }
    return ok();
  }

  // The "category" key of an op (OpCategory's names).
  Result<OpCategory> op_category(const json& o, const std::string& path) {
    OFFSIM_ASSIGN_OR_RETURN(std::string name, r_.string(o, "category", path));
    std::optional<OpCategory> c = op_category_from_string(name);
    if (!c) {
      return r_.error(path + ".category",
                      fmt::format("unknown op category \"{}\" (expected one of {})", name,
                                  op_category_names()));
    }
    return *c;
  }

  // The "category" key of a tensor (TensorCategory's names).
  Result<TensorCategory> tensor_category(const json& o, const std::string& path) {
    OFFSIM_ASSIGN_OR_RETURN(std::string name, r_.string(o, "category", path));
    std::optional<TensorCategory> c = tensor_category_from_string(name);
    if (!c) {
      return r_.error(path + ".category",
                      fmt::format("unknown tensor category \"{}\" (expected one of {})", name,
                                  tensor_category_names()));
    }
    return *c;
  }

  // Optional: [{"name", "category", "bytes", "pool"}, ...], by tensor id.
  Status parse_tensors(const json& root) {
    OFFSIM_ASSIGN_OR_RETURN(const json* tensors, r_.optional_member(root, "tensors", "$"));
    if (tensors == nullptr) return ok();
    if (!tensors->is_array()) {
      return r_.error("$.tensors", fmt::format("expected an array of tensors, got {}",
                                               json_type_name(*tensors)));
    }
    t_.tensors.reserve(tensors->size());
    for (std::size_t i = 0; i < tensors->size(); ++i) {
      const std::string path = fmt::format("$.tensors[{}]", i);
      const json& o = (*tensors)[i];
      OFFSIM_RETURN_IF_ERROR(r_.only_keys(o, {"name", "category", "bytes", "pool"}, path));
      TensorInfo info;
      OFFSIM_ASSIGN_OR_RETURN(info.name, r_.string(o, "name", path));
      OFFSIM_ASSIGN_OR_RETURN(info.category, tensor_category(o, path));
      OFFSIM_ASSIGN_OR_RETURN(info.bytes, r_.integer(o, "bytes", path));
      if (info.bytes < 0) {
        return r_.error(path + ".bytes",
                        fmt::format("expected a byte count >= 0, got {}", info.bytes));
      }
      OFFSIM_ASSIGN_OR_RETURN(std::uint32_t pool, index(o, "pool", path, t_.pools.size(), "pool"));
      info.pool = PoolId{pool};
      t_.tensors.push_back(std::move(info));
    }
    return ok();
  }

  // Optional: [[time_ns, tensor, delta_bytes], ...] in applied order; the pool is the tensor's.
  // Checked by replaying them: each alloc of a tensor that is not live and each free of one that
  // is, +bytes or -bytes of that tensor, times in order.
  Status parse_memory_events(const json& root) {
    OFFSIM_ASSIGN_OR_RETURN(const json* events, r_.optional_member(root, "memory_events", "$"));
    if (events == nullptr) return ok();
    if (!events->is_array()) {
      return r_.error("$.memory_events",
                      fmt::format("expected an array of events, got {}", json_type_name(*events)));
    }
    t_.memory_events.reserve(events->size());
    for (std::size_t k = 0; k < events->size(); ++k) {
      const std::string path = fmt::format("$.memory_events[{}]", k);
      const json& e = (*events)[k];
      if (!e.is_array() || e.size() != 3) {
        return r_.error(path, "expected [time_ns, tensor, delta_bytes]");
      }
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t time, r_.as_integer(e[0], path + "[0]"));
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t tensor, r_.as_integer(e[1], path + "[1]"));
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t delta, r_.as_integer(e[2], path + "[2]"));
      if (time < 0) {
        return r_.error(path + "[0]", fmt::format("expected a time >= 0 ns, got {}", time));
      }
      if (tensor < 0 || static_cast<std::size_t>(tensor) >= t_.tensors.size()) {
        return r_.error(path + "[1]",
                        fmt::format("tensor index {} is out of range (the timeline has {} "
                                    "tensors in $.tensors)",
                                    tensor, t_.tensors.size()));
      }
      const TensorInfo& info = t_.tensors[static_cast<std::size_t>(tensor)];
      t_.memory_events.push_back(
          MemoryEvent{at_ns(time), TensorId{static_cast<std::size_t>(tensor)}, delta, info.pool});
    }
    // The ledger's checks (order, sizes, allocs and frees of live tensors) name the event.
    if (std::optional<MemoryEventProblem> bad = check_memory_events(t_)) {
      return r_.error(fmt::format("$.memory_events[{}]", bad->index), bad->message);
    }
    return ok();
  }

  Result<std::vector<LiveTensor>> parse_live(const json& list, const std::string& path) {
    std::vector<LiveTensor> live;
    if (!list.is_array()) {
      return r_.error(path, fmt::format("expected an array, got {}", json_type_name(list)));
    }
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string p = fmt::format("{}[{}]", path, i);
      OFFSIM_RETURN_IF_ERROR(r_.only_keys(list[i], {"name", "category", "bytes"}, p));
      LiveTensor t;
      OFFSIM_ASSIGN_OR_RETURN(t.name, r_.string(list[i], "name", p));
      OFFSIM_ASSIGN_OR_RETURN(t.category, tensor_category(list[i], p));
      OFFSIM_ASSIGN_OR_RETURN(t.bytes, r_.integer(list[i], "bytes", p));
      live.push_back(std::move(t));
    }
    return live;
  }

  Status parse_pools(const json& root) {
    OFFSIM_ASSIGN_OR_RETURN(const json* pools, r_.array(root, "pools", "$"));
    for (std::size_t i = 0; i < pools->size(); ++i) {
      const std::string path = fmt::format("$.pools[{}]", i);
      const json& p = (*pools)[i];
      OFFSIM_RETURN_IF_ERROR(r_.only_keys(p,
                                          {"name", "capacity_bytes", "samples", "peak_bytes",
                                           "peak_time_ns", "live_at_peak", "kind", "owner"},
                                          path));
      PoolTrace pool;
      OFFSIM_ASSIGN_OR_RETURN(pool.name, r_.string(p, "name", path));
      OFFSIM_ASSIGN_OR_RETURN(
          std::optional<PoolKind> kind,
          r_.optional_enum(p, "kind", path, pool_kind_from_string, "pool kind"));
      if (kind) pool.kind = *kind;
      OFFSIM_ASSIGN_OR_RETURN(const json* owner, r_.optional_member(p, "owner", path));
      if (owner) {
        OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, r_.as_integer(*owner, path + ".owner"));
        if (v < -1 || v > (1 << 24)) return r_.error(path + ".owner", "out of range");
        pool.owner = static_cast<int>(v);
      }
      OFFSIM_ASSIGN_OR_RETURN(pool.capacity_bytes, r_.integer(p, "capacity_bytes", path));
      if (pool.capacity_bytes < 0) {
        return r_.error(path + ".capacity_bytes",
                        fmt::format("expected a byte count >= 0, got {}", pool.capacity_bytes));
      }
      OFFSIM_ASSIGN_OR_RETURN(const json* samples, r_.array(p, "samples", path));
      for (std::size_t k = 0; k < samples->size(); ++k) {
        const std::string sp = fmt::format("{}.samples[{}]", path, k);
        const json& s = (*samples)[k];
        if (!s.is_array() || s.size() != 2) {
          return r_.error(sp, "expected [time_ns, bytes_in_use]");
        }
        OFFSIM_ASSIGN_OR_RETURN(std::int64_t time, r_.as_integer(s[0], sp + "[0]"));
        OFFSIM_ASSIGN_OR_RETURN(std::int64_t bytes, r_.as_integer(s[1], sp + "[1]"));
        if (time < 0 || bytes < 0) {
          return r_.error(
              sp, fmt::format("expected a time and a byte count >= 0, got [{}, {}]", time, bytes));
        }
        if (!pool.samples.empty() && at_ns(time) < pool.samples.back().time) {
          return r_.error(sp + "[0]",
                          fmt::format("time {} ns is before the previous sample's {} ns", time,
                                      ns(pool.samples.back().time)));
        }
        pool.samples.push_back(MemorySample{at_ns(time), bytes});
      }
      OFFSIM_ASSIGN_OR_RETURN(pool.peak_bytes, r_.integer(p, "peak_bytes", path));
      if (pool.peak_bytes < 0) {
        return r_.error(path + ".peak_bytes",
                        fmt::format("expected a byte count >= 0, got {}", pool.peak_bytes));
      }
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t peak_time, r_.integer(p, "peak_time_ns", path));
      pool.peak_time = at_ns(peak_time);
      OFFSIM_ASSIGN_OR_RETURN(const json* live, r_.member(p, "live_at_peak", path));
      OFFSIM_ASSIGN_OR_RETURN(pool.live_at_peak, parse_live(*live, path + ".live_at_peak"));
      t_.pools.push_back(std::move(pool));
    }
    return ok();
  }

  Status parse_outcome(const json& root) {
    const std::string path = "$.outcome";
    OFFSIM_ASSIGN_OR_RETURN(const json* o, r_.object(root, "outcome", "$"));
    OFFSIM_RETURN_IF_ERROR(r_.only_keys(*o, {"kind", "message", "oom", "deadlock"}, path));
    OFFSIM_ASSIGN_OR_RETURN(std::string kind, r_.string(*o, "kind", path));
    std::optional<OutcomeKind> k = outcome_kind_from_string(kind);
    if (!k) {
      return r_.error(path + ".kind",
                      fmt::format("unknown outcome \"{}\" (expected completed, out_of_memory, "
                                  "deadlock or limit_exceeded)",
                                  kind));
    }
    t_.outcome.kind = *k;
    OFFSIM_ASSIGN_OR_RETURN(t_.outcome.message, r_.string(*o, "message", path));
    OFFSIM_ASSIGN_OR_RETURN(const json* oom, r_.optional_member(*o, "oom", path));
    if (oom != nullptr) {
      OFFSIM_ASSIGN_OR_RETURN(OutOfMemory m, parse_oom(*oom, path + ".oom"));
      t_.outcome.oom = std::move(m);
    }
    OFFSIM_ASSIGN_OR_RETURN(const json* deadlock, r_.optional_member(*o, "deadlock", path));
    if (deadlock != nullptr) {
      OFFSIM_ASSIGN_OR_RETURN(Deadlock d, parse_deadlock(*deadlock, path + ".deadlock"));
      t_.outcome.deadlock = std::move(d);
    }
    return ok();
  }

  // $.outcome.oom at `p`: the allocation that did not fit.
  Result<OutOfMemory> parse_oom(const json& oom, const std::string& p) {
    OFFSIM_RETURN_IF_ERROR(
        r_.only_keys(oom,
                     {"op", "op_name", "pool", "pool_kind", "pool_id", "time_ns", "requested_bytes",
                      "in_use_bytes", "capacity_bytes", "live"},
                     p));
    OutOfMemory m;
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t op, r_.integer(oom, "op", p));
    if (op < -1 || op >= static_cast<std::int64_t>(t_.ops.size())) {
      return r_.error(p + ".op", fmt::format("op index {} is out of range (-1 for none; the "
                                             "timeline has {} ops)",
                                             op, t_.ops.size()));
    }
    if (op >= 0) m.op = OpId{static_cast<std::uint32_t>(op)};
    OFFSIM_ASSIGN_OR_RETURN(m.op_name, r_.string(oom, "op_name", p));
    OFFSIM_ASSIGN_OR_RETURN(m.pool, r_.string(oom, "pool", p));
    OFFSIM_RETURN_IF_ERROR(parse_oom_pool_identity(oom, p, m));
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t time, r_.integer(oom, "time_ns", p));
    m.time = at_ns(time);
    OFFSIM_ASSIGN_OR_RETURN(m.requested_bytes, r_.integer(oom, "requested_bytes", p));
    OFFSIM_ASSIGN_OR_RETURN(m.in_use_bytes, r_.integer(oom, "in_use_bytes", p));
    OFFSIM_ASSIGN_OR_RETURN(m.capacity_bytes, r_.integer(oom, "capacity_bytes", p));
    OFFSIM_ASSIGN_OR_RETURN(const json* live, r_.member(oom, "live", p));
    OFFSIM_ASSIGN_OR_RETURN(m.live, parse_live(*live, p + ".live"));
    return m;
  }

  // The optional typed pool of an out-of-memory record: "pool_kind" and "pool_id" (-1: none).
  Status parse_oom_pool_identity(const json& oom, const std::string& p, OutOfMemory& m) {
    OFFSIM_ASSIGN_OR_RETURN(
        std::optional<PoolKind> kind,
        r_.optional_enum(oom, "pool_kind", p, pool_kind_from_string, "pool kind"));
    if (kind) m.pool_kind = *kind;
    OFFSIM_ASSIGN_OR_RETURN(const json* pool_id, r_.optional_member(oom, "pool_id", p));
    if (pool_id) {
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t id, r_.as_integer(*pool_id, p + ".pool_id"));
      if (id < -1 || id >= static_cast<std::int64_t>(t_.pools.size())) {
        return r_.error(p + ".pool_id", fmt::format("pool index {} is out of range (-1 for none; "
                                                    "the timeline has {} pools)",
                                                    id, t_.pools.size()));
      }
      if (id >= 0) m.pool_id = PoolId{static_cast<std::uint32_t>(id)};
    }
    return ok();
  }

  // $.outcome.deadlock at `p`: when the run stopped and the ops that could not start.
  Result<Deadlock> parse_deadlock(const json& deadlock, const std::string& p) {
    OFFSIM_RETURN_IF_ERROR(r_.only_keys(deadlock, {"time_ns", "stuck_ops"}, p));
    Deadlock d;
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t time, r_.integer(deadlock, "time_ns", p));
    d.time = at_ns(time);
    OFFSIM_ASSIGN_OR_RETURN(const json* stuck, r_.array(deadlock, "stuck_ops", p));
    for (std::size_t i = 0; i < stuck->size(); ++i) {
      OFFSIM_ASSIGN_OR_RETURN(std::string s,
                              r_.as_string((*stuck)[i], fmt::format("{}.stuck_ops[{}]", p, i)));
      d.stuck_ops.push_back(std::move(s));
    }
    return d;
  }

  JsonReader r_;
  Timeline t_;
};

}  // namespace

Result<Timeline> timeline_from_json(const json& json, const std::string& source) {
  TimelineParser parser(source);
  return parser.parse(json);
}

Result<Timeline> timeline_from_json_text(const std::string& text, const std::string& source) {
  OFFSIM_ASSIGN_OR_RETURN(json root, parse_json_text(text, source));
  return timeline_from_json(root, source);
}

Result<Timeline> read_timeline_file(const std::string& path) {
  OFFSIM_ASSIGN_OR_RETURN(std::string text, read_input_file(path, kTimelineInput));
  return timeline_from_json_text(text, path);
}

// --- Chrome trace-event JSON ------------------------------------------------------------------

namespace {

// A JSON string literal; invalid UTF-8 is replaced rather than thrown on.
std::string json_string(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

// Integer nanoseconds as microseconds with exactly three decimals, without going through a
// double: 1234567 ns -> "1234.567".
std::string micros(std::int64_t value_ns) {
  const bool negative = value_ns < 0;
  const std::uint64_t a = negative ? std::uint64_t{0} - static_cast<std::uint64_t>(value_ns)
                                   : static_cast<std::uint64_t>(value_ns);
  return fmt::format("{}{}.{:03}", negative ? "-" : "", a / 1000, a % 1000);
}

std::string number(double x) { return std::isfinite(x) ? fmt::format("{}", x) : "null"; }

// The lane's typed identity as further thread_name args (rank, stage, role); nothing for a
// timeline without identity.
std::string lane_identity_args(const Timeline& t, std::size_t lane) {
  if (lane >= t.lane_identity.size()) return {};
  const LaneIdentity& id = t.lane_identity[lane];
  return fmt::format(R"(,"rank":{},"stage":{},"role":"{}")", id.rank, id.stage, to_string(id.role));
}

}  // namespace

std::string chrome_trace_json(const std::vector<const Timeline*>& timelines) {
  std::string out = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[";
  bool first = true;
  std::int64_t flow_id = 0;
  auto emit = [&](const std::string& event) {
    out += first ? "\n" : ",\n";
    out += event;
    first = false;
  };
  for (std::size_t i = 0; i < timelines.size(); ++i) {
    const Timeline& t = *timelines[i];
    const std::size_t pid = i + 1;
    emit(fmt::format(R"({{"ph":"M","pid":{},"tid":0,"name":"process_name","args":{{"name":{}}}}})",
                     pid, json_string(t.source)));
    emit(fmt::format(
        R"({{"ph":"M","pid":{},"tid":0,"name":"process_sort_index","args":{{"sort_index":{}}}}})",
        pid, i));
    for (std::size_t l = 0; l < t.lanes.size(); ++l) {
      emit(fmt::format(
          R"({{"ph":"M","pid":{},"tid":{},"name":"thread_name","args":{{"name":{}{}}}}})", pid,
          l + 1, json_string(t.lanes[l]), lane_identity_args(t, l)));
      emit(fmt::format(
          R"({{"ph":"M","pid":{},"tid":{},"name":"thread_sort_index","args":{{"sort_index":{}}}}})",
          pid, l + 1, l));
    }
    for (const Span& s : t.spans) {
      const OpInfo& op = t.ops[s.op.index()];
      const char* kind = to_string(op.kind);
      const char* category = to_string(op.category);
      const std::int64_t start = s.start.time_since_epoch().count();
      const std::int64_t end = s.end.time_since_epoch().count();
      emit(fmt::format(
          R"({{"ph":"X","pid":{},"tid":{},"name":{},"cat":{},"ts":{},"dur":{},"args":{{"op":{},"kind":"{}","category":{},"flops":{},"bytes":{}}}}})",
          pid, s.lane.index() + 1, json_string(op.name),
          json_string(op.category == OpCategory::kNone ? kind : category), micros(start),
          micros(end - start), s.op.value(), kind, json_string(category), number(op.flops),
          op.bytes));
    }
    // Flow arrows for cross-lane dependencies: from the end of the dependency's slice to the
    // start of the waiting op's slice ("s" binds to the slice enclosing its time stamp, "f" with
    // "bp":"e" to the one starting at it).
    std::vector<const Span*> span_of(t.ops.size(), nullptr);
    for (const Span& s : t.spans) {
      if (s.op.index() < span_of.size()) span_of[s.op.index()] = &s;
    }
    for (const Span& s : t.spans) {
      for (OpId d : t.ops[s.op.index()].deps) {
        const Span* from = d.index() < span_of.size() ? span_of[d.index()] : nullptr;
        if (from == nullptr || from->lane == s.lane) continue;
        const std::int64_t from_start = from->start.time_since_epoch().count();
        const std::int64_t from_end = from->end.time_since_epoch().count();
        // Inside the producer's slice: its last nanosecond (its start when it has no length).
        const std::int64_t at = std::max(from_start, from_end - 1);
        ++flow_id;
        emit(fmt::format(
            R"({{"ph":"s","id":{},"pid":{},"tid":{},"ts":{},"name":"dep","cat":"dep"}})", flow_id,
            pid, from->lane.index() + 1, micros(at)));
        emit(fmt::format(
            R"({{"ph":"f","bp":"e","id":{},"pid":{},"tid":{},"ts":{},"name":"dep","cat":"dep"}})",
            flow_id, pid, s.lane.index() + 1, micros(s.start.time_since_epoch().count())));
      }
    }
    for (const PoolTrace& p : t.pools) {
      const std::string name = json_string(p.name);
      // The counter's typed pool: a metadata event trace viewers skip, offsim's import reads.
      emit(fmt::format(
          R"({{"ph":"M","pid":{},"tid":0,"name":"offsim_pool","args":{{"name":{},"kind":"{}","owner":{}}}}})",
          pid, name, to_string(p.kind), p.owner));
      for (const MemorySample& m : p.samples) {
        emit(fmt::format(
            R"({{"ph":"C","pid":{},"tid":0,"name":{},"ts":{},"args":{{"bytes_in_use":{}}}}})", pid,
            name, micros(m.time.time_since_epoch().count()), m.bytes_in_use));
      }
    }
  }
  out += "\n]}\n";
  return out;
}

}  // namespace offsim::sim
