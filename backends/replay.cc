#include "backends/replay.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/gpu_plugin.h"
#include "sim/trace/memory_ledger.h"

namespace offsim::backends {

const char* to_string(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "?";
}

const char* to_string(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kDevice:
      return "device";
    case MemoryKind::kHostPinned:
      return "host_pinned";
    case MemoryKind::kHostPageable:
      return "host_pageable";
  }
  return "?";
}

sim::Status Device::host_function(StreamId, Buffer, std::string_view label, const HostFunction&) {
  return sim::fail(sim::ErrorCode::kUnsupported, "{}: the {} device runs no host functions", label,
                   to_string(info().kind));
}

namespace {

// Scratch operand sizes one lane needs (the max over its ops), in bytes.
struct LaneNeeds {
  std::int64_t x = 0;  // first device operand: GEMM A, attention q/k/v, copy device side, comm buf
  std::int64_t y = 0;  // GEMM B
  std::int64_t z = 0;  // output: GEMM C, attention out, elementwise out, D2D destination
  std::int64_t pinned = 0;    // host side of copies
  std::int64_t pageable = 0;  // host compute
};

struct LanePlan {
  int local_rank = -1;  // -1: the lane belongs to a rank that does not run
  StreamId stream;
  Buffer x, y, z, pinned, pageable;
};

// Attention operands are sized for at least 2-byte elements: the CUDA kernel is bf16.
std::int64_t attention_element_bytes(const sim::AttentionShape& a) {
  return std::max<std::int64_t>(sim::dtype_bytes(a.dtype), 2);
}

std::int64_t attention_qkv_bytes(const sim::AttentionShape& a) {
  const std::int64_t kv_heads = a.kv_heads > 0 ? a.kv_heads : a.heads;
  return (a.batch * a.heads * a.seq_q + 2 * a.batch * kv_heads * a.seq_kv) * a.head_dim *
         attention_element_bytes(a);
}

std::int64_t attention_out_bytes(const sim::AttentionShape& a) {
  return a.batch * a.heads * a.seq_q * a.head_dim * attention_element_bytes(a);
}

void add_needs(const sim::Op& op, LaneNeeds& n) {
  const std::int64_t bytes = std::max<std::int64_t>(op.sizes.bytes, 0);
  switch (op.kind) {
    case sim::OpKind::kGemm: {
      const sim::GemmShape& g = op.sizes.gemm;
      const std::int64_t e = sim::dtype_bytes(g.dtype) * std::max<std::int64_t>(g.batch, 1);
      n.x = std::max(n.x, g.m * g.k * e);
      n.y = std::max(n.y, g.k * g.n * e);
      // fp8 GEMMs write bf16 output.
      const std::int64_t out_e =
          g.dtype == sim::DType::kFp8 ? 2 * std::max<std::int64_t>(g.batch, 1) : e;
      n.z = std::max(n.z, g.m * g.n * out_e);
      break;
    }
    case sim::OpKind::kAttention:
      n.x = std::max(n.x, attention_qkv_bytes(op.sizes.attention));
      n.z = std::max(n.z, attention_out_bytes(op.sizes.attention));
      break;
    case sim::OpKind::kElementwise:
      n.x = std::max(n.x, bytes / 2);
      n.z = std::max(n.z, bytes / 2);
      break;
    case sim::OpKind::kCopy:
      switch (op.sizes.copy_direction) {
        case sim::CopyDirection::kH2D:
        case sim::CopyDirection::kD2H:
          n.x = std::max(n.x, bytes);
          n.pinned = std::max(n.pinned, bytes);
          break;
        case sim::CopyDirection::kD2D:
          n.x = std::max(n.x, bytes);
          n.z = std::max(n.z, bytes);
          break;
        case sim::CopyDirection::kH2H:
          n.pinned = std::max(n.pinned, bytes);
          n.pageable = std::max(n.pageable, bytes);
          break;
      }
      break;
    case sim::OpKind::kCollective:
    case sim::OpKind::kP2P:
      n.x = std::max(n.x, bytes);
      n.z = std::max(n.z, bytes);  // the local fallbacks write here
      break;
    case sim::OpKind::kHostCompute:
      n.pageable = std::max(n.pageable, bytes);
      break;
    case sim::OpKind::kAlloc:
    case sim::OpKind::kFree:
    case sim::OpKind::kMarker:
      break;
  }
}

// The global rank whose device pool `pool` is, or -1 for host and other pools.
int device_pool_rank(const sim::Pool& pool) {
  return pool.kind == sim::PoolKind::kHbm ? pool.owner : -1;
}

// True when `dep` is the send that the receive `op` completes: the two are one transfer, so the
// receive is posted without waiting for the send to end (which needs the receive).
bool is_paired_send(const sim::Op& op, const sim::Op& dep) {
  return op.kind == sim::OpKind::kP2P && op.sizes.p2p_role == sim::P2PRole::kRecv &&
         dep.kind == sim::OpKind::kP2P && dep.sizes.p2p_role == sim::P2PRole::kSend &&
         op.sizes.p2p_pair >= 0 && dep.sizes.p2p_pair == op.sizes.p2p_pair;
}

// The order ops are issued in: plan order, except that an op waits until every op it depends on
// has been issued (a wait on an event must come after the event's record, as with
// cudaStreamWaitEvent; a receive made after its consumer in plan order would otherwise be waited
// on before it was recorded). Kahn's algorithm taking the lowest op index first, over lane order
// and deps, so each lane keeps its order and the order is deterministic.
std::vector<std::size_t> issue_order(const sim::Plan& plan) {
  const std::size_t n = plan.ops.size();
  std::vector<std::vector<std::size_t>> next(n);
  std::vector<int> waiting(n, 0);
  std::vector<std::optional<std::size_t>> last_on_lane(plan.lanes.size());
  for (std::size_t i = 0; i < n; ++i) {
    auto& last = last_on_lane[plan.ops[i].lane.index()];
    if (last) {
      next[*last].push_back(i);
      ++waiting[i];
    }
    last = i;
    for (sim::OpId d : plan.ops[i].deps) {
      next[d.index()].push_back(i);
      ++waiting[i];
    }
  }
  std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
  for (std::size_t i = 0; i < n; ++i) {
    if (waiting[i] == 0) ready.push(i);
  }
  std::vector<std::size_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    const std::size_t i = ready.top();
    ready.pop();
    order.push_back(i);
    for (std::size_t j : next[i]) {
      if (--waiting[j] == 0) ready.push(j);
    }
  }
  return order;  // complete: replay_on validated the plan (no cycles)
}

