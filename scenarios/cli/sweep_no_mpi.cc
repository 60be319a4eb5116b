#include <fmt/format.h>

#include "scenarios/cli/sweep_mpi.h"

namespace offsim::cli {

int run_sweep_mpi(const scenarios::ScenarioFile&, const scenarios::SweepRunOptions&) {
  fmt::print(stderr,
             "offsim: error: --mpi: this offsim was built without MPI (install libopenmpi-dev "
             "and reconfigure); use --shard I/N to split a sweep by hand\n");
  return 1;
}

}  // namespace offsim::cli
