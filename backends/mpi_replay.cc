#include "backends/mpi_replay.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "backends/cpu_device.h"
#include "backends/gpu_plugin.h"
#include "backends/mpi_device.h"
#include "sim/trace/timeline_json.h"

namespace offsim::backends {

sim::Result<std::unique_ptr<MpiSession>> MpiSession::start() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    return sim::fail(sim::ErrorCode::kInternal, "MPI is already initialized in this process");
  }
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    return sim::fail(sim::ErrorCode::kDevice, "MPI_Init_thread failed");
  }
  std::unique_ptr<MpiSession> s(new MpiSession());
  MPI_Comm_rank(MPI_COMM_WORLD, &s->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &s->size_);
  if (provided < MPI_THREAD_MULTIPLE) {
    // Each stream of the device is a thread that may wait on MPI messages.
    return sim::fail(sim::ErrorCode::kUnsupported,
                     "replay --mpi needs an MPI library with MPI_THREAD_MULTIPLE; this one "
                     "provides level {} of {}",
                     provided, MPI_THREAD_MULTIPLE);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  s->host_.assign(name, static_cast<std::size_t>(std::max(len, 0)));
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (local != nullptr && *local != '\0') {
    s->local_rank_ = std::atoi(local);
  } else {
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, s->rank_, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &s->local_rank_);
    MPI_Comm_free(&node);
  }
  return s;
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

int MpiSession::first_failed(bool ok) const {
  int mine = ok ? INT_MAX : rank_;
  int lowest = INT_MAX;
  MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return lowest == INT_MAX ? -1 : lowest;
}

void MpiSession::abort(const sim::Error& error) const {
  std::fprintf(stderr, "offsim: error: rank %d of %d (%s): %s\n", rank_, size_, host_.c_str(),
               error.message.c_str());
  std::fflush(stderr);
  const bool input = error.code == sim::ErrorCode::kInvalidInput ||
                     error.code == sim::ErrorCode::kNotFound ||
                     error.code == sim::ErrorCode::kLimitExceeded;
  MPI_Abort(MPI_COMM_WORLD, input ? 2 : 1);
  std::abort();  // MPI_Abort does not return
}

