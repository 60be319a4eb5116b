// Redraw time of the timeline view with one million spans, rendered offscreen to a QImage, at
// zoom levels from the whole step down to a 1/100,000 slice. Target: under 50 ms per redraw.
//
//   QT_QPA_PLATFORM=offscreen ./timeline_redraw_benchmark
#include <QApplication>
#include <QImage>
#include <QPainter>
#include <memory>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include "gui/app/timeline_view.h"
#include "gui/model/timeline_model.h"

namespace offsim::gui {
namespace {

constexpr int kRanks = 8;
constexpr std::int64_t kSpans = 1'000'000;

// 8 ranks x (compute, h2d, d2h, comm) lanes. Compute spans are 20-80 µs back to back; copies and
// collectives sit on their lanes with gaps. Deterministic (a linear congruential sequence).
std::shared_ptr<const TimelineModel> million_span_model() {
  sim::Timeline t;
  const char* kinds[] = {"compute", "h2d", "d2h", "comm"};
  for (int r = 0; r < kRanks; ++r) {
    for (const char* k : kinds) t.lanes.push_back(fmt::format("rank{}.{}", r, k));
  }
  std::vector<std::int64_t> lane_time(t.lanes.size(), 0);
  std::uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 33;
  };
  t.ops.reserve(kSpans);
  t.spans.reserve(kSpans);
  for (std::int64_t i = 0; i < kSpans; ++i) {
    const std::size_t lane =
        static_cast<std::size_t>(i % static_cast<std::int64_t>(t.lanes.size()));
    const int kind_index = static_cast<int>(lane % 4);
    const sim::OpKind kind = kind_index == 0   ? sim::OpKind::kGemm
                             : kind_index == 3 ? sim::OpKind::kCollective
                                               : sim::OpKind::kCopy;
    const std::int64_t duration = 20'000 + static_cast<std::int64_t>(next() % 60'000);
    const std::int64_t gap = kind_index == 0 ? 0 : static_cast<std::int64_t>(next() % 40'000);
    const std::int64_t start = lane_time[lane] + gap;
    lane_time[lane] = start + duration;
    t.ops.push_back(sim::OpInfo{"op", kind, sim::OpCategory::kNone, -1, 1e9, 1'000'000});
    t.spans.push_back(sim::Span{sim::OpId(static_cast<std::size_t>(i)), sim::LaneId(lane),
                                sim::kTimeZero + sim::Duration{start},
                                sim::kTimeZero + sim::Duration{start + duration}});
  }
  auto model = TimelineModel::build({std::move(t)});
  if (!model) return nullptr;
  return std::make_shared<const TimelineModel>(std::move(*model));
}

const std::shared_ptr<const TimelineModel>& shared_model() {
  static const std::shared_ptr<const TimelineModel> model = million_span_model();
  return model;
}

// range(0): the visible fraction is 1 / range(0) of the step, centred.
void BM_TimelineRedraw(benchmark::State& state) {
  const auto& model = shared_model();
  if (!model) {
    state.SkipWithError("building the model failed");
    return;
  }
  TimelineView view;
  view.resize(1600, 900);
  view.set_model(model);
  const TimeWindow extent = model->extent();
  const std::int64_t width = (extent.end_ns - extent.start_ns) / state.range(0);
  const std::int64_t mid = extent.start_ns / 2 + extent.end_ns / 2;
  view.set_window({mid - width / 2, mid + width / 2});
  QImage image(view.size(), QImage::Format_ARGB32_Premultiplied);
  for (auto _ : state) {
    QPainter painter(&image);
    view.render(&painter);
    painter.end();
    benchmark::DoNotOptimize(image.constBits());
  }
  const DrawStats stats = view.draw_stats();
  state.counters["spans_visible"] = static_cast<double>(stats.spans);
  state.counters["rectangles"] = static_cast<double>(stats.rectangles);
  state.counters["lanes"] = static_cast<double>(stats.lanes);
}
BENCHMARK(BM_TimelineRedraw)
    ->Arg(1)
    ->Arg(10)
    ->Arg(1000)
    ->Arg(100000)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Culling alone (no Qt painting): every lane at 1600 px, whole step.
void BM_VisibleSpansAllLanes(benchmark::State& state) {
  const auto& model = shared_model();
  if (!model) {
    state.SkipWithError("building the model failed");
    return;
  }
  const TimeWindow extent = model->extent();
  const std::int64_t width = (extent.end_ns - extent.start_ns) / state.range(0);
  const std::int64_t mid = extent.start_ns / 2 + extent.end_ns / 2;
  std::vector<DrawSpan> out;
  for (auto _ : state) {
    for (std::size_t row = 0; row < model->rows().size(); ++row) {
      model->visible_spans(row, {mid - width / 2, mid + width / 2}, 1600.0, out);
      benchmark::DoNotOptimize(out.data());
    }
  }
}
BENCHMARK(BM_VisibleSpansAllLanes)->Arg(1)->Arg(1000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace offsim::gui

int main(int argc, char** argv) {
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  QApplication app(argc, argv);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
