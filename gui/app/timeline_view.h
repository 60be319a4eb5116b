// TimelineView: the timeline chart — one row per lane, spans drawn by a single culled item on a
// QChart; wheel zoom, rubber-band zoom, pan (middle or shift-drag, arrow keys), fit-all (F or
// double-click), hover tooltips, critical-path outline and exposed-transfer marks.
//
//   auto* view = new gui::TimelineView;
//   view->set_model(std::make_shared<const gui::TimelineModel>(std::move(model)));
//   view->fit_all();
//   connect(view, &gui::TimelineView::time_range_changed, memory,
//   &gui::MemoryView::set_time_range); gui::DrawStats s = view->draw_stats();  // lanes and spans
//   of the last paint
#pragma once

#include <QChartView>
#include <QGraphicsItem>
#include <memory>

#include "gui/model/timeline_model.h"

class QCategoryAxis;
class QValueAxis;
class QLineSeries;

namespace offsim::gui {

struct DrawStats {
  std::size_t lanes = 0;       // rows drawn
  std::size_t spans = 0;       // spans represented by the drawn rectangles
  std::size_t rectangles = 0;  // rectangles painted for them
};

// The one graphics item that paints every visible span over the chart's plot area.
class SpanItem : public QGraphicsItem {
 public:
  explicit SpanItem(QChart* chart);
  void set_model(std::shared_ptr<const TimelineModel> model);
  void set_window(TimeWindow window);
  QRectF boundingRect() const override;
  void paint(QPainter* painter, const QStyleOptionGraphicsItem* option, QWidget* widget) override;
  void plot_area_changed();
  const DrawStats& stats() const { return stats_; }

 private:
  QChart* chart_;
  std::shared_ptr<const TimelineModel> model_;
  TimeWindow window_;
  QRectF area_;
  DrawStats stats_;
  std::vector<DrawSpan> rects_;        // reused between paints
  std::vector<TimeWindow> intervals_;  // reused between paints
};

class TimelineView : public QChartView {
  Q_OBJECT
 public:
  explicit TimelineView(QWidget* parent = nullptr);
  void set_model(std::shared_ptr<const TimelineModel> model);
  const TimelineModel* model() const { return model_.get(); }
  TimeWindow window() const { return window_; }
  DrawStats draw_stats() const { return item_->stats(); }

 public slots:
  void fit_all();
  void set_window(offsim::gui::TimeWindow window);
  // In milliseconds, as the memory view's time axis.
  void set_time_range_ms(double min_ms, double max_ms);

 signals:
  void time_range_changed(double min_ms, double max_ms);
  void span_selected(int source, quint32 span);

 protected:
  void wheelEvent(QWheelEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void mouseDoubleClickEvent(QMouseEvent* event) override;
  void keyPressEvent(QKeyEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;

 private:
  void axis_range_changed(double min_ms, double max_ms);
  // The row and time under a view position; row -1 when outside the plot.
  std::pair<int, std::int64_t> hit(QPointF view_pos) const;
  void update_lane_axis();

  std::shared_ptr<const TimelineModel> model_;
  QValueAxis* axis_x_;
  QCategoryAxis* axis_y_;
  QLineSeries* anchor_;  // invisible; gives the axes a series so the chart lays them out
  SpanItem* item_;
  TimeWindow window_{0, 1};
  bool panning_ = false;
  QPointF pan_from_;
  bool updating_axis_ = false;
};

}  // namespace offsim::gui
