#include "gui/app/timeline_view.h"

#include <QCategoryAxis>
#include <QKeyEvent>
#include <QLineSeries>
#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <QValueAxis>
#include <QWheelEvent>
#include <algorithm>
#include <cmath>

#include "gui/app/colours.h"

namespace offsim::gui {
namespace {

constexpr double kMinWindowNs = 10.0;

double to_ms(std::int64_t ns) { return static_cast<double>(ns) * 1e-6; }
std::int64_t from_ms(double ms) { return static_cast<std::int64_t>(std::llround(ms * 1e6)); }

}  // namespace

SpanItem::SpanItem(QChart* chart) : QGraphicsItem(chart), chart_(chart) {
  setZValue(10);
  area_ = chart->plotArea();
}

void SpanItem::set_model(std::shared_ptr<const TimelineModel> model) {
  model_ = std::move(model);
  update();
}

void SpanItem::set_window(TimeWindow window) {
  window_ = window;
  update();
}

QRectF SpanItem::boundingRect() const { return area_; }

void SpanItem::plot_area_changed() {
  prepareGeometryChange();
  area_ = chart_->plotArea();
  update();
}

void SpanItem::paint(QPainter* painter, const QStyleOptionGraphicsItem*, QWidget*) {
  stats_ = {};
  if (!model_ || area_.width() <= 0 || area_.height() <= 0) return;
  const auto& rows = model_->rows();
  if (rows.empty() || window_.end_ns <= window_.start_ns) return;
  painter->save();
  painter->setClipRect(area_);
  painter->setRenderHint(QPainter::Antialiasing, false);
  const double row_h = area_.height() / static_cast<double>(rows.size());
  const double width = area_.width();
  const double px_per_ns = width / static_cast<double>(window_.end_ns - window_.start_ns);
  auto x_of = [&](std::int64_t t) {
    return area_.left() + static_cast<double>(t - window_.start_ns) * px_per_ns;
  };
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const LaneRow& row = rows[i];
    const double top = area_.top() + static_cast<double>(i) * row_h;
    if (row.source > 0)
      painter->fillRect(QRectF(area_.left(), top, width, row_h), QColor(246, 246, 250));
    const double pad = std::min(2.0, row_h * 0.1);
    const double bar_top = top + pad;
    const double bar_h = std::max(1.0, row_h - 2.0 * pad);
    model_->visible_spans(i, window_, width, rects_);
    for (const DrawSpan& r : rects_) {
      const double x0 = std::max(x_of(r.start_ns), area_.left() - 1.0);
      const double x1 = std::min(x_of(r.end_ns), area_.right() + 1.0);
      const QColor c = busy_shade(kind_colour(r.kind), r.busy);
      painter->fillRect(QRectF(x0, bar_top, std::max(x1 - x0, 1.0), bar_h), c);
      stats_.spans += r.count;
    }
    stats_.rectangles += rects_.size();
    // Exposed copy time: a red band along the bottom of the transfer row.
    if (!row.exposed.empty()) {
      visible_intervals(row.exposed, window_, width, intervals_);
      const double band = std::max(2.0, bar_h * 0.3);
      for (const TimeWindow& w : intervals_) {
        const double x0 = x_of(w.start_ns);
        const double x1 = x_of(w.end_ns);
        const QRectF mark(x0, bar_top + bar_h - band, std::max(x1 - x0, 1.0), band);
        painter->fillRect(mark, QColor(255, 255, 255));
        painter->fillRect(mark, QBrush(exposed_colour(), Qt::BDiagPattern));
        painter->fillRect(QRectF(mark.left(), mark.top(), mark.width(), 1.5), exposed_colour());
      }
    }
    // Critical path: an orange band along the top of the row.
    if (!row.critical.empty()) {
      visible_intervals(row.critical, window_, width, intervals_);
      const double band = std::max(2.0, bar_h * 0.2);
      for (const TimeWindow& w : intervals_) {
        const double x0 = x_of(w.start_ns);
        const double x1 = x_of(w.end_ns);
        painter->fillRect(QRectF(x0, bar_top, std::max(x1 - x0, 1.0), band), critical_colour());
      }
    }
  }
  stats_.lanes = rows.size();
  painter->restore();
}

