#include "gui/model/chrome_trace.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sim/core/json_reader.h"
#include "sim/plan/plan.h"

namespace offsim::gui {
namespace {

using nlohmann::json;
using sim::ErrorCode;

// Time stamps in µs; ±9e12 µs keeps nanoseconds inside int64.
constexpr double kMaxMicros = 9.0e12;

struct Process {
  std::string name;
  std::map<std::int64_t, std::string> threads;         // tid -> thread_name
  std::map<std::int64_t, sim::LaneIdentity> identity;  // tid -> thread_name's rank, stage, role
  struct PoolIdentity {
    sim::PoolKind kind = sim::PoolKind::kOther;
    int owner = -1;
  };
  std::map<std::string, PoolIdentity> pools;  // counter name -> offsim_pool's kind, owner
  struct Slice {
    std::int64_t tid;
    std::int64_t start_ns;
    std::int64_t end_ns;
    sim::OpInfo op;
  };
  std::vector<Slice> slices;
  std::map<std::string, std::vector<sim::MemorySample>> counters;  // pool -> samples, file order
};

sim::Result<std::int64_t> integer(const json& event, const char* key, const std::string& where) {
  auto it = event.find(key);
  if (it == event.end() || !it->is_number_integer()) {
    return sim::fail(ErrorCode::kInvalidInput, "{}.{}: expected an integer", where, key);
  }
  return it->get<std::int64_t>();
}

sim::Result<double> micros(const json& event, const char* key, const std::string& where,
                           double min) {
  auto it = event.find(key);
  if (it == event.end() || !it->is_number() || !std::isfinite(it->get<double>()) ||
      it->get<double>() < min || std::fabs(it->get<double>()) > kMaxMicros) {
    return sim::fail(ErrorCode::kInvalidInput, "{}.{}: expected a time in µs{}", where, key,
                     min >= 0.0 ? " >= 0" : "");
  }
  return it->get<double>();
}

std::string text_of(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

double number_of(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_number() && std::isfinite(it->get<double>())
             ? it->get<double>()
             : 0.0;
}

std::int64_t ns_of(double us) { return std::llround(us * 1000.0); }

// An optional small integer argument (rank, stage, owner): -1 when absent or out of range.
int index_of(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_number_integer()) return -1;
  const std::int64_t v = it->get<std::int64_t>();
  return v >= 0 && v <= (1 << 24) ? static_cast<int>(v) : -1;
}

}  // namespace

bool is_chrome_trace(std::string_view text) {
  const std::size_t open = text.find_first_not_of(" \t\r\n");
  if (open == std::string_view::npos) return false;
  if (text[open] == '[') return true;  // the JSON Array Format: just the events
  if (text[open] != '{') return false;
  const std::size_t key = text.find_first_not_of(" \t\r\n", open + 1);
  if (key == std::string_view::npos) return false;
  const std::string_view rest = text.substr(key);
  for (const char* first :
       {"\"displayTimeUnit\"", "\"traceEvents\"", "\"otherData\"", "\"systemTraceEvents\""}) {
    if (rest.rfind(first, 0) == 0) return true;
  }
  return false;
}

namespace {

// A complete event (ph X): one slice on thread `tid`.
sim::Status read_slice(const json& e, const json& args, const std::string& where,
                       Process& process) {
  OFFSIM_ASSIGN_OR_RETURN(const std::int64_t tid, integer(e, "tid", where));
  OFFSIM_ASSIGN_OR_RETURN(const double ts, micros(e, "ts", where, -kMaxMicros));
  OFFSIM_ASSIGN_OR_RETURN(const double dur, micros(e, "dur", where, 0.0));
  sim::OpInfo op;
  op.name = text_of(e, "name");
  op.kind = sim::op_kind_from_string(text_of(args, "kind")).value_or(sim::OpKind::kMarker);
  op.category =
      sim::op_category_from_string(text_of(args, "category")).value_or(sim::OpCategory::kNone);
  op.flops = std::max(0.0, number_of(args, "flops"));
  op.bytes = static_cast<std::int64_t>(std::clamp(number_of(args, "bytes"), 0.0, 9.0e18));
  const std::int64_t start = ns_of(ts);
  process.slices.push_back({tid, start, start + ns_of(dur), std::move(op)});
  if (!process.threads.count(tid)) process.threads[tid] = "";
  return sim::ok();
}

// A counter event (ph C): a bytes_in_use sample of the counter's pool.
sim::Status read_counter(const json& e, const json& args, const std::string& where,
                         Process& process) {
  OFFSIM_ASSIGN_OR_RETURN(const double ts, micros(e, "ts", where, -kMaxMicros));
  auto bytes = args.find("bytes_in_use");
  if (bytes == args.end() || !bytes->is_number() || !std::isfinite(bytes->get<double>()) ||
      bytes->get<double>() < 0.0 || bytes->get<double>() > 9.0e18) {
    return sim::fail(ErrorCode::kInvalidInput, "{}.args.bytes_in_use: expected a byte count >= 0",
                     where);
  }
  process.counters[text_of(e, "name")].push_back(
      {sim::kTimeZero + sim::Duration{ns_of(ts)},
       static_cast<std::int64_t>(std::llround(bytes->get<double>()))});
  return sim::ok();
}

// The lane identity offsim writes into a thread_name's args (rank, stage, role); a thread
// without a known role has none.
void read_lane_identity(std::int64_t tid, const json& args, Process& process) {
  const auto role = sim::lane_role_from_string(text_of(args, "role"));
  if (!role) return;
  process.identity[tid] = {
      .rank = index_of(args, "rank"), .stage = index_of(args, "stage"), .role = *role};
}

// The typed pool offsim writes for each counter (metadata event "offsim_pool").
void read_pool_identity(const json& args, Process& process) {
  const auto kind = sim::pool_kind_from_string(text_of(args, "kind"));
  if (!kind) return;
  process.pools[text_of(args, "name")] = {*kind, index_of(args, "owner")};
}

// One trace event into its process: names (ph M), slices (X) and counters (C); the rest
// (flows, instants, ...) is not drawn.
sim::Status read_event(const json& e, const std::string& where,
                       std::map<std::int64_t, Process>& processes) {
  if (!e.is_object()) {
    return sim::fail(ErrorCode::kInvalidInput, "{}: expected an object", where);
  }
  const std::string ph = text_of(e, "ph");
  if (ph != "M" && ph != "X" && ph != "C") return sim::ok();
  OFFSIM_ASSIGN_OR_RETURN(const std::int64_t pid, integer(e, "pid", where));
  Process& process = processes[pid];
  const json empty = json::object();
  auto args_it = e.find("args");
  const json& args = args_it != e.end() && args_it->is_object() ? *args_it : empty;
  if (ph == "X") return read_slice(e, args, where, process);
  if (ph == "C") return read_counter(e, args, where, process);
  const std::string name = text_of(e, "name");
  if (name == "process_name") process.name = text_of(args, "name");
  if (name == "offsim_pool") read_pool_identity(args, process);
  if (name == "thread_name") {
    OFFSIM_ASSIGN_OR_RETURN(const std::int64_t tid, integer(e, "tid", where));
    process.threads[tid] = text_of(args, "name");
    read_lane_identity(tid, args, process);
  }
  return sim::ok();
}

// A process as a Timeline: a lane per thread, ops in file order, spans by end time then op id
// (the Timeline's order), a pool per counter.
sim::Timeline timeline_of(std::int64_t pid, Process& process) {
  sim::Timeline t;
  t.source = process.name.empty() ? fmt::format("pid {}", pid) : process.name;
  std::map<std::int64_t, std::size_t> lane_of;
  for (const auto& [tid, name] : process.threads) {
    lane_of[tid] = t.lanes.size();
    t.lanes.push_back(name.empty() ? fmt::format("tid {}", tid) : name);
    // Identity for every lane once any thread carries it (a thread without: rank -1, kOther).
    if (!process.identity.empty()) {
      auto id = process.identity.find(tid);
      t.lane_identity.push_back(id != process.identity.end() ? id->second : sim::LaneIdentity{});
    }
  }
  for (auto& slice : process.slices) {
    const sim::OpId op(t.ops.size());
    t.ops.push_back(std::move(slice.op));
    t.spans.push_back({op, sim::LaneId(lane_of.at(slice.tid)),
                       sim::kTimeZero + sim::Duration{slice.start_ns},
                       sim::kTimeZero + sim::Duration{slice.end_ns}});
    t.makespan = std::max(t.makespan, t.spans.back().end);
  }
  std::stable_sort(t.spans.begin(), t.spans.end(), [](const sim::Span& a, const sim::Span& b) {
    return std::tie(a.end, a.op) < std::tie(b.end, b.op);
  });
  for (auto& [name, samples] : process.counters) {
    sim::PoolTrace pool;
    pool.name = name;
    if (auto id = process.pools.find(name); id != process.pools.end()) {
      pool.kind = id->second.kind;
      pool.owner = id->second.owner;
    }
    std::stable_sort(
        samples.begin(), samples.end(),
        [](const sim::MemorySample& a, const sim::MemorySample& b) { return a.time < b.time; });
    pool.samples = std::move(samples);
    for (const sim::MemorySample& s : pool.samples) {
      if (s.bytes_in_use > pool.peak_bytes) {
        pool.peak_bytes = s.bytes_in_use;
        pool.peak_time = s.time;
      }
    }
    t.pools.push_back(std::move(pool));
  }
  t.metadata.emplace_back("format", "Chrome trace");
  return t;
}

}  // namespace

sim::Result<std::vector<sim::Timeline>> timelines_from_chrome_trace(std::string_view text,
                                                                    const std::string& source) {
  // Strict JSON, as every input: a duplicate key is refused with its line and path.
  auto parsed = sim::parse_json_text(std::string(text), source);
  if (!parsed) {
    return sim::fail(ErrorCode::kInvalidInput, "{} (a Chrome trace was expected)",
                     parsed.error().message);
  }
  const json doc = std::move(*parsed);
  auto events = doc.is_object() ? doc.find("traceEvents") : doc.end();
  if (!doc.is_array() && (events == doc.end() || !events->is_array())) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: traceEvents: expected a list of trace events (a Chrome trace)", source);
  }
  const json& list = doc.is_array() ? doc : *events;
  std::map<std::int64_t, Process> processes;
  for (std::size_t i = 0; i < list.size(); ++i) {
    OFFSIM_RETURN_IF_ERROR(
        read_event(list[i], fmt::format("{}: traceEvents[{}]", source, i), processes));
  }
  std::vector<sim::Timeline> out;
  for (auto& [pid, process] : processes) {
    if (process.slices.empty() && process.counters.empty()) continue;
    out.push_back(timeline_of(pid, process));
  }
  if (out.empty()) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: traceEvents: no slices (ph X) or counters (ph C) to show", source);
  }
  return out;
}

std::string trace_limits(const std::string& source) {
  return fmt::format(
      "{}: a Chrome trace has no pool capacities, live sets or plan dependencies; open the "
      "file of `offsim run --timeline-out` for them",
      source);
}

}  // namespace offsim::gui