namespace {

std::vector<int> named_ranks(const sim::Plan& plan) {
  std::set<int> named;
  for (const sim::Lane& lane : plan.lanes) {
    if (lane.rank >= 0) named.insert(lane.rank);
  }
  if (named.empty()) named.insert(0);
  return {named.begin(), named.end()};
}

bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Every communicator group (sorted global ranks) the replay of `run` ranks creates: the same
// members the replay puts in each collective and p2p (replay.cc, comm_members()).
std::set<std::vector<int>> comm_groups(const sim::Plan& plan, const std::vector<int>& run) {
  std::set<std::vector<int>> groups;
  for (const sim::Op& op : plan.ops) {
    if (op.kind != sim::OpKind::kCollective && op.kind != sim::OpKind::kP2P) continue;
    const int lane_rank = plan.lanes[op.lane.index()].rank;
    const int self = lane_rank < 0 ? run.front() : lane_rank;
    if (!contains(run, self)) continue;
    std::vector<int> members;
    if (op.kind == sim::OpKind::kP2P) {
      if (!contains(run, op.sizes.peer) || op.sizes.peer == self) continue;
      members = {std::min(self, op.sizes.peer), std::max(self, op.sizes.peer)};
    } else {
      const std::vector<int>& group =
          op.sizes.collective.group.empty() ? run : op.sizes.collective.group;
      for (int g : group) {
        if (contains(run, g) && !contains(members, g)) members.push_back(g);
      }
      if (members.size() < 2 || !contains(members, self)) continue;
      std::sort(members.begin(), members.end());
    }
    groups.insert(std::move(members));
  }
  return groups;
}

nlohmann::json result_to_json(const ReplayResult& r) {
  nlohmann::json j;
  j["timeline"] = sim::timeline_to_json(r.timeline);
  nlohmann::json steps = nlohmann::json::array();
  for (sim::Duration d : r.step_times) steps.push_back(d.count());
  j["step_times_ns"] = steps;
  nlohmann::json pools = nlohmann::json::array();
  for (const PoolHighWater& p : r.pools) {
    pools.push_back({{"pool", p.pool},
                     {"planned_peak_bytes", p.planned_peak_bytes},
                     {"used_high_bytes", p.used_high_bytes},
                     {"reserved_high_bytes", p.reserved_high_bytes}});
  }
  j["pools"] = pools;
  return j;
}

// Gathers each process's `payload` on world rank 0 (empty elsewhere).
sim::Result<std::vector<std::string>> gather_strings(const MpiSession& session,
                                                     const std::string& payload) {
  if (payload.size() > static_cast<std::size_t>(INT_MAX)) {
    return sim::fail(sim::ErrorCode::kLimitExceeded,
                     "the measurements of one rank are {} bytes of JSON, over MPI's 2 GiB per "
                     "message; replay fewer layers",
                     payload.size());
  }
  const int len = static_cast<int>(payload.size());
  std::vector<int> lens(static_cast<std::size_t>(session.size()), 0);
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<int> offsets(lens.size(), 0);
  std::int64_t total = 0;
  for (std::size_t i = 0; i < lens.size(); ++i) {
    offsets[i] = static_cast<int>(std::min<std::int64_t>(total, INT_MAX));
    total += lens[i];
  }
  if (session.rank() == 0 && total > INT_MAX) {
    return sim::fail(sim::ErrorCode::kLimitExceeded,
                     "the measurements of all ranks are {} bytes of JSON, over MPI's 2 GiB per "
                     "gather; replay fewer layers",
                     total);
  }
  std::string all(session.rank() == 0 ? static_cast<std::size_t>(total) : 0, '\0');
  MPI_Gatherv(payload.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, 0,
              MPI_COMM_WORLD);
  std::vector<std::string> out;
  if (session.rank() == 0) {
    for (std::size_t i = 0; i < lens.size(); ++i) {
      out.push_back(
          all.substr(static_cast<std::size_t>(offsets[i]), static_cast<std::size_t>(lens[i])));
    }
  }
  return out;
}

void set_metadata(sim::Timeline& t, const std::string& key, const std::string& value) {
  for (auto& [k, v] : t.metadata) {
    if (k == key) {
      v = value;
      return;
    }
  }
  t.metadata.emplace_back(key, value);
}

// Merges the other processes' measurements into rank 0's `merged`.
sim::Status merge(const sim::Plan& full, const std::vector<int>& run,
                  const std::vector<std::string>& payloads, ReplayResult& merged) {
  sim::Timeline& t = merged.timeline;
  for (std::size_t q = 1; q < run.size() && q < payloads.size(); ++q) {
    const std::string source = fmt::format("measurements of rank {} (process {})", run[q], q);
    nlohmann::json j = nlohmann::json::parse(payloads[q], nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("timeline")) {
      return sim::fail(sim::ErrorCode::kInternal, "{}: not a JSON object with a timeline", source);
    }
    OFFSIM_ASSIGN_OR_RETURN(sim::Timeline other, sim::timeline_from_json(j["timeline"], source));
    t.spans.insert(t.spans.end(), other.spans.begin(), other.spans.end());
    for (std::size_t p = 0; p < full.pools.size() && p < other.pools.size() && p < t.pools.size();
         ++p) {
      if (full.pools[p].kind == sim::PoolKind::kHbm && full.pools[p].owner == run[q]) {
        t.pools[p] = other.pools[p];
      }
    }
    const auto& steps = j.value("step_times_ns", nlohmann::json::array());
    for (std::size_t s = 0; s < steps.size() && s < merged.step_times.size(); ++s) {
      merged.step_times[s] =
          std::max(merged.step_times[s], sim::Duration{steps[s].get<std::int64_t>()});
    }
    for (const auto& p : j.value("pools", nlohmann::json::array())) {
      merged.pools.push_back(PoolHighWater{p.at("pool").get<std::string>(),
                                           p.at("planned_peak_bytes").get<std::int64_t>(),
                                           p.at("used_high_bytes").get<std::int64_t>(),
                                           p.at("reserved_high_bytes").get<std::int64_t>()});
    }
  }
  std::sort(t.spans.begin(), t.spans.end(), [](const sim::Span& a, const sim::Span& b) {
    return a.end != b.end ? a.end < b.end : a.op < b.op;
  });
  return sim::ok();
}

// The merged timeline cut back to the ops, lanes and pools of the plan the expansion started
// from (the copies come after them, so ids are unchanged).
void keep_original(const sim::Plan& plan, sim::Timeline& t) {
  t.ops.resize(std::min(t.ops.size(), plan.ops.size()));
  t.lanes.resize(std::min(t.lanes.size(), plan.lanes.size()));
  if (t.lane_identity.size() > plan.lanes.size()) t.lane_identity.resize(plan.lanes.size());
  t.pools.resize(std::min(t.pools.size(), plan.pools.size()));
  std::erase_if(t.spans, [&](const sim::Span& s) { return s.op.index() >= plan.ops.size(); });
  t.makespan = sim::kTimeZero;
  for (const sim::Span& s : t.spans) t.makespan = std::max(t.makespan, s.end);
}

// A short fingerprint of a communicator id (FNV-1a, 64 bits), for the record of who joined what.
std::string id_fingerprint(const Device::CommUniqueId& id) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : id) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