TimelineView::TimelineView(QWidget* parent) : QChartView(parent) {
  auto* chart = new QChart;
  chart->legend()->hide();
  chart->setMargins(QMargins(4, 4, 12, 4));
  chart->setBackgroundRoundness(0);
  axis_x_ = new QValueAxis;
  axis_x_->setTitleText("time (ms)");
  axis_x_->setLabelFormat("%.3f");
  axis_y_ = new QCategoryAxis;
  axis_y_->setLabelsPosition(QCategoryAxis::AxisLabelsPositionCenter);
  axis_y_->setReverse(true);
  axis_y_->setGridLineVisible(false);
  chart->addAxis(axis_x_, Qt::AlignBottom);
  chart->addAxis(axis_y_, Qt::AlignLeft);
  anchor_ = new QLineSeries;
  anchor_->setPen(Qt::NoPen);
  chart->addSeries(anchor_);
  anchor_->attachAxis(axis_x_);
  anchor_->attachAxis(axis_y_);
  setChart(chart);
  item_ = new SpanItem(chart);
  setRenderHint(QPainter::Antialiasing, false);
  setRubberBand(QChartView::HorizontalRubberBand);
  setMouseTracking(true);
  setFocusPolicy(Qt::StrongFocus);
  connect(chart, &QChart::plotAreaChanged, this,
          [this](const QRectF&) { item_->plot_area_changed(); });
  connect(axis_x_, &QValueAxis::rangeChanged, this, &TimelineView::axis_range_changed);
  update_lane_axis();
}

void TimelineView::set_model(std::shared_ptr<const TimelineModel> model) {
  model_ = std::move(model);
  item_->set_model(model_);
  update_lane_axis();
  fit_all();
}

void TimelineView::update_lane_axis() {
  for (const QString& label : axis_y_->categoriesLabels()) axis_y_->remove(label);
  const std::size_t n = model_ ? model_->rows().size() : 0;
  for (std::size_t i = 0; i < n; ++i) {
    axis_y_->append(QString::fromStdString(model_->rows()[i].label), static_cast<double>(i + 1));
  }
  axis_y_->setRange(0.0, static_cast<double>(std::max<std::size_t>(n, 1)));
  anchor_->clear();
  anchor_->append(0.0, 0.0);
}

void TimelineView::fit_all() {
  TimeWindow extent = model_ ? model_->extent() : TimeWindow{0, 1};
  if (extent.end_ns <= extent.start_ns) extent.end_ns = extent.start_ns + 1000;
  set_window(extent);
}

void TimelineView::set_window(TimeWindow window) {
  if (static_cast<double>(window.end_ns - window.start_ns) < kMinWindowNs) {
    const std::int64_t mid = window.start_ns / 2 + window.end_ns / 2;
    window = {mid - 5, mid + 5};
  }
  window_ = window;
  updating_axis_ = true;
  axis_x_->setRange(to_ms(window.start_ns), to_ms(window.end_ns));
  updating_axis_ = false;
  item_->set_window(window_);
  emit time_range_changed(to_ms(window.start_ns), to_ms(window.end_ns));
}

void TimelineView::set_time_range_ms(double min_ms, double max_ms) {
  const TimeWindow w{from_ms(min_ms), from_ms(max_ms)};
  if (w == window_) return;
  set_window(w);
}

void TimelineView::axis_range_changed(double min_ms, double max_ms) {
  if (updating_axis_) return;
  // A rubber-band zoom changed the axis directly.
  window_ = {from_ms(min_ms), from_ms(max_ms)};
  item_->set_window(window_);
  emit time_range_changed(min_ms, max_ms);
}

std::pair<int, std::int64_t> TimelineView::hit(QPointF view_pos) const {
  const QPointF p = chart()->mapFromScene(mapToScene(view_pos.toPoint()));
  const QRectF area = chart()->plotArea();
  if (!model_ || !area.contains(p) || model_->rows().empty()) return {-1, 0};
  const double f = (p.x() - area.left()) / area.width();
  const auto t = window_.start_ns + static_cast<std::int64_t>(
                                        f * static_cast<double>(window_.end_ns - window_.start_ns));
  const int row = static_cast<int>((p.y() - area.top()) / area.height() *
                                   static_cast<double>(model_->rows().size()));
  return {std::clamp(row, 0, static_cast<int>(model_->rows().size()) - 1), t};
}

