// Memory as frameworks meet it: per-class dtypes and their presets (bytes per parameter by hand),
// the demand of steps that do not fit, the runtime's overheads and the device allocator replay,
// the report's structure and the warning for host state replicated over data-parallel ranks.
#include <gtest/gtest.h>

#include <algorithm>

#include "models/evaluate.h"
#include "models/formulas.h"
#include "models/plan_size.h"
#include "models/runtime.h"
#include "models/step_builder.h"
#include "sim/engine/simulator.h"
#include "sim/platform/profile.h"

namespace offsim::models {
namespace {

using sim::DType;
constexpr std::int64_t kMiB = 1 << 20;
constexpr std::int64_t kGiB = 1LL << 30;

Scenario base(const std::string& model, const std::string& system) {
  Scenario s;
  s.name = "memory";
  s.model = *find_model(model);
  s.hardware.system = system;
  s.training = {.global_batch = 8, .micro_batch = 1, .seq_len = 2048};
  return s;
}

Report run(const Scenario& s) {
  auto e = evaluate(s, {});
  EXPECT_TRUE(e) << (e ? "" : e.error().message);
  return e ? e->report : Report{};
}

TrainingConfig with_preset(const std::string& name) {
  TrainingConfig t;
  t.dtypes = *dtype_preset(name);
  return t;
}

// --- dtypes ---------------------------------------------------------------------------------

TEST(Dtypes, PresetsGiveTheFrameworksBytesPerParameter) {
  // Megatron-Core docs/distrib_optimizer.md: fp16/bf16 params with fp32 grads 18 B, fp32 16 B;
  // ZeRO paper: 2 + 2 + 12 = 16 B; FSDP2 and MaxText fp32 weights are their own master: 16 B;
  // optax mu_dtype bf16 saves 2 B of the first moment: 14 B.
  const std::pair<const char*, std::int64_t> expected[] = {
      {"megatron_fp16", 18},   {"megatron_bf16", 18},  {"megatron_fp32", 16},
      {"deepspeed_fp16", 16},  {"deepspeed_bf16", 18}, {"fsdp2_mixed", 16},
      {"maxtext_default", 16}, {"maxtext_bf16_mu", 14}};
  for (const auto& [name, bytes] : expected) {
    EXPECT_EQ(resolve_dtypes(with_preset(name)).state_bytes_per_param(), bytes) << name;
  }
  EXPECT_EQ(list_dtype_presets().size(), std::size(expected));
  // Defaults as before: bf16 weights and grads, fp32 master and moments = 16 B; without the
  // master 12 B; fp8 GEMMs keep bf16 weights.
  TrainingConfig t;
  EXPECT_EQ(resolve_dtypes(t).state_bytes_per_param(), 16);
  t.fp32_master_weights = false;
  EXPECT_EQ(resolve_dtypes(t).state_bytes_per_param(), 12);
  t.compute_dtype = DType::kFp8;
  EXPECT_EQ(resolve_dtypes(t).params, DType::kBf16);
  // fp32 weights with the default fp32 master: the weights are the master, no copy.
  EXPECT_FALSE(resolve_dtypes(with_preset("maxtext_default")).master.has_value());
  EXPECT_EQ(resolve_dtypes(with_preset("fsdp2_mixed")).all_gather, DType::kBf16);
  EXPECT_EQ(resolve_dtypes(with_preset("maxtext_default")).all_gather, DType::kFp32);
  EXPECT_FALSE(dtype_preset("megatron_fp8"));
}

TEST(Dtypes, StaticMemoryShardsEachClassAsZeroDoes) {
  const std::int64_t psi = 1000;
  // Megatron fp16 params, fp32 grads, distributed optimizer over d = 4: 6 + 12/d = 9 B/param:
  // params 2Ψ = 2000, grads 4Ψ = 4000, master + moments 12Ψ/4 = 3000 (master 4Ψ/4 = 1000).
  const StaticMemory m =
      static_memory(psi, {.dp = 4, .zero_stage = 1}, resolve_dtypes(with_preset("megatron_fp16")));
  EXPECT_EQ(m.params_bytes, 2000);
  EXPECT_EQ(m.grads_bytes, 4000);
  EXPECT_EQ(m.optimizer_bytes, 3000);
  EXPECT_EQ(m.master_bytes, 1000);
  // FSDP2 over 8: fp32 params 4Ψ/8 = 500, fp32 grads 500, no master, moments 8Ψ/8 = 1000.
  const StaticMemory f =
      static_memory(psi, {.dp = 8, .fsdp = true}, resolve_dtypes(with_preset("fsdp2_mixed")));
  EXPECT_EQ(f.params_bytes, 500);
  EXPECT_EQ(f.grads_bytes, 500);
  EXPECT_EQ(f.optimizer_bytes, 1000);
  EXPECT_EQ(f.master_bytes, 0);
  // The old signature is the default dtypes: 2Ψ + 2Ψ + 12Ψ.
  const StaticMemory d = static_memory(psi, {.dp = 1}, true, DType::kBf16);
  EXPECT_EQ(d.params_bytes + d.grads_bytes + d.optimizer_bytes, 16 * psi);
}

TEST(Dtypes, TheBuilderLowersThem) {
  // llama3-8b on one rank with Megatron bf16: the plan's gradient buffers are fp32 main_grad,
  // 4 bytes per parameter, and the optimizer state 12 (master + moments).
  Scenario s = base("llama3-8b", "dgx-h100");
  s.parallelism = {.dp = 8, .zero_stage = 1};
  s.training.dtypes = *dtype_preset("megatron_bf16");
  auto step = build_step(s);
  ASSERT_TRUE(step) << step.error().message;
  const std::int64_t psi = parameter_count(s.model);
  std::int64_t grads = 0;
  std::int64_t params = 0;
  const sim::Op* reduce = nullptr;
  for (sim::TensorId id : step->plan.initial_tensors) {
    const sim::Tensor& t = step->plan.tensors[id.index()];
    if (t.category == sim::TensorCategory::kGrads) grads += t.bytes;
    if (t.category == sim::TensorCategory::kParams) params += t.bytes;
  }
  EXPECT_EQ(grads, 4 * psi);
  EXPECT_EQ(params, 2 * psi);
  for (const sim::Op& op : step->plan.ops) {
    if (op.name == "mb0.l0.grad_reducescatter") reduce = &op;
  }
  ASSERT_NE(reduce, nullptr);
  // Reduced in fp32: 4 bytes per parameter of layer 0.
  EXPECT_EQ(reduce->sizes.bytes, 4 * layer_parameter_count_per_rank(s.model, 1));

  // FSDP2 mixed precision: gathered weights in bf16 (2 B), sharded fp32 weights (4 B / 8).
  s.parallelism = {.dp = 8, .fsdp = true};
  s.training.dtypes = *dtype_preset("fsdp2_mixed");
  step = build_step(s);
  ASSERT_TRUE(step) << step.error().message;
  bool found = false;
  for (const sim::Tensor& t : step->plan.tensors) {
    if (t.name.starts_with("l0.") && t.name.ends_with(".params_gathered")) {
      EXPECT_EQ(t.bytes, 2 * layer_parameter_count_per_rank(s.model, 1)) << t.name;
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

TEST(Dtypes, MasterRemaindersHoldTheBitsTheWeightsDoNot) {
  // Transformer Engine's store_param_remainders: bf16 weights, bf16 grads, a 2-byte master and
  // fp32 moments = 2 + 2 + 2 + 8 = 14 B per parameter (16 with a whole fp32 master).
  TrainingConfig t;
  t.store_param_remainders = true;
  const ResolvedDtypes d = resolve_dtypes(t);
  EXPECT_TRUE(d.master_remainders);
  EXPECT_EQ(d.master_bytes(), 2);
  EXPECT_EQ(d.state_bytes_per_param(), 14);
  const StaticMemory m = static_memory(1000, {.dp = 4, .zero_stage = 1}, d);
  EXPECT_EQ(m.master_bytes, 500);
  EXPECT_EQ(m.optimizer_bytes, 2500);

  // In the plan: layer 0's master is 2 bytes per parameter of its shard, and its update reads
  // the gradient (2), reads and writes the remainders and the weights (2 x 2 + 2 x 2) and both
  // moments (2 x 8): 26 bytes per parameter instead of 28.
  Scenario s = base("llama3-8b", "dgx-h100");
  s.parallelism = {.dp = 8, .zero_stage = 1};
  s.training.store_param_remainders = true;
  ASSERT_TRUE(check_scenario(s));
  auto step = build_step(s);
  ASSERT_TRUE(step) << step.error().message;
  const std::int64_t shard = ceil_div(layer_parameter_count_per_rank(s.model, 1), 8);
  const sim::Tensor* master = nullptr;
  for (const sim::Tensor& x : step->plan.tensors) {
    if (x.name == "l0.master") master = &x;
  }
  ASSERT_NE(master, nullptr);
  EXPECT_EQ(master->bytes, 2 * shard);
  const sim::Op* adam = nullptr;
  for (const sim::Op& op : step->plan.ops) {
    if (op.name == "l0.adam") adam = &op;
  }
  ASSERT_NE(adam, nullptr);
  EXPECT_EQ(adam->sizes.bytes, 26 * shard);
}

TEST(Dtypes, CombinationsNoFrameworkRunsAreInputErrors) {
  const auto error_of = [](auto edit) {
    Scenario s = base("llama3-8b", "dgx-h100");
    edit(s);
    const sim::Status st = check_scenario(s);
    return st ? std::string() : st.error().message;
  };
  EXPECT_NE(error_of([](Scenario& s) {
              s.training.dtypes.first_moment = DType::kFp16;
            }).find("training.dtypes.first_moment"),
            std::string::npos);
  EXPECT_NE(error_of([](Scenario& s) {
              s.training.dtypes.params = DType::kFp16;
              s.training.dtypes.grads = DType::kBf16;
            }).find("training.dtypes.grads"),
            std::string::npos);
  EXPECT_NE(error_of([](Scenario& s) {
              s.training.dtypes.params = DType::kFp32;
              s.training.dtypes.master = DType::kBf16;
            }).find("training.dtypes.master"),
            std::string::npos);
  EXPECT_NE(error_of([](Scenario& s) {
              s.training.dtypes.params = DType::kFp8;
            }).find("training.dtypes.params"),
            std::string::npos);
  EXPECT_NE(error_of([](Scenario& s) {
              s.training.dtypes.all_gather = DType::kFp16;
            }).find("training.dtypes.all_gather"),
            std::string::npos);
  EXPECT_NE(error_of([](Scenario& s) {
              s.training.fp32_master_weights = false;
              s.training.dtypes.master = DType::kFp32;
            }).find("training.dtypes.master"),
            std::string::npos);
  // Remainders complete bf16 weights to an fp32 master, on the GPU.
  EXPECT_NE(error_of([](Scenario& s) {
              s.training.store_param_remainders = true;
              s.training.dtypes = *dtype_preset("maxtext_default");
            }).find("training.store_param_remainders"),
            std::string::npos);
  EXPECT_NE(error_of([](Scenario& s) {
              s.training.store_param_remainders = true;
              s.training.compute_dtype = DType::kFp16;
            }).find("training.store_param_remainders"),
            std::string::npos);
  EXPECT_NE(error_of([](Scenario& s) {
              s.training.store_param_remainders = true;
              s.offload.rules.push_back(
                  {.cls = TensorClass::kOptimizerStates, .where = Placement::kHost});
            }).find("training.store_param_remainders"),
            std::string::npos);
  EXPECT_EQ(error_of([](Scenario& s) { s.training.dtypes = *dtype_preset("fsdp2_mixed"); }), "");
}

// --- demand of a step that does not fit -----------------------------------------------------

TEST(Demand, ANonFittingStepReportsWhatItNeeds) {
  // 8B on one 80 GB GPU with micro-batch 8 and no recompute does not fit. The step still runs
  // to its end: the demand is its true peak, which a run with the capacity raised reproduces to
  // the byte.
  Scenario s = base("llama3-8b", "dgx-h100");
  s.hardware.gpus = 1;
  s.training = {.global_batch = 8, .micro_batch = 8, .seq_len = 4096};
  const Report r = run(s);
  ASSERT_FALSE(r.fits);
  ASSERT_TRUE(r.oom.has_value());
  ASSERT_EQ(r.over_capacity.size(), 1u);
  const PoolDemand& d = r.over_capacity[0];
  EXPECT_EQ(d.pool, "rank0.hbm");
  EXPECT_EQ(d.capacity_bytes, r.hbm_capacity_bytes);
  EXPECT_EQ(d.demand_bytes, r.hbm_peak_bytes);
  EXPECT_EQ(d.overshoot_bytes, d.demand_bytes - d.capacity_bytes);
  EXPECT_GT(d.overshoot_bytes, 0);
  EXPECT_EQ(d.first_failure.op, r.oom->op);

  auto step = build_step(s);
  ASSERT_TRUE(step);
  for (sim::Pool& p : step->plan.pools) p.capacity_bytes = std::int64_t{1} << 50;
  auto unbounded = sim::simulate(step->plan);
  ASSERT_TRUE(unbounded);
  ASSERT_EQ(unbounded->timeline.outcome.kind, sim::OutcomeKind::kCompleted);
  for (const sim::PoolTrace& p : unbounded->timeline.pools) {
    if (p.name == "rank0.hbm") {
      EXPECT_EQ(p.peak_bytes, d.demand_bytes);
    }
  }
  // The step time of the unbounded run is kept, but JSON gives none of the rates.
  EXPECT_DOUBLE_EQ(r.step_time_s, sim::to_seconds(unbounded->timeline.makespan));
  const nlohmann::json j = report_to_json(r);
  for (const char* key : {"step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "hfu"}) {
    EXPECT_TRUE(j[key].is_null()) << key;
  }
  ASSERT_EQ(j["over_capacity"].size(), 1u);
  EXPECT_EQ(j["over_capacity"][0]["demand_bytes"].get<std::int64_t>(), d.demand_bytes);
  EXPECT_EQ(j["over_capacity"][0]["overshoot_bytes"].get<std::int64_t>(), d.overshoot_bytes);
}

TEST(Demand, AFittingStepHasNoneAndNumbersInJson) {
  Scenario s = base("llama3-8b", "dgx-h100");
  s.parallelism = {.dp = 8, .zero_stage = 1};
  const Report r = run(s);
  ASSERT_TRUE(r.fits);
  EXPECT_TRUE(r.over_capacity.empty());
  const nlohmann::json j = report_to_json(r);
  EXPECT_TRUE(j["step_time_s"].is_number());
  EXPECT_TRUE(j["over_capacity"].empty());
}

// --- report structure -----------------------------------------------------------------------

TEST(ReportStructure, RanksCarryNumericIdentityAndStagesAreBrokenDown) {
  Scenario s = base("llama3-8b", "dgx-h100");
  s.parallelism = {.dp = 2, .tp = 2, .pp = 2, .sequence_parallel = true, .zero_stage = 1};
  s.recompute.mode = RecomputeConfig::Mode::kSelective;
  const Report r = run(s);
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_EQ(r.ranks[1].stage, 1);
  EXPECT_EQ(r.ranks[1].rank, 4);  // stage × tp × dp
  EXPECT_EQ(r.ranks[1].dp_rank, 0);
  EXPECT_EQ(r.ranks[1].tp_rank, 0);
  const nlohmann::json j = report_to_json(r);
  EXPECT_EQ(j["ranks"][1]["stage"].get<int>(), 1);
  ASSERT_EQ(j["stages"].size(), 2u);
  EXPECT_EQ(j["stages"][1]["hbm_peak_bytes"].get<std::int64_t>(), r.ranks[1].hbm_peak_bytes);
  EXPECT_TRUE(j["memory"].contains("transient_bytes"));
  EXPECT_TRUE(j["memory"].contains("runtime_bytes"));
  // Re-created attention for one layer's backward is a transient, not a saved activation.
  auto step = build_step(s);
  ASSERT_TRUE(step);
  bool any = false;
  for (const sim::Tensor& t : step->plan.tensors) {
    if (t.name.ends_with(".recomputed")) {
      EXPECT_EQ(t.category, sim::TensorCategory::kTransients);
      any = true;
    }
  }
  EXPECT_TRUE(any);
}

// Megatron-Core frees a stage's forward output once it is sent (deallocate_output_tensor);
// without that, the output stays until the chunk's backward. Stage 0 of a 1F1B pipeline of
// four stages holds four micro-batches at its peak (the first backward), so the kept outputs
// add exactly four b·s·h tensors there, and none exist when outputs are deallocated.
TEST(PipelineOutputs, KeptOutputsAddOneResidualPerMicroBatchInFlight) {
  const auto scenario = [](bool deallocate) {
    Scenario s = base("llama3-8b", "dgx-h100");
    s.model.layers = 8;
    s.training.global_batch = 16;  // 8 micro-batches per data-parallel rank
    s.parallelism = {.dp = 2, .pp = 4, .deallocate_pipeline_outputs = deallocate};
    s.recompute.mode = RecomputeConfig::Mode::kFull;
    return s;
  };
  const std::int64_t residual = 2048LL * 4096 * 2;  // tokens × hidden × bf16
  const auto outputs = [](const Scenario& s) {
    auto step = build_step(s);
    EXPECT_TRUE(step);
    std::vector<std::int64_t> bytes;
    for (const sim::Tensor& t : step->plan.tensors) {
      if (t.name.ends_with(".stage_output")) bytes.push_back(t.bytes);
    }
    return bytes;
  };
  EXPECT_TRUE(outputs(scenario(true)).empty());
  // Every stage but the last sends each of its 8 micro-batches' outputs.
  EXPECT_EQ(outputs(scenario(false)), std::vector<std::int64_t>(3 * 8, residual));
  const Report freed = run(scenario(true));
  const Report kept = run(scenario(false));
  ASSERT_EQ(kept.ranks.size(), 4u);
  EXPECT_EQ(kept.ranks[0].hbm_peak_bytes - freed.ranks[0].hbm_peak_bytes, 4 * residual);
  EXPECT_EQ(kept.ranks[0].memory.activations_bytes - freed.ranks[0].memory.activations_bytes,
            4 * residual);
  // The last stage sends nothing: its peak does not move.
  EXPECT_EQ(kept.ranks[3].hbm_peak_bytes, freed.ranks[3].hbm_peak_bytes);
}

TEST(ReportStructure, HostStateReplicatedOverDataParallelRanksIsFlagged) {
  const auto flagged = [](int zero_stage) {
    Scenario s = base("llama3-8b", "dgx-h100");
    s.parallelism = {.dp = 8, .zero_stage = zero_stage};
    s.offload = *offload_preset("zero_offload", {});
    auto step = build_step(s);
    EXPECT_TRUE(step);
    return std::any_of(step->flags.begin(), step->flags.end(), [](const std::string& f) {
      return f.find("host state replicated over dp=8") != std::string::npos &&
             f.find("parallelism.zero_stage: 2") != std::string::npos;
    });
  };
  EXPECT_TRUE(flagged(0));
  EXPECT_FALSE(flagged(2));
}

// --- runtime overheads ----------------------------------------------------------------------

TEST(Runtime, OverheadsByHand) {
  // NCCL per connection: 4 MiB Simple + 8·512·8·16 = 524,288 B LL + 120·640·8·8 = 4,915,200 B
  // LL128 = 9,633,792 B; 16 channels in an NVLink domain: 154,140,672 B per communicator.
  const RuntimeModel h100 =
      runtime_model(HardwareConfig::Runtime::kPytorch, 9, 80 * kGiB, {{.ranks = 8}, {.ranks = 1}});
  EXPECT_EQ(h100.cuda_context_bytes, 300 * kMiB);
  EXPECT_EQ(h100.nccl_bytes, 154'140'672);
  EXPECT_EQ(h100.cublas_workspace_bytes, 32 * kMiB);  // ":4096:8" on Hopper
  EXPECT_EQ(h100.allocator_limit_bytes, 80 * kGiB - 300 * kMiB - 154'140'672);
  EXPECT_EQ(rounded_allocation(h100, 1), 512);
  EXPECT_EQ(rounded_allocation(h100, 513), 1024);
  // A100: ":4096:2:16:8" = 2·4 MiB + 8·16 KiB = 8,519,680 B; two communicators over PCIe/IB
  // get 2 channels each: 2 · 2 · 9,633,792 B.
  const RuntimeModel a100 =
      runtime_model(HardwareConfig::Runtime::kPytorch, 8, 80 * kGiB,
                    {{.ranks = 2, .nvlink = false}, {.ranks = 4, .nvlink = false}});
  EXPECT_EQ(a100.cublas_workspace_bytes, 8'519'680);
  EXPECT_EQ(a100.nccl_bytes, 4 * 9'633'792);
  // JAX: the pool is 75% of the HBM, context and NCCL outside it, BFC rounds to 256 B.
  const RuntimeModel jax =
      runtime_model(HardwareConfig::Runtime::kJax, 9, 80 * kGiB, {{.ranks = 8}});
  EXPECT_EQ(jax.allocator_limit_bytes, 60 * kGiB);
  EXPECT_TRUE(jax.preallocated);
  EXPECT_EQ(rounded_allocation(jax, 300), 512);
  const RuntimeModel none =
      runtime_model(HardwareConfig::Runtime::kNone, 9, 80 * kGiB, {{.ranks = 8}});
  EXPECT_EQ(none.cuda_context_bytes + none.nccl_bytes + none.cublas_workspace_bytes, 0);
  EXPECT_EQ(rounded_allocation(none, 513), 513);
}

// The workspace follows the profile's compute capability, not its name: every Blackwell part
// (10.0, 10.3, 12.0) takes Hopper's 32 MiB, Ampere and Ada (8.0, 8.9) the smaller one.
TEST(Runtime, CublasWorkspaceFollowsTheComputeCapability) {
  const auto workspace = [](const std::string& kind) {
    const auto profile = sim::platform::builtin_profile(kind);
    EXPECT_TRUE(profile.has_value()) << kind;
    return runtime_model(HardwareConfig::Runtime::kPytorch, profile->gpu.compute_capability_major(),
                         80 * kGiB, {})
        .cublas_workspace_bytes;
  };
  for (const char* kind :
       {"h100-sxm", "h200", "gh200", "b200", "gb200", "b300", "gb300", "rtx5090"}) {
    EXPECT_EQ(workspace(kind), 32 * kMiB) << kind;
  }
  for (const char* kind : {"a100-80gb", "l4", "l40s", "rtx4090", "rtx6000ada"}) {
    EXPECT_EQ(workspace(kind), 8'519'680) << kind;
  }
  EXPECT_EQ(sim::platform::builtin_profile("b300")->gpu.compute_capability.value, 10.3);
  EXPECT_EQ(sim::platform::builtin_profile("rtx5090")->gpu.compute_capability_major(), 12);
}

std::vector<AllocEvent> fragmenting_events() {
  // A 1000 B, B 5 MiB, C 12 MiB, free B, D 30 MiB.
  return {{1, 1000, false},
          {2, 5 * kMiB, false},
          {3, 12 * kMiB, false},
          {2, 5 * kMiB, true},
          {4, 30 * kMiB, false}};
}

TEST(Runtime, CachingAllocatorReservesSegments) {
  const RuntimeModel rt = runtime_model(HardwareConfig::Runtime::kPytorch, 9, 80 * kGiB, {});
  // A: 1024 B from a 2 MiB small segment. B: 5 MiB from a 20 MiB segment (rest 15 MiB split
  // off). C: 12 MiB from that 15 MiB block. B freed: a 5 MiB hole that D (30 MiB) cannot use:
  // a new 30 MiB segment. Reserved 2 + 20 + 30 = 52 MiB; allocated at most 1024 B + 42 MiB.
  const AllocatorReplay a = replay_allocator(rt, fragmenting_events(), 80 * kGiB);
  EXPECT_EQ(a.reserved_peak_bytes, 52 * kMiB);
  EXPECT_EQ(a.allocated_peak_bytes, 1024 + 42 * kMiB);
  EXPECT_EQ(a.first_failure, -1);
  // Under a 40 MiB limit D fails: no cached segment is wholly free to release; 22 MiB reserved.
  const AllocatorReplay tight = replay_allocator(rt, fragmenting_events(), 40 * kMiB);
  EXPECT_EQ(tight.first_failure, 4);
  EXPECT_EQ(tight.reserved_at_failure_bytes, 22 * kMiB);
  EXPECT_EQ(tight.reserved_peak_bytes, 52 * kMiB);  // the replay measures the demand
}

TEST(Runtime, CachedBlocksStayWithTheirStream) {
  // A 1 MiB block freed on stream 0 is not reused by a 1 MiB request on stream 1: each stream's
  // small pool takes its own 2 MiB segment (4 MiB reserved); on one stream the second request
  // reuses the first block (2 MiB). BFC shares one region whatever the stream: 1 MiB.
  const RuntimeModel rt = runtime_model(HardwareConfig::Runtime::kPytorch, 9, 80 * kGiB, {});
  const std::vector<AllocEvent> two = {
      {1, kMiB, false, 0}, {1, kMiB, true, 0}, {2, kMiB, false, 1}};
  const std::vector<AllocEvent> one = {
      {1, kMiB, false, 0}, {1, kMiB, true, 0}, {2, kMiB, false, 0}};
  EXPECT_EQ(replay_allocator(rt, two, 80 * kGiB).reserved_peak_bytes, 4 * kMiB);
  EXPECT_EQ(replay_allocator(rt, one, 80 * kGiB).reserved_peak_bytes, 2 * kMiB);
  const RuntimeModel jax = runtime_model(HardwareConfig::Runtime::kJax, 9, 80 * kGiB, {});
  EXPECT_EQ(replay_allocator(jax, two, 80 * kGiB).reserved_peak_bytes, kMiB);
}

TEST(Runtime, ExpandableSegmentsAndBfc) {
  // Expandable: the small pool maps 2 MiB; the large pool maps 20 MiB pages: 20 MiB for B and
  // C (tail 3 MiB free), D needs 30 - 3 = 27 MiB more: two pages (40 MiB). 2 + 60 = 62 MiB.
  const RuntimeModel ex =
      runtime_model(HardwareConfig::Runtime::kPytorchExpandable, 9, 80 * kGiB, {});
  EXPECT_EQ(replay_allocator(ex, fragmenting_events(), 80 * kGiB).reserved_peak_bytes, 62 * kMiB);
  // BFC in one region, 256 B granularity: the 5 MiB hole stays, D extends the region's end:
  // high water 1024 B + 5 + 12 + 30 MiB.
  const RuntimeModel jax = runtime_model(HardwareConfig::Runtime::kJax, 9, 80 * kGiB, {});
  const AllocatorReplay b = replay_allocator(jax, fragmenting_events(), 40 * kMiB);
  EXPECT_EQ(b.reserved_peak_bytes, 1024 + 47 * kMiB);
  EXPECT_EQ(b.first_failure, 4);
}

TEST(Runtime, EvaluateChargesTheFrameworkRuntime) {
  Scenario s = base("llama3-8b", "dgx-h100");
  s.parallelism = {.dp = 8, .zero_stage = 1};
  const Report plain = run(s);
  s.hardware.runtime = HardwareConfig::Runtime::kPytorch;
  const Report torch = run(s);
  ASSERT_TRUE(torch.fits) << torch.outcome;
  // Context and one data-parallel communicator live for the whole step.
  EXPECT_EQ(torch.memory.runtime_bytes, 300 * kMiB + 154'140'672);
  EXPECT_GE(torch.hbm_reserved_bytes, torch.hbm_peak_bytes);
  EXPECT_EQ(plain.hbm_reserved_bytes, 0);
  s.hardware.runtime = HardwareConfig::Runtime::kJax;
  const Report jax = run(s);
  EXPECT_EQ(jax.hbm_capacity_bytes, jax.hbm_reserved_bytes);
  EXPECT_EQ(jax.memory.runtime_bytes, 0);
  EXPECT_LT(jax.hbm_capacity_bytes, torch.hbm_capacity_bytes);
}

TEST(Runtime, PlanSizeEstimateCountsTheNewTensors) {
  // The closed-form estimate stays exact in tensors with runtimes and dtype presets (fp32 weights
  // have no master tensor; JAX's context and NCCL live outside the pool: no tensors).
  for (const auto runtime : {HardwareConfig::Runtime::kNone, HardwareConfig::Runtime::kPytorch,
                             HardwareConfig::Runtime::kJax}) {
    for (const char* preset : {"megatron_bf16", "maxtext_default"}) {
      Scenario s = base("llama3-8b", "dgx-h100");
      s.parallelism = {.dp = 4, .tp = 2, .zero_stage = 1};
      s.hardware.runtime = runtime;
      s.training.dtypes = *dtype_preset(preset);
      auto step = build_step(s);
      ASSERT_TRUE(step) << step.error().message;
      EXPECT_EQ(estimate_plan_size(s).tensors, static_cast<double>(step->plan.tensors.size()))
          << to_string(runtime) << " " << preset;
    }
  }
}

}  // namespace
}  // namespace offsim::models
