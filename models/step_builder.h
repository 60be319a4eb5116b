// build_step: lowers a Scenario to the Plan of one training step (target offsim_models).
//
// One representative rank is simulated per pipeline stage; its flows carry the multiplicity of
// the identical ranks it stands for (data- and tensor-parallel peers), so the plan stays small.
// Lanes: rank<r>.compute, .comm, .h2d, .d2h, .cpu. Op categories: compute, recompute, comm,
// offload, optimizer, cpu_optimizer.
//
//   OFFSIM_ASSIGN_OR_RETURN(models::BuiltStep step, models::build_step(scenario, {}));
//   fmt::print("{} ops, {:.1f} model TFLOP per step\n", step.plan.ops.size(),
//              step.model_flops_per_step / 1e12);
//   OFFSIM_ASSIGN_OR_RETURN(sim::SimResult r, sim::simulate(step.plan));
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "models/formulas.h"
#include "models/resolve.h"
#include "models/runtime.h"
#include "models/scenario.h"
#include "sim/core/result.h"
#include "sim/plan/plan.h"

namespace offsim::models {

// Options of the lowering.
struct BuildOptions {
  // A reduced step (the steady-state fast path of evaluate()): only this many micro-batches
  // (0: the scenario's), the last one named as micro-batch `last_micro_batch_label` (-1: by its
  // own index), so that its names are those the full step gives its last micro-batch.
  int micro_batches = 0;
  int last_micro_batch_label = -1;
  // Only the static state: lanes, pools and the tensors alive at t = 0 (weights, gradients,
  // optimizer state, workspace) in the full step's order, and no ops (static_memory.h).
  bool static_only = false;
  // A layer-reduced step (layer periodicity, models/README.md): only this many layers per model
  // chunk (0: all), the chunk's first n - n/2 and last n/2 layers under their own numbers, so
  // that names, per-layer policies and the chunk's first and last layers are the full step's.
  int layers_per_chunk = 0;
};

// Where one micro-batch's ops and tensors begin in the plan (ids of its first ones).
struct MicroBatchStart {
  std::size_t op = 0;
  std::size_t tensor = 0;
};

// One task of a pipeline plan (pp > 1): the forward or backward pass of micro-batch `mb` over
// model chunk `chunk` on `stage`, as the ops [op_begin, op_end) and the tensors created with
// them [tensor_begin, tensor_end); or (receive) the one receive op of such a task's send.
// `index` numbers the stage's tasks as its steady state pairs them: a forward's ordinal among
// the stage's forwards minus its warm-up forwards, a backward's ordinal among its backwards
// (1F1B: forward of micro-batch w + j and backward of j have index j, w the warm-up).
struct PipelineTask {
  int stage = 0;
  int chunk = 0;
  int mb = 0;
  bool forward = true;
  bool receive = false;
  std::int64_t index = 0;
  std::size_t op_begin = 0;
  std::size_t op_end = 0;
  std::size_t tensor_begin = 0;
  std::size_t tensor_end = 0;
};

// One simulated (representative) rank.
struct SimRankInfo {
  int rank = 0;              // global rank of the representative
  int stage = 0;             // pipeline stage
  int dp_rank = 0;           // the representative's data-parallel index
  int tp_rank = 0;           // and tensor-parallel index
  int multiplicity = 1;      // identical ranks it stands for
  sim::PoolId hbm_pool;      // its HBM
  sim::PoolId host_pool;     // the pinned host memory of its node
  sim::LaneId compute_lane;  // its compute stream
};

struct BuiltStep {
  sim::Plan plan;
  std::vector<SimRankInfo> ranks;
  int gpus = 0;
  std::int64_t tokens_per_step = 0;      // global_batch * seq_len
  double model_flops_per_step = 0.0;     // whole job, forward + backward, no recompute
  double hardware_flops_per_step = 0.0;  // whole job, with recompute
  double peak_flops_per_gpu = 0.0;       // dense peak of the compute dtype
  std::int64_t hbm_capacity_bytes = 0;
  std::int64_t host_capacity_bytes = 0;
  // Host time of issuing the simulated ops of every rank built (the framework's work per op,
  // graph replays in captured modules), whether or not it holds the GPU back.
  double host_issue_s = 0.0;
  std::vector<std::string> flags;
  RuntimeModel runtime;  // hardware.runtime's overheads (runtime.h)
  // With one pipeline stage, micro-batch i's forward and backward ops are the plan's ops from
  // micro_batch_starts[i].op on (its tensors likewise); empty with pipeline parallelism. With
  // parallelism.moe_a2a_overlap each entry starts a combined step instead (micro-batch i + 1's
  // forward and i's backward), from the second forward on.
  std::vector<MicroBatchStart> micro_batch_starts;
  // With pipeline parallelism: every task in op order (the stages' tasks, then the receives).
  std::vector<PipelineTask> pipeline_tasks;
};

sim::Result<BuiltStep> build_step(const ResolvedScenario& scenario,
                                  const BuildOptions& options = {});
// Resolves the scenario (resolve.h), then builds it.
sim::Result<BuiltStep> build_step(const Scenario& scenario, const BuildOptions& options = {});

}  // namespace offsim::models
