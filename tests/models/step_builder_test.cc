// The lowering (build_step) and evaluate(): plans are valid, static memory in the plan equals
// the closed forms, and offload behaves as it physically should on the default profiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "models/cost_model.h"
#include "models/evaluate.h"
#include "models/formulas.h"
#include "models/resolve.h"
#include "models/step_builder.h"
#include "sim/engine/simulator.h"

namespace offsim::models {
namespace {

using Mode = RecomputeConfig::Mode;
using Schedule = ParallelConfig::PipelineSchedule;

Scenario base(const std::string& model, const std::string& system) {
  Scenario s;
  s.name = "test";
  s.model = *find_model(model);
  s.hardware.system = system;
  s.training = {.global_batch = 8, .micro_batch = 1, .seq_len = 2048};
  return s;
}

std::int64_t initial_bytes(const sim::Plan& plan, sim::PoolId pool, sim::TensorCategory category) {
  std::int64_t total = 0;
  for (sim::TensorId id : plan.initial_tensors) {
    const sim::Tensor& t = plan.tensors[id.index()];
    if (t.pool == pool && t.category == category) total += t.bytes;
  }
  return total;
}

TEST(BuildStep, PlansValidateAcrossLayouts) {
  struct Case {
    ParallelConfig p;
    Mode mode;
    std::string preset;
  };
  std::vector<Case> cases = {
      {{.dp = 8}, Mode::kNone, "none"},
      {{.dp = 2, .tp = 4, .sequence_parallel = true, .zero_stage = 1},
       Mode::kSelective,
       "megatron_activation_offload"},
      {{.dp = 1, .tp = 2, .pp = 4, .schedule = Schedule::k1F1B}, Mode::kFull, "none"},
      {{.dp = 1, .tp = 2, .pp = 4, .schedule = Schedule::kInterleaved1F1B, .virtual_stages = 2},
       Mode::kSelective,
       "megatron_activation_offload"},
      {{.dp = 8, .fsdp = true}, Mode::kFull, "jax_offload_dot_with_no_batch_dims"},
      {{.dp = 8, .zero_stage = 2}, Mode::kNone, "zero_offload"},
      {{.dp = 8, .fsdp = true}, Mode::kNone, "fsdp_cpu_offload"},
  };
  for (const Case& c : cases) {
    Scenario s = base("llama3-8b", "dgx-h100");
    s.parallelism = c.p;
    s.recompute.mode = c.mode;
    s.offload = *offload_preset(c.preset, {});
    auto step = build_step(s);
    ASSERT_TRUE(step) << c.preset << ": " << step.error().message;
    auto v = sim::validate(step->plan);
    EXPECT_TRUE(v) << c.preset << ": " << (v ? "" : v.error().message);
    EXPECT_EQ(static_cast<int>(step->ranks.size()), c.p.pp);
    EXPECT_EQ(step->ranks.front().multiplicity, c.p.dp * c.p.tp);
  }
}

// Identity is typed: every lane of a pipeline plan names its rank, stage and role, every pool its
// kind and owner, and each pipeline send has exactly one receive on a lane of its peer, paired
// by id, that the receiver's consumers wait on.
TEST(BuildStep, PipelineSendsHaveExplicitReceivesAndLanesTypedIdentity) {
  for (const Schedule schedule : {Schedule::k1F1B, Schedule::kInterleaved1F1B}) {
    Scenario s = base("llama3-8b", "dgx-h100");
    s.model.layers = 8;
    s.parallelism = {.tp = 2,
                     .pp = 4,
                     .schedule = schedule,
                     .virtual_stages = schedule == Schedule::k1F1B ? 1 : 2};
    auto step = build_step(s);
    ASSERT_TRUE(step) << step.error().message;
    const sim::Plan& plan = step->plan;
    ASSERT_TRUE(sim::validate(plan));
    for (const sim::Lane& lane : plan.lanes) {
      EXPECT_GE(lane.rank, 0) << lane.name;
      EXPECT_EQ(lane.stage, lane.rank / 2) << lane.name;
      EXPECT_NE(lane.role, sim::LaneRole::kOther) << lane.name;
    }
    for (const sim::Pool& pool : plan.pools) EXPECT_NE(pool.kind, sim::PoolKind::kOther);
    std::map<std::int64_t, sim::OpId> sends, recvs;
    for (std::size_t i = 0; i < plan.ops.size(); ++i) {
      const sim::Op& op = plan.ops[i];
      if (op.kind != sim::OpKind::kP2P) continue;
      ASSERT_GE(op.sizes.p2p_pair, 0) << op.name;
      auto& into = op.sizes.p2p_role == sim::P2PRole::kSend ? sends : recvs;
      EXPECT_TRUE(into.emplace(op.sizes.p2p_pair, sim::OpId{i}).second) << op.name;
    }
    const std::int64_t m = grad_accum_steps(s.training, s.parallelism);
    EXPECT_EQ(static_cast<std::int64_t>(sends.size()),
              2 * m * (s.parallelism.pp * s.parallelism.virtual_stages - 1));
    ASSERT_EQ(sends.size(), recvs.size());
    std::vector<int> waiting(plan.ops.size(), 0);
    for (const sim::Op& op : plan.ops) {
      for (sim::OpId d : op.deps) ++waiting[d.index()];
    }
    for (const auto& [pair, send_id] : sends) {
      const sim::Op& send = plan.ops[send_id.index()];
      const sim::Op& recv = plan.ops[recvs.at(pair).index()];
      const sim::Lane& to = plan.lanes[recv.lane.index()];
      EXPECT_EQ(to.rank, send.sizes.peer) << recv.name;
      EXPECT_EQ(to.role, sim::LaneRole::kRecv) << recv.name;
      EXPECT_EQ(recv.sizes.peer, plan.lanes[send.lane.index()].rank) << recv.name;
      EXPECT_EQ(recv.sizes.bytes, send.sizes.bytes) << recv.name;
      EXPECT_EQ(recv.deps, std::vector<sim::OpId>{send_id}) << recv.name;
      EXPECT_EQ(recv.cost.work, 0.0) << recv.name;
      // The send's only waiter is its receive; the receive has consumers.
      EXPECT_EQ(waiting[send_id.index()], 1) << send.name;
      EXPECT_GE(waiting[recvs.at(pair).index()], 1) << recv.name;
    }
  }
}

TEST(BuildStep, StaticMemoryPerZeroStageMatchesClosedForms) {
  // Llama 3 8B, one stage, dp = 8: every parameter group divides by 8, so the plan's initial
  // tensors must be exactly params 2Ψ, grads 2Ψ, optimizer 12Ψ, each /8 from its ZeRO stage on.
  const std::int64_t psi = parameter_count(*find_model("llama3-8b"));
  ASSERT_EQ(psi % 8, 0);
  struct Case {
    int stage;
    bool fsdp;
    std::int64_t params, grads, opt;
  } cases[] = {{0, false, 2 * psi, 2 * psi, 12 * psi},
               {1, false, 2 * psi, 2 * psi, 12 * psi / 8},
               {2, false, 2 * psi, 2 * psi / 8, 12 * psi / 8},
               {3, false, 2 * psi / 8, 2 * psi / 8, 12 * psi / 8},
               {0, true, 2 * psi / 8, 2 * psi / 8, 12 * psi / 8}};
  for (const Case& c : cases) {
    Scenario s = base("llama3-8b", "dgx-h100");
    s.parallelism = {.dp = 8, .zero_stage = c.stage, .fsdp = c.fsdp};
    auto step = build_step(s);
    ASSERT_TRUE(step) << step.error().message;
    const sim::PoolId pool = step->ranks.front().hbm_pool;
    EXPECT_EQ(initial_bytes(step->plan, pool, sim::TensorCategory::kParams), c.params) << c.stage;
    EXPECT_EQ(initial_bytes(step->plan, pool, sim::TensorCategory::kGrads), c.grads) << c.stage;
    EXPECT_EQ(initial_bytes(step->plan, pool, sim::TensorCategory::kOptimizer), c.opt) << c.stage;
  }
}

// DeepSpeed's 2021 ZeRO-3 (param_gather per_tensor_synchronized) on four GPT-3 175B layers over
// 16 A100s in two nodes, micro-batch 1, full recompute.
Scenario zero3_2021_gpt3() {
  Scenario s = base("gpt3-175b", "dgx-a100-80gb");
  s.model.layers = 4;
  s.hardware.nodes = 2;
  s.training = {.global_batch = 16, .micro_batch = 1, .seq_len = 2048};
  s.parallelism = {.dp = 16,
                   .zero_stage = 3,
                   .param_gather = ParallelConfig::ParamGather::kPerTensorSynchronized};
  s.recompute.mode = RecomputeConfig::Mode::kFull;
  return s;
}

// The step built with the host's cudaMemcpyAsync submit cost at 5 us and at 15 us.
std::pair<BuiltStep, BuiltStep> at_submit_costs_5_and_15_us(const Scenario& s) {
  Scenario fast = s;
  Scenario slow = s;
  fast.hardware.overrides.emplace_back("profile.host_link.submit_overhead_s", 5e-6);
  slow.hardware.overrides.emplace_back("profile.host_link.submit_overhead_s", 15e-6);
  auto a = build_step(fast);
  auto b = build_step(slow);
  EXPECT_TRUE(a && b);
  if (!a || !b) return {};
  return {std::move(*a), std::move(*b)};
}

TEST(BuildStep, PerTensorSynchronizedGatherIssuesOneAllGatherPerParameterAfterTheCompute) {
  // DeepSpeed's 2021 ZeRO-3 fetch (param_gather per_tensor_synchronized) on a GPT-3-shaped model
  // with biases and LayerNorm: each layer's forward gathers its 12 parameter tensors one by one,
  // the first after the previous layer's last compute op (the device synchronisation), each
  // with the host's round trip and one cudaMemcpyAsync per rank of its list output on top of
  // NCCL's time; a fully recomputed layer's backward gathers them twice. The bytes sum to the
  // layer's shard, gathered.
  const Scenario s = zero3_2021_gpt3();
  auto step = build_step(s);
  ASSERT_TRUE(step) << step.error().message;
  const sim::Plan& plan = step->plan;
  std::vector<std::size_t> fwd;
  std::size_t bwd = 0;
  std::int64_t fwd_bytes = 0;
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    const std::string& name = plan.ops[i].name;
    if (name.rfind("l2.mb0.fwd.params_allgather", 0) == 0) {
      fwd.push_back(i);
      fwd_bytes += plan.ops[i].sizes.bytes;
    }
    if (name.rfind("l2.mb0.bwd.", 0) == 0 && name.find("params_allgather") != std::string::npos) {
      ++bwd;
    }
  }
  ASSERT_EQ(fwd.size(), 12u);
  EXPECT_EQ(bwd, 24u);
  EXPECT_EQ(fwd_bytes, 2 * layer_parameter_count_per_rank(s.model, 1));
  const sim::Op& first = plan.ops[fwd.front()];
  ASSERT_FALSE(first.deps.empty());
  const sim::Op& synced = plan.ops[first.deps.back().index()];
  EXPECT_EQ(synced.name.rfind("mb0.l1.", 0), 0u) << synced.name;  // layer 1's last forward op
  EXPECT_EQ(synced.lane, step->ranks.front().compute_lane);
  for (std::size_t i = 1; i < fwd.size(); ++i) {
    EXPECT_EQ(plan.ops[fwd[i]].lane, first.lane);  // one after another on the comm lane
  }
  // A bias of 12,288 fp16 elements over 16 ranks: NCCL's latency plus the 26.11 us round trip
  // plus 16 copies at the profile's cudaMemcpyAsync submit cost (10 us more each: 160 us more).
  const sim::Op& bias = plan.ops[fwd[1]];
  EXPECT_EQ(bias.sizes.bytes, 2 * 12288);
  EXPECT_GT(sim::to_seconds(bias.cost.latency), 26.11e-6 + 16 * 5e-6);
  const auto [a, b] = at_submit_costs_5_and_15_us(s);
  ASSERT_EQ(a.plan.ops.size(), plan.ops.size());
  EXPECT_NEAR(sim::to_seconds(b.plan.ops[fwd[1]].cost.latency - a.plan.ops[fwd[1]].cost.latency),
              160e-6, 1e-9);
}

TEST(BuildStep, PerTensorSynchronizedReducesEachParameterGradientWithItsListInputCopies) {
  // DeepSpeed's 2021 ZeRO-3 gradient reduction (v0.3.13 _reduce_scatter_gradients): one
  // reduce-scatter per parameter tensor of the layer, the first after the layer's backward, the
  // others after it on the comm lane, each with one cudaMemcpyAsync per rank for its list of
  // input views on top of NCCL's time and no synchronisation; the bytes sum to the layer's
  // gradient on the wire, and the gradient bucket is freed by the last.
  const Scenario s = zero3_2021_gpt3();
  const auto [a, b] = at_submit_costs_5_and_15_us(s);
  ASSERT_FALSE(a.plan.ops.empty());
  const sim::Plan& plan = a.plan;
  std::vector<std::size_t> rs;
  std::int64_t bytes = 0;
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    if (plan.ops[i].name.rfind("mb0.l2.grad_reducescatter", 0) == 0) {
      rs.push_back(i);
      bytes += plan.ops[i].sizes.bytes;
      EXPECT_EQ(plan.ops[i].sizes.collective.kind, sim::CollectiveKind::kReduceScatter);
    }
  }
  ASSERT_EQ(rs.size(), 12u);
  EXPECT_EQ(bytes, 2 * layer_parameter_count_per_rank(s.model, 1));
  ASSERT_EQ(plan.ops[rs.front()].deps.size(), 1u);
  EXPECT_EQ(plan.ops[plan.ops[rs.front()].deps.front().index()].lane, a.ranks.front().compute_lane);
  for (std::size_t i = 1; i < rs.size(); ++i) {
    EXPECT_TRUE(plan.ops[rs[i]].deps.empty()) << plan.ops[rs[i]].name;
    EXPECT_EQ(plan.ops[rs[i]].lane, plan.ops[rs.front()].lane);
  }
  EXPECT_TRUE(plan.ops[rs.front()].frees.empty());
  EXPECT_EQ(plan.ops[rs.back()].frees.size(), 1u);
  // 16 copies at 10 us more each, and no synchronisation round trip: 160 us more per tensor.
  for (std::size_t i : rs) {
    EXPECT_NEAR(sim::to_seconds(b.plan.ops[i].cost.latency - plan.ops[i].cost.latency), 160e-6,
                1e-9);
  }
  // The default fetch reduces the layer's gradient in one collective.
  Scenario per_layer = s;
  per_layer.parallelism.param_gather = ParallelConfig::ParamGather::kPerLayer;
  auto c = build_step(per_layer);
  ASSERT_TRUE(c);
  int reduces = 0;
  for (const sim::Op& op : c->plan.ops) {
    if (op.name.rfind("mb0.l2.grad_reducescatter", 0) == 0) ++reduces;
  }
  EXPECT_EQ(reduces, 1);
}

