// replay_mpi(): `mpirun -np N offsim replay --mpi ...` — one process per rank.
//
// Every process loads the same plan and expands its representatives (sim::expand_representatives)
// into every rank they stand for. When the processes are enough, process p replays rank p of the
// expanded plan; otherwise the plan's own representative ranks run (as many as there are
// processes) and their peers are emulated as in a single-process replay (collectives among the
// members that run, sends to a peer that does not run as local copies), and the result says so.
// Processes beyond the ranks idle. Before the replay the processes agree on every communicator
// group in one order and create one MPI communicator per group (the CPU device's stand-in for
// NCCL: its collectives and p2p exchange bytes through MPI, see mpi_device.h); each step starts
// after a barrier of the running processes. Every member of a group also joins one communicator
// of its device with the id the group's first member made and MPI_Bcast to the others (on GPUs
// the NCCL communicator that carries the group's collectives and p2p; --device cuda drives
// GPU = the process's local rank). Each process's spans, pool traces and step times are
// gathered to world rank 0, which merges them into one measured timeline of the original plan's
// ops (comparable with the forecast).
//
// Failures: replay_mpi() returns this process's error; the caller reports it with
// MpiSession::abort(), which names the rank and ends every process (MPI_Abort).
//
//   auto session = backends::MpiSession::start();            // MPI_Init_thread (MULTIPLE)
//   if (!session) { ... session.error().message ... }
//   auto r = backends::replay_mpi(**session, plan, options);
//   if (!r) (*session)->abort(r.error());                     // never returns
//   if (r->root) { ... r->merged.timeline ... r->note ... }
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/replay.h"
#include "sim/core/result.h"
#include "sim/plan/plan.h"

namespace offsim::backends {

// MPI for the life of the object (MPI_Init_thread with MPI_THREAD_MULTIPLE, MPI_Finalize).
class MpiSession {
 public:
  // Fails with kUnsupported when offsim was built without MPI or the library lacks
  // MPI_THREAD_MULTIPLE.
  static sim::Result<std::unique_ptr<MpiSession>> start();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The process's index among those on its node: OMPI_COMM_WORLD_LOCAL_RANK when set, else from
  // MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). The GPU a process would use.
  int local_rank() const { return local_rank_; }
  std::string host() const { return host_; }

  // Collective: the lowest world rank whose `ok` is false, or -1 when every process is ok.
  int first_failed(bool ok) const;
  // Prints "offsim: error: rank R of N (host): message" and ends every process.
  [[noreturn]] void abort(const sim::Error& error) const;

 private:
  MpiSession() = default;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  std::string host_;
};

struct MpiReplayResult {
  bool root = false;       // world rank 0: `merged` holds every process's measurements
  ReplayResult merged;     // rank 0 only
  std::vector<int> ranks;  // the plan ranks that ran, by process (fewer than processes: idle ones)
  int processes = 0;
  bool subset = false;  // the expanded plan had more ranks than processes
  std::string note;     // which ranks ran where, and what was emulated
};

sim::Result<MpiReplayResult> replay_mpi(const MpiSession& session, const sim::Plan& plan,
                                        const ReplayOptions& options);

}  // namespace offsim::backends
