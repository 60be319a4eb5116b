// Every example in scenarios/examples/ (a sweep's first point), a pipeline plan under both
// schedules, replayed on the CPU device in CI and compared with its forecast. Scaled down so the
// suite stays fast, as the test names say: two layers per pipeline stage and at most four
// micro-batches; every layer keeps its real shapes, and the CPU device caps the work of each op
// (CpuDeviceOptions), so the measured times check ordering, matching and memory, not speed.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "backends/replay.h"
#include "models/evaluate.h"
#include "scenarios/scenario_loader.h"
#include "sim/trace/compare.h"

namespace offsim::backends {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

#ifdef OFFSIM_SANITIZED
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// Two layers per stage (and model chunk) and at most four micro-batches.
void scale_down(models::Scenario& s) {
  const auto& p = s.parallelism;
  s.model.layers = 2 * static_cast<std::int64_t>(p.pp) * p.virtual_stages;
  if (!p.layout.empty()) s.parallelism.layout = models::scale_layout(p.layout, s.model.layers);
  const std::int64_t per_step = s.training.micro_batch * p.dp;
  s.training.global_batch = std::min<std::int64_t>(s.training.global_batch, 4 * per_step);
}

struct Replayed {
  sim::Plan plan;
  sim::Timeline predicted;
  ReplayResult measured;
};

// Evaluates (keeping plan and timeline), replays on the CPU device, and checks what must hold
// for any plan: every run rank's op has a span, after its deps on the same rank (spans are
// measured from a per-rank origin, so times of two ranks are not comparable), and compare
// accepts the pair.
void replay_and_check(const models::Scenario& s, const std::string& what, Replayed& out,
                      bool all_ranks = false) {
  models::EvalOptions eo;
  eo.keep_plan = true;
  eo.keep_timeline = true;
  auto e = models::evaluate(s, eo);
  ASSERT_TRUE(e) << what << ": " << e.error().message;
  ReplayOptions o;
  o.device = DeviceKind::kCpu;
  o.warmup_steps = 0;
  o.measured_steps = 1;
  o.watchdog_timeout = 60s;
  o.all_ranks = all_ranks;
  auto r = replay(*e->plan, o);
  ASSERT_TRUE(r) << what << ": " << r.error().message;
  const sim::Plan& plan = *e->plan;
  std::map<std::size_t, sim::Span> spans;
  for (const sim::Span& sp : r->timeline.spans) spans[sp.op.index()] = sp;
  EXPECT_EQ(static_cast<std::int64_t>(spans.size()) + r->skipped_ops,
            static_cast<std::int64_t>(plan.ops.size()))
      << what;
  for (const auto& [i, span] : spans) {
    const sim::Op& op = plan.ops[i];
    for (sim::OpId dep : op.deps) {
      auto d = spans.find(dep.index());
      if (d == spans.end() ||
          plan.lanes[op.lane.index()].rank != plan.lanes[plan.ops[dep.index()].lane.index()].rank) {
        continue;
      }
      EXPECT_GE(span.start, d->second.end)
          << what << ": " << op.name << " after " << plan.ops[dep.index()].name << " on "
          << plan.lanes[plan.ops[dep.index()].lane.index()].name;
    }
  }
  auto cmp = sim::compare_timelines(*e->timeline, r->timeline);
  ASSERT_TRUE(cmp) << what << ": " << cmp.error().message;
  EXPECT_GT(cmp->matched_ops, 0) << what;
  out = Replayed{std::move(*e->plan), std::move(*e->timeline), std::move(*r)};
}

TEST(ReplayExamples, EveryExampleScaledDownReplaysOnTheCpuDevice) {
  const fs::path dir = fs::path(OFFSIM_SOURCE_DIR) / "scenarios/examples";
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 10u);
  int multi_gpu = 0;  // multi-GPU examples so far
  for (const fs::path& path : files) {
    auto file = scenarios::load_scenario_file(path.string());
    ASSERT_TRUE(file) << file.error().message;
    scenarios::Node doc = file->base;
    if (file->sweep) {
      auto first = scenarios::apply_point(file->base, file->sweep->point(0));
      ASSERT_TRUE(first) << first.error().message;
      doc = *first;
    }
    auto s = scenarios::scenario_from_document(doc, file->base_dir);
    ASSERT_TRUE(s) << s.error().message;
    scale_down(*s);
    Replayed r;
    replay_and_check(*s, path.filename().string(), r);
    // One simulated rank per pipeline stage runs (the representatives).
    EXPECT_EQ(static_cast<int>(r.measured.ranks.size()), s->parallelism.pp) << path;
    // And with every rank: data- and tensor-parallel collectives meet their real peers. Under
    // the sanitizers (several times slower, and the every-rank replays are most of this test's
    // time) every third multi-GPU example, in name order: data parallel over two nodes, tensor
    // parallel and expert parallel today.
    const int gpus = s->parallelism.dp * s->parallelism.tp * s->parallelism.pp;
    const bool every_rank = gpus > 1 && (!kSanitized || multi_gpu % 3 == 0);
    multi_gpu += gpus > 1 ? 1 : 0;
    if (every_rank) {
      Replayed all;
      replay_and_check(*s, path.filename().string() + " (all ranks)", all, true);
      EXPECT_EQ(static_cast<int>(all.measured.ranks.size()), gpus) << path;
      EXPECT_EQ(all.measured.timeline.ops.size(), all.plan.ops.size()) << path;
    }
  }
}