// FSDP's default BACKWARD_PRE prefetch: the next layer's backward all-gather is queued on the
// collective lane ahead of the current layer's reduce-scatter, so it runs while the current
// layer computes; it waits only for the start of the current layer's backward.
// Layer 30's backward all-gather and layer 31's gradient reduce-scatter of the first
// micro-batch of an FSDP step (the backward runs layer 31 first), with `prefetch`.
struct FsdpBackwardOrder {
  std::optional<BuiltStep> step;
  std::size_t gather = 0;
  std::size_t reduce = 0;
};
FsdpBackwardOrder fsdp_backward_order(ParallelConfig::BackwardPrefetch prefetch) {
  Scenario s = base("llama3-8b", "dgx-h100");
  s.training = {.global_batch = 8, .micro_batch = 1, .seq_len = 4096};
  s.parallelism = {.dp = 8, .fsdp = true, .backward_prefetch = prefetch};
  FsdpBackwardOrder o;
  auto step = build_step(s);
  if (!step) return o;
  std::optional<std::size_t> gather30;
  std::optional<std::size_t> reduce31;
  for (std::size_t i = 0; i < step->plan.ops.size(); ++i) {
    const sim::Op& op = step->plan.ops[i];
    if (op.name == "l30.mb0.bwd.params_allgather" && !gather30) gather30 = i;
    if (op.name == "mb0.l31.grad_reducescatter" && !reduce31) reduce31 = i;
  }
  if (!gather30 || !reduce31) return o;
  o.step = std::move(*step);
  o.gather = *gather30;
  o.reduce = *reduce31;
  return o;
}