void TimelineView::wheelEvent(QWheelEvent* event) {
  const auto [row, t] = hit(event->position());
  const std::int64_t anchor = row >= 0 ? t : (window_.start_ns / 2 + window_.end_ns / 2);
  const double factor = std::pow(1.2, -event->angleDelta().y() / 120.0);
  const auto scale = [&](std::int64_t edge) {
    return anchor + static_cast<std::int64_t>(static_cast<double>(edge - anchor) * factor);
  };
  set_window({scale(window_.start_ns), scale(window_.end_ns)});
  event->accept();
}

void TimelineView::mousePressEvent(QMouseEvent* event) {
  if (event->button() == Qt::MiddleButton ||
      (event->button() == Qt::LeftButton && (event->modifiers() & Qt::ShiftModifier))) {
    panning_ = true;
    pan_from_ = event->position();
    event->accept();
    return;
  }
  if (event->button() == Qt::LeftButton) {
    const auto [row, t] = hit(event->position());
    if (row >= 0) {
      const double ns_per_px = static_cast<double>(window_.end_ns - window_.start_ns) /
                               std::max(1.0, chart()->plotArea().width());
      if (auto span = model_->span_at(static_cast<std::size_t>(row), t,
                                      static_cast<std::int64_t>(3 * ns_per_px))) {
        emit span_selected(model_->rows()[static_cast<std::size_t>(row)].source, *span);
      }
    }
  }
  if (event->button() == Qt::RightButton) {
    // Zoom out around the centre instead of QChartView's zoom of both axes.
    const std::int64_t half = window_.end_ns - window_.start_ns;
    set_window({window_.start_ns - half / 2, window_.end_ns + half / 2});
    event->accept();
    return;
  }
  QChartView::mousePressEvent(event);
}

void TimelineView::mouseMoveEvent(QMouseEvent* event) {
  if (panning_) {
    const double dx = event->position().x() - pan_from_.x();
    pan_from_ = event->position();
    const double ns_per_px = static_cast<double>(window_.end_ns - window_.start_ns) /
                             std::max(1.0, chart()->plotArea().width());
    const auto shift = static_cast<std::int64_t>(-dx * ns_per_px);
    set_window({window_.start_ns + shift, window_.end_ns + shift});
    event->accept();
    return;
  }
  if (event->buttons() == Qt::NoButton) {
    const auto [row, t] = hit(event->position());
    std::optional<std::uint32_t> span;
    if (row >= 0) {
      const double ns_per_px = static_cast<double>(window_.end_ns - window_.start_ns) /
                               std::max(1.0, chart()->plotArea().width());
      span = model_->span_at(static_cast<std::size_t>(row), t,
                             static_cast<std::int64_t>(3 * ns_per_px));
    }
    if (span) {
      const int source = model_->rows()[static_cast<std::size_t>(row)].source;
      const std::string tip =
          span_tooltip(model_->timelines()[static_cast<std::size_t>(source)], *span);
      QToolTip::showText(event->globalPosition().toPoint(), QString::fromStdString(tip), this);
    } else {
      QToolTip::hideText();
    }
  }
  QChartView::mouseMoveEvent(event);
}

void TimelineView::mouseReleaseEvent(QMouseEvent* event) {
  if (panning_) {
    panning_ = false;
    event->accept();
    return;
  }
  if (event->button() == Qt::RightButton) {
    event->accept();
    return;
  }
  QChartView::mouseReleaseEvent(event);
}

void TimelineView::mouseDoubleClickEvent(QMouseEvent* event) {
  fit_all();
  event->accept();
}

void TimelineView::keyPressEvent(QKeyEvent* event) {
  const std::int64_t span = window_.end_ns - window_.start_ns;
  switch (event->key()) {
    case Qt::Key_F:
    case Qt::Key_Home:
      fit_all();
      break;
    case Qt::Key_Left:
      set_window({window_.start_ns - span / 10, window_.end_ns - span / 10});
      break;
    case Qt::Key_Right:
      set_window({window_.start_ns + span / 10, window_.end_ns + span / 10});
      break;
    case Qt::Key_Plus:
    case Qt::Key_Equal:
      set_window({window_.start_ns + span / 4, window_.end_ns - span / 4});
      break;
    case Qt::Key_Minus:
      set_window({window_.start_ns - span / 2, window_.end_ns + span / 2});
      break;
    default:
      QChartView::keyPressEvent(event);
      return;
  }
  event->accept();
}

void TimelineView::resizeEvent(QResizeEvent* event) {
  QChartView::resizeEvent(event);
  item_->plot_area_changed();
}

}  // namespace offsim::gui