std::int64_t median(std::vector<std::int64_t> v) {
  OFFSIM_CHECK(!v.empty());
  const std::size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  if (v.size() % 2 == 1) return v[mid];
  const std::int64_t upper = v[mid];
  const std::int64_t lower =
      *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return lower + (upper - lower) / 2;
}

class Replayer {
 public:
  Replayer(Device& device, const sim::Plan& plan, const ReplayOptions& options)
      : dev_(device), plan_(plan), options_(options) {}

  sim::Result<ReplayResult> run() {
    OFFSIM_RETURN_IF_ERROR(choose_ranks());
    OFFSIM_RETURN_IF_ERROR(setup());
    OFFSIM_RETURN_IF_ERROR(allocate_initial());
    const int total = options_.warmup_steps + options_.measured_steps;
    for (int step = 0; step < total; ++step) {
      const bool measured = step >= options_.warmup_steps;
      if (step == options_.warmup_steps) {
        for (int r = 0; r < local_count(); ++r)
          OFFSIM_RETURN_IF_ERROR(dev_.reset_pool_high_water(r));
      }
      if (options_.before_step) OFFSIM_RETURN_IF_ERROR(options_.before_step(step));
      OFFSIM_RETURN_IF_ERROR(run_step(step, measured));
    }
    OFFSIM_RETURN_IF_ERROR(read_memory());
    return finish();
  }

 private:
  int local_count() const { return static_cast<int>(ranks_.size()); }

  int local_of(int global) const {
    auto it = std::find(ranks_.begin(), ranks_.end(), global);
    return it == ranks_.end() ? -1 : static_cast<int>(it - ranks_.begin());
  }

  // The device index of a global rank in communicators: local_of(), else the index that stands
  // for a rank another process runs (ReplayOptions::remote_ranks), else -1.
  int member_of(int global) const {
    const int local = local_of(global);
    if (local >= 0) return local;
    const std::vector<int>& remote = options_.remote_ranks;
    auto it = std::find(remote.begin(), remote.end(), global);
    return it == remote.end() ? -1 : local_count() + static_cast<int>(it - remote.begin());
  }

