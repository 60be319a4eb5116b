#include "gui/app/memory_view.h"

#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineSeries>
#include <QMouseEvent>
#include <QScatterSeries>
#include <QSplitter>
#include <QTableWidget>
#include <QVBoxLayout>
#include <QValueAxis>
#include <algorithm>
#include <cmath>

#include "gui/app/colours.h"

namespace offsim::gui {
namespace {

constexpr double kGiB = kBytesPerGiB;  // one unit with the CLI: GiB
double to_ms(std::int64_t ns) { return static_cast<double>(ns) * 1e-6; }

}  // namespace

void MemoryChartView::mousePressEvent(QMouseEvent* event) {
  if (event->button() == Qt::LeftButton && chart() != nullptr) {
    const QPointF p = chart()->mapFromScene(mapToScene(event->position().toPoint()));
    if (chart()->plotArea().contains(p) && !chart()->series().isEmpty()) {
      const QPointF value = chart()->mapToValue(p, chart()->series().first());
      emit clicked_at_ms(value.x());
    }
  }
  QChartView::mousePressEvent(event);
}

MemoryView::MemoryView(QWidget* parent) : QWidget(parent) {
  view_ = new MemoryChartView(new QChart);
  view_->setRenderHint(QPainter::Antialiasing);
  view_->setRubberBand(QChartView::HorizontalRubberBand);
  pool_box_ = new QComboBox;
  live_label_ =
      new QLabel("Live tensors: click the chart for a time, or pick a pool for its peak.");
  live_label_->setWordWrap(true);
  table_ = new QTableWidget(0, 3);
  table_->setHorizontalHeaderLabels({"tensor (or allocating op)", "class", "size"});
  table_->horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);
  table_->horizontalHeader()->setSectionResizeMode(1, QHeaderView::ResizeToContents);
  table_->horizontalHeader()->setSectionResizeMode(2, QHeaderView::ResizeToContents);
  table_->verticalHeader()->hide();
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  auto* side = new QWidget;
  auto* side_layout = new QVBoxLayout(side);
  side_layout->setContentsMargins(0, 0, 0, 0);
  side_layout->addWidget(new QLabel("Pool"));
  side_layout->addWidget(pool_box_);
  side_layout->addWidget(live_label_);
  side_layout->addWidget(table_, 1);
  auto* splitter = new QSplitter;
  splitter->addWidget(view_);
  splitter->addWidget(side);
  splitter->setStretchFactor(0, 3);
  splitter->setStretchFactor(1, 1);
  side->setMinimumWidth(380);
  auto* layout = new QHBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->addWidget(splitter);
  connect(pool_box_, &QComboBox::currentIndexChanged, this,
          [this](int) { show_peak_of_selected(); });
  connect(view_, &MemoryChartView::clicked_at_ms, this, [this](double ms) {
    const int pool = pool_box_->currentIndex();
    if (pool >= 0) show_live_at(pool, static_cast<std::int64_t>(std::llround(ms * 1e6)));
  });
  rebuild_chart();
}

void MemoryView::set_data(std::shared_ptr<const TimelineModel> timelines,
                          std::vector<MemoryModel> memory) {
  timelines_ = std::move(timelines);
  memory_ = std::move(memory);
  rebuild_chart();
}

void MemoryView::rebuild_chart() {
  auto* chart = new QChart;
  chart->setMargins(QMargins(4, 4, 12, 4));
  chart->setBackgroundRoundness(0);
  chart->legend()->setAlignment(Qt::AlignBottom);
  axis_x_ = new QValueAxis;
  axis_x_->setTitleText("time (ms)");
  axis_x_->setLabelFormat("%.3f");
  axis_y_ = new QValueAxis;
  axis_y_->setTitleText("bytes in use (GiB)");
  axis_y_->setLabelFormat("%.1f");
  chart->addAxis(axis_x_, Qt::AlignBottom);
  chart->addAxis(axis_y_, Qt::AlignLeft);
  pools_.clear();
  pool_box_->blockSignals(true);
  pool_box_->clear();
  const bool several = memory_.size() > 1;
  double max_peak = 0.0;
  for (std::size_t m = 0; m < memory_.size(); ++m) {
    for (const PoolSeries& p : memory_[m].pools())
      max_peak = std::max(max_peak, double(p.peak_bytes));
  }
  double y_max = max_peak;
  auto* peaks = new QScatterSeries;
  peaks->setName("peak");
  peaks->setMarkerShape(QScatterSeries::MarkerShapeTriangle);
  peaks->setMarkerSize(11);
  peaks->setColor(QColor(200, 0, 0));
  int colour = 0;
  for (std::size_t m = 0; m < memory_.size(); ++m) {
    const std::string source =
        timelines_ && m < timelines_->timelines().size() ? timelines_->timelines()[m].source : "";
    for (std::size_t i = 0; i < memory_[m].pools().size(); ++i) {
      const PoolSeries& p = memory_[m].pools()[i];
      const QString name = QString::fromStdString(several ? p.name + " (" + source + ")" : p.name);
      auto* series = new QLineSeries;
      series->setName(name);
      QPen pen(category_colour(colour));
      pen.setWidthF(1.6);
      if (m > 0) pen.setStyle(Qt::DashLine);  // measured under predicted
      series->setPen(pen);
      chart->addSeries(series);
      series->attachAxis(axis_x_);
      series->attachAxis(axis_y_);
      pools_.push_back({static_cast<int>(m), static_cast<int>(i), series});
      pool_box_->addItem(name);
      peaks->append(to_ms(p.peak_time_ns), static_cast<double>(p.peak_bytes) / kGiB);
      // The capacity line, unless it is far above every peak (an "unbounded" host pool).
      if (p.capacity_bytes > 0 &&
          static_cast<double>(p.capacity_bytes) <= 4.0 * std::max(max_peak, 1.0)) {
        auto* cap = new QLineSeries;
        cap->setName(name + " capacity");
        QPen cap_pen(category_colour(colour));
        cap_pen.setStyle(Qt::DotLine);
        cap_pen.setWidthF(1.2);
        cap->setPen(cap_pen);
        const TimeWindow extent = timelines_ ? timelines_->extent() : TimeWindow{0, 1};
        const double c = static_cast<double>(p.capacity_bytes) / kGiB;
        cap->append(to_ms(std::min<std::int64_t>(extent.start_ns, 0)), c);
        cap->append(to_ms(std::max<std::int64_t>(extent.end_ns, 1)), c);
        chart->addSeries(cap);
        cap->attachAxis(axis_x_);
        cap->attachAxis(axis_y_);
        y_max = std::max(y_max, static_cast<double>(p.capacity_bytes));
      }
      ++colour;
    }
  }
  chart->addSeries(peaks);
  peaks->attachAxis(axis_x_);
  peaks->attachAxis(axis_y_);
  axis_y_->setRange(0.0, std::max(y_max * 1.08 / kGiB, 1e-9));
  const TimeWindow extent = timelines_ ? timelines_->extent() : TimeWindow{0, 1};
  axis_x_->setRange(to_ms(extent.start_ns), to_ms(std::max(extent.end_ns, extent.start_ns + 1)));
  connect(axis_x_, &QValueAxis::rangeChanged, this, [this](double lo, double hi) {
    redecimate();
    if (!updating_axis_) emit time_range_changed(lo, hi);
  });
  QChart* old = view_->chart();
  view_->setChart(chart);
  delete old;
  pool_box_->blockSignals(false);
  // Start on the pool with the highest peak.
  int best = -1;
  double best_peak = -1.0;
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    const PoolSeries& p = memory_[pools_[i].model].pools()[pools_[i].pool];
    if (double(p.peak_bytes) > best_peak) {
      best_peak = double(p.peak_bytes);
      best = static_cast<int>(i);
    }
  }
  redecimate();
  if (best >= 0) {
    pool_box_->setCurrentIndex(best);
    show_peak_of_selected();
  } else {
    table_->setRowCount(0);
  }
}