// This process's device: the CPU device, or GPU `local_rank` through the GPU module.
sim::Result<std::unique_ptr<Device>> make_process_device(const MpiSession& session,
                                                         const ReplayOptions& options,
                                                         const CpuDeviceOptions& cpu) {
  if (options.device == DeviceKind::kCpu) return make_cpu_device(cpu);
  auto plugin = load_gpu_plugin();
  if (!plugin) return sim::fail(sim::with_context(plugin.error(), "replay --mpi on cuda: "));
  auto dev = (*plugin)->make_cuda_device(session.local_rank(), 1);
  if (!dev) {
    return sim::fail(sim::with_context(
        dev.error(), fmt::format("replay --mpi on cuda (GPU {}, the process's local rank): ",
                                 session.local_rank())));
  }
  return std::move(*dev);
}

// Every group this process is a member of gets one communicator of the device: its first member
// makes the id (NCCL: ncclGetUniqueId), MPI_Bcast carries the 128 bytes to the others, every
// member joins with its position in the group. Groups are visited in the same (sorted) order in
// every process, so no two processes wait on each other's groups in opposite orders. `record`
// gets "ranks G as member I id FINGERPRINT" per group.
sim::Result<std::map<std::vector<int>, CommId>> join_groups(
    Device& device, const std::map<std::vector<int>, MPI_Comm>& groups, int mine,
    std::vector<std::string>& record) {
  std::map<std::vector<int>, CommId> joined;
  for (const auto& [members, comm] : groups) {
    const int me =
        static_cast<int>(std::find(members.begin(), members.end(), mine) - members.begin());
    Device::CommUniqueId id{};
    if (me == 0) {
      OFFSIM_ASSIGN_OR_RETURN(id, device.new_comm_unique_id());
    }
    if (MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_CHAR, 0, comm) != MPI_SUCCESS) {
      return sim::fail(sim::ErrorCode::kDevice,
                       "MPI_Bcast of the communicator id for ranks {} failed",
                       fmt::join(members, ","));
    }
    auto c = device.join_communicator(0, static_cast<int>(members.size()), me, id);
    if (!c) {
      return sim::fail(sim::with_context(
          c.error(), fmt::format("communicator of ranks {}: ", fmt::join(members, ","))));
    }
    joined.emplace(members, *c);
    record.push_back(fmt::format("ranks {} as member {} id {}", fmt::join(members, ","), me,
                                 id_fingerprint(id)));
  }
  return joined;
}

struct Comms {
  std::map<std::vector<int>, MPI_Comm> groups;
  MPI_Comm runners = MPI_COMM_NULL;
  ~Comms() {
    for (auto& [members, c] : groups) MPI_Comm_free(&c);
    if (runners != MPI_COMM_NULL) MPI_Comm_free(&runners);
  }
};