TEST(BuildStep, FsdpBackwardAllGatherIsQueuedAheadOfTheReduceScatter) {
  // BACKWARD_PRE (the default): issued when layer 31's backward starts, ahead of its reduction.
  const FsdpBackwardOrder o = fsdp_backward_order(ParallelConfig::BackwardPrefetch::kPre);
  ASSERT_TRUE(o.step);
  const sim::Plan& plan = o.step->plan;
  const sim::Op& gather = plan.ops[o.gather];
  const sim::Op& reduce = plan.ops[o.reduce];
  EXPECT_EQ(gather.lane, reduce.lane);  // one process group, one lane: issue order is run order
  EXPECT_LT(o.gather, o.reduce);
  ASSERT_EQ(gather.deps.size(), 1u);
  EXPECT_EQ(plan.ops[gather.deps[0].index()].name.rfind("mb0.l31.", 0), 0u)
      << plan.ops[gather.deps[0].index()].name;
  EXPECT_EQ(std::count(reduce.deps.begin(), reduce.deps.end(), gather.deps[0]), 0);
}

TEST(BuildStep, FsdpBackwardPostWaitsForTheGradientsAndNoneForTheReduction) {
  // BACKWARD_POST: still ahead of the reduce-scatter, but after layer 31's gradients, which
  // the reduce-scatter waits for too.
  const FsdpBackwardOrder post = fsdp_backward_order(ParallelConfig::BackwardPrefetch::kPost);
  ASSERT_TRUE(post.step);
  const sim::Op& gather = post.step->plan.ops[post.gather];
  const sim::Op& reduce = post.step->plan.ops[post.reduce];
  EXPECT_LT(post.gather, post.reduce);
  ASSERT_EQ(gather.deps.size(), 1u);
  EXPECT_EQ(std::count(reduce.deps.begin(), reduce.deps.end(), gather.deps[0]), 1);
  // None: issued when layer 30's backward is reached, behind layer 31's reduce-scatter.
  const FsdpBackwardOrder none = fsdp_backward_order(ParallelConfig::BackwardPrefetch::kNone);
  ASSERT_TRUE(none.step);
  EXPECT_EQ(none.step->plan.ops[none.gather].lane, none.step->plan.ops[none.reduce].lane);
  EXPECT_GT(none.gather, none.reduce);
  // The order changes the step: prefetching ahead of the reduction is the fastest.
  const auto makespan = [](const BuiltStep& b) {
    auto r = sim::simulate(b.plan, {});
    return r ? r->timeline.makespan.time_since_epoch().count() : std::int64_t{-1};
  };
  const FsdpBackwardOrder pre = fsdp_backward_order(ParallelConfig::BackwardPrefetch::kPre);
  ASSERT_TRUE(pre.step);
  EXPECT_LT(makespan(*pre.step), makespan(*none.step));
  EXPECT_LE(makespan(*pre.step), makespan(*post.step));
  EXPECT_LE(makespan(*post.step), makespan(*none.step));
}

TEST(BuildStep, EmbeddingAndLossSlotsMoveLayersBetweenStages) {
  // 6 layers + the embedding and loss slots over pp 2 x 2 chunks (2 slots each): stage 0 builds
  // the embedding + layer 0 and layers 3-4, stage 1 layers 1-2 and layer 5 + the loss.
  Scenario s = base("llama3-8b", "dgx-h100");
  s.model.layers = 6;
  s.parallelism = {.pp = 2,
                   .account_for_embedding_in_pipeline_split = true,
                   .account_for_loss_in_pipeline_split = true,
                   .schedule = Schedule::kInterleaved1F1B,
                   .virtual_stages = 2};
  s.hardware.gpus = 2;
  auto step = build_step(s);
  ASSERT_TRUE(step) << step.error().message;
  std::map<int, std::set<int>> stages_of_layer;
  for (const sim::Op& op : step->plan.ops) {
    if (op.layer >= 0) stages_of_layer[op.layer].insert(step->plan.lanes[op.lane.index()].stage);
  }
  const std::map<int, std::set<int>> expected = {{0, {0}}, {1, {1}}, {2, {1}},
                                                 {3, {0}}, {4, {0}}, {5, {1}}};
  EXPECT_EQ(stages_of_layer, expected);
}

// Megatron-Core's finalize_model_grads: with pp > 1 and tied embeddings the first and the last
// stage all-reduce the word embedding's gradient once their data-parallel reductions are done,
// each waiting for the other's; the gradient norm waits for it. Untied (without MTP) or with
// one stage: no such op.
TEST(BuildStep, TiedEmbeddingGradientsAreAllReducedBetweenFirstAndLastStage) {
  Scenario s = base("llama3-8b", "dgx-h100");
  s.model.layers = 4;
  s.model.tied_embeddings = true;
  s.parallelism = {.dp = 2, .tp = 2, .pp = 2};
  auto step = build_step(s);
  ASSERT_TRUE(step) << step.error().message;
  const sim::Plan& plan = step->plan;
  std::vector<const sim::Op*> syncs;
  for (const sim::Op& op : plan.ops) {
    if (op.name == "embedding.grad_allreduce") syncs.push_back(&op);
  }
  ASSERT_EQ(syncs.size(), 2U);
  const LayerDims d = layer_dims(s);
  std::set<int> stages;
  for (const sim::Op* op : syncs) {
    const int stage = plan.lanes[op->lane.index()].stage;
    stages.insert(stage);
    EXPECT_EQ(op->sizes.collective.kind, sim::CollectiveKind::kAllReduce);
    EXPECT_EQ(op->sizes.collective.group, (std::vector<int>{0, stage_ranks(s.parallelism)}));
    EXPECT_EQ(op->sizes.bytes % (d.v * d.h), 0);
    // It waits for ops of both stages.
    std::set<int> waited;
    for (const sim::OpId dep : op->deps)
      waited.insert(plan.lanes[plan.ops[dep.index()].lane.index()].stage);
    EXPECT_EQ(waited, (std::set<int>{0, 1})) << stage;
  }
  EXPECT_EQ(stages, (std::set<int>{0, 1}));
  for (const bool tied : {false, true}) {
    Scenario other = s;
    other.model.tied_embeddings = tied;
    if (tied) other.parallelism = {.dp = 4, .tp = 2, .pp = 1};
    auto o = build_step(other);
    ASSERT_TRUE(o) << o.error().message;
    for (const sim::Op& op : o->plan.ops) EXPECT_NE(op.name, "embedding.grad_allreduce");
  }
}