  sim::Status choose_ranks() {
    if (options_.measured_steps < 1 || options_.warmup_steps < 0) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "replay: measured steps {} must be >= 1 and warm-up steps {} >= 0",
                       options_.measured_steps, options_.warmup_steps);
    }
    std::set<int> named;
    for (const sim::Lane& lane : plan_.lanes) {
      if (lane.rank >= 0) named.insert(lane.rank);
    }
    if (named.empty()) named.insert(0);  // a plan without rank lanes runs as rank 0
    if (options_.ranks.empty()) {
      ranks_.assign(named.begin(), named.end());
    } else {
      for (int r : options_.ranks) {
        if (!named.count(r)) {
          return sim::fail(sim::ErrorCode::kInvalidInput,
                           "replay: rank {} was asked for but the plan has lanes only for ranks {}",
                           r, fmt::join(named, ","));
        }
        if (local_of(r) < 0) ranks_.push_back(r);
      }
    }
    if (local_count() > dev_.info().ranks) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "replay: {} ranks to run ({}) but the {} device has {}; pass fewer ranks",
                       local_count(), fmt::join(ranks_, ","), to_string(dev_.info().kind),
                       dev_.info().ranks);
    }
    return sim::ok();
  }

  sim::Status setup() {
    lanes_.resize(plan_.lanes.size());
    std::vector<LaneNeeds> needs(plan_.lanes.size());
    for (std::size_t i = 0; i < plan_.lanes.size(); ++i) {
      const int global = plan_.lanes[i].rank;
      lanes_[i].local_rank = global < 0 ? (options_.run_unranked_lanes ? 0 : -1) : local_of(global);
    }
    for (const sim::Op& op : plan_.ops) add_needs(op, needs[op.lane.index()]);
    for (std::size_t i = 0; i < plan_.lanes.size(); ++i) {
      LanePlan& lp = lanes_[i];
      if (lp.local_rank < 0) continue;
      OFFSIM_ASSIGN_OR_RETURN(lp.stream, dev_.create_stream(lp.local_rank, plan_.lanes[i].name));
      const LaneNeeds& n = needs[i];
      OFFSIM_ASSIGN_OR_RETURN(lp.x, dev_.scratch(lp.local_rank, MemoryKind::kDevice, n.x));
      OFFSIM_ASSIGN_OR_RETURN(lp.y, dev_.scratch(lp.local_rank, MemoryKind::kDevice, n.y));
      OFFSIM_ASSIGN_OR_RETURN(lp.z, dev_.scratch(lp.local_rank, MemoryKind::kDevice, n.z));
      OFFSIM_ASSIGN_OR_RETURN(lp.pinned,
                              dev_.scratch(lp.local_rank, MemoryKind::kHostPinned, n.pinned));
      OFFSIM_ASSIGN_OR_RETURN(lp.pageable,
                              dev_.scratch(lp.local_rank, MemoryKind::kHostPageable, n.pageable));
    }
    // A control stream per rank records the step origin.
    for (int r = 0; r < local_count(); ++r) {
      OFFSIM_ASSIGN_OR_RETURN(
          StreamId s,
          dev_.create_stream(r, fmt::format("rank{}.replay", ranks_[static_cast<std::size_t>(r)])));
      control_.push_back(s);
      OFFSIM_ASSIGN_OR_RETURN(EventId e, dev_.create_event(r));
      origin_.push_back(e);
    }
    order_ = issue_order(plan_);
    run_op_.assign(plan_.ops.size(), false);
    start_ev_.resize(plan_.ops.size());
    end_ev_.resize(plan_.ops.size());
    for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
      const LanePlan& lp = lanes_[plan_.ops[i].lane.index()];
      if (lp.local_rank < 0) {
        ++skipped_;
        continue;
      }
      run_op_[i] = true;
      OFFSIM_ASSIGN_OR_RETURN(start_ev_[i], dev_.create_event(lp.local_rank));
      OFFSIM_ASSIGN_OR_RETURN(end_ev_[i], dev_.create_event(lp.local_rank));
    }
    starts_.assign(plan_.ops.size(), {});
    ends_.assign(plan_.ops.size(), {});
    // Device pools: the HBM pools of run ranks; allocations go to the device when the op's
    // lane is on the same rank, and are only accounted otherwise (host pools).
    pool_local_.assign(plan_.pools.size(), -1);
    for (std::size_t p = 0; p < plan_.pools.size(); ++p) {
      const int global = device_pool_rank(plan_.pools[p]);
      if (global >= 0) pool_local_[p] = local_of(global);
    }
    classify_tensors();
    OFFSIM_RETURN_IF_ERROR(prepare_attention());
    set_deadline();
    return create_communicators();
  }

  // Each attention shape is prepared once per rank before the first step (graph building and
  // workspaces stay out of the measured steps); every op records the kernel it runs on.
  sim::Status prepare_attention() {
    attention_fallback_.assign(plan_.ops.size(), false);
    std::map<std::pair<int, std::size_t>, AttentionKernelChoice> by_shape;
    std::vector<sim::AttentionShape> shapes;
    for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
      const sim::Op& op = plan_.ops[i];
      if (!run_op_[i] || op.kind != sim::OpKind::kAttention) continue;
      const int r = lanes_[op.lane.index()].local_rank;
      auto shape_it = std::find(shapes.begin(), shapes.end(), op.sizes.attention);
      const std::size_t shape_index = static_cast<std::size_t>(shape_it - shapes.begin());
      if (shape_it == shapes.end()) shapes.push_back(op.sizes.attention);
      auto it = by_shape.find({r, shape_index});
      if (it == by_shape.end()) {
        sim::Result<AttentionKernelChoice> c = dev_.prepare_attention(r, op.sizes.attention);
        if (!c) {
          return sim::fail(sim::with_context(
              c.error(), fmt::format("replay: preparing attention for op '{}': ", op.name)));
        }
        it = by_shape.emplace(std::pair{r, shape_index}, *c).first;
      }
      attention_fallback_[i] = !it->second.fused;
      attention_.push_back(
          AttentionOpKernel{op.name, op.category, op.sizes.attention.backward, it->second});
    }
    return sim::ok();
  }

  // Predicted time of op `i` in ns: its forecast span, else its cost in isolation.
  std::int64_t predicted_ns(std::size_t i) const {
    if (options_.forecast && i < forecast_span_.size() && forecast_span_[i] >= 0) {
      return forecast_span_[i];
    }
    const sim::OpCost& c = plan_.ops[i].cost;
    double seconds = sim::to_seconds(c.latency);
    if (c.work > 0.0 && c.max_rate > 0.0 && std::isfinite(c.max_rate))
      seconds += c.work / c.max_rate;
    return static_cast<std::int64_t>(seconds * 1e9);
  }

  // The per-step watchdog deadline (see replay.h).
  void set_deadline() {
    forecast_span_.assign(plan_.ops.size(), -1);
    if (options_.forecast) {
      for (const sim::Span& sp : options_.forecast->spans) {
        if (sp.op.index() < forecast_span_.size()) {
          forecast_span_[sp.op.index()] = (sp.end - sp.start).count();
        }
      }
    }
    std::vector<double> lane_sum(plan_.lanes.size(), 0.0);
    double fallback_ns = 0.0;
    for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
      if (!run_op_[i]) continue;
      const double p = static_cast<double>(predicted_ns(i));
      lane_sum[plan_.ops[i].lane.index()] += p;
      if (attention_fallback_[i]) fallback_ns += p;
    }
    double step_ns = lane_sum.empty() ? 0.0 : *std::max_element(lane_sum.begin(), lane_sum.end());
    if (options_.forecast) {
      step_ns = static_cast<double>((options_.forecast->makespan - sim::kTimeZero).count());
    }
    const double extra =
        std::max(options_.fallback_attention_factor - options_.watchdog_factor, 0.0);
    const double scaled_ns = options_.watchdog_factor * step_ns + extra * fallback_ns;
    const double floor_ns = static_cast<double>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(options_.watchdog_timeout).count());
    // At most a year: a bound that still fits the clocks' arithmetic.
    const double deadline_ns = std::min(std::max(floor_ns, scaled_ns), 3.15e16);
    deadline_ = std::chrono::milliseconds{static_cast<std::int64_t>(std::ceil(deadline_ns / 1e6))};
  }

  bool on_device(sim::TensorId t, int local_rank) const {
    const int pool_rank = pool_local_[plan_.tensors[t.index()].pool.index()];
    return pool_rank >= 0 && pool_rank == local_rank;
  }

  // A tensor lives in the device pool when it is initial or its allocating op runs on the pool's
  // rank; every other tensor is only accounted (host pools, pools of ranks that do not run).
  void classify_tensors() {
    device_tensor_.assign(plan_.tensors.size(), false);
    for (sim::TensorId t : plan_.initial_tensors) {
      device_tensor_[t.index()] = pool_local_[plan_.tensors[t.index()].pool.index()] >= 0;
    }
    for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
      if (!run_op_[i]) continue;
      const int r = lanes_[plan_.ops[i].lane.index()].local_rank;
      for (sim::TensorId t : plan_.ops[i].allocs) device_tensor_[t.index()] = on_device(t, r);
    }
  }

  sim::Status allocate_initial() {
    for (sim::TensorId t : plan_.initial_tensors) {
      const int r = pool_local_[plan_.tensors[t.index()].pool.index()];
      if (r < 0) continue;
      OFFSIM_RETURN_IF_ERROR(dev_.allocate(control_[static_cast<std::size_t>(r)], t.value(),
                                           plan_.tensors[t.index()].bytes, "initial tensors"));
    }
    return sync("allocating the initial tensors");
  }

  sim::Status sync(std::string_view what) {
    const auto began = std::chrono::steady_clock::now();
    sim::Status s = dev_.synchronize(deadline_);
    if (!s) {
      std::string culprit;
      if (s.error().code == sim::ErrorCode::kDevice &&
          s.error().message.find("watchdog") != std::string::npos) {
        const double waited_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began)
                .count();
        culprit = watchdog_culprit(waited_ms);
      }
      return sim::fail(s.error().code, "replay on {} ({}): {}{}", dev_.info().name, what, culprit,
                       s.error().message);
    }
    return sim::ok();
  }

  // The first op in issue order whose end never completed, with its prediction and budget.
  std::string watchdog_culprit(double waited_ms) {
    for (const std::size_t i : order_) {
      if (!run_op_[i]) continue;
      sim::Result<bool> done = dev_.completed(end_ev_[i]);
      if (!done || *done) continue;
      const double predicted_ms = static_cast<double>(predicted_ns(i)) / 1e6;
      const double factor =
          attention_fallback_[i] ? options_.fallback_attention_factor : options_.watchdog_factor;
      return fmt::format(
          "op '{}' ({}{}) did not finish: predicted {:.3f} ms ({}), its budget {:.3f} ms ({}x); "
          "waited {:.0f} ms for the step (deadline {} ms = max(floor {} ms, {}x the step's "
          "prediction{})). ",
          plan_.ops[i].name, sim::to_string(plan_.ops[i].kind),
          attention_fallback_[i] ? " on the fallback attention kernel" : "", predicted_ms,
          options_.forecast && forecast_span_[i] >= 0 ? "forecast span" : "cost in isolation",
          predicted_ms * factor, factor, waited_ms, deadline_.count(),
          options_.watchdog_timeout.count(), options_.watchdog_factor,
          fallback_ops() > 0 ? fmt::format(" + {}x for {} fallback attention op(s)",
                                           options_.fallback_attention_factor, fallback_ops())
                             : std::string());
    }
    return "";
  }

  std::size_t fallback_ops() const {
    std::size_t n = 0;
    for (std::size_t i = 0; i < plan_.ops.size(); ++i) n += run_op_[i] && attention_fallback_[i];
    return n;
  }

  // The split of every run rank after the measured steps, then the untimed marks step.
  sim::Status read_memory() {
    memory_.resize(ranks_.size());
    for (int r = 0; r < local_count(); ++r) {
      RankMemory& m = memory_[static_cast<std::size_t>(r)];
      m.rank = ranks_[static_cast<std::size_t>(r)];
      OFFSIM_ASSIGN_OR_RETURN(m.split, dev_.memory_split(r));
      OFFSIM_ASSIGN_OR_RETURN(PoolUsage u, dev_.pool_usage(r));
      usage_.push_back(u);
    }
    if (!options_.memory_marks) return sim::ok();
    for (int r = 0; r < local_count(); ++r) {
      static_cast<void>(dev_.take_memory_marks(r));  // nothing from the timed steps
    }
    const int step = options_.warmup_steps + options_.measured_steps;
    OFFSIM_RETURN_IF_ERROR(run_step(step, /*measured=*/false, /*marks=*/true));
    return sim::ok();
  }

  // Marks of the marks step, in device order: ops named, unknown used bytes filled from the
  // plan's allocations (tag 2i: after op i's allocs; 2i+1: after its frees), high-water found.
  sim::Status collect_marks() {
    for (int r = 0; r < local_count(); ++r) {
      RankMemory& m = memory_[static_cast<std::size_t>(r)];
      OFFSIM_ASSIGN_OR_RETURN(m.marks, dev_.take_memory_marks(r));
      std::int64_t in_use = initial_device_bytes(r);
      m.used_high_bytes = 0;
      for (MemoryMark& mark : m.marks) {
        const std::size_t i = static_cast<std::size_t>(mark.tag / 2);
        if (i >= plan_.ops.size()) continue;
        const bool after_frees = mark.tag % 2 == 1;
        const sim::Op& op = plan_.ops[i];
        in_use += mark_change_bytes(op, after_frees, r);
        if (mark.used_bytes < 0) mark.used_bytes = in_use;
        m.mark_ops.push_back(
            fmt::format("{} ({})", op.name, after_frees ? "after frees" : "after allocs"));
        if (mark.used_bytes > m.used_high_bytes) {
          m.used_high_bytes = mark.used_bytes;
          m.used_high_op = m.mark_ops.back();
        }
        m.reserved_high_bytes = std::max(m.reserved_high_bytes, mark.reserved_bytes);
      }
    }
    return sim::ok();
  }

  // Whether tensor `t` is allocated in local rank `r`'s device pool.
  bool in_rank_pool(sim::TensorId t, int r) const {
    return device_tensor_[t.index()] && pool_local_[plan_.tensors[t.index()].pool.index()] == r;
  }

  // Bytes of the initial tensors in local rank `r`'s device pool.
  std::int64_t initial_device_bytes(int r) const {
    std::int64_t bytes = 0;
    for (sim::TensorId t : plan_.initial_tensors) {
      if (in_rank_pool(t, r)) bytes += plan_.tensors[t.index()].bytes;
    }
    return bytes;
  }

  // What op `op` changes in local rank `r`'s pool at its mark: + its allocs (after allocs) or
  // − the frees its own lane releases (after frees).
  std::int64_t mark_change_bytes(const sim::Op& op, bool after_frees, int r) const {
    std::int64_t change = 0;
    for (sim::TensorId t : after_frees ? op.frees : op.allocs) {
      if (!in_rank_pool(t, r)) continue;
      if (after_frees && !on_device(t, lanes_[op.lane.index()].local_rank)) continue;
      change += after_frees ? -plan_.tensors[t.index()].bytes : plan_.tensors[t.index()].bytes;
    }
    return change;
  }

  // The local ranks a collective or p2p op runs among; empty when it runs locally (fewer than
  // two members run, or the op's own rank is not in its group).
  std::vector<int> comm_members(const sim::Op& op, const LanePlan& lp) const {
    std::vector<int> locals;
    if (op.kind == sim::OpKind::kP2P) {
      const int peer = member_of(op.sizes.peer);
      if (peer < 0 || peer == lp.local_rank) return {};
      return {std::min(lp.local_rank, peer), std::max(lp.local_rank, peer)};
    }
    std::vector<int> group = op.sizes.collective.group;
    if (group.empty()) {
      group = ranks_;
      group.insert(group.end(), options_.remote_ranks.begin(), options_.remote_ranks.end());
    }
    for (int g : group) {
      const int l = member_of(g);
      if (l >= 0 && std::find(locals.begin(), locals.end(), l) == locals.end()) locals.push_back(l);
    }
    if (locals.size() < 2 ||
        std::find(locals.begin(), locals.end(), lp.local_rank) == locals.end()) {
      return {};
    }
    return locals;
  }

  // Communicators are made before the first step (NCCL's set-up must not land in a step).
  sim::Status create_communicators() {
    for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
      const sim::Op& op = plan_.ops[i];
      if (!run_op_[i] || (op.kind != sim::OpKind::kCollective && op.kind != sim::OpKind::kP2P)) {
        continue;
      }
      const std::vector<int> members = comm_members(op, lanes_[op.lane.index()]);
      if (members.empty()) continue;
      sim::Result<CommId> comm = comm_for(members);
      if (!comm) return sim::fail(comm.error());
    }
    return sim::ok();
  }

  sim::Result<CommId> comm_for(std::vector<int> locals) {
    auto it = comms_.find(locals);
    if (it != comms_.end()) return it->second;
    OFFSIM_ASSIGN_OR_RETURN(CommId c, dev_.create_communicator(locals));
    comms_.emplace(std::move(locals), c);
    return c;
  }

  sim::Status issue_work(const sim::Op& op, const LanePlan& lp) {
    const std::int64_t bytes = std::max<std::int64_t>(op.sizes.bytes, 0);
    const StreamId s = lp.stream;
    switch (op.kind) {
      case sim::OpKind::kGemm:
        return dev_.gemm(s, op.sizes.gemm, lp.x, lp.y, lp.z);
      case sim::OpKind::kAttention:
        return dev_.attention(s, op.sizes.attention, lp.x, lp.z);
      case sim::OpKind::kElementwise:
        return dev_.elementwise(s, bytes, lp.x, lp.z);
      case sim::OpKind::kCopy:
        switch (op.sizes.copy_direction) {
          case sim::CopyDirection::kH2D:
            return dev_.copy(s, lp.x, lp.pinned, bytes);
          case sim::CopyDirection::kD2H:
            return dev_.copy(s, lp.pinned, lp.x, bytes);
          case sim::CopyDirection::kD2D:
            return dev_.copy(s, lp.z, lp.x, bytes);
          case sim::CopyDirection::kH2H:
            return dev_.copy(s, lp.pageable, lp.pinned, bytes);
        }
        return sim::ok();
      case sim::OpKind::kCollective: {
        const std::vector<int> members = comm_members(op, lp);
        if (members.empty()) return dev_.elementwise(s, 2 * bytes, lp.x, lp.z);  // read + write
        OFFSIM_ASSIGN_OR_RETURN(CommId c, comm_for(members));
        return dev_.collective(s, c, op.sizes.collective.kind, lp.x, bytes, op.name);
      }
      case sim::OpKind::kP2P: {
        const std::vector<int> members = comm_members(op, lp);
        if (members.empty()) {
          // The peer does not run: the send side moves the bytes as a local copy; the receive
          // has nothing left to do.
          if (op.sizes.p2p_role == sim::P2PRole::kRecv) return sim::ok();
          return dev_.copy(s, lp.z, lp.x, bytes);
        }
        const int peer = member_of(op.sizes.peer);
        const bool send = op.sizes.p2p_role == sim::P2PRole::kSend;
        OFFSIM_ASSIGN_OR_RETURN(CommId c, comm_for(members));
        return dev_.p2p(s, c, peer, send, lp.x, bytes, op.name);
      }
      case sim::OpKind::kHostCompute:
        return dev_.host_compute(s, bytes, lp.pageable);
      case sim::OpKind::kAlloc:
      case sim::OpKind::kFree:
      case sim::OpKind::kMarker:
        return sim::ok();
    }
    return sim::ok();
  }

  // Tensors of one step: the device tensors it allocated and which of them it freed.
  struct StepTensors {
    std::vector<sim::TensorId> live;
    std::vector<bool> freed;
  };

  // One step: the origin, every op in issue order, the wait for the device, then (measured) the
  // op times and the memory state restored for the next step.
  sim::Status run_step(int step, bool measured, bool marks = false) {
    OFFSIM_RETURN_IF_ERROR(record_origin());
    StepTensors tensors;
    tensors.freed.assign(plan_.tensors.size(), false);
    for (const std::size_t i : order_) {
      if (run_op_[i]) OFFSIM_RETURN_IF_ERROR(issue_op(i, marks, tensors));
    }
    OFFSIM_RETURN_IF_ERROR(
        sync(marks ? std::string("the memory marks step") : fmt::format("step {}", step)));
    if (marks) OFFSIM_RETURN_IF_ERROR(collect_marks());
    if (measured) OFFSIM_RETURN_IF_ERROR(read_step_times());
    return restore_memory(tensors);
  }

  // Each rank's control stream records the step origin; every lane waits for all origins.
  sim::Status record_origin() {
    for (int r = 0; r < local_count(); ++r) {
      OFFSIM_RETURN_IF_ERROR(
          dev_.record(control_[static_cast<std::size_t>(r)], origin_[static_cast<std::size_t>(r)]));
    }
    for (const LanePlan& lp : lanes_) {
      if (lp.local_rank < 0) continue;
      for (EventId e : origin_) OFFSIM_RETURN_IF_ERROR(dev_.wait(lp.stream, e));
    }
    return sim::ok();
  }

  // Op `i` on its lane's stream: waits for its dependencies on other lanes, start record,
  // allocations, the work, its frees on this rank, end record (memory marks around the work).
  sim::Status issue_op(std::size_t i, bool marks, StepTensors& tensors) {
    const sim::Op& op = plan_.ops[i];
    const LanePlan& lp = lanes_[op.lane.index()];
    for (sim::OpId dep : op.deps) {
      if (!run_op_[dep.index()] || plan_.ops[dep.index()].lane == op.lane ||
          is_paired_send(op, plan_.ops[dep.index()])) {
        continue;
      }
      OFFSIM_RETURN_IF_ERROR(dev_.wait(lp.stream, end_ev_[dep.index()]));
    }
    OFFSIM_RETURN_IF_ERROR(dev_.record(lp.stream, start_ev_[i]));
    for (sim::TensorId t : op.allocs) {
      if (!device_tensor_[t.index()]) continue;
      OFFSIM_RETURN_IF_ERROR(
          dev_.allocate(lp.stream, t.value(), plan_.tensors[t.index()].bytes, op.name));
      tensors.live.push_back(t);
    }
    if (marks) OFFSIM_RETURN_IF_ERROR(dev_.mark_memory(lp.stream, 2 * std::uint64_t{i}));
    OFFSIM_RETURN_IF_ERROR(issue_work(op, lp));
    for (sim::TensorId t : op.frees) {
      // A free on another rank's lane is left to the end of the step (restore_memory).
      if (!device_tensor_[t.index()] || !on_device(t, lp.local_rank)) continue;
      OFFSIM_RETURN_IF_ERROR(dev_.release(lp.stream, t.value()));
      tensors.freed[t.index()] = true;
    }
    // Before the end record, so that a consumer on another stream marks after this mark.
    if (marks) OFFSIM_RETURN_IF_ERROR(dev_.mark_memory(lp.stream, 2 * std::uint64_t{i} + 1));
    return dev_.record(lp.stream, end_ev_[i]);
  }

  // Start and end of every run op from its rank's origin, and the step's time (the last end).
  sim::Status read_step_times() {
    std::vector<std::int64_t> ends_this_step;
    for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
      if (!run_op_[i]) continue;
      const std::size_t r = static_cast<std::size_t>(lanes_[plan_.ops[i].lane.index()].local_rank);
      OFFSIM_ASSIGN_OR_RETURN(sim::Duration s, dev_.elapsed(origin_[r], start_ev_[i]));
      OFFSIM_ASSIGN_OR_RETURN(sim::Duration e, dev_.elapsed(origin_[r], end_ev_[i]));
      starts_[i].push_back(std::max<std::int64_t>(s.count(), 0));
      ends_[i].push_back(std::max<std::int64_t>(e.count(), starts_[i].back()));
      ends_this_step.push_back(ends_[i].back());
    }
    step_times_.push_back(sim::Duration{
        ends_this_step.empty() ? 0
                               : *std::max_element(ends_this_step.begin(), ends_this_step.end())});
    return sim::ok();
  }

  // Every step starts alike: tensors the step allocated but did not free are released (they
  // would pile up over the repeated steps), initial tensors it freed are allocated again.
  sim::Status restore_memory(const StepTensors& tensors) {
    bool leftover = false;
    for (sim::TensorId t : tensors.live) {
      if (tensors.freed[t.index()]) continue;
      const int r = pool_local_[plan_.tensors[t.index()].pool.index()];
      OFFSIM_RETURN_IF_ERROR(dev_.release(control_[static_cast<std::size_t>(r)], t.value()));
      leftover = true;
    }
    for (sim::TensorId t : plan_.initial_tensors) {
      if (!tensors.freed[t.index()] || !device_tensor_[t.index()]) continue;
      const int r = pool_local_[plan_.tensors[t.index()].pool.index()];
      OFFSIM_RETURN_IF_ERROR(dev_.allocate(control_[static_cast<std::size_t>(r)], t.value(),
                                           plan_.tensors[t.index()].bytes, "initial tensors"));
      leftover = true;
    }
    if (leftover) OFFSIM_RETURN_IF_ERROR(sync("restoring the memory state between steps"));
    return sim::ok();
  }

  sim::Result<ReplayResult> finish() {
    ReplayResult result;
    result.device = dev_.info();
    result.ranks = ranks_;
    result.skipped_ops = skipped_;
    result.step_times = step_times_;
    sim::Timeline& t = result.timeline;
    t = sim::timeline_skeleton(plan_);
    t.source = "measured";
    std::vector<sim::TimePoint> start(plan_.ops.size()), end(plan_.ops.size());
    for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
      if (!run_op_[i]) continue;
      start[i] = sim::kTimeZero + sim::Duration{median(starts_[i])};
      end[i] = sim::kTimeZero + sim::Duration{median(ends_[i])};
      t.spans.push_back(sim::Span{sim::OpId{i}, plan_.ops[i].lane, start[i], end[i]});
      t.makespan = std::max(t.makespan, end[i]);
    }
    std::sort(t.spans.begin(), t.spans.end(), [](const sim::Span& a, const sim::Span& b) {
      return a.end != b.end ? a.end < b.end : a.op < b.op;
    });
    fill_memory(t, start, end);
    for (std::size_t p = 0; p < plan_.pools.size(); ++p) {
      const int r = pool_local_[p];
      if (r < 0) continue;
      const PoolUsage& u = usage_[static_cast<std::size_t>(r)];
      if (options_.forecast && p < options_.forecast->pools.size()) {
        RankMemory& m = memory_[static_cast<std::size_t>(r)];
        m.forecast_peak_bytes =
            std::max(m.forecast_peak_bytes, options_.forecast->pools[p].peak_bytes);
      }
      PoolHighWater hw{plan_.pools[p].name, t.pools[p].peak_bytes, u.used_high_bytes,
                       u.reserved_high_bytes};
      // The measured peak: the allocator's own high-water (granularity included), unless the plan's
      // tensors live at once in the measured device order exceed it. The allocator counts in
      // the order its calls are made, on the host, which runs ahead of the GPU: a buffer whose
      // free is queued behind a copy still in flight (activation offload) already counts as
      // free there, yet it holds device memory until the copy has run.
      t.pools[p].peak_bytes = std::max(u.used_high_bytes, hw.planned_peak_bytes);
      result.pools.push_back(hw);
    }
    t.outcome = sim::Outcome{};
    t.outcome.message =
        fmt::format("replayed {} measured steps on {}", options_.measured_steps, dev_.info().name);
    t.metadata.emplace_back("timeline.source", "replay");
    t.metadata.emplace_back("replay.device", dev_.info().name);
    t.metadata.emplace_back("replay.ranks", fmt::format("{}", fmt::join(ranks_, ",")));
    t.metadata.emplace_back("replay.warmup_steps", std::to_string(options_.warmup_steps));
    t.metadata.emplace_back("replay.measured_steps", std::to_string(options_.measured_steps));
    t.metadata.emplace_back("replay.skipped_ops", std::to_string(skipped_));
    t.metadata.emplace_back("replay.watchdog_ms", std::to_string(deadline_.count()));
    t.metadata.emplace_back("replay.attention_fallback_ops", std::to_string(fallback_ops()));
    result.attention = attention_;
    result.memory = memory_;
    result.watchdog_deadline = deadline_;
    if (!dev_.info().note.empty()) t.metadata.emplace_back("replay.note", dev_.info().note);
    return result;
  }

  // The measured memory events, applied to the memory ledger (sim/trace/memory_ledger.h) for
  // the pools' samples, peaks and live sets: initial tensors at time zero, each op's allocs at its
  // measured start and frees at its measured end; at one instant frees come first, then the
  // device's order (the order the replay issued the ops). Pools of ranks that did not run, and
  // tensors they hold, are left out.
  void fill_memory(sim::Timeline& t, const std::vector<sim::TimePoint>& start,
                   const std::vector<sim::TimePoint>& end) const {
    struct Change {
      sim::TimePoint time;
      int order;           // 0 free, 1 alloc
      std::size_t issued;  // position in the device's issue order (initial tensors first)
      sim::TensorId tensor;
    };
    std::vector<Change> changes;
    auto pool_runs = [&](sim::TensorId tensor) {
      const std::size_t p = plan_.tensors[tensor.index()].pool.index();
      return device_pool_rank(plan_.pools[p]) < 0 || pool_local_[p] >= 0;
    };
    for (sim::TensorId tensor : plan_.initial_tensors) {
      if (pool_runs(tensor)) changes.push_back({sim::kTimeZero, 1, 0, tensor});
    }
    for (std::size_t k = 0; k < order_.size(); ++k) {
      const std::size_t i = order_[k];
      if (!run_op_[i]) continue;
      for (sim::TensorId tensor : plan_.ops[i].allocs) {
        if (pool_runs(tensor)) changes.push_back({start[i], 1, k + 1, tensor});
      }
      for (sim::TensorId tensor : plan_.ops[i].frees) {
        if (pool_runs(tensor)) changes.push_back({end[i], 0, k + 1, tensor});
      }
    }
    std::stable_sort(changes.begin(), changes.end(), [](const Change& a, const Change& b) {
      return std::tie(a.time, a.order, a.issued) < std::tie(b.time, b.order, b.issued);
    });
    sim::MemoryLedger ledger(plan_.pools.size(), {.record_samples = true, .record_events = true});
    for (const Change& c : changes) {
      const sim::Tensor& tensor = plan_.tensors[c.tensor.index()];
      if (c.order == 1) {
        ledger.alloc(c.time, c.tensor, tensor.pool, tensor.bytes);
      } else {
        ledger.free(c.time, c.tensor, tensor.pool, tensor.bytes);
      }
    }
    t.tensors = sim::tensor_infos(plan_);
    sim::fill_pool_traces(ledger, t.tensors, t.pools);
    // A pool without any change (one of a rank that did not run) keeps no samples, so that
    // `compare` can tell it was not measured.
    std::vector<bool> changed(plan_.pools.size(), false);
    for (const Change& c : changes) changed[plan_.tensors[c.tensor.index()].pool.index()] = true;
    for (std::size_t p = 0; p < t.pools.size(); ++p) {
      if (!changed[p]) t.pools[p].samples.clear();
    }
    t.memory_events = ledger.take_events();
  }

  Device& dev_;
  const sim::Plan& plan_;
  const ReplayOptions& options_;
  std::vector<int> ranks_;  // global ranks that run, by local index
  std::vector<LanePlan> lanes_;
  std::vector<StreamId> control_;
  std::vector<EventId> origin_;
  std::vector<std::size_t> order_;  // issue order (issue_order())
  std::vector<bool> run_op_;
  std::vector<EventId> start_ev_, end_ev_;
  std::vector<std::vector<std::int64_t>> starts_, ends_;  // ns from the origin, per measured step
  std::vector<int> pool_local_;
  std::vector<bool> device_tensor_;
  std::map<std::vector<int>, CommId> comms_;
  std::vector<sim::Duration> step_times_;
  std::int64_t skipped_ = 0;
  std::vector<bool> attention_fallback_;  // by op: an attention op on a fallback kernel
  std::vector<AttentionOpKernel> attention_;
  std::vector<std::int64_t> forecast_span_;  // by op, ns; -1 without a forecast span
  std::chrono::milliseconds deadline_{60000};
  std::vector<RankMemory> memory_;  // by local rank
  std::vector<PoolUsage> usage_;    // by local rank, after the measured steps
};

