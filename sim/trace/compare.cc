#include "sim/trace/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "sim/core/escape.h"
#include "sim/trace/analysis.h"
#include "sim/trace/memory_ledger.h"

namespace offsim::sim {
namespace {

double relative(double predicted, double measured) {
  if (measured == 0.0) return predicted == 0.0 ? 0.0 : std::copysign(1.0, predicted);
  return (predicted - measured) / measured;
}

// Categories in the order of their names, as reports list them.
struct ByName {
  bool operator()(TensorCategory a, TensorCategory b) const {
    return std::string_view(to_string(a)) < std::string_view(to_string(b));
  }
};

std::vector<const Span*> spans_by_op(const Timeline& t) {
  std::vector<const Span*> out(t.ops.size(), nullptr);
  for (const Span& s : t.spans) {
    if (s.op.index() < out.size()) out[s.op.index()] = &s;
  }
  return out;
}

std::string percent(double x) { return fmt::format("{:+.1f}%", 100.0 * x); }

std::string ms(Duration d) {
  return fmt::format("{:.3f} ms", static_cast<double>(d.count()) * 1e-6);
}

std::string mib(std::int64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

bool has_span_on(const Timeline& t, LaneId lane) {
  return std::any_of(t.spans.begin(), t.spans.end(), [&](const Span& s) { return s.lane == lane; });
}

Duration exposed_transfer(const Timeline& t, LaneId lane, const std::vector<int>& lane_rank) {
  Duration sum{0};
  for (const IdleInterval& w : idle_intervals(t, lane, lane_rank)) {
    if (w.cause == IdleCause::kExposedOffload) sum += w.end - w.start;
  }
  return sum;
}

// Exposed transfer time of each compute lane in both timelines (one lane table, typed identity).
std::vector<ExposedError> compare_exposed(const Timeline& predicted, const Timeline& measured) {
  std::vector<ExposedError> out;
  if (predicted.lane_identity.size() != predicted.lanes.size() ||
      predicted.lanes != measured.lanes || predicted.lane_identity != measured.lane_identity) {
    return out;
  }
  std::vector<int> lane_rank;
  for (const LaneIdentity& id : predicted.lane_identity) lane_rank.push_back(id.rank);
  for (std::size_t l = 0; l < predicted.lanes.size(); ++l) {
    const LaneId lane{l};
    if (predicted.lane_identity[l].role != LaneRole::kCompute || !has_span_on(predicted, lane) ||
        !has_span_on(measured, lane)) {
      continue;
    }
    ExposedError e{predicted.lanes[l], exposed_transfer(predicted, lane, lane_rank),
                   exposed_transfer(measured, lane, lane_rank), 0.0};
    e.relative_error =
        relative(static_cast<double>(e.predicted.count()), static_cast<double>(e.measured.count()));
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

CriticalPath critical_path(const Timeline& timeline) {
  CriticalPath path;
  for (std::uint32_t i : critical_path_spans(timeline)) {
    const Span& s = timeline.spans[i];
    path.ops.push_back(s.op);
    path.busy += s.end - s.start;
  }
  return path;
}

namespace {

// Both timelines must come from one plan: the same ops, by name, in the same order.
Status check_same_plan(const Timeline& predicted, const Timeline& measured) {
  if (predicted.ops.size() != measured.ops.size()) {
    return fail(ErrorCode::kInvalidInput,
                "compare: the timelines come from different plans: predicted has {} ops, "
                "measured has {}",
                predicted.ops.size(), measured.ops.size());
  }
  for (std::size_t i = 0; i < predicted.ops.size(); ++i) {
    if (predicted.ops[i].name != measured.ops[i].name) {
      return fail(ErrorCode::kInvalidInput,
                  "compare: the timelines come from different plans: op {} is '{}' in the "
                  "predicted timeline and '{}' in the measured one",
                  i, escape_for_message(predicted.ops[i].name),
                  escape_for_message(measured.ops[i].name));
    }
  }
  return ok();
}

// The duration error of one op that ran in both timelines.
OpError op_error(const Timeline& predicted, std::size_t i, const Span& p, const Span& m) {
  OpError e;
  e.op = OpId{i};
  e.name = predicted.ops[i].name;
  e.lane = p.lane.index() < predicted.lanes.size() ? predicted.lanes[p.lane.index()] : "";
  e.predicted = p.end - p.start;
  e.measured = m.end - m.start;
  e.error = e.predicted - e.measured;
  e.relative_error = e.measured.count() == 0 ? 0.0
                                             : static_cast<double>(e.error.count()) /
                                                   static_cast<double>(e.measured.count());
  return e;
}

// Counts the matched and unmatched ops and keeps the `top_ops` largest absolute errors
// (ties: lower op id first).
void compare_ops(const Timeline& predicted, const Timeline& measured, int top_ops,
                 TimelineComparison& c) {
  const auto p_spans = spans_by_op(predicted);
  const auto m_spans = spans_by_op(measured);
  std::vector<OpError> errors;
  for (std::size_t i = 0; i < p_spans.size(); ++i) {
    const Span* p = p_spans[i];
    const Span* m = m_spans[i];
    if (p && m) {
      ++c.matched_ops;
      errors.push_back(op_error(predicted, i, *p, *m));
    } else if (p) {
      ++c.only_predicted_ops;
    } else if (m) {
      ++c.only_measured_ops;
    }
  }
  std::stable_sort(errors.begin(), errors.end(), [](const OpError& a, const OpError& b) {
    const auto ea = std::llabs(a.error.count());
    const auto eb = std::llabs(b.error.count());
    return ea != eb ? ea > eb : a.op < b.op;
  });
  if (errors.size() > static_cast<std::size_t>(top_ops)) {
    errors.resize(static_cast<std::size_t>(top_ops));
  }
  c.top_ops = std::move(errors);
}

// The busy time of a lane, or nothing when no span ran on it.
std::optional<Duration> lane_busy(const Timeline& t, LaneId lane) {
  Duration busy{0};
  bool any = false;
  for (const Span& s : t.spans) {
    if (s.lane == lane) {
      busy += s.end - s.start;
      any = true;
    }
  }
  if (!any) return std::nullopt;
  return busy;
}

// Busy time per lane that ran in both timelines. Lanes are joined by name: both timelines
// carry the plan's lane table.
std::vector<LaneError> compare_lanes(const Timeline& predicted, const Timeline& measured) {
  std::vector<LaneError> out;
  for (std::size_t l = 0; l < predicted.lanes.size(); ++l) {
    const std::string& name = predicted.lanes[l];
    auto it = std::find(measured.lanes.begin(), measured.lanes.end(), name);
    if (it == measured.lanes.end()) continue;
    const LaneId ml{static_cast<std::size_t>(it - measured.lanes.begin())};
    const std::optional<Duration> pb = lane_busy(predicted, LaneId{l});
    const std::optional<Duration> mb = lane_busy(measured, ml);
    if (!pb || !mb) continue;
    out.push_back(
        LaneError{name, *pb, *mb,
                  relative(static_cast<double>(pb->count()), static_cast<double>(mb->count()))});
  }
  return out;
}

// The critical paths of both timelines and the ops on only one of them.
void compare_paths(const Timeline& predicted, const Timeline& measured, TimelineComparison& c) {
  c.predicted_path = critical_path(predicted);
  c.measured_path = critical_path(measured);
  std::set<OpId> on_p(c.predicted_path.ops.begin(), c.predicted_path.ops.end());
  std::set<OpId> on_m(c.measured_path.ops.begin(), c.measured_path.ops.end());
  for (OpId op : c.predicted_path.ops) {
    if (!on_m.count(op)) c.only_on_predicted_path.push_back(predicted.ops[op.index()].name);
  }
  for (OpId op : c.measured_path.ops) {
    if (!on_p.count(op)) c.only_on_measured_path.push_back(measured.ops[op.index()].name);
  }
}

// The peak of predicted pool `pp` against measured pool `mp`, with the bytes live at each peak
// by category; `ledger_peak` is the measured alloc/free order's peak (-1: not known).
PoolError pool_error(const PoolTrace& pp, const PoolTrace& mp, std::int64_t ledger_peak) {
  PoolError e{pp.name, pp.peak_bytes, mp.peak_bytes,
              relative(static_cast<double>(pp.peak_bytes), static_cast<double>(mp.peak_bytes))};
  e.predicted_peak_time = pp.peak_time;
  e.measured_peak_time = mp.peak_time;
  if (ledger_peak >= 0) e.measured_ledger_peak_bytes = ledger_peak;
  std::map<TensorCategory, std::pair<std::int64_t, std::int64_t>, ByName> by_category;
  for (const LiveTensor& t : pp.live_at_peak) by_category[t.category].first += t.bytes;
  for (const LiveTensor& t : mp.live_at_peak) by_category[t.category].second += t.bytes;
  for (const auto& [category, bytes] : by_category) {
    e.categories.push_back({category, bytes.first, bytes.second});
  }
  return e;
}

// Peak memory per pool that both timelines carry (joined by name).
Status compare_pools(const Timeline& predicted, const Timeline& measured, TimelineComparison& c) {
  // The measured memory events through the memory ledger, when both timelines carry them.
  std::optional<MemoryLedger> measured_ledger;
  if (!predicted.memory_events.empty() && !measured.memory_events.empty()) {
    Result<MemoryLedger> l = MemoryLedger::replay(measured);
    if (!l) return fail(with_context(l.error(), "measured timeline: "));
    measured_ledger = std::move(*l);
  }
  for (const PoolTrace& pp : predicted.pools) {
    auto it = std::find_if(measured.pools.begin(), measured.pools.end(),
                           [&](const PoolTrace& m) { return m.name == pp.name; });
    if (it == measured.pools.end()) continue;
    // A pool the replay did not run (a skipped rank's) has neither samples nor a peak.
    if (it->samples.empty() && it->peak_bytes == 0) continue;
    const auto m_index = static_cast<std::size_t>(it - measured.pools.begin());
    std::int64_t ledger_peak = -1;
    if (measured_ledger && m_index < measured_ledger->pool_count()) {
      ledger_peak = measured_ledger->pool(PoolId{m_index}).peak_bytes;
    }
    PoolError e = pool_error(pp, *it, ledger_peak);
    c.max_abs_pool_relative_error =
        std::max(c.max_abs_pool_relative_error, std::abs(e.relative_error));
    c.pools.push_back(std::move(e));
  }
  return ok();
}

}  // namespace

Result<TimelineComparison> compare_timelines(const Timeline& predicted, const Timeline& measured,
                                             const CompareOptions& options) {
  OFFSIM_RETURN_IF_ERROR(check_same_plan(predicted, measured));
  if (options.top_ops < 0) {
    return fail(ErrorCode::kInvalidInput, "compare: top_ops {} is negative", options.top_ops);
  }
  TimelineComparison c;
  c.predicted_step = predicted.makespan - kTimeZero;
  c.measured_step = measured.makespan - kTimeZero;
  c.step_relative_error = relative(static_cast<double>(c.predicted_step.count()),
                                   static_cast<double>(c.measured_step.count()));
  compare_ops(predicted, measured, options.top_ops, c);
  c.lanes = compare_lanes(predicted, measured);
  c.exposed = compare_exposed(predicted, measured);
  compare_paths(predicted, measured, c);
  OFFSIM_RETURN_IF_ERROR(compare_pools(predicted, measured, c));
  return c;
}

std::string comparison_to_text(const TimelineComparison& c) {
  std::string out;
  out += fmt::format("step time   predicted {}  measured {}  error {}\n", ms(c.predicted_step),
                     ms(c.measured_step), percent(c.step_relative_error));
  out += fmt::format("ops         {} matched, {} only predicted, {} only measured\n", c.matched_ops,
                     c.only_predicted_ops, c.only_measured_ops);
  if (!c.pools.empty()) {
    out += "\npeak memory\n";
    for (const PoolError& p : c.pools) {
      out += fmt::format("  {:<24} predicted {:>12}  measured {:>12}  error {}\n", p.pool,
                         mib(p.predicted_peak_bytes), mib(p.measured_peak_bytes),
                         percent(p.relative_error));
      if (p.measured_ledger_peak_bytes >= 0) {
        out += fmt::format("  {:<24} measured alloc/free order gives {}\n", "",
                           mib(p.measured_ledger_peak_bytes));
      }
      for (const CategoryAtPeak& k : p.categories) {
        out += fmt::format("    {:<22} predicted {:>12}  measured {:>12}  (live at the peak)\n",
                           to_string(k.category), mib(k.predicted_bytes), mib(k.measured_bytes));
      }
    }
  }
  if (!c.lanes.empty()) {
    out += "\nbusy time per lane\n";
    for (const LaneError& l : c.lanes) {
      out += fmt::format("  {:<24} predicted {:>12}  measured {:>12}  error {}\n", l.lane,
                         ms(l.predicted_busy), ms(l.measured_busy), percent(l.relative_error));
    }
  }
  if (!c.exposed.empty()) {
    out += "\nexposed transfer time per compute lane (waiting on a copy)\n";
    for (const ExposedError& e : c.exposed) {
      out += fmt::format("  {:<24} predicted {:>12}  measured {:>12}  error {}\n", e.lane,
                         ms(e.predicted), ms(e.measured), percent(e.relative_error));
    }
  }
  if (!c.top_ops.empty()) {
    out += fmt::format("\n{} ops with the largest error\n", c.top_ops.size());
    for (const OpError& e : c.top_ops) {
      out += fmt::format("  {:<32} {:<18} predicted {:>12}  measured {:>12}  error {}\n", e.name,
                         e.lane, ms(e.predicted), ms(e.measured), percent(e.relative_error));
    }
  }
  out += fmt::format("\ncritical path: predicted {} ops ({} busy), measured {} ops ({} busy)\n",
                     c.predicted_path.ops.size(), ms(c.predicted_path.busy),
                     c.measured_path.ops.size(), ms(c.measured_path.busy));
  auto list = [](const std::vector<std::string>& names) {
    std::string s;
    const std::size_t shown = std::min<std::size_t>(names.size(), 10);
    for (std::size_t i = 0; i < shown; ++i) s += (i ? ", " : "") + names[i];
    if (names.size() > shown) s += fmt::format(", ... ({} more)", names.size() - shown);
    return s.empty() ? std::string("(none)") : s;
  };
  out += fmt::format("  only on the predicted path: {}\n", list(c.only_on_predicted_path));
  out += fmt::format("  only on the measured path:  {}\n", list(c.only_on_measured_path));
  return out;
}

nlohmann::json comparison_to_json(const TimelineComparison& c) {
  using nlohmann::json;
  json j;
  j["predicted_step_ns"] = c.predicted_step.count();
  j["measured_step_ns"] = c.measured_step.count();
  j["step_relative_error"] = c.step_relative_error;
  j["matched_ops"] = c.matched_ops;
  j["only_predicted_ops"] = c.only_predicted_ops;
  j["only_measured_ops"] = c.only_measured_ops;
  j["lanes"] = json::array();
  for (const LaneError& l : c.lanes) {
    j["lanes"].push_back({{"lane", l.lane},
                          {"predicted_busy_ns", l.predicted_busy.count()},
                          {"measured_busy_ns", l.measured_busy.count()},
                          {"relative_error", l.relative_error}});
  }
  j["exposed"] = json::array();
  for (const ExposedError& e : c.exposed) {
    j["exposed"].push_back({{"lane", e.lane},
                            {"predicted_ns", e.predicted.count()},
                            {"measured_ns", e.measured.count()},
                            {"relative_error", e.relative_error}});
  }
  j["top_ops"] = json::array();
  for (const OpError& e : c.top_ops) {
    j["top_ops"].push_back({{"op", e.op.value()},
                            {"name", e.name},
                            {"lane", e.lane},
                            {"predicted_ns", e.predicted.count()},
                            {"measured_ns", e.measured.count()},
                            {"error_ns", e.error.count()},
                            {"relative_error", e.relative_error}});
  }
  auto path_json = [](const CriticalPath& p) {
    json ops = json::array();
    for (OpId op : p.ops) ops.push_back(op.value());
    return json{{"ops", ops}, {"busy_ns", p.busy.count()}};
  };
  j["critical_path"] = {{"predicted", path_json(c.predicted_path)},
                        {"measured", path_json(c.measured_path)},
                        {"only_on_predicted", c.only_on_predicted_path},
                        {"only_on_measured", c.only_on_measured_path}};
  j["pools"] = json::array();
  for (const PoolError& p : c.pools) {
    json categories = json::array();
    for (const CategoryAtPeak& k : p.categories) {
      categories.push_back({{"category", to_string(k.category)},
                            {"predicted_bytes", k.predicted_bytes},
                            {"measured_bytes", k.measured_bytes}});
    }
    json pool = {{"pool", p.pool},
                 {"predicted_peak_bytes", p.predicted_peak_bytes},
                 {"measured_peak_bytes", p.measured_peak_bytes},
                 {"relative_error", p.relative_error},
                 {"predicted_peak_time_ns", p.predicted_peak_time.time_since_epoch().count()},
                 {"measured_peak_time_ns", p.measured_peak_time.time_since_epoch().count()},
                 {"categories_at_peak", std::move(categories)}};
    if (p.measured_ledger_peak_bytes >= 0) {
      pool["measured_ledger_peak_bytes"] = p.measured_ledger_peak_bytes;
    }
    j["pools"].push_back(std::move(pool));
  }
  j["max_abs_pool_relative_error"] = c.max_abs_pool_relative_error;
  return j;
}

}  // namespace offsim::sim