// Megatron's gradient clipping all-reduces the norm over the model-parallel group (tp x pp):
// with pp > 1 every stage's all-reduce waits for every stage's norm, and the stage's updates
// wait for it. One stage: no all-reduce.
TEST(BuildStep, GradientNormIsAllReducedOverTheStages) {
  Scenario s = base("llama3-8b", "dgx-h100");
  s.model.layers = 4;
  s.parallelism = {.dp = 2, .tp = 2, .pp = 2};
  auto step = build_step(s);
  ASSERT_TRUE(step) << step.error().message;
  const sim::Plan& plan = step->plan;
  const auto stage_of = [&](sim::OpId id) {
    return plan.lanes[plan.ops[id.index()].lane.index()].stage;
  };
  std::map<int, sim::OpId> norm;
  std::map<int, sim::OpId> sync;
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    const sim::OpId id(static_cast<std::uint32_t>(i));
    if (plan.ops[i].name == "grad_norm") norm[stage_of(id)] = id;
    if (plan.ops[i].name == "grad_norm.allreduce") sync[stage_of(id)] = id;
  }
  ASSERT_EQ(norm.size(), 2U);
  ASSERT_EQ(sync.size(), 2U);
  for (const auto& [stage, id] : sync) {
    const sim::Op& op = plan.ops[id.index()];
    EXPECT_EQ(op.sizes.collective.group,
              (std::vector<int>{0, 1, stage_ranks(s.parallelism), stage_ranks(s.parallelism) + 1}));
    for (const auto& [other, n] : norm) {
      EXPECT_NE(std::find(op.deps.begin(), op.deps.end(), n), op.deps.end()) << stage << other;
    }
  }
  Scenario one = s;
  one.parallelism = {.dp = 4, .tp = 2, .pp = 1};
  auto o = build_step(one);
  ASSERT_TRUE(o) << o.error().message;
  for (const sim::Op& op : o->plan.ops) EXPECT_NE(op.name, "grad_norm.allreduce");
}

TEST(BuildStep, ZeroOffloadMovesOptimizerStateToHost) {
  Scenario s = base("llama3-8b", "dgx-h100");
  s.parallelism = {.dp = 8, .zero_stage = 2};
  s.offload = *offload_preset("zero_offload", {});
  auto step = build_step(s);
  ASSERT_TRUE(step);
  const std::int64_t psi = parameter_count(s.model);
  EXPECT_EQ(
      initial_bytes(step->plan, step->ranks.front().hbm_pool, sim::TensorCategory::kOptimizer), 0);
  EXPECT_EQ(
      initial_bytes(step->plan, step->ranks.front().host_pool, sim::TensorCategory::kOptimizer),
      12 * psi / 8);
  // DeepSpeed's step() runs once on the rank's flat fp32 partition, then one H2D of the bf16
  // partition, which every group's all-gather waits for.
  int cpu_ops = 0;
  int h2d_ops = 0;
  for (const sim::Op& op : step->plan.ops) {
    cpu_ops += op.category == sim::OpCategory::kCpuOptimizer;
    h2d_ops += op.name == "partition.params_h2d";
  }
  EXPECT_EQ(cpu_ops, 1);
  EXPECT_EQ(h2d_ops, 1);
}

TEST(BuildStep, ZeroOffloadHostStepStreamsDeepSpeedsPasses) {
  // The CPU update streams, per parameter of the rank's shard, unscale/clip (4 + 4), Adam
  // (4 + 3 x 8) and the fp32 master narrowed to bf16 for the H2D copy (4 + 2): 42 bytes. The
  // gradient is widened to fp32 and its norm taken on the GPU, so it crosses the link in fp32.
  Scenario s = base("llama3-8b", "dgx-h100");
  s.parallelism = {.dp = 8, .zero_stage = 2};
  s.offload = *offload_preset("zero_offload", {});
  auto step = build_step(s);
  ASSERT_TRUE(step);
  std::int64_t bytes = 0;
  for (const sim::Op& op : step->plan.ops) {
    if (op.category == sim::OpCategory::kCpuOptimizer) bytes += op.sizes.bytes;
  }
  // Each group's shard is ceil(params / 8): the sum lies within a few parameters of psi / 8.
  const std::int64_t psi = parameter_count(s.model);
  EXPECT_GE(bytes, 42 * (psi / 8));
  EXPECT_LE(bytes, 42 * (psi / 8 + s.model.layers + 2));
  std::int64_t d2h = 0;
  for (const sim::Op& op : step->plan.ops) {
    if (op.name.find(".grads_d2h") != std::string::npos) d2h += op.sizes.bytes;
  }
  EXPECT_GE(d2h, 4 * (psi / 8));
}

TEST(BuildStep, SavedActivationsInPlanMatchFormula) {
  // One micro-batch, no offload: the activation tensors of layer 0 total the formula's bytes.
  Scenario s = base("llama3-8b", "dgx-h100");
  s.parallelism = {.dp = 8};
  s.recompute.mode = Mode::kSelective;
  auto step = build_step(s);
  ASSERT_TRUE(step);
  const LayerDims d = layer_dims(s);
  const std::int64_t expected = layer_activations(d, Mode::kSelective, {}).saved_bytes(d);
  std::int64_t got = 0;
  for (const sim::Tensor& t : step->plan.tensors) {
    if (t.name == "mb0.l0.act") got += t.bytes;
  }
  EXPECT_EQ(got, expected);
}

TEST(BuildStep, PipelineFlagForMegatronActivationOffload) {
  Scenario s = base("llama3-8b", "dgx-h100");
  s.parallelism = {.dp = 2, .tp = 1, .pp = 4};
  s.offload = *offload_preset("megatron_activation_offload", {});
  auto step = build_step(s);
  ASSERT_TRUE(step);
  ASSERT_FALSE(step->flags.empty());
  EXPECT_NE(step->flags[0].find("megatron cannot offload activations with pp>1"),
            std::string::npos);
}

Report run(const Scenario& s) {
  auto e = evaluate(s, {});
  EXPECT_TRUE(e) << (e ? "" : e.error().message);
  return e ? e->report : Report{};
}

TEST(Evaluate, TimeSplitAddsUpToStepTime) {
  Scenario s = base("llama3-8b", "dgx-h100");
  s.parallelism = {.dp = 2, .tp = 2, .pp = 2, .sequence_parallel = true, .zero_stage = 1};
  s.recompute.mode = Mode::kSelective;
  const Report r = run(s);
  ASSERT_TRUE(r.fits) << r.outcome;
  const TimeSplit& t = r.time;
  const double sum = t.compute_s + t.recompute_s + t.exposed_comm_s + t.exposed_offload_s +
                     t.bubble_s + t.cpu_optimizer_s + t.other_s;
  EXPECT_NEAR(sum, r.step_time_s, 1e-6);
  EXPECT_GT(t.bubble_s, 0.0);  // two pipeline stages
  EXPECT_GT(r.mfu, 0.05);
  EXPECT_LT(r.mfu, 1.0);
  EXPECT_NEAR(r.tokens_per_s * r.step_time_s, 8.0 * 2048, 1e-3);
}

