// replay --mpi in a build without MPI: every entry point says how to get it.
#include <cstdio>
#include <cstdlib>

#include "backends/mpi_replay.h"

namespace offsim::backends {

sim::Result<std::unique_ptr<MpiSession>> MpiSession::start() {
  return sim::fail(sim::ErrorCode::kUnsupported,
                   "replay --mpi: offsim was built without MPI (install an MPI library such as "
                   "Open MPI and configure with OFFSIM_WITH_MPI=ON)");
}

MpiSession::~MpiSession() = default;

int MpiSession::first_failed(bool ok) const { return ok ? -1 : 0; }

void MpiSession::abort(const sim::Error& error) const {
  std::fprintf(stderr, "offsim: error: %s\n", error.message.c_str());
  std::exit(1);
}

sim::Result<MpiReplayResult> replay_mpi(const MpiSession&, const sim::Plan&, const ReplayOptions&) {
  return sim::fail(sim::ErrorCode::kUnsupported, "replay --mpi: offsim was built without MPI");
}

}  // namespace offsim::backends