std::vector<int> plan_ranks(const sim::Plan& plan, const std::vector<int>& asked) {
  if (!asked.empty()) return asked;
  std::set<int> named;
  for (const sim::Lane& lane : plan.lanes) {
    if (lane.rank >= 0) named.insert(lane.rank);
  }
  if (named.empty()) named.insert(0);
  return {named.begin(), named.end()};
}

}  // namespace

sim::Result<ReplayResult> replay_on(Device& device, const sim::Plan& plan,
                                    const ReplayOptions& options) {
  sim::Status valid = sim::validate(plan);
  if (!valid) return sim::fail(sim::with_context(valid.error(), "replay: invalid plan: "));
  Replayer replayer(device, plan, options);
  return replayer.run();
}

namespace {

// A measured timeline of an expanded plan cut back to the ops, lanes and pools of the plan it
// was expanded from (the copies come after them, so ids are unchanged).
void keep_original(const sim::Plan& plan, sim::Timeline& t) {
  t.ops.resize(plan.ops.size());
  t.lanes.resize(plan.lanes.size());
  if (t.lane_identity.size() > plan.lanes.size()) t.lane_identity.resize(plan.lanes.size());
  t.pools.resize(plan.pools.size());
  t.tensors.resize(std::min(t.tensors.size(), plan.tensors.size()));
  std::erase_if(t.memory_events,
                [&](const sim::MemoryEvent& e) { return e.tensor.index() >= plan.tensors.size(); });
  std::erase_if(t.spans, [&](const sim::Span& s) { return s.op.index() >= plan.ops.size(); });
  t.makespan = sim::kTimeZero;
  for (const sim::Span& s : t.spans) t.makespan = std::max(t.makespan, s.end);
}

}  // namespace