TEST(Evaluate, ActivationOffloadLowersPeakAndHidesBehindBigLayers) {
  // Llama 3 70B layer shapes on 8 H100s (FSDP, optimizer on the CPU so it fits at all), seq 4096:
  // a layer's forward is ~10 ms of GEMMs while its ~1.1 GB of saved activations need ~20 ms at
  // ~55 GB/s... so use selective recompute with a partial offload that the link can carry.
  Scenario s = base("llama3-70b", "dgx-h100");
  s.training = {.global_batch = 8, .micro_batch = 1, .seq_len = 4096};
  s.parallelism = {.dp = 8, .fsdp = true};
  s.recompute.mode = Mode::kFull;
  s.offload = *offload_preset("zero_offload", {});
  const Report keep = run(s);
  s.offload.rules.push_back({.cls = TensorClass::kNamedActivation, .name = "decoder_layer_input"});
  const Report off = run(s);
  ASSERT_TRUE(keep.fits);
  ASSERT_TRUE(off.fits);
  // Full recompute keeps 2·s·h bytes per layer; offloaded, at most a few layers stay on HBM.
  const std::int64_t per_layer = 2 * 4096 * 8192;
  EXPECT_LE(off.memory.activations_bytes, keep.memory.activations_bytes - 60 * per_layer);
  EXPECT_LT(off.step_time_s, keep.step_time_s * 1.02);
}

TEST(Evaluate, SlowLinkExposesOffload) {
  // Same offload on the A100 (PCIe Gen4, 2 GPUs per switch): the copies of every saved
  // activation do not fit behind the compute.
  Scenario s = base("llama3-8b", "dgx-a100-80gb");
  s.parallelism = {.dp = 8, .zero_stage = 1};
  s.offload = *offload_preset("megatron_activation_offload", {});
  const Report off = run(s);
  s.offload = {};
  const Report keep = run(s);
  ASSERT_TRUE(off.fits);
  ASSERT_TRUE(keep.fits);
  EXPECT_GT(off.step_time_s, keep.step_time_s * 1.05);
  EXPECT_GT(off.time.exposed_offload_s, 0.0);
}

TEST(Evaluate, PrefetchDepthTradesMemoryForExposedTime) {
  Scenario s = base("llama3-8b", "dgx-h100");
  s.parallelism = {.dp = 8, .zero_stage = 1};
  s.recompute.mode = Mode::kSelective;
  s.offload = *offload_preset("megatron_activation_offload", {.prefetch_layers = 1});
  const Report k1 = run(s);
  s.offload = *offload_preset("megatron_activation_offload", {.prefetch_layers = 4});
  const Report k4 = run(s);
  ASSERT_TRUE(k1.fits);
  ASSERT_TRUE(k4.fits);
  EXPECT_LE(k4.time.exposed_offload_s, k1.time.exposed_offload_s);
  EXPECT_GE(k4.hbm_peak_bytes, k1.hbm_peak_bytes);
}

TEST(Evaluate, CpuOptimizerDominatesZeroOffload) {
  Scenario s = base("llama3-8b", "dgx-h100");
  s.parallelism = {.dp = 8, .zero_stage = 2};
  const Report gpu = run(s);
  s.offload = *offload_preset("zero_offload", {});
  const Report cpu = run(s);
  ASSERT_TRUE(gpu.fits);
  ASSERT_TRUE(cpu.fits);
  EXPECT_GT(cpu.step_time_s, gpu.step_time_s);
  EXPECT_GT(cpu.time.cpu_optimizer_s, 0.0);
  EXPECT_LT(cpu.hbm_peak_bytes, gpu.hbm_peak_bytes);
}

TEST(Evaluate, OutOfMemoryIsReported) {
  // 70B with plain data parallelism on 80 GB GPUs: 16 bytes per parameter never fit.
  Scenario s = base("llama3-70b", "dgx-h100");
  s.parallelism = {.dp = 8};
  const Report r = run(s);
  EXPECT_FALSE(r.fits);
  ASSERT_TRUE(r.oom.has_value());
  EXPECT_GT(r.oom->requested_bytes + r.oom->in_use_bytes, r.oom->capacity_bytes);
  EXPECT_TRUE(r.oom->device_memory());  // typed from the pool's kind, not its name
  const auto j = report_to_json(r);
  EXPECT_FALSE(j["fits"].get<bool>());
  EXPECT_TRUE(j.contains("memory"));
}

}  // namespace
}  // namespace offsim::models

