// SweepView: a sweep's points as a scatter — step time or tokens/s against peak HBM — coloured
// by any axis, infeasible points marked, the Pareto front drawn. Clicking a point shows its
// axes and report and asks for it to be simulated (point_activated).
//
//   auto* sweep = new gui::SweepView;
//   sweep->set_table(data.sweep);
//   sweep->set_colour_axis("offload.policy");
//   connect(sweep, &gui::SweepView::point_activated, window, &MainWindow::run_sweep_point);
#pragma once

#include <QWidget>
#include <memory>

#include "gui/model/sweep_model.h"

class QChartView;
class QComboBox;
class QLabel;
class QScatterSeries;

namespace offsim::gui {

class SweepView : public QWidget {
  Q_OBJECT
 public:
  explicit SweepView(QWidget* parent = nullptr);
  void set_table(std::shared_ptr<const SweepTable> table);
  void set_colour_axis(const QString& axis);
  std::size_t points_drawn() const { return points_drawn_; }
  std::size_t front_size() const { return front_size_; }
  QChartView* chart_view() const { return view_; }

 signals:
  // The row of the table that was clicked.
  void point_activated(int row);

 private:
  void rebuild();
  void point_clicked(const QPointF& value);

  std::shared_ptr<const SweepTable> table_;
  QChartView* view_;
  QComboBox* metric_box_;
  QComboBox* colour_box_;
  QLabel* details_;
  std::size_t points_drawn_ = 0;
  std::size_t front_size_ = 0;
};

}  // namespace offsim::gui
