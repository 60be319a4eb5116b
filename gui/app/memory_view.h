// MemoryView: bytes in use over time per pool (step curves), each pool's capacity line and peak
// marker, and a table of the live tensors at the peak or at a clicked time. Its time axis
// follows the timeline's (set_time_range_ms / time_range_changed, in milliseconds).
//
//   auto* memory = new gui::MemoryView;
//   memory->set_data(data.timeline, data.memory);   // from gui::load_data_set
//   memory->show_live_at(pool_index, t_ns);         // fills the table
#pragma once

#include <QChartView>
#include <QWidget>
#include <memory>
#include <vector>

#include "gui/model/memory_model.h"
#include "gui/model/timeline_model.h"

class QComboBox;
class QLabel;
class QLineSeries;
class QTableWidget;
class QValueAxis;

namespace offsim::gui {

class MemoryChartView : public QChartView {
  Q_OBJECT
 public:
  using QChartView::QChartView;
 signals:
  void clicked_at_ms(double ms);

 protected:
  void mousePressEvent(QMouseEvent* event) override;
};

class MemoryView : public QWidget {
  Q_OBJECT
 public:
  explicit MemoryView(QWidget* parent = nullptr);
  void set_data(std::shared_ptr<const TimelineModel> timelines, std::vector<MemoryModel> memory);
  void show_live_at(int pool, std::int64_t t_ns);
  std::size_t pool_count() const { return pools_.size(); }
  std::size_t points_drawn() const { return points_drawn_; }
  QChartView* chart_view() const { return view_; }

 public slots:
  void set_time_range_ms(double min_ms, double max_ms);

 signals:
  void time_range_changed(double min_ms, double max_ms);

 private:
  struct PoolRef {
    int model = 0;  // index into memory_
    int pool = 0;   // index into memory_[model].pools()
    QLineSeries* series = nullptr;
  };
  void rebuild_chart();
  void redecimate();
  void show_peak_of_selected();

  std::shared_ptr<const TimelineModel> timelines_;
  std::vector<MemoryModel> memory_;
  std::vector<PoolRef> pools_;
  MemoryChartView* view_;
  QValueAxis* axis_x_ = nullptr;
  QValueAxis* axis_y_ = nullptr;
  QComboBox* pool_box_;
  QLabel* live_label_;
  QTableWidget* table_;
  std::size_t points_drawn_ = 0;
  bool updating_axis_ = false;
};

}  // namespace offsim::gui
