// MainWindow: the offsim-gui window — Timeline, Memory, Sweep and Scenario tabs, file loading
// and scenario runs in worker threads with progress and cancel, and offscreen screenshots.
//
//   gui::MainWindow window;
//   window.open_files({"pred.json", "meas.json"});        // loads in a worker thread
//   window.apply(std::move(*gui::load_data_set(paths)));   // or synchronously (screenshots)
//   window.show_view(gui::View::kMemory);
//   window.view_widget(gui::View::kMemory)->grab().save("memory.png");
#pragma once

#include <QMainWindow>
#include <QPointer>
#include <QStringList>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "gui/model/background_task.h"
#include "gui/model/data_set.h"

class QLabel;
class QLineEdit;
class QPlainTextEdit;
class QProgressBar;
class QPushButton;
class QTabWidget;
class QThread;

namespace offsim::gui {

class MemoryView;
class SweepView;
class TimelineView;

enum class View { kTimeline, kMemory, kSweep, kScenario };

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  explicit MainWindow(QWidget* parent = nullptr);
  ~MainWindow() override;

  // Loads timelines and/or a sweep file in a worker thread; replaces what is shown.
  void open_files(const QStringList& paths);
  // Shows loaded data: timelines replace the timeline and memory views, a sweep the sweep view.
  void apply(DataSet data);
  void show_view(View view);
  QWidget* view_widget(View view) const;

  TimelineView* timeline_view() const { return timeline_view_; }
  MemoryView* memory_view() const { return memory_view_; }
  SweepView* sweep_view() const { return sweep_view_; }

 private:
  // Runs `work` on a worker thread; `done` gets its result on the GUI thread unless cancelled.
  template <class T>
  void run_in_background(const QString& what,
                         std::function<T(const std::atomic<bool>*, const ProgressFn&)> work,
                         std::function<void(T)> done);
  void open_dialog();
  void add_timeline_dialog();
  void open_scenario(const QString& path);
  void run_scenario_clicked();
  void run_sweep_point(int row);
  void cancel_background();
  void set_busy(const QString& what);
  void set_idle(const QString& message);
  void error(const QString& message);

  QTabWidget* tabs_;
  TimelineView* timeline_view_;
  MemoryView* memory_view_;
  SweepView* sweep_view_;
  QWidget* timeline_tab_;
  QWidget* scenario_tab_;
  QLabel* scenario_path_;
  QPlainTextEdit* overrides_;
  QPlainTextEdit* report_;
  QPushButton* run_button_;
  QProgressBar* progress_;
  QPushButton* cancel_button_;
  QStringList timeline_paths_;
  QString sweep_path_;
  std::shared_ptr<const SweepTable> sweep_;
  // Worker tasks (gui/model/background_task.h): the current one and cancelled ones still
  // finishing. A result reaches the window only from the task of the current generation.
  std::vector<std::unique_ptr<BackgroundTask>> tasks_;
  BackgroundTask* current_ = nullptr;
  std::uint64_t generation_ = 0;
};

}  // namespace offsim::gui