namespace offsim::models {
namespace {

TEST(Evaluate, GradientReduceAfterBackwardIsExposed) {
  // Megatron-LM 2021 reduced gradients after the backward; overlapping hides part of it.
  Scenario s = base("llama3-8b", "dgx-a100-80gb");
  s.hardware.nodes = 2;
  s.parallelism = {.dp = 16, .zero_stage = 1};
  s.training.global_batch = 16;
  const Report overlapped = run(s);
  s.parallelism.overlap_grad_reduce = false;
  auto step = build_step(s);
  ASSERT_TRUE(step);
  EXPECT_TRUE(sim::validate(step->plan));
  const Report after = run(s);
  ASSERT_TRUE(overlapped.fits);
  ASSERT_TRUE(after.fits);
  EXPECT_GT(after.step_time_s, overlapped.step_time_s);
  EXPECT_GT(after.time.exposed_comm_s, overlapped.time.exposed_comm_s);
}

TEST(BuildStep, Fp8GemmsCastTheirInputs) {
  // Every FP8 forward and dgrad GEMM is preceded by Transformer Engine's cast-transpose of its
  // m × k input; wgrad GEMMs are not, and bf16 steps have no casts. H100, delayed scaling (TE's
  // default there): 4 bytes per element (read bf16, write FP8 and its transpose), 2 after a
  // norm, which writes FP8 itself and leaves the transpose (read 1, write 1).
  Scenario s = base("llama3-8b", "dgx-h100");
  s.parallelism = {.dp = 8};
  s.training.compute_dtype = sim::DType::kFp8;
  auto step = build_step(s);
  ASSERT_TRUE(step) << step.error().message;
  const auto& ops = step->plan.ops;
  int casts = 0;
  for (std::size_t i = 0; i + 1 < ops.size(); ++i) {
    if (!ops[i].name.ends_with(".fp8_cast")) continue;
    ++casts;
    const sim::Op& g = ops[i + 1];
    ASSERT_EQ(g.kind, sim::OpKind::kGemm) << ops[i].name;
    EXPECT_EQ(ops[i].name, g.name + ".fp8_cast");
    EXPECT_FALSE(g.name.ends_with(".wgrad"));
    const bool from_norm = g.name.ends_with(".qkv.fwd") || g.name.ends_with(".mlpwi.fwd");
    EXPECT_EQ(ops[i].sizes.bytes, (from_norm ? 2 : 4) * g.sizes.gemm.m * g.sizes.gemm.k) << g.name;
  }
  // The LM head is not a Transformer Engine layer: its GEMMs stay in bf16, without casts.
  int fp8_gemms = 0;
  int head_gemms = 0;
  for (const sim::Op& op : ops) {
    if (op.kind != sim::OpKind::kGemm) continue;
    if (op.name.find(".lm_head.") != std::string::npos) {
      ++head_gemms;
      EXPECT_EQ(op.sizes.gemm.dtype, sim::DType::kBf16) << op.name;
      continue;
    }
    EXPECT_EQ(op.sizes.gemm.dtype, sim::DType::kFp8) << op.name;
    if (!op.name.ends_with(".wgrad")) ++fp8_gemms;
  }
  EXPECT_GT(head_gemms, 0);
  EXPECT_EQ(casts, fp8_gemms);
  EXPECT_GT(casts, 0);
  s.training.compute_dtype = sim::DType::kBf16;
  auto bf16 = build_step(s);
  ASSERT_TRUE(bf16);
  for (const sim::Op& op : bf16->plan.ops) EXPECT_FALSE(op.name.ends_with(".fp8_cast"));
}

// The bytes of the first layer's FP8 casts before the qkv GEMM (input: the first norm's output)
// and the out_proj GEMM (input: the attention output), both 2048 × 4096 values in llama3-8b.
std::pair<std::int64_t, std::int64_t> first_casts(const std::string& system,
                                                  TrainingConfig::Fp8Recipe recipe) {
  Scenario s = base("llama3-8b", system);
  s.parallelism = {.dp = 8};
  s.training.compute_dtype = sim::DType::kFp8;
  s.training.fp8_recipe = recipe;
  auto step = build_step(s);
  EXPECT_TRUE(step) << step.error().message;
  if (!step) return {-1, -1};
  std::int64_t qkv = -1;
  std::int64_t proj = -1;
  for (const sim::Op& op : step->plan.ops) {
    if (qkv < 0 && op.name.ends_with(".l0.qkv.fwd.fp8_cast")) qkv = op.sizes.bytes;
    if (proj < 0 && op.name.ends_with(".l0.out_proj.fwd.fp8_cast")) proj = op.sizes.bytes;
  }
  return {qkv, proj};
}

TEST(BuildStep, Fp8CastBytesFollowTheRecipe) {
  using R = TrainingConfig::Fp8Recipe;
  const std::int64_t n = 2048 * 4096;
  // H100 (transposed copies for the backward GEMMs). Delayed: the norm writes FP8, the transpose
  // remains (2 n); elsewhere one cast-transpose (read 2, write 1 + 1).
  EXPECT_EQ(first_casts("dgx-h100", R::kDelayed), std::make_pair(2 * n, 4 * n));
  // Current scaling: the cast (4 n) and, where no norm produced the amax, an amax pass (read 2).
  EXPECT_EQ(first_casts("dgx-h100", R::kCurrent), std::make_pair(4 * n, 6 * n));
  // Blockwise (1x128): read 2, write 1 + 1 and an fp32 scale per 128 values each way; no fusion.
  EXPECT_EQ(first_casts("dgx-h100", R::kBlockwise),
            std::make_pair(4 * n + 8 * n / 128, 4 * n + 8 * n / 128));
  // B200 takes non-TN FP8 GEMMs: no transposes for the per-tensor recipes. Delayed: nothing left
  // after the norm; elsewhere read 2, write 1. MXFP8: read 2, write 1 + 1 and an E8M0 scale per
  // 32 values each way, not fused with the norm.
  EXPECT_EQ(first_casts("dgx-b200", R::kDelayed), std::make_pair(std::int64_t{0}, 3 * n));
  EXPECT_EQ(first_casts("dgx-b200", R::kCurrent), std::make_pair(3 * n, 5 * n));
  EXPECT_EQ(first_casts("dgx-b200", R::kMxfp8),
            std::make_pair(4 * n + 2 * n / 32, 4 * n + 2 * n / 32));
}

// Transformer Engine's rules by the profile's compute capability: FP8 from 8.9 on, MXFP8 on 10.x
// only, the default recipe delayed / MXFP8 / current scaling (12.x), non-TN GEMMs on 10.x.
TEST(BuildStep, Fp8RecipeDefaultsToTransformerEnginesAndMxfp8NeedsBlackwell) {
  Scenario s = base("llama3-8b", "dgx-h100");
  s.parallelism = {.dp = 8};
  s.training.compute_dtype = sim::DType::kFp8;
  auto h100 = resolve(s);
  ASSERT_TRUE(h100) << h100.error().message;
  EXPECT_EQ(h100->scenario().training.fp8_recipe, TrainingConfig::Fp8Recipe::kDelayed);
  s.training.fp8_recipe = TrainingConfig::Fp8Recipe::kMxfp8;
  auto refused = resolve(s);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, sim::ErrorCode::kInvalidInput);
  EXPECT_TRUE(refused.error().message.starts_with(
      "training.fp8_recipe: mxfp8 needs compute capability 10.x"))
      << refused.error().message;
  EXPECT_NE(refused.error().message.find("with 9.0"), std::string::npos) << refused.error().message;
  s.training.fp8_recipe.reset();
  s.hardware.system = "dgx-b200";
  auto b200 = resolve(s);
  ASSERT_TRUE(b200) << b200.error().message;
  EXPECT_EQ(b200->scenario().training.fp8_recipe, TrainingConfig::Fp8Recipe::kMxfp8);
  // RTX 5090 (12.0): current scaling by default, MXFP8 refused ("not supported on 12.0+ yet").
  s.hardware.system = "rtx5090-8gpu";
  auto rtx = resolve(s);
  ASSERT_TRUE(rtx) << rtx.error().message;
  EXPECT_EQ(rtx->scenario().training.fp8_recipe, TrainingConfig::Fp8Recipe::kCurrent);
  s.training.fp8_recipe = TrainingConfig::Fp8Recipe::kMxfp8;
  EXPECT_FALSE(resolve(s));
  s.training.fp8_recipe.reset();
  // A100 (8.0) has no FP8 tensor cores.
  s.hardware.system = "dgx-a100-80gb";
  auto a100 = resolve(s);
  ASSERT_FALSE(a100);
  EXPECT_TRUE(a100.error().message.starts_with("training.precision: fp8 needs FP8 tensor cores"))
      << a100.error().message;
  EXPECT_NE(a100.error().message.find("compute capability 8.0"), std::string::npos);
  EXPECT_TRUE(fp8_non_tn_gemm(100) && fp8_non_tn_gemm(103) && fp8_non_tn_gemm(130));
  EXPECT_FALSE(fp8_non_tn_gemm(89) || fp8_non_tn_gemm(90) || fp8_non_tn_gemm(120));
  EXPECT_TRUE(fp8_supported(89) && !fp8_supported(86));
  // bf16 steps leave the recipe alone.
  s.training.compute_dtype = sim::DType::kBf16;
  auto bf16 = resolve(s);
  ASSERT_TRUE(bf16);
  EXPECT_FALSE(bf16->scenario().training.fp8_recipe);
}

TEST(BuildStep, FrameworkOpsHaveExactBytes) {
  // llama3-8b (h 4096, 32 query and 8 key/value heads of 128, ffn 14336, rotary positions) at
  // TP 2 with SP, micro-batch 1 × 2048 tokens, DP 4 with ZeRO-1, FP8.
  Scenario s = base("llama3-8b", "dgx-h100");
  s.parallelism = {.dp = 4, .tp = 2, .sequence_parallel = true, .zero_stage = 1};
  s.training.compute_dtype = sim::DType::kFp8;
  auto step = build_step(s);
  ASSERT_TRUE(step) << step.error().message;
  const std::int64_t tokens = 2048;
  const std::int64_t q = 16 * 128;  // query width on a TP rank
  const std::int64_t kv = 4 * 128;
  const std::int64_t f = 14336 / 2;
  int rope = 0;
  int casts = 0;
  int norms = 0;
  for (const sim::Op& op : step->plan.ops) {
    if (op.name.ends_with(".rope.fwd") || op.name.ends_with(".rope.bwd")) {
      // Read and write q and k, bf16.
      EXPECT_EQ(op.sizes.bytes, 2 * tokens * (q + kv) * 2) << op.name;
      ++rope;
    } else if (op.name.ends_with(".fp8_weight_cast")) {
      // Read bf16, write FP8 and its transpose: 4 bytes per linear weight of the layer's shard.
      const std::int64_t weights = 4096 * (q + 2 * kv) + q * 4096 + 4096 * f * 2 + f * 4096;
      EXPECT_EQ(op.sizes.bytes, 4 * weights) << op.name;
      ++casts;
    } else if (op.name == "grad_norm") {
      // fp32 main gradients of this rank's ZeRO-1 shard, read once.
      ++norms;
      EXPECT_GT(op.sizes.bytes, 0);
      EXPECT_EQ(op.sizes.bytes % 4, 0);
    }
    EXPECT_NE(op.name, "unscale_inf_check");  // fp16 only
  }
  const int layers = 32;
  const int micro_batches = 2;  // 8 sequences / DP 4 / micro-batch 1
  EXPECT_EQ(rope, 2 * layers * micro_batches);
  EXPECT_EQ(casts, layers);  // once per step
  EXPECT_EQ(norms, 1);

  // fp16 adds the unscale/inf-check pass; a model with learned positions has no rotary op.
  Scenario g = base("megatron-1.7b", "dgx-a100-80gb");
  g.training.compute_dtype = sim::DType::kFp16;
  g.parallelism = {.dp = 8};
  auto gs = build_step(g);
  ASSERT_TRUE(gs) << gs.error().message;
  int unscale = 0;
  for (const sim::Op& op : gs->plan.ops) {
    EXPECT_EQ(op.name.find(".rope."), std::string::npos) << op.name;
    if (op.name == "unscale_inf_check") ++unscale;
  }
  EXPECT_EQ(unscale, 1);
}

// FP8 weights in memory: with bf16 parameters Transformer Engine's cached FP8 copies (row-wise
// and, on Hopper, the transpose) sit beside the bf16 weights; with FP8 parameters
// (training.dtypes.params fp8, --fp8-param-gather) the copies are the weights, the norms stay
// bf16, the per-step cast shrinks to the transpose, and the gather moves FP8 (bf16 under MXFP8).
TEST(BuildStep, Fp8WeightsAreHeldAsTheRecipeKeepsThem) {
  Scenario s = base("llama3-8b", "dgx-h100");
  s.parallelism = {.dp = 4, .tp = 2, .sequence_parallel = true, .zero_stage = 1};
  s.training.compute_dtype = sim::DType::kFp8;
  s.training.fp8_recipe = TrainingConfig::Fp8Recipe::kDelayed;
  const std::int64_t q = 16 * 128;
  const std::int64_t kv = 4 * 128;
  const std::int64_t f = 14336 / 2;
  const std::int64_t linear = 4096 * (q + 2 * kv) + q * 4096 + 4096 * f * 2 + f * 4096;
  const std::int64_t norms = 2 * 4096;
  EXPECT_EQ(linear_weight_count_per_rank(s.model, 2, 0), linear);
  const auto bytes_of = [](const sim::Plan& plan, const std::string& name) -> std::int64_t {
    for (const sim::Tensor& t : plan.tensors) {
      if (t.name == name) return t.bytes;
    }
    return -1;
  };
  const auto op_bytes = [](const sim::Plan& plan, const std::string& name) -> std::int64_t {
    for (const sim::Op& op : plan.ops) {
      if (op.name == name) return op.sizes.bytes;
    }
    return -1;
  };
  auto bf16 = build_step(s);
  ASSERT_TRUE(bf16) << bf16.error().message;
  EXPECT_EQ(bytes_of(bf16->plan, "l0.params"), 2 * (linear + norms));
  EXPECT_EQ(bytes_of(bf16->plan, "l0.fp8_weights"), 2 * linear);
  EXPECT_EQ(op_bytes(bf16->plan, "l0.fp8_weight_cast"), 4 * linear);
  EXPECT_EQ(op_bytes(bf16->plan, "l0.params_allgather"), 2 * (linear + norms));

  s.training.dtypes.params = sim::DType::kFp8;
  ASSERT_TRUE(check_scenario(s));
  auto fp8 = build_step(s);
  ASSERT_TRUE(fp8) << fp8.error().message;
  EXPECT_EQ(bytes_of(fp8->plan, "l0.params"), 2 * linear + 2 * norms);
  EXPECT_EQ(bytes_of(fp8->plan, "l0.fp8_weights"), -1);
  EXPECT_EQ(bytes_of(fp8->plan, "l0.grads"), bytes_of(bf16->plan, "l0.grads"));  // bf16
  EXPECT_EQ(op_bytes(fp8->plan, "l0.fp8_weight_cast"), 2 * linear);  // the transpose only
  EXPECT_EQ(op_bytes(fp8->plan, "l0.params_allgather"), linear + norms);

  // Blackwell, current scaling: one row-wise byte per weight, no transpose; the cast is the
  // amax pass over the fp32 master shard.
  s.hardware.system = "dgx-b200";
  s.training.fp8_recipe = TrainingConfig::Fp8Recipe::kCurrent;
  auto b200 = build_step(s);
  ASSERT_TRUE(b200) << b200.error().message;
  EXPECT_EQ(bytes_of(b200->plan, "l0.params"), linear + 2 * norms);
  EXPECT_EQ(op_bytes(b200->plan, "l0.fp8_weight_cast"), 4 * (linear / 4));
  // MXFP8: row- and column-wise copies with their scales, gathered in bf16 and quantized whole.
  s.training.fp8_recipe = TrainingConfig::Fp8Recipe::kMxfp8;
  auto mx = build_step(s);
  ASSERT_TRUE(mx) << mx.error().message;
  EXPECT_EQ(bytes_of(mx->plan, "l0.params"), 2 * linear + 2 * ((linear + 31) / 32) + 2 * norms);
  EXPECT_EQ(op_bytes(mx->plan, "l0.params_allgather"), 2 * (linear + norms));
  EXPECT_EQ(op_bytes(mx->plan, "l0.fp8_weight_cast"),
            fp8_quantize_bytes(TrainingConfig::Fp8Recipe::kMxfp8, true, false, linear));

  // FP8 weights need FP8 GEMMs and a master copy.
  s.training.fp32_master_weights = false;
  EXPECT_NE(check_scenario(s).error().message.find("training.fp32_master_weights"),
            std::string::npos);
  s.training.fp32_master_weights = true;
  s.training.compute_dtype = sim::DType::kBf16;
  EXPECT_NE(check_scenario(s).error().message.find("training.precision fp8"), std::string::npos);
}

TEST(BuildStep, Megatron2021OptionsAddTheirOps) {
  // megatron-1.7b on 2 stages of TP 2: blocking pipeline sends go on the compute lane and carry
  // the TP rank's half of the b·s·h fp16 activation (1 · 2048 · 2304 · 2 / 2 = 4,718,592 bytes);
  // unfused accumulation adds one add per layer and micro-batch over its 3 · params · 2 bytes.
  Scenario s = base("megatron-1.7b", "dgx-a100-80gb");
  s.model.attention = ModelArch::AttentionImpl::kClassic;
  s.training.compute_dtype = sim::DType::kFp16;
  s.parallelism = {.dp = 2, .tp = 2, .pp = 2};
  auto overlapped = build_step(s);
  ASSERT_TRUE(overlapped);
  s.parallelism.overlap_p2p_comm = false;
  s.training.gradient_accumulation_fusion = false;
  auto blocking = build_step(s);
  ASSERT_TRUE(blocking) << blocking.error().message;
  EXPECT_TRUE(sim::validate(blocking->plan));
  const auto count = [](const sim::Plan& plan, const std::string& suffix, bool on_compute,
                        std::int64_t bytes) {
    int n = 0;
    for (const sim::Op& op : plan.ops) {
      if (!op.name.ends_with(suffix)) continue;
      const bool compute = plan.lanes[op.lane.index()].name.ends_with(".compute");
      if (compute == on_compute && op.sizes.bytes == bytes) ++n;
    }
    return n;
  };
  const std::int64_t full = 2048 * 2304 * 2;
  // Global batch 8 over dp 2: 4 micro-batches, one forward send (stage 0) and one backward send
  // (stage 1) each.
  EXPECT_EQ(count(overlapped->plan, ".send", false, full), 8);
  EXPECT_EQ(count(blocking->plan, ".send", true, full / 2), 8);
  // The accumulation reads the accumulated and the new fp16 gradient and writes the sum: 3 · 2
  // bytes per parameter of the layer on its TP-2 rank (about 12h²/2 = 31.9M parameters).
  const std::int64_t per_layer = 6 * layer_parameter_count_per_rank(s.model, 2);
  EXPECT_NEAR(static_cast<double>(per_layer), 6.0 * 12 * 2304 * 2304 / 2, 0.01 * per_layer);
  int accum = 0;
  for (const sim::Op& op : blocking->plan.ops) {
    if (!op.name.ends_with(".grad_accum")) continue;
    ++accum;
    EXPECT_EQ(op.sizes.bytes, per_layer) << op.name;
  }
  // 24 layers over 2 stages, 4 micro-batches: 12 layers · 4 per stage, 2 stages.
  EXPECT_EQ(accum, 24 * 4);
  for (const sim::Op& op : overlapped->plan.ops) EXPECT_FALSE(op.name.ends_with(".grad_accum"));
  // Both cost time: the blocking, unfused step is slower.
  EXPECT_GT(run(s).step_time_s, [&] {
    Scenario o = s;
    o.parallelism.overlap_p2p_comm = true;
    o.training.gradient_accumulation_fusion = true;
    return run(o).step_time_s;
  }());
}

}  // namespace
}  // namespace offsim::models

