#include "gui/app/main_window.h"

#include <QApplication>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QLabel>
#include <QMenuBar>
#include <QMessageBox>
#include <QPlainTextEdit>
#include <QProgressBar>
#include <QPushButton>
#include <QStatusBar>
#include <QTabWidget>
#include <QToolBar>
#include <QVBoxLayout>
#include <algorithm>
#include <optional>

#include "gui/app/colours.h"
#include "gui/app/memory_view.h"
#include "gui/app/sweep_view.h"
#include "gui/app/timeline_view.h"
#include "gui/model/scenario_runner.h"

namespace offsim::gui {
namespace {

QString legend_html() {
  QString html;
  const std::pair<sim::OpKind, const char*> kinds[] = {{sim::OpKind::kGemm, "gemm"},
                                                       {sim::OpKind::kAttention, "attention"},
                                                       {sim::OpKind::kElementwise, "elementwise"},
                                                       {sim::OpKind::kCopy, "copy"},
                                                       {sim::OpKind::kCollective, "collective"},
                                                       {sim::OpKind::kP2P, "p2p"},
                                                       {sim::OpKind::kHostCompute, "host compute"}};
  auto swatch = [](const QColor& c, const QString& name) {
    return QString("<span style='color:%1'>&#9632;</span>&nbsp;%2&nbsp;&nbsp; ")
        .arg(c.name(), name);
  };
  for (const auto& [kind, name] : kinds) html += swatch(kind_colour(kind), name);
  html += swatch(exposed_colour(), "exposed copy (compute idle)");
  html += swatch(critical_colour(), "critical path");
  return html;
}

}  // namespace

MainWindow::MainWindow(QWidget* parent) : QMainWindow(parent) {
  setWindowTitle("offsim");
  tabs_ = new QTabWidget;
  // Timeline tab: legend and fit button above the chart.
  timeline_view_ = new TimelineView;
  timeline_tab_ = new QWidget;
  {
    auto* layout = new QVBoxLayout(timeline_tab_);
    layout->setContentsMargins(2, 2, 2, 2);
    auto* bar = new QHBoxLayout;
    auto* legend = new QLabel(legend_html());
    legend->setTextFormat(Qt::RichText);
    auto* fit = new QPushButton("Fit all");
    connect(fit, &QPushButton::clicked, timeline_view_, &TimelineView::fit_all);
    bar->addWidget(legend, 1);
    bar->addWidget(new QLabel("wheel: zoom · drag: zoom to range · shift-drag: pan"));
    bar->addWidget(fit);
    layout->addLayout(bar);
    layout->addWidget(timeline_view_, 1);
  }
  memory_view_ = new MemoryView;
  sweep_view_ = new SweepView;
  // Scenario tab.
  scenario_tab_ = new QWidget;
  {
    auto* layout = new QVBoxLayout(scenario_tab_);
    auto* top = new QHBoxLayout;
    auto* open = new QPushButton("Open scenario…");
    scenario_path_ = new QLabel("no scenario");
    top->addWidget(open);
    top->addWidget(scenario_path_, 1);
    layout->addLayout(top);
    layout->addWidget(new QLabel("Overrides, one key.path=value per line (as --set):"));
    overrides_ = new QPlainTextEdit;
    overrides_->setMaximumHeight(110);
    layout->addWidget(overrides_);
    auto* run_row = new QHBoxLayout;
    run_button_ = new QPushButton("Run");
    run_button_->setEnabled(false);
    run_row->addWidget(run_button_);
    run_row->addStretch(1);
    layout->addLayout(run_row);
    layout->addWidget(new QLabel("Report:"));
    report_ = new QPlainTextEdit;
    report_->setReadOnly(true);
    layout->addWidget(report_, 1);
    if (!scenarios_available()) {
      report_->setPlainText(QString::fromStdString(run_scenario("scenario", {}).error().message));
    }
    connect(open, &QPushButton::clicked, this, [this] {
      const QString path = QFileDialog::getOpenFileName(this, "Open scenario", {},
                                                        "Scenarios (*.yaml *.yml);;All files (*)");
      if (!path.isEmpty()) open_scenario(path);
    });
    connect(run_button_, &QPushButton::clicked, this, &MainWindow::run_scenario_clicked);
  }
  tabs_->addTab(timeline_tab_, "Timeline");
  tabs_->addTab(memory_view_, "Memory");
  tabs_->addTab(sweep_view_, "Sweep");
  tabs_->addTab(scenario_tab_, "Scenario");
  setCentralWidget(tabs_);

  progress_ = new QProgressBar;
  progress_->setMaximumWidth(220);
  progress_->setRange(0, 1000);
  progress_->hide();
  cancel_button_ = new QPushButton("Cancel");
  cancel_button_->hide();
  statusBar()->addPermanentWidget(progress_);
  statusBar()->addPermanentWidget(cancel_button_);
  connect(cancel_button_, &QPushButton::clicked, this, &MainWindow::cancel_background);

  QMenu* file = menuBar()->addMenu("&File");
  file->addAction("&Open timelines or sweep…", QKeySequence::Open, this, &MainWindow::open_dialog);
  file->addAction("&Add timeline (e.g. measured)…", this, &MainWindow::add_timeline_dialog);
  file->addAction("Open &scenario…", this, [this] {
    const QString path = QFileDialog::getOpenFileName(this, "Open scenario", {},
                                                      "Scenarios (*.yaml *.yml);;All files (*)");
    if (!path.isEmpty()) open_scenario(path);
  });
  file->addSeparator();
  file->addAction("&Quit", QKeySequence::Quit, this, &QWidget::close);

  // One time axis for timeline and memory.
  connect(timeline_view_, &TimelineView::time_range_changed, memory_view_,
          &MemoryView::set_time_range_ms);
  connect(memory_view_, &MemoryView::time_range_changed, timeline_view_,
          &TimelineView::set_time_range_ms);
  connect(sweep_view_, &SweepView::point_activated, this, &MainWindow::run_sweep_point);
  resize(1400, 820);
}

MainWindow::~MainWindow() {
  cancel_background();
  tasks_.clear();  // each task cancels and joins its thread
}

template <class T>
void MainWindow::run_in_background(
    const QString& what, std::function<T(const std::atomic<bool>*, const ProgressFn&)> work,
    std::function<void(T)> done) {
  cancel_background();
  tasks_.erase(std::remove_if(tasks_.begin(), tasks_.end(),
                              [](const std::unique_ptr<BackgroundTask>& t) { return t->done(); }),
               tasks_.end());
  set_busy(what);
  const std::uint64_t generation = ++generation_;
  QPointer<MainWindow> self(this);
  auto result = std::make_shared<std::optional<T>>();
  // Progress and the result travel to the GUI thread as queued calls; there only the current
  // generation's arrive.
  ProgressFn progress = [self, generation](double f) {
    QMetaObject::invokeMethod(
        qApp,
        [self, generation, f] {
          if (self && self->generation_ == generation && self->current_ != nullptr) {
            self->progress_->setValue(static_cast<int>(f * 1000));
          }
        },
        Qt::QueuedConnection);
  };
  BackgroundTask::Finished finished = [self, generation, result, done](bool cancelled) {
    if (cancelled) return;
    QMetaObject::invokeMethod(
        qApp,
        [self, generation, result, done] {
          if (!self || self->generation_ != generation || self->current_ == nullptr) return;
          self->current_ = nullptr;
          self->set_idle({});
          done(std::move(**result));
        },
        Qt::QueuedConnection);
  };
  tasks_.push_back(std::make_unique<BackgroundTask>(
      [result, work = std::move(work)](const std::atomic<bool>* cancel, const ProgressFn& report) {
        result->emplace(work(cancel, report));
      },
      std::move(progress), std::move(finished)));
  current_ = tasks_.back().get();
}

void MainWindow::cancel_background() {
  if (current_ != nullptr) {
    current_->cancel();
    current_ = nullptr;
    ++generation_;
    set_idle("cancelled");
  }
}

void MainWindow::set_busy(const QString& what) {
  statusBar()->showMessage(what);
  progress_->setValue(0);
  progress_->show();
  cancel_button_->show();
}

void MainWindow::set_idle(const QString& message) {
  progress_->hide();
  cancel_button_->hide();
  statusBar()->showMessage(message, 8000);
}

void MainWindow::error(const QString& message) {
  statusBar()->showMessage(message);
  if (QApplication::platformName() != "offscreen") QMessageBox::warning(this, "offsim", message);
}

void MainWindow::open_files(const QStringList& paths) {
  std::vector<std::string> files;
  QStringList timelines;
  for (const QString& p : paths) {
    if (file_kind(p.toStdString()) == FileKind::kScenario) {
      open_scenario(p);
      continue;
    }
    if (file_kind(p.toStdString()) == FileKind::kSweep) {
      sweep_path_ = p;
    } else {
      timelines << p;
    }
    files.push_back(p.toStdString());
  }
  if (files.empty()) return;
  if (!timelines.isEmpty()) timeline_paths_ = timelines;
  const QString what = QString("loading %1 file(s)…").arg(files.size());
  run_in_background<sim::Result<DataSet>>(
      what,
      [files](const std::atomic<bool>* cancel, const ProgressFn& progress) {
        return load_data_set(files, cancel, progress);
      },
      [this](sim::Result<DataSet> data) {
        if (!data) {
          error(QString::fromStdString(data.error().message));
          return;
        }
        apply(std::move(*data));
      });
}

void MainWindow::apply(DataSet data) {
  if (data.timeline) {
    timeline_view_->set_model(data.timeline);
    memory_view_->set_data(data.timeline, std::move(data.memory));
    timeline_view_->fit_all();
    tabs_->setCurrentWidget(timeline_tab_);
    statusBar()->showMessage(QString("%1 lanes, %2 spans")
                                 .arg(data.timeline->rows().size())
                                 .arg(data.timeline->span_count()),
                             8000);
  }
  if (data.sweep) {
    sweep_ = data.sweep;
    sweep_view_->set_table(data.sweep);
    if (!data.timeline) tabs_->setCurrentWidget(sweep_view_);
  }
  if (!data.warnings.empty()) {
    statusBar()->showMessage(QString::fromStdString(data.warnings.front()), 8000);
  }
}

void MainWindow::show_view(View view) { tabs_->setCurrentWidget(view_widget(view)); }

QWidget* MainWindow::view_widget(View view) const {
  switch (view) {
    case View::kTimeline:
      return timeline_tab_;
    case View::kMemory:
      return memory_view_;
    case View::kSweep:
      return sweep_view_;
    case View::kScenario:
      return scenario_tab_;
  }
  return timeline_tab_;
}

void MainWindow::open_dialog() {
  const QStringList paths = QFileDialog::getOpenFileNames(
      this, "Open timelines (predicted, measured) or a sweep", {},
      "offsim files (*.json *.jsonl *.csv *.yaml *.yml);;All files (*)");
  if (!paths.isEmpty()) open_files(paths);
}

void MainWindow::add_timeline_dialog() {
  const QString path = QFileDialog::getOpenFileName(this, "Add a timeline (e.g. measured)", {},
                                                    "Timelines and traces (*.json);;All files (*)");
  if (path.isEmpty()) return;
  QStringList paths = timeline_paths_;
  paths << path;
  open_files(paths);
}

void MainWindow::open_scenario(const QString& path) {
  scenario_path_->setText(path);
  run_button_->setEnabled(scenarios_available());
  tabs_->setCurrentWidget(scenario_tab_);
}

void MainWindow::run_scenario_clicked() {
  const std::string path = scenario_path_->text().toStdString();
  std::vector<std::string> overrides;
  for (const QString& line : overrides_->toPlainText().split('\n', Qt::SkipEmptyParts)) {
    const QString trimmed = line.trimmed();
    if (!trimmed.isEmpty() && !trimmed.startsWith('#')) overrides.push_back(trimmed.toStdString());
  }
  report_->setPlainText("running…");
  using Out = sim::Result<std::pair<ScenarioRun, DataSet>>;
  run_in_background<Out>(
      QString("running %1…").arg(QFileInfo(scenario_path_->text()).fileName()),
      [path, overrides](const std::atomic<bool>* cancel, const ProgressFn& progress) -> Out {
        OFFSIM_ASSIGN_OR_RETURN(ScenarioRun run,
                                run_scenario(path, overrides, std::nullopt, cancel,
                                             [&progress](double f) { progress(0.8 * f); }));
        std::vector<sim::Timeline> timelines;
        if (run.timeline) timelines.push_back(std::move(*run.timeline));
        run.timeline.reset();
        OFFSIM_ASSIGN_OR_RETURN(DataSet data,
                                data_set_from_timelines(std::move(timelines), cancel));
        return std::make_pair(std::move(run), std::move(data));
      },
      [this](Out out) {
        if (!out) {
          report_->setPlainText(QString::fromStdString(out.error().message));
          return;
        }
        report_->setPlainText(QString::fromStdString(out->first.report_json));
        apply(std::move(out->second));
        tabs_->setCurrentWidget(scenario_tab_);
      });
}

void MainWindow::run_sweep_point(int row) {
  if (!sweep_ || row < 0 || static_cast<std::size_t>(row) >= sweep_->rows.size()) return;
  const SweepRow& r = sweep_->rows[static_cast<std::size_t>(row)];
  if (!scenarios_available() || r.scenario.empty()) {
    statusBar()->showMessage(scenarios_available()
                                 ? "this sweep row names no scenario file"
                                 : "built without the scenarios library: cannot simulate a point",
                             8000);
    return;
  }
  // The scenario path as written by the CLI, else relative to the sweep file.
  QString scenario = QString::fromStdString(r.scenario);
  if (!QFileInfo::exists(scenario)) {
    scenario = QFileInfo(sweep_path_).dir().filePath(scenario);
  }
  const std::string path = scenario.toStdString();
  const std::int64_t index = r.index;
  using Out = sim::Result<DataSet>;
  run_in_background<Out>(
      QString("simulating sweep point %1…").arg(index),
      [path, index](const std::atomic<bool>* cancel, const ProgressFn& progress) -> Out {
        OFFSIM_ASSIGN_OR_RETURN(ScenarioRun run, run_scenario(path, {}, index, cancel));
        std::vector<sim::Timeline> timelines;
        if (run.timeline) timelines.push_back(std::move(*run.timeline));
        return data_set_from_timelines(std::move(timelines), cancel, progress);
      },
      [this](Out data) {
        if (!data) {
          error(QString::fromStdString(data.error().message));
          return;
        }
        apply(std::move(*data));
      });
}

}  // namespace offsim::gui
