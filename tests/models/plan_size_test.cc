// estimate_plan_size against the Plans build_step really emits: every example and validation
// scenario, every point of the example sweeps, and variants that switch on the features that
// add ops (tensor/sequence parallelism, interleaved pipelines, ZeRO-3, chunked offload). On the
// same plans, each layer's recipe (layer_recipe) against the ops every micro-batch gives it, kind
// by kind.
#include "models/plan_size.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "models/evaluate.h"
#include "models/step_builder.h"
#include "scenarios/document.h"
#include "scenarios/scenario_loader.h"
#include "sim/plan/plan.h"
#include "sim/trace/timeline.h"

namespace offsim::models {
namespace {

namespace fs = std::filesystem;

// The stated accuracy: ops and tensors within 5% of the real counts (they are exact on every case
// here today), deps within a factor of 1.5, bytes within 25%.
constexpr double kCountTolerance = 1.05;
constexpr double kDepsTolerance = 1.5;
constexpr double kBytesTolerance = 1.25;

struct Case {
  std::string name;
  Scenario scenario;
};

std::vector<std::string> scenario_files(const char* dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(fs::path(OFFSIM_SOURCE_DIR) / "scenarios" / dir)) {
    if (e.path().extension() == ".yaml") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// scenarios/validation/*.yaml: `cases:`, each naming its row's scenario file (in the CLI's
// scenario language) with `scenario:`.
int add_validation_cases(std::vector<Case>& cases) {
  int added = 0;
  for (const std::string& path : scenario_files("validation")) {
    auto doc = scenarios::load_document_file(path);
    if (!doc) continue;
    const scenarios::Node* list = doc->find("cases");
    if (list == nullptr) continue;
    for (std::size_t i = 0; i < list->items.size(); ++i) {
      const scenarios::Node* sc = list->items[i].find("scenario");
      if (sc == nullptr || sc->kind != scenarios::NodeKind::kScalar) continue;
      auto file =
          scenarios::load_scenario_file((fs::path(path).parent_path() / sc->scalar).string());
      if (!file) continue;
      auto s = scenarios::scenario_from_document(file->base, file->base_dir);
      if (!s || !scenarios::check_loaded(*s, file->base)) continue;
      cases.push_back({fmt::format("{} case {}", fs::path(path).stem().string(), i), *s});
      ++added;
    }
  }
  return added;
}

void add_case(std::vector<Case>& cases, const std::string& name, const std::string& path,
              const std::vector<std::string>& sets) {
  auto file = scenarios::load_scenario_file(path, sets);
  if (!file) return;  // a variant a scenario does not admit (e.g. tp over the heads)
  auto s = scenarios::scenario_from_document(file->base, file->base_dir);
  if (!s || !scenarios::check_loaded(*s, file->base)) return;
  cases.push_back({name, *s});
  if (!file->sweep || !sets.empty()) return;
  for (std::int64_t i = 0; i < file->sweep->size(); ++i) {
    auto doc = scenarios::apply_point(file->base, file->sweep->point(i));
    if (!doc) continue;
    auto point = scenarios::scenario_from_document(*doc, file->base_dir);
    if (point && scenarios::check_loaded(*point, *doc)) {
      cases.push_back({fmt::format("{} point {}", name, i), *point});
    }
  }
}

std::vector<Case> all_cases(int* validation_cases) {
  std::vector<Case> cases;
  *validation_cases = add_validation_cases(cases);
  const std::vector<std::vector<std::string>> variants = {
      {},
      {"parallelism.tp=2", "parallelism.sequence_parallel=true"},
      {"parallelism.zero_stage=3"},
      {"model.layers=8", "parallelism.pp=2", "parallelism.dp=1", "training.global_batch=16",
       "training.micro_batch=1"},
      {"model.layers=8", "parallelism.pp=2", "parallelism.dp=1", "training.global_batch=16",
       "training.micro_batch=1", "parallelism.schedule=interleaved_1f1b",
       "parallelism.virtual_stages=2"},
  };
  for (const std::string& path : scenario_files("examples")) {
    const std::string stem = fs::path(path).stem().string();
    for (std::size_t v = 0; v < variants.size(); ++v) {
      add_case(cases, v == 0 ? stem : fmt::format("{} variant {}", stem, v), path, variants[v]);
    }
  }
  return cases;
}

// Bytes the Plan and Timeline hold: struct sizes plus heap blocks of strings past the
// small-string buffer and of vectors, at their capacity.
double string_heap(const std::string& s) {
  return s.capacity() > 15 ? static_cast<double>(s.capacity() + 1) : 0.0;
}
double string_heap(const sim::InlineString& s) {
  return s.size() > sim::InlineString::kInlineCapacity ? static_cast<double>(s.size() + 1) : 0.0;
}
template <typename T>
double vector_heap(const std::vector<T>& v) {
  return static_cast<double>(v.capacity() * sizeof(T));
}
template <typename T, std::size_t N>
double vector_heap(const sim::SmallVector<T, N>& v) {
  return v.capacity() > N ? static_cast<double>(v.capacity() * sizeof(T)) : 0.0;
}
// What a Timeline recorded with its memory events holds for them: the events and the tensor
// infos they name.
double memory_event_bytes(const sim::Timeline& t) {
  double bytes = vector_heap(t.memory_events);
  for (const sim::TensorInfo& info : t.tensors) {
    bytes += sizeof(sim::TensorInfo) + string_heap(info.name);
  }
  return bytes;
}
double real_bytes(const sim::Plan& plan, const sim::Timeline& t) {
  double bytes = 0;
  for (const sim::Op& op : plan.ops) {
    bytes += sizeof(sim::Op) + string_heap(op.name) + vector_heap(op.deps) +
             vector_heap(op.allocs) + vector_heap(op.frees) + vector_heap(op.cost.uses) +
             vector_heap(op.sizes.collective.group);
  }
  for (const sim::Tensor& tensor : plan.tensors) {
    bytes += sizeof(sim::Tensor) + string_heap(tensor.name);
  }
  for (const sim::OpInfo& info : t.ops) {
    bytes += sizeof(sim::OpInfo) + string_heap(info.name);
  }
  bytes += vector_heap(t.spans);
  for (const sim::PoolTrace& p : t.pools) bytes += vector_heap(p.samples);
  return bytes + memory_event_bytes(t);
}

double ratio(double estimate, double real) { return real > 0 ? estimate / real : 1.0; }

// --- Layer recipes against the built plan ------------------------------------------------------

constexpr int kRecipeKinds = 5;

RecipeOpKind recipe_kind(sim::OpKind kind) {
  switch (kind) {
    case sim::OpKind::kCollective:
      return RecipeOpKind::kCollective;
    case sim::OpKind::kP2P:
      return RecipeOpKind::kP2P;
    case sim::OpKind::kCopy:
      return RecipeOpKind::kCopy;
    case sim::OpKind::kMarker:
    case sim::OpKind::kAlloc:
    case sim::OpKind::kFree:
      return RecipeOpKind::kMarker;
    default:
      return RecipeOpKind::kKernel;
  }
}

// Ops per (layer, kind) of a range of a plan's ops; layer -1 and host issue markers are not
// counted.
using KindCounts = std::vector<std::array<double, kRecipeKinds>>;
KindCounts count_layer_ops(const sim::Plan& plan, std::size_t begin, std::size_t end, int layers) {
  KindCounts out(static_cast<std::size_t>(layers), std::array<double, kRecipeKinds>{});
  for (std::size_t i = begin; i < end; ++i) {
    const sim::Op& op = plan.ops[i];
    if (op.layer < 0 || op.layer >= layers || host_issue_marker(op)) continue;
    out[static_cast<std::size_t>(op.layer)][static_cast<std::size_t>(recipe_kind(op.kind))] += 1;
  }
  return out;
}

// What a micro-batch other than the last gives layer l besides its recipe: with sharded
// gradients, their reduce-scatter (dp > 1; an MoE layer's routed experts their own, expert-DP
// > 1) and their D2H (host gradients) in every micro-batch (step_params.cc grads_done and
// expert_grads_done; the other reductions wait for the last micro-batch).
double per_micro_batch_gradient_ops(const Scenario& s, int layer, RecipeOpKind kind) {
  const ParallelConfig& p = s.parallelism;
  if (!dp_sharding(p).grads) return 0;
  const bool moe = s.model.moe.experts > 0 && is_moe_layer(s.model, layer);
  const double groups = 1 + (moe ? 1 : 0);
  if (kind == RecipeOpKind::kCollective) {
    const bool replicated = grad_dp(p) / shard_dp(p) > 1;  // hybrid sharding's all-reduce
    return (grad_dp(p) > 1 ? 1 : 0) + (replicated ? 1 : 0) + (moe && expert_dp(p) > 1 ? 1 : 0);
  }
  if (kind != RecipeOpKind::kCopy) return 0;
  const LayerDims d =
      s.model.moe.experts > 0 ? layer_dims(s.model, s.training, p, layer) : layer_dims(s);
  return layer_policy(s, d, layer).grads_on_host ? groups : 0;
}

// One micro-batch's pass (forward, backward or both) over the layers it holds: the ops of each
// layer, kind by kind, against the layer's recipe. Returns the passes compared.
int check_pass(const Scenario& s, const std::vector<LayerRecipe>& recipes, const KindCounts& counts,
               const std::vector<int>& layers, bool forward, bool backward,
               const std::string& where) {
  for (int l : layers) {
    const LayerRecipe& r = recipes[static_cast<std::size_t>(l)];
    for (int k = 0; k < kRecipeKinds; ++k) {
      const auto kind = static_cast<RecipeOpKind>(k);
      double expected = 0;
      for (const RecipeRow& row : r.rows) {
        if (row.kind != kind) continue;
        expected += (forward ? row.forward : 0) + (backward ? row.backward + row.recompute : 0);
      }
      if (backward) expected += per_micro_batch_gradient_ops(s, l, kind);
      EXPECT_EQ(counts[static_cast<std::size_t>(l)][static_cast<std::size_t>(k)], expected)
          << where << ", layer " << l << ", " << to_string(kind) << " ops";
    }
  }
  return 1;
}

// Every micro-batch but the last (whose backward also holds the once-per-step gradient
// reductions): with one stage, its forward and backward ops; with pipeline stages, each of its
// forward and backward tasks over the layers of the task's chunk.
int check_recipes(const std::string& name, const Scenario& s, const BuiltStep& step) {
  const int layers = s.model.layers;
  std::vector<LayerRecipe> recipes;
  for (int l = 0; l < layers; ++l) recipes.push_back(layer_recipe(s, l));
  const sim::Plan& plan = step.plan;
  int passes = 0;
  const std::vector<MicroBatchStart>& starts = step.micro_batch_starts;
  std::vector<int> all(static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l) all[static_cast<std::size_t>(l)] = l;
  for (std::size_t i = 0; i + 1 < starts.size(); ++i) {
    const KindCounts counts = count_layer_ops(plan, starts[i].op, starts[i + 1].op, layers);
    passes +=
        check_pass(s, recipes, counts, all, true, true, fmt::format("{}: micro-batch {}", name, i));
  }
  const int m = static_cast<int>(grad_accum_steps(s.training, s.parallelism));
  const PipelineLayout layout = pipeline_layout(layers, s.parallelism);
  for (const PipelineTask& t : step.pipeline_tasks) {
    if (t.receive || t.mb >= m - 1) continue;
    std::vector<int> held;
    const PipelineLayout::Span span = layout.span(t.stage, t.chunk);
    for (int l = span.first; l < span.first + span.count; ++l) held.push_back(l);
    const KindCounts counts = count_layer_ops(plan, t.op_begin, t.op_end, layers);
    passes += check_pass(s, recipes, counts, held, t.forward, !t.forward,
                         fmt::format("{}: stage {} chunk {} micro-batch {} {}", name, t.stage,
                                     t.chunk, t.mb, t.forward ? "forward" : "backward"));
  }
  return passes;
}

TEST(PlanSize, WithinStatedFactorOfTheRealPlan) {
  int validation_cases = 0;
  const std::vector<Case> cases = all_cases(&validation_cases);
  ASSERT_GE(cases.size(), 50u) << "too few scenarios found under scenarios/";
  EXPECT_GE(validation_cases, 10) << "too few scenarios/validation cases load";
  int compared = 0;
  int recipe_passes = 0;  // micro-batch passes checked against the layer recipes
  // Extreme estimate/real ratios over all cases, printed for the record.
  double lo[4] = {1e9, 1e9, 1e9, 1e9};
  double hi[4] = {0, 0, 0, 0};
  for (const Case& c : cases) {
    auto step = build_step(c.scenario);
    ASSERT_TRUE(step) << c.name << ": " << step.error().message;
    const sim::Plan& plan = step->plan;
    recipe_passes += check_recipes(c.name, c.scenario, *step);
    double deps = 0;
    for (const sim::Op& op : plan.ops) deps += static_cast<double>(op.deps.size());
    const PlanSize est = estimate_plan_size(c.scenario, {.with_memory_samples = true});
    const double ops = static_cast<double>(plan.ops.size());
    const double tensors = static_cast<double>(plan.tensors.size());
    // Bytes need the Timeline: simulated for the plans of up to 60 000 ops (the large
    // validation plans take seconds each, more under the sanitizers).
    double bytes = est.bytes;
    if (ops <= 60000) {
      EvalOptions options;
      options.keep_timeline = true;
      auto e = evaluate(c.scenario, options);
      ASSERT_TRUE(e) << c.name << ": " << e.error().message;
      bytes = real_bytes(plan, *e->timeline);
    }
    SCOPED_TRACE(
        fmt::format("{}: ops {} est {:.0f}, tensors {} est {:.0f}, deps {} est {:.0f}, "
                    "bytes {:.0f} est {:.0f}",
                    c.name, ops, est.ops, tensors, est.tensors, deps, est.deps, bytes, est.bytes));
    EXPECT_LE(ratio(est.ops, ops), kCountTolerance);
    EXPECT_GE(ratio(est.ops, ops), 1.0 / kCountTolerance);
    EXPECT_LE(ratio(est.tensors, tensors), kCountTolerance);
    EXPECT_GE(ratio(est.tensors, tensors), 1.0 / kCountTolerance);
    EXPECT_LE(ratio(est.deps, deps), kDepsTolerance);
    EXPECT_GE(ratio(est.deps, deps), 1.0 / kDepsTolerance);
    EXPECT_LE(ratio(est.bytes, bytes), kBytesTolerance);
    EXPECT_GE(ratio(est.bytes, bytes), 1.0 / kBytesTolerance);
    const double r[4] = {ratio(est.ops, ops), ratio(est.tensors, tensors), ratio(est.deps, deps),
                         ratio(est.bytes, bytes)};
    for (int i = 0; i < 4; ++i) {
      lo[i] = std::min(lo[i], r[i]);
      hi[i] = std::max(hi[i], r[i]);
    }
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(cases.size()));
  EXPECT_GT(recipe_passes, compared) << "too few micro-batch passes checked against recipes";
  std::printf(
      "%d cases (%d from scenarios/validation), %d micro-batch passes checked against the layer "
      "recipes; estimate/real: ops %.3f..%.3f, tensors %.3f..%.3f, deps %.3f..%.3f, bytes "
      "%.3f..%.3f\n",
      compared, validation_cases, recipe_passes, lo[0], hi[0], lo[1], hi[1], lo[2], hi[2], lo[3],
      hi[3]);
}

// The layer's forward recipe covers every forward op once, in order, so the FLOPs summed over
// its entries are the layer's forward FLOPs.
TEST(LayerForwardRecipe, CoversEveryForwardOpOnceInOrder) {
  int next = 0;
  for (const LayerOpEntry& e : layer_forward_recipe()) {
    EXPECT_EQ(static_cast<int>(e.first), next) << e.name;
    EXPECT_LE(static_cast<int>(e.first), static_cast<int>(e.last)) << e.name;
    next = static_cast<int>(e.last) + 1;
  }
  EXPECT_EQ(next, kNumFwdOps);
  auto file = scenarios::load_scenario_file(
      (fs::path(OFFSIM_SOURCE_DIR) / "scenarios/examples/2b-1xa100-no-offload.yaml").string(), {});
  ASSERT_TRUE(file) << file.error().message;
  auto s = scenarios::scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  const LayerDims d = layer_dims(*s);
  double flops = 0.0;
  for (const LayerOpEntry& e : layer_forward_recipe()) {
    for (int op = static_cast<int>(e.first); op <= static_cast<int>(e.last); ++op) {
      flops += fwd_op_flops(d, static_cast<FwdOp>(op), false);
    }
  }
  EXPECT_EQ(flops, layer_forward_flops(d, false));
}

// A built layer's forward kernels, and under full recompute the kernels its backward re-runs,
// are the recipe's entries in the recipe's order (tensor and sequence parallelism on).
TEST(LayerForwardRecipe, IsTheOrderOfABuiltLayer) {
  auto file = scenarios::load_scenario_file(
      (fs::path(OFFSIM_SOURCE_DIR) / "scenarios/examples/llama3-70b-8xh200-full-remat.yaml")
          .string(),
      {"model.layers=4"});
  ASSERT_TRUE(file) << file.error().message;
  auto s = scenarios::scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  auto step = build_step(*s);
  ASSERT_TRUE(step) << step.error().message;
  // "mb0.l1.<entry>.<pass>", the entry's own kernel (no rotary, casts or collectives).
  const auto entries_of = [&](const std::string& pass) {
    std::vector<std::string> names;
    const std::string prefix = "mb0.l1.";
    for (const sim::Op& op : step->plan.ops) {
      if (op.name.rfind(prefix, 0) != 0 || op.kind == sim::OpKind::kCollective) continue;
      const std::string rest = op.name.substr(prefix.size());
      const std::size_t dot = rest.find('.');
      if (dot == std::string::npos || rest.substr(dot + 1) != pass) continue;
      if (rest.substr(0, dot) != "rope") names.push_back(rest.substr(0, dot));
    }
    return names;
  };
  std::vector<std::string> forward;
  std::vector<std::string> rerun;
  const LayerActivations acts = layer_activations(layer_dims(*s), RecomputeConfig::Mode::kFull, {});
  for (const LayerOpEntry& e : layer_forward_recipe()) {
    forward.emplace_back(e.name);
    if (recomputes(e, acts)) rerun.emplace_back(e.name);
  }
  EXPECT_EQ(entries_of("fwd"), forward);
  EXPECT_EQ(entries_of("recompute"), rerun);
  EXPECT_FALSE(rerun.empty());
}

// The ops of micro-batch 0's layer 1 ("mb0.l1.<name>"): the names among `names`, in plan order,
// and every GEMM's shape by name.
struct Layer1Ops {
  std::vector<std::string> names;
  std::map<std::string, sim::GemmShape> gemms;
};
Layer1Ops first_micro_batch_layer1(const sim::Plan& plan, const std::vector<std::string>& names) {
  const std::string prefix = "mb0.l1.";
  Layer1Ops out;
  for (const sim::Op& op : plan.ops) {
    if (op.name.rfind(prefix, 0) != 0) continue;
    const std::string rest = op.name.substr(prefix.size());
    if (op.kind == sim::OpKind::kGemm) out.gemms[rest] = op.sizes.gemm;
    if (std::find(names.begin(), names.end(), rest) != names.end()) out.names.push_back(rest);
  }
  return out;
}

// A built layer's backward ops (its kernels and tensor-parallel collectives) are the backward
// recipe's entries in the recipe's order (tensor and sequence parallelism on, asynchronous
// gradient reductions: each started right after its dgrad), and its dense GEMMs have the dims
// of the forward GEMM they differentiate.
TEST(LayerBackwardRecipe, IsTheOrderOfABuiltLayer) {
  auto file = scenarios::load_scenario_file(
      (fs::path(OFFSIM_SOURCE_DIR) / "scenarios/examples/llama3-70b-8xh200-full-remat.yaml")
          .string(),
      {"model.layers=4", "parallelism.tp_async_grad_reduce=true"});
  ASSERT_TRUE(file) << file.error().message;
  auto s = scenarios::scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  auto step = build_step(*s);
  ASSERT_TRUE(step) << step.error().message;
  std::vector<std::string> recipe;
  for (const LayerBackwardEntry& e : layer_backward_recipe()) {
    if (*e.gather != '\0') recipe.emplace_back(e.gather);
    recipe.emplace_back(e.name);
  }
  // "mb0.l1.<name>" of every op named by the recipe, in plan order (no casts, recompute ops,
  // fetches or gradient reductions over data parallelism).
  auto [built, gemms] = first_micro_batch_layer1(step->plan, recipe);
  EXPECT_EQ(built, recipe);
  // Dgrad m × k × n and wgrad k × n × m of the forward GEMM m × n × k.
  for (const char* gemm : {"qkv", "out_proj", "mlpwi", "mlpwo"}) {
    const std::string name = gemm;
    ASSERT_EQ(gemms.count(name + ".fwd"), 1U) << name;
    const sim::GemmShape f = gemms[name + ".fwd"];
    const sim::GemmShape dg = gemms[name + ".dgrad"];
    const sim::GemmShape wg = gemms[name + ".wgrad"];
    EXPECT_EQ(std::tuple(dg.m, dg.n, dg.k), std::tuple(f.m, f.k, f.n)) << name;
    EXPECT_EQ(std::tuple(wg.m, wg.n, wg.k), std::tuple(f.k, f.n, f.m)) << name;
  }
}

// The MoE FFN of a built MoE layer (mb0.l1) is its recipes' entries that run for its dims, in
// order: the forward (".fwd"), its recompute (".recompute", the whole FFN, when `recomputed`) and
// the backward; a GEMM's dgrad and wgrad are the transposes of its forward.
void expect_moe_layer_follows_recipe(const std::vector<std::string>& sets, bool recomputed) {
  auto file = scenarios::load_scenario_file(
      (fs::path(OFFSIM_SOURCE_DIR) / "scenarios/examples/qwen3-30b-a3b-8xh100-no-offload.yaml")
          .string(),
      sets);
  ASSERT_TRUE(file) << file.error().message;
  auto s = scenarios::scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  auto step = build_step(*s);
  ASSERT_TRUE(step) << step.error().message;
  const LayerDims d = layer_dims(s->model, s->training, s->parallelism, 1);
  ASSERT_TRUE(d.moe);
  std::vector<std::string> all;  // every name the recipes may give an op
  std::vector<std::string> expected;
  for (const char* sfx : {".fwd", ".recompute"}) {
    for (const MoeOpEntry& e : moe_forward_recipe()) {
      all.push_back(e.name + std::string(sfx));
      const bool runs = sfx[1] == 'f' || recomputed;
      if (runs && moe_entry_runs(e, d) && e.kind != MoeOpKind::kRoutedFetch) {
        expected.push_back(all.back());
      }
    }
  }
  for (const MoeOpEntry& e : moe_backward_recipe()) {
    all.emplace_back(e.name);
    if (moe_entry_runs(e, d)) expected.push_back(all.back());
  }
  auto [built, gemms] = first_micro_batch_layer1(step->plan, all);
  EXPECT_EQ(built, expected);
  for (const MoeOpEntry& e : moe_backward_recipe()) {
    if (e.pass == GemmPass::kForward || !moe_entry_runs(e, d)) continue;
    const std::string name = e.name;
    const std::string fwd = name.substr(0, name.rfind('.')) + ".fwd";
    ASSERT_EQ(gemms.count(fwd), 1U) << fwd;
    ASSERT_EQ(gemms.count(name), 1U) << name;
    const sim::GemmShape f = gemms[fwd];
    const sim::GemmShape g = gemms[name];
    if (e.pass == GemmPass::kDgrad) {
      EXPECT_EQ(std::tuple(g.m, g.n, g.k), std::tuple(f.m, f.k, f.n)) << name;
    } else {
      EXPECT_EQ(std::tuple(g.m, g.n, g.k), std::tuple(f.k, f.n, f.m)) << name;
    }
  }
}

TEST(MoeRecipe, IsTheOrderOfABuiltLayer) {
  // Every conditional entry on: expert and expert-tensor parallelism, tensor parallelism with
  // SP, a shared expert; the whole layer recomputed.
  expect_moe_layer_follows_recipe(
      {"model.layers=4", "training.global_batch=16", "parallelism.tp=2",
       "parallelism.sequence_parallel=true", "parallelism.ep=2", "parallelism.etp=2",
       "parallelism.dp=4", "model.moe.shared_experts=1", "recompute=full"},
      true);
  // The example's own: ep 8, no tensor parallelism, no shared expert, selective recompute.
  expect_moe_layer_follows_recipe({"model.layers=4", "training.global_batch=16"}, false);
}

// The MoE recipes count the MoE rows of the layer recipe: the forward's ops are its entries
// that run (the router-aware fetch apart, a copy), the backward's likewise.
TEST(MoeRecipe, CountsTheMoeRows) {
  auto file = scenarios::load_scenario_file(
      (fs::path(OFFSIM_SOURCE_DIR) / "scenarios/examples/qwen3-30b-a3b-8xh100-no-offload.yaml")
          .string(),
      {"parallelism.tp=2", "parallelism.sequence_parallel=true", "parallelism.ep=2",
       "parallelism.dp=4", "model.moe.shared_experts=1"});
  ASSERT_TRUE(file) << file.error().message;
  auto s = scenarios::scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  const LayerDims d = layer_dims(s->model, s->training, s->parallelism, 0);
  double fwd = 0;
  double bwd = 0;
  for (const MoeOpEntry& e : moe_forward_recipe()) {
    fwd += moe_entry_runs(e, d) && e.kind != MoeOpKind::kRoutedFetch ? 1 : 0;
  }
  for (const MoeOpEntry& e : moe_backward_recipe()) bwd += moe_entry_runs(e, d) ? 1 : 0;
  // Forward: 9 kernels (the sort of the received rows by local expert and its inverse among
  // them: 64 local experts per rank), the marker, 3 all-to-alls, 5 shared-expert
  // ops with their 2 TP collectives. Backward: 12 kernels, 3 all-to-alls, 7 shared-expert ops.
  EXPECT_EQ(fwd, 18);
  EXPECT_EQ(bwd, 22);
  double moe_fwd = 0;
  double moe_bwd = 0;
  for (const RecipeRow& row : layer_recipe(*s, 0).rows) {
    if (std::string_view(row.what).rfind("MoE", 0) != 0) continue;
    moe_fwd += row.forward;
    moe_bwd += row.backward;
  }
  EXPECT_EQ(moe_fwd, fwd);
  EXPECT_EQ(moe_bwd, bwd);
}

// The FLOP columns of the recipes. Model FLOPs count attention in full (fwd_op_flops).
Scenario example_scenario(const char* file, const std::vector<std::string>& sets) {
  auto loaded = scenarios::load_scenario_file(
      (fs::path(OFFSIM_SOURCE_DIR) / "scenarios/examples" / file).string(), sets);
  EXPECT_TRUE(loaded) << file << ": " << loaded.error().message;
  if (!loaded) return {};
  auto s = scenarios::scenario_from_document(loaded->base, loaded->base_dir);
  EXPECT_TRUE(s) << file << ": " << s.error().message;
  return s ? *s : Scenario{};
}
double rel_diff(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1.0); }
// The dims build_step() counts model FLOPs over: the whole layer (no parallelism), an MoE
// layer's experts at balanced routing.
LayerDims useful_dims(const Scenario& s, int l) {
  return s.model.moe.experts > 0 ? layer_dims(s.model, s.training, ParallelConfig{}, l, true)
                                 : layer_dims(s.model, s.training, ParallelConfig{});
}
const std::vector<std::pair<const char*, std::vector<std::string>>>& flop_examples() {
  static const std::vector<std::pair<const char*, std::vector<std::string>>> kExamples = {
      {"2b-1xa100-no-offload.yaml", {}},
      {"llama3-70b-8xh200-full-remat.yaml", {"model.layers=4"}},
      {"qwen3-30b-a3b-8xh100-no-offload.yaml", {"model.layers=4"}},
      {"qwen3-30b-a3b-8xh100-no-offload.yaml",
       {"model.layers=4", "model.moe.shared_experts=1", "model.moe.shared_ffn_hidden=1024"}},
  };
  return kExamples;
}

// A layer's backward recipe costs twice its forward recipe (a dgrad and a wgrad per GEMM, the
// attention core's backward twice its forward), dense and MoE, and the forward recipe's FLOPs
// are fwd_op_flops' (the dense layer's exactly: the same sums in the same order).
TEST(RecipeFlops, BackwardIsTwiceTheForward) {
  for (const auto& [file, sets] : flop_examples()) {
    const Scenario s = example_scenario(file, sets);
    for (int l = 0; l < s.model.layers; ++l) {
      const LayerDims d = useful_dims(s, l);
      const double fwd = layer_forward_flops(d, false);
      ASSERT_GT(fwd, 0) << file;
      if (!d.moe) {
        EXPECT_EQ(recipe_forward_flops(d), fwd) << file;
      }
      EXPECT_LE(rel_diff(recipe_forward_flops(d), fwd), 1e-12) << file << " layer " << l;
      EXPECT_LE(rel_diff(recipe_backward_flops(d), 2 * fwd), 1e-12) << file << " layer " << l;
    }
  }
}

// build_step()'s backward FLOPs (its model FLOPs less the forward's) are the backward recipe's,
// summed over the layers and the micro-batches, with the LM head's dgrad and wgrad (the head is
// not in the recipes yet: 2 × lm_head_forward_flops).
TEST(RecipeFlops, AreTheBuiltStepsBackwardFlops) {
  for (const auto& [file, sets] : flop_examples()) {
    const Scenario s = example_scenario(file, sets);
    auto step = build_step(s);
    ASSERT_TRUE(step) << file << ": " << step.error().message;
    const double head = lm_head_forward_flops(useful_dims(s, 0));
    double fwd = head;
    double bwd = 2 * head;
    for (int l = 0; l < s.model.layers; ++l) {
      fwd += recipe_forward_flops(useful_dims(s, l));
      bwd += recipe_backward_flops(useful_dims(s, l));
    }
    const double sequences =
        static_cast<double>(s.training.global_batch) / static_cast<double>(s.training.micro_batch);
    EXPECT_LE(rel_diff(step->model_flops_per_step - fwd * sequences, bwd * sequences), 1e-12)
        << file;
  }
}

// The built GEMMs of a layer's backward have the FLOPs of the recipes' column on the rank's
// dims: the dense dgrads and wgrads, the MoE router's and shared experts'; a grouped GEMM at
// least its useful FLOPs (its most-loaded expert sets the shape of the rest).
TEST(RecipeFlops, AreTheBuiltGemmsFlops) {
  for (const auto& [file, sets] : flop_examples()) {
    const Scenario s = example_scenario(file, sets);
    auto step = build_step(s);
    ASSERT_TRUE(step) << file << ": " << step.error().message;
    const LayerDims d = layer_dims(s.model, s.training, s.parallelism, 1);
    std::map<std::string, double> flops;
    for (const sim::Op& op : step->plan.ops) {
      if (op.kind == sim::OpKind::kGemm && op.name.rfind("mb0.l1.", 0) == 0) {
        flops[op.name.substr(7)] = op.sizes.flops;
      }
    }
    int checked = 0;
    for (const LayerBackwardEntry& e : layer_backward_recipe()) {
      if (e.kind != LayerBackwardKind::kDgrad && e.kind != LayerBackwardKind::kWgrad) continue;
      if (e.ffn && d.moe) continue;
      ASSERT_EQ(flops.count(e.name), 1U) << file << " " << e.name;
      EXPECT_DOUBLE_EQ(flops[e.name], backward_entry_flops(e, d)) << file << " " << e.name;
      ++checked;
    }
    for (const MoeOpEntry& e : moe_backward_recipe()) {
      if (!d.moe || !moe_entry_runs(e, d) || moe_entry_flops(e, d) == 0) continue;
      ASSERT_EQ(flops.count(e.name), 1U) << file << " " << e.name;
      if (e.kind == MoeOpKind::kGemm) {
        EXPECT_DOUBLE_EQ(flops[e.name], moe_entry_flops(e, d)) << file << " " << e.name;
      } else {
        EXPECT_GE(flops[e.name], moe_entry_flops(e, d)) << file << " " << e.name;
      }
      ++checked;
    }
    EXPECT_GE(checked, 8) << file;
  }
}

// The steady-state paths build reduced steps (BuildOptions::micro_batches = k); build_step
// reserves their room from the estimate for k micro-batches, which is within the same factor.
TEST(PlanSize, WithinStatedFactorOfAReducedStep) {
  int validation_cases = 0;
  int compared = 0;
  for (const Case& c : all_cases(&validation_cases)) {
    const ParallelConfig& p = c.scenario.parallelism;
    const std::int64_t m = grad_accum_steps(c.scenario.training, p);
    if (estimate_plan_size(c.scenario).ops > 200000) continue;  // keeps the test short
    // Counts a pipeline schedule can run (whole rounds of pp for the interleaved one).
    const std::vector<int> counts =
        p.pp == 1 ? std::vector<int>{2, 5} : std::vector<int>{static_cast<int>(7 * p.pp)};
    for (int k : counts) {
      if (m <= k) continue;
      BuildOptions options;
      options.micro_batches = k;
      options.last_micro_batch_label = static_cast<int>(m - 1);
      auto step = build_step(c.scenario, options);
      ASSERT_TRUE(step) << c.name << ": " << step.error().message;
      const PlanSize est = estimate_plan_size(c.scenario, {.micro_batches = k});
      const double ops = static_cast<double>(step->plan.ops.size());
      const double tensors = static_cast<double>(step->plan.tensors.size());
      SCOPED_TRACE(fmt::format("{}, {} micro-batches: ops {} est {:.0f}, tensors {} est {:.0f}",
                               c.name, k, ops, est.ops, tensors, est.tensors));
      EXPECT_LE(ratio(est.ops, ops), kCountTolerance);
      EXPECT_GE(ratio(est.ops, ops), 1.0 / kCountTolerance);
      EXPECT_LE(ratio(est.tensors, tensors), kCountTolerance);
      EXPECT_GE(ratio(est.tensors, tensors), 1.0 / kCountTolerance);
      ++compared;
    }
  }
  EXPECT_GE(compared, 20) << "too few scenarios with more micro-batches than a reduced step";
}

TEST(PlanSize, ScalesWithLayersAndMicroBatchesWithoutOverflow) {
  auto file = scenarios::load_scenario_file(
      (fs::path(OFFSIM_SOURCE_DIR) / "scenarios/examples/2b-1xa100-no-offload.yaml").string(),
      {"model.layers=65536", "training.global_batch=1073741824", "training.micro_batch=1"});
  ASSERT_TRUE(file) << file.error().message;
  auto s = scenarios::scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  const PlanSize huge = estimate_plan_size(*s);
  // 65536 layers × 2^30 micro-batches × at least 22 ops per layer pass.
  EXPECT_GE(huge.ops, 65536.0 * 1073741824.0 * 22);
  EXPECT_TRUE(std::isfinite(huge.bytes));
  EXPECT_NE(describe(huge).find("G ops"), std::string::npos) << describe(huge);
}

// A kept timeline holds, per alloc and free, a memory sample and a memory event, and a tensor
// info per tensor: the estimate with memory samples counts all three.
TEST(PlanSize, CountsTheMemoryEventsOfAKeptTimeline) {
  auto file = scenarios::load_scenario_file(
      (fs::path(OFFSIM_SOURCE_DIR) / "scenarios/examples/2b-1xa100-no-offload.yaml").string(), {});
  ASSERT_TRUE(file) << file.error().message;
  auto s = scenarios::scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  EvalOptions options;
  options.keep_timeline = true;
  auto e = evaluate(*s, options);
  ASSERT_TRUE(e) << e.error().message;
  const sim::Timeline& t = *e->timeline;
  ASSERT_FALSE(t.memory_events.empty());
  double samples = 0;
  for (const sim::PoolTrace& p : t.pools) samples += vector_heap(p.samples);
  const double real = samples + memory_event_bytes(t);
  const double extra =
      estimate_plan_size(*s, {.with_memory_samples = true}).bytes - estimate_plan_size(*s).bytes;
  EXPECT_LE(ratio(extra, real), kBytesTolerance) << extra << " estimated, " << real << " real";
  EXPECT_GE(ratio(extra, real), 1.0 / kBytesTolerance)
      << extra << " estimated, " << real << " real";
}

// Llama 3 8B, four layers, tensor and sequence parallel over 2 of a DGX H100's GPUs, two
// micro-batches, the loss in `chunks` chunks.
Scenario head_scenario(std::int64_t chunks) {
  Scenario s;
  s.name = "head";
  s.model = *find_model("llama3-8b");
  s.model.layers = 4;
  s.hardware.system = "dgx-h100";
  s.parallelism = {.dp = 4, .tp = 2, .sequence_parallel = true};
  s.training = {.global_batch = 8, .micro_batch = 1, .seq_len = 2048};
  s.training.loss_chunks = chunks;
  return s;
}

// The ops of micro-batch 0's head ("mb0.head.<name>"), in plan order; host-issue markers (of
// host-bound segments, which depend on the kernels' times) are not the head's.
std::vector<std::string> head_ops_of(const sim::Plan& plan) {
  const std::string prefix = "mb0.head.";
  std::vector<std::string> out;
  for (const sim::Op& op : plan.ops) {
    if (op.kind == sim::OpKind::kMarker) continue;
    if (op.name.rfind(prefix, 0) == 0) out.push_back(op.name.substr(prefix.size()));
  }
  return out;
}

double ops_but_markers(const sim::Plan& plan) {
  return static_cast<double>(std::count_if(plan.ops.begin(), plan.ops.end(), [](const sim::Op& op) {
    return op.kind != sim::OpKind::kMarker;
  }));
}

// The built head is its recipes, in order (the per-chunk entries chunk by chunk), and the
// estimate counts as many head ops and tensors as the builder emits.
TEST(HeadRecipe, IsTheBuiltHeadAndWhatTheEstimateCounts) {
  for (const std::int64_t chunks : {1, 3}) {
    const Scenario s = head_scenario(chunks);
    auto step = build_step(s);
    ASSERT_TRUE(step) << step.error().message;
    const LayerDims d = layer_dims(s);
    const bool chunked = chunks > 1;
    std::vector<std::string> expected;
    double counted = 0;
    for (const auto recipe : {head_forward_recipe(chunked), head_backward_recipe(chunked)}) {
      for (const HeadOpEntry& e : recipe) counted += head_ops(e, d, chunks);
    }
    for (const HeadOpEntry& e : head_forward_recipe(chunked)) {
      if (!e.per_chunk) expected.emplace_back(e.name);
    }
    for (std::int64_t c = 0; c < chunks && chunked; ++c) {
      for (const HeadOpEntry& e : head_forward_recipe(chunked)) {
        if (e.per_chunk) expected.push_back(fmt::format("chunk{}.{}", c, e.name));
      }
    }
    for (const HeadOpEntry& e : head_backward_recipe(chunked)) expected.emplace_back(e.name);
    EXPECT_EQ(head_ops_of(step->plan), expected) << chunks << " chunks";
    EXPECT_EQ(static_cast<double>(expected.size()), counted) << chunks << " chunks";
  }
  // What the chunks add to the plan is what they add to the estimate: ops and tensors.
  auto whole = build_step(head_scenario(1));
  auto chunked = build_step(head_scenario(5));
  ASSERT_TRUE(whole && chunked);
  const PlanSize est_whole = estimate_plan_size(head_scenario(1));
  const PlanSize est_chunked = estimate_plan_size(head_scenario(5));
  EXPECT_EQ(ops_but_markers(chunked->plan) - ops_but_markers(whole->plan),
            est_chunked.ops - est_whole.ops);
  EXPECT_EQ(static_cast<double>(chunked->plan.tensors.size()) -
                static_cast<double>(whole->plan.tensors.size()),
            est_chunked.tensors - est_whole.tensors);
}

TEST(PlanSize, DescribeNamesEveryFigure) {
  const PlanSize size{.ops = 3.2e6, .tensors = 1.1e6, .deps = 4.0e6, .bytes = 2.5 * (1 << 30)};
  EXPECT_EQ(describe(size),
            "3.2M ops, 1.1M tensors, 4.0M deps, about 2.5 GiB of plan and timeline");
}

}  // namespace
}  // namespace offsim::models