// Which ranks run: every rank of the expanded plan when there are enough processes, else the
// plan's representatives (as many as there are processes); the note says which were emulated.
void choose_mpi_ranks(const MpiSession& session, const std::vector<int>& every,
                      const std::vector<int>& representatives, MpiReplayResult& out) {
  const auto n = static_cast<std::size_t>(session.size());
  if (every.size() <= n) {
    out.ranks = every;
  } else {
    out.subset = true;
    out.ranks.assign(
        representatives.begin(),
        representatives.begin() + static_cast<std::ptrdiff_t>(std::min(representatives.size(), n)));
  }
  const std::vector<int>& run = out.ranks;
  if (out.subset) {
    std::vector<int> emulated;
    for (int r : every) {
      if (!contains(run, r)) emulated.push_back(r);
    }
    out.note = fmt::format(
        "the plan has {} ranks but {} processes ran: ranks {} ran ({} of the plan's {} "
        "representatives), "
        "ranks {} were emulated (collectives among the ranks that ran, sends to a rank that did "
        "not run as local copies)",
        every.size(), n, fmt::join(run, ","), run.size(), representatives.size(),
        fmt::join(emulated, ","));
  } else {
    out.note = fmt::format("{} processes ran ranks {}, one each{}", n, fmt::join(run, ","),
                           run.size() < n ? fmt::format(" ({} idle)", n - run.size()) : "");
  }
}

// Every process creates the groups in the same order (MPI_Comm_split is collective), then the
// communicator of the processes that run a rank.
sim::Status split_comms(const MpiSession& session, const sim::Plan& full,
                        const std::vector<int>& run, int mine, Comms& comms) {
  for (const std::vector<int>& g : comm_groups(full, run)) {
    const bool member = contains(g, mine);
    const int key = member ? static_cast<int>(std::find(g.begin(), g.end(), mine) - g.begin()) : 0;
    MPI_Comm c = MPI_COMM_NULL;
    if (MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, key, &c) != MPI_SUCCESS) {
      return sim::fail(sim::ErrorCode::kDevice, "MPI_Comm_split for ranks {} failed",
                       fmt::join(g, ","));
    }
    if (member) comms.groups.emplace(g, c);
  }
  MPI_Comm_split(MPI_COMM_WORLD, mine >= 0 ? 0 : MPI_UNDEFINED, session.rank(), &comms.runners);
  return sim::ok();
}

// This process's rank `mine` of the expanded plan, on its device wrapped in the MPI transport;
// `joins` receives the communicators it joined.
sim::Result<ReplayResult> replay_own_rank(const MpiSession& session, const sim::Plan& full,
                                          const ReplayOptions& options, const std::vector<int>& run,
                                          int mine, const Comms& comms,
                                          std::vector<std::string>& joins) {
  CpuDeviceOptions cpu = options.cpu;
  cpu.ranks = 1;
  MpiDeviceOptions mo;
  mo.globals = {mine};
  for (int r : run) {
    if (r != mine) mo.globals.push_back(r);
  }
  mo.local_ranks = 1;
  mo.groups = comms.groups;
  mo.max_message_bytes = cpu.max_buffer_bytes;
  mo.timeout = options.watchdog_timeout;
  ReplayOptions o = options;
  o.ranks = {mine};
  o.remote_ranks.assign(mo.globals.begin() + 1, mo.globals.end());
  o.run_unranked_lanes = session.rank() == 0;
  MPI_Comm runners = comms.runners;
  o.before_step = [runners](int step) -> sim::Status {
    if (MPI_Barrier(runners) != MPI_SUCCESS) {
      return sim::fail(sim::ErrorCode::kDevice, "MPI_Barrier before step {} failed", step);
    }
    return sim::ok();
  };
  // A failure below destroys the device before the caller's MPI_Abort: the CUDA device
  // aborts its NCCL communicators (ncclCommAbort) when it goes away after an error.
  OFFSIM_ASSIGN_OR_RETURN(std::unique_ptr<Device> inner,
                          make_process_device(session, options, cpu));
  OFFSIM_ASSIGN_OR_RETURN(auto joined, join_groups(*inner, comms.groups, mine, joins));
  // On the CPU device the bytes travel by MPI messages (the joined one-member communicators
  // only rehearse the agreement); on GPUs NCCL carries them.
  if (options.device != DeviceKind::kCpu) mo.joined = std::move(joined);
  std::unique_ptr<Device> device = make_mpi_device(std::move(inner), mo);
  return replay_on(*device, full, o);
}