// A pipeline plan: every stage on its own simulated rank, each send matched by its receive on
// the peer (the replay hung before receives were ops), under both schedules.
TEST(ReplayExamples, PipelinePlansReplayWithMatchedSendsAndReceives) {
  using Schedule = models::ParallelConfig::PipelineSchedule;
  for (const Schedule schedule : {Schedule::k1F1B, Schedule::kInterleaved1F1B}) {
    models::Scenario s;
    s.name = "pipeline";
    s.model = *models::find_model("llama3-8b");
    s.hardware.system = "dgx-h100";
    s.training = {.global_batch = 4, .micro_batch = 1, .seq_len = 1024};
    s.parallelism = {.tp = 2,
                     .pp = 4,
                     .schedule = schedule,
                     .virtual_stages = schedule == Schedule::k1F1B ? 1 : 2};
    scale_down(s);
    const std::string what = std::string("pp4 ") + models::to_string(schedule);
    Replayed r;
    replay_and_check(s, what, r);
    EXPECT_EQ(r.measured.ranks, (std::vector<int>{0, 2, 4, 6})) << what;
    EXPECT_EQ(r.measured.skipped_ops, 0) << what;
    // Every send and every receive ran (on the device they meet: a lone one would have hung
    // until the watchdog).
    std::map<std::size_t, const sim::Span*> by_op;
    for (const sim::Span& sp : r.measured.timeline.spans) by_op[sp.op.index()] = &sp;
    int sends = 0;
    int receives = 0;
    for (std::size_t i = 0; i < r.plan.ops.size(); ++i) {
      const sim::Op& op = r.plan.ops[i];
      if (op.kind != sim::OpKind::kP2P) continue;
      EXPECT_TRUE(by_op.count(i)) << op.name;
      (op.sizes.p2p_role == sim::P2PRole::kSend ? sends : receives) += 1;
    }
    EXPECT_EQ(receives, sends) << what;
    EXPECT_GT(receives, 0) << what;
  }
}

// DP x TP x PP: the plan's representatives (one per stage) expanded to all eight ranks, each on
// its own simulated rank, with tensor- and data-parallel collectives among them and every
// pipeline transfer between matching members of adjacent stages.
TEST(ReplayExamples, DataTensorPipelinePlanRunsEveryRank) {
  models::Scenario s;
  s.name = "dp2-tp2-pp2";
  s.model = *models::find_model("llama3-8b");
  s.hardware.system = "dgx-h100";
  s.training = {.global_batch = 8, .micro_batch = 1, .seq_len = 1024};
  s.parallelism = {.dp = 2, .tp = 2, .pp = 2, .sequence_parallel = true, .zero_stage = 1};
  scale_down(s);
  Replayed r;
  replay_and_check(s, "dp2 tp2 pp2", r, true);
  EXPECT_EQ(r.measured.ranks, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(r.measured.skipped_ops, 0);
  EXPECT_EQ(r.measured.timeline.spans.size(), r.plan.ops.size());

  // The expanded plan itself: every member has the representative's ops, and each copied
  // transfer pairs members at the same offset of adjacent stages.
  auto full = sim::expand_representatives(r.plan);
  ASSERT_TRUE(full) << full.error().message;
  ASSERT_TRUE(sim::validate(*full));
  EXPECT_EQ(full->ops.size(), 4 * r.plan.ops.size());
  std::map<int, int> p2p_per_rank;
  for (const sim::Op& op : full->ops) {
    if (op.kind != sim::OpKind::kP2P) continue;
    const int rank = full->lanes[op.lane.index()].rank;
    ++p2p_per_rank[rank];
    EXPECT_EQ(op.sizes.peer % 4, rank % 4) << op.name;  // same member offset, other stage
    EXPECT_NE(op.sizes.peer / 4, rank / 4) << op.name;
  }
  EXPECT_EQ(p2p_per_rank.size(), 8u);
}

}  // namespace
}  // namespace offsim::backends
