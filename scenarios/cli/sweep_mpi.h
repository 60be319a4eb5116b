// run_sweep_mpi: `offsim sweep --mpi` — the points of a sweep split over MPI ranks.
//
// Rank r evaluates the remaining points k with k % size == r on its own threads and sends each
// row to rank 0 in order; rank 0 opens (or resumes) the results file and writes every row in
// point order, so the file is the same as a single-process run. Without MPI in the build it
// returns an error saying so.
//
//   // mpirun -n 4 offsim sweep s.yaml --out r.csv --mpi
//   return offsim::cli::run_sweep_mpi(file, options);   // an exit status
#pragma once

#include "scenarios/scenario_loader.h"
#include "scenarios/sweep_runner.h"

namespace offsim::cli {

int run_sweep_mpi(const scenarios::ScenarioFile& file, const scenarios::SweepRunOptions& options);

}  // namespace offsim::cli