void MemoryView::redecimate() {
  if (axis_x_ == nullptr) return;
  const auto lo = static_cast<std::int64_t>(std::floor(axis_x_->min() * 1e6));
  const auto hi = static_cast<std::int64_t>(std::ceil(axis_x_->max() * 1e6));
  const double width = std::max(100.0, view_->chart()->plotArea().width());
  points_drawn_ = 0;
  for (const PoolRef& ref : pools_) {
    const PoolSeries& p =
        memory_[static_cast<std::size_t>(ref.model)].pools()[static_cast<std::size_t>(ref.pool)];
    const std::vector<StepPoint> steps = decimate_steps(p.steps, lo, std::max(hi, lo + 1), width);
    QList<QPointF> points;
    points.reserve(static_cast<qsizetype>(steps.size()));
    for (const StepPoint& s : steps)
      points.append(QPointF(to_ms(s.time_ns), double(s.bytes) / kGiB));
    points_drawn_ += steps.size();
    ref.series->replace(points);
  }
}

void MemoryView::set_time_range_ms(double min_ms, double max_ms) {
  if (axis_x_ == nullptr || (axis_x_->min() == min_ms && axis_x_->max() == max_ms)) return;
  updating_axis_ = true;
  axis_x_->setRange(min_ms, max_ms);
  updating_axis_ = false;
}

void MemoryView::show_peak_of_selected() {
  const int i = pool_box_->currentIndex();
  if (i < 0 || static_cast<std::size_t>(i) >= pools_.size()) return;
  const PoolSeries& p = memory_[pools_[i].model].pools()[pools_[i].pool];
  show_live_at(i, p.peak_time_ns);
}

void MemoryView::show_live_at(int pool, std::int64_t t_ns) {
  if (pool < 0 || static_cast<std::size_t>(pool) >= pools_.size() || !timelines_) return;
  const PoolRef& ref = pools_[static_cast<std::size_t>(pool)];
  const MemoryModel& model = memory_[static_cast<std::size_t>(ref.model)];
  const sim::Timeline& timeline = timelines_->timelines()[static_cast<std::size_t>(ref.model)];
  const LiveSet live = model.live_at(timeline, static_cast<std::size_t>(ref.pool), t_ns);
  const PoolSeries& p = model.pools()[static_cast<std::size_t>(ref.pool)];
  live_label_->setText(QString::fromStdString(
      p.name + ": " + format_bytes(double(live.bytes_in_use)) + " in use at " +
      format_duration_ns(t_ns) + (t_ns == p.peak_time_ns ? " (the peak)" : "") +
      (live.exact ? " — live tensors"
                  : " — the timeline has no memory events for the live set here")));
  table_->setRowCount(static_cast<int>(live.entries.size()));
  for (std::size_t r = 0; r < live.entries.size(); ++r) {
    const LiveEntry& e = live.entries[r];
    const int row = static_cast<int>(r);
    table_->setItem(row, 0, new QTableWidgetItem(QString::fromStdString(e.name)));
    table_->setItem(row, 1, new QTableWidgetItem(QString::fromUtf8(sim::to_string(e.category))));
    auto* size = new QTableWidgetItem(QString::fromStdString(format_bytes(double(e.bytes))));
    size->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
    table_->setItem(row, 2, size);
  }
}

}  // namespace offsim::gui