// Who joined which communicator with which id, per rank (every member must hold its first
// member's id): rank 0's own joins, then those each other process sent with its result.
std::vector<std::string> all_joins(const std::vector<int>& run,
                                   const std::vector<std::string>& joins,
                                   const std::vector<std::string>& payloads) {
  std::vector<std::string> all;
  for (const std::string& j : joins) all.push_back(fmt::format("rank {}: {}", run[0], j));
  for (std::size_t q = 1; q < run.size() && q < payloads.size(); ++q) {
    nlohmann::json j = nlohmann::json::parse(payloads[q], nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;  // merge() has checked it already
    for (const auto& e : j.value("joins", nlohmann::json::array())) {
      if (e.is_string()) all.push_back(fmt::format("rank {}: {}", run[q], e.get<std::string>()));
    }
  }
  return all;
}

// Rank 0's merged result cut back to the plan, with the ranks, skipped ops and joins it names.
void describe_merged(const sim::Plan& plan, const sim::Plan& full, const ReplayOptions& options,
                     const std::vector<std::string>& joins, int processes, MpiReplayResult& out) {
  ReplayResult& m = out.merged;
  const std::vector<int>& run = out.ranks;
  m.ranks = run;
  m.skipped_ops = 0;
  for (const sim::Op& op : full.ops) {
    const int r = full.lanes[op.lane.index()].rank;
    if (r >= 0 && !contains(run, r)) ++m.skipped_ops;
  }
  keep_original(plan, m.timeline);
  set_metadata(m.timeline, "replay.ranks", fmt::format("{}", fmt::join(run, ",")));
  set_metadata(m.timeline, "replay.skipped_ops", std::to_string(m.skipped_ops));
  set_metadata(m.timeline, "replay.mpi", out.note);
  set_metadata(m.timeline, "replay.communicators", fmt::format("{}", fmt::join(joins, "; ")));
  m.timeline.outcome.message = fmt::format("replayed {} measured steps on {} ({} processes)",
                                           options.measured_steps, m.device.name, processes);
}

}  // namespace

sim::Result<MpiReplayResult> replay_mpi(const MpiSession& session, const sim::Plan& plan,
                                        const ReplayOptions& options) {
  if (!options.ranks.empty() || options.all_ranks) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "replay --mpi chooses the ranks itself (one per process); a list of ranks "
                     "or --all-ranks does not apply");
  }
  OFFSIM_ASSIGN_OR_RETURN(sim::Plan full, sim::expand_representatives(plan));
  MpiReplayResult out;
  out.processes = session.size();
  out.root = session.rank() == 0;
  choose_mpi_ranks(session, named_ranks(full), named_ranks(plan), out);
  const std::vector<int>& run = out.ranks;
  const int mine = static_cast<std::size_t>(session.rank()) < run.size() ? run[session.rank()] : -1;
  Comms comms;
  OFFSIM_RETURN_IF_ERROR(split_comms(session, full, run, mine, comms));

  std::string payload;
  ReplayResult own;
  std::vector<std::string> joins;  // this process's communicator joins
  if (mine >= 0) {
    OFFSIM_ASSIGN_OR_RETURN(own, replay_own_rank(session, full, options, run, mine, comms, joins));
    if (!out.root) {
      nlohmann::json j = result_to_json(own);
      j["joins"] = joins;
      payload = j.dump();
    }
  }
  OFFSIM_ASSIGN_OR_RETURN(std::vector<std::string> payloads, gather_strings(session, payload));
  if (!out.root) return out;

  out.merged = std::move(own);
  OFFSIM_RETURN_IF_ERROR(merge(full, run, payloads, out.merged));
  describe_merged(plan, full, options, all_joins(run, joins, payloads), session.size(), out);
  return out;
}

}  // namespace offsim::backends