namespace offsim::models {
namespace {

// The forward host segment of layer 1 in the second micro-batch: its marker's latency on the
// host lane (the host time of the segment's ops), and the segment's forward ops, GEMMs among
// them, and FP8 input casts.
struct ForwardSegment {
  double host_s = -1.0;
  int ops = 0;
  int gemms = 0;
  int casts = 0;
};

ForwardSegment forward_segment(sim::DType dtype, CudaGraphModules graphs = {}) {
  // A tiny dense model whose short kernels leave the GPU waiting for the host.
  Scenario s = base("llama3-8b", "dgx-h100");
  s.model.layers = 4;
  s.model.hidden = 256;
  s.model.heads = 4;
  s.model.kv_heads = 4;
  s.model.head_dim = 64;
  s.model.ffn_hidden = 512;
  s.training.seq_len = 512;
  s.training.compute_dtype = dtype;
  s.training.cuda_graph_modules = graphs;
  s.hardware.gpus = 1;
  s.parallelism = {.dp = 1};
  auto step = build_step(s);
  EXPECT_TRUE(step.has_value()) << step.error().message;
  ForwardSegment seg;
  if (!step) return seg;
  for (const sim::Op& op : step->plan.ops) {
    if (seg.host_s < 0.0 && op.name == "mb1.l1.host_issue") {
      seg.host_s = sim::to_seconds(op.cost.latency);
    }
    if (!op.name.starts_with("mb1.l1.")) continue;
    if (op.name.ends_with(".fwd")) ++seg.ops;
    if (op.kind == sim::OpKind::kGemm && op.name.ends_with(".fwd")) ++seg.gemms;
    if (op.name.ends_with(".fwd.fp8_cast")) ++seg.casts;
  }
  return seg;
}

// Every forward op of an FP8 layer, its linears' input casts included, costs the host one
// framework op: 9.02 us x 3.47 on an x86 host (the fitted scale, validation table 19), about a
// Transformer Engine linear module's measured forward (36.2 us at the 8480C's speed,
// TransformerEngine issue 2053).
TEST(HostIssue, Fp8LinearForwardCostsOneFrameworkOp) {
  const ForwardSegment fp8 = forward_segment(sim::DType::kFp8);
  ASSERT_GT(fp8.host_s, 0.0);
  EXPECT_EQ(fp8.ops, 10);   // ln1, qkv, rope, attn, out_proj, res1_ln2, mlpwi, act, mlpwo, res2
  EXPECT_EQ(fp8.gemms, 4);  // qkv, out_proj, mlpwi, mlpwo
  EXPECT_EQ(fp8.casts, 4);  // each forward GEMM quantizes its input
  EXPECT_NEAR(fp8.host_s, 9.02e-6 * 3.47 * (fp8.ops + fp8.casts), 1e-9);
}

// Per-layer CUDA graphs (training.cuda_graph_modules): a captured module's forward costs the host
// one graph replay (3 framework ops: Transformer Engine's graphed callable, the copy into its
// static input, replay()) in place of its ops. The attention module holds ln1, qkv, rope, attn,
// out_proj and res1_ln2; the dense MLP module mlpwi, act, mlpwo and res2.
TEST(CudaGraphs, ACapturedModuleCostsTheHostOneReplay) {
  const double op = 9.02e-6 * 3.47;
  const ForwardSegment eager = forward_segment(sim::DType::kBf16);
  ASSERT_EQ(eager.ops, 10);
  EXPECT_NEAR(eager.host_s, op * 10, 1e-9);
  CudaGraphModules attn;
  attn.add(CudaGraphModule::kAttn);
  EXPECT_NEAR(forward_segment(sim::DType::kBf16, attn).host_s, op * (3 + 4), 1e-9);
  CudaGraphModules both = attn;
  both.add(CudaGraphModule::kMlp);
  EXPECT_NEAR(forward_segment(sim::DType::kBf16, both).host_s, op * (3 + 3), 1e-9);
}

TEST(Evaluate, GpusSharingAPcieSwitchSlowEachOthersOffload) {
  // DGX A100 puts 2 GPUs behind each PCIe Gen4 switch: with all 8 GPUs offloading (one
  // representative of multiplicity 8) each gets less host bandwidth than a GPU offloading
  // alone, so the same per-GPU work exposes more transfer time.
  Scenario s = base("llama3-8b", "dgx-a100-80gb");
  s.recompute.mode = Mode::kSelective;
  s.offload = *offload_preset("megatron_activation_offload", {});
  s.hardware.gpus = 1;
  s.parallelism = {.dp = 1, .zero_stage = 1};
  s.training.global_batch = 2;
  s.model.layers = 8;  // keep a single GPU's static memory small
  const Report alone = run(s);
  s.hardware.gpus = 8;
  s.parallelism = {.dp = 8, .zero_stage = 1};
  s.training.global_batch = 16;
  const Report shared = run(s);
  ASSERT_TRUE(alone.fits);
  ASSERT_TRUE(shared.fits);
  EXPECT_GT(shared.time.exposed_offload_s, alone.time.exposed_offload_s);
}

}  // namespace
}  // namespace offsim::models