sim::Result<ReplayResult> replay(const sim::Plan& plan, const ReplayOptions& options) {
  if (options.all_ranks) {
    if (!options.ranks.empty()) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "replay: all ranks and a list of ranks ({}) exclude each other",
                       fmt::join(options.ranks, ","));
    }
    OFFSIM_ASSIGN_OR_RETURN(sim::Plan full, sim::expand_representatives(plan));
    ReplayOptions o = options;
    o.all_ranks = false;
    OFFSIM_ASSIGN_OR_RETURN(ReplayResult r, replay(full, o));
    keep_original(plan, r.timeline);
    r.timeline.metadata.emplace_back(
        "replay.all_ranks",
        fmt::format("{} ranks ran; the timeline keeps the representatives' ops", r.ranks.size()));
    return r;
  }
  const int ranks = static_cast<int>(plan_ranks(plan, options.ranks).size());
  switch (options.device) {
    case DeviceKind::kCpu: {
      CpuDeviceOptions cpu = options.cpu;
      cpu.ranks = std::max(ranks, 1);
      std::unique_ptr<Device> device = make_cpu_device(cpu);
      return replay_on(*device, plan, options);
    }
    case DeviceKind::kCuda: {
      if (!gpu_plugin_built()) {
        return sim::fail(sim::ErrorCode::kUnsupported,
                         "replay on cuda: offsim was built without CUDA (configure with nvcc "
                         "available, OFFSIM_WITH_CUDA=AUTO or ON); use the cpu device instead");
      }
      OFFSIM_ASSIGN_OR_RETURN(const GpuPlugin* gpu, load_gpu_plugin());
      OFFSIM_ASSIGN_OR_RETURN(std::unique_ptr<Device> device,
                              gpu->make_cuda_device(options.first_gpu, std::max(ranks, 1)));
      return replay_on(*device, plan, options);
    }
  }
  return sim::fail(sim::ErrorCode::kInvalidInput, "replay: unknown device kind");
}

namespace {

std::string gib(std::int64_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / static_cast<double>(1LL << 30));
}

}  // namespace

std::string replay_report_text(const ReplayResult& r) {
  std::string out;
  if (!r.attention.empty()) {
    // Groups of ops by (kernel, reason), in order of first appearance.
    struct Group {
      AttentionKernelChoice kernel;
      std::vector<std::string> ops;
    };
    std::vector<Group> groups;
    for (const AttentionOpKernel& a : r.attention) {
      auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
        return g.kernel.kernel == a.kernel.kernel && g.kernel.reason == a.kernel.reason &&
               g.kernel.fused == a.kernel.fused;
      });
      if (it == groups.end()) it = groups.insert(groups.end(), Group{a.kernel, {}});
      it->ops.push_back(a.op);
    }
    out += "attention kernels:\n";
    for (const Group& g : groups) {
      const std::size_t shown = std::min<std::size_t>(g.ops.size(), 3);
      out += fmt::format(
          "  {} op(s) on {} ({}){}: {}{}\n", g.ops.size(), g.kernel.kernel,
          g.kernel.fused ? "fused" : "FALLBACK",
          g.kernel.fused ? "" : ", because " + g.kernel.reason,
          fmt::join(g.ops.begin(), g.ops.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
          g.ops.size() > shown ? fmt::format(", ... ({} more)", g.ops.size() - shown) : "");
    }
  }
  if (!r.memory.empty()) {
    out +=
        "device memory per rank (measured after the warm-up; high-water marks in device "
        "order):\n";
    for (const RankMemory& m : r.memory) {
      const MemorySplit& s = m.split;
      out += fmt::format(
          "  rank{}: forecast peak {}; measured plan tensors {} used high, {} reserved "
          "high",
          m.rank, m.forecast_peak_bytes >= 0 ? gib(m.forecast_peak_bytes) : "n/a",
          gib(s.plan_used_high), gib(s.plan_reserved_high));
      out += fmt::format(
          "; runtime overheads {} (context {}, NCCL {}, library workspaces {}); replay scratch "
          "{}; total {}",
          gib(s.runtime_overheads()), gib(s.context), gib(s.comm_buffers),
          gib(s.library_workspaces), gib(s.replay_scratch), gib(s.total()));
      if (s.device_used >= 0) out += fmt::format(" (device reports {} in use)", gib(s.device_used));
      if (s.allocator_retries > 0) {
        out += fmt::format(
            "; {} allocation(s) succeeded only after synchronizing and releasing the pool's "
            "unused reservations (timing of those steps includes the wait)",
            s.allocator_retries);
      }
      out += "\n";
      if (!m.marks.empty()) {
        out += fmt::format("    marks: {} samples, used high {} at {}", m.marks.size(),
                           gib(m.used_high_bytes), m.used_high_op);
        if (m.reserved_high_bytes >= 0) {
          out += fmt::format(", reserved high {}", gib(m.reserved_high_bytes));
        }
        out += "\n";
      }
    }
  }
  return out;
}

std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> out;
  CpuDeviceOptions cpu;
  out.push_back(make_cpu_device(cpu)->info());
  if (gpu_plugin_built()) {
    // A module that does not load lists no GPU here; replay and calibrate say why.
    if (auto gpu = load_gpu_plugin()) {
      for (DeviceInfo& info : (*gpu)->list_cuda_devices()) out.push_back(std::move(info));
    }
  }
  return out;
}

}  // namespace offsim::backends
