// offsim-gui: timeline, memory and sweep explorer for offsim results.
//
//   offsim-gui [FILE...]      timelines or `offsim run --trace` files (.json), a sweep, a scenario
//   offsim-gui --screenshot OUT.png [--view timeline|memory|sweep] [--size 1400x820] FILE...
//
// --screenshot renders the view offscreen (no display needed), saves it, prints what was drawn
// ("timeline: lanes=8 spans=1200 rectangles=310") and exits: 0 on success, 2 on bad input.
#include <QApplication>
#include <QCommandLineParser>
#include <QPixmap>
#include <cstdio>
#include <string>
#include <vector>

#include "gui/app/main_window.h"
#include "gui/app/memory_view.h"
#include "gui/app/sweep_view.h"
#include "gui/app/timeline_view.h"

namespace {

int screenshot(offsim::gui::MainWindow& window, const QString& out, const QString& view_name,
               const QSize& size, const QStringList& files) {
  using offsim::gui::View;
  std::vector<std::string> paths;
  for (const QString& f : files) paths.push_back(f.toStdString());
  auto data = offsim::gui::load_data_set(paths);
  if (!data) {
    std::fprintf(stderr, "offsim-gui: %s\n", data.error().message.c_str());
    return 2;
  }
  for (const std::string& w : data->warnings) std::fprintf(stderr, "offsim-gui: %s\n", w.c_str());
  View view = View::kTimeline;
  if (view_name == "memory") {
    view = View::kMemory;
  } else if (view_name == "sweep") {
    view = View::kSweep;
  } else if (view_name != "timeline") {
    std::fprintf(stderr, "offsim-gui: --view '%s': expected timeline, memory or sweep\n",
                 view_name.toStdString().c_str());
    return 2;
  }
  if ((view == View::kSweep && !data->sweep) || (view != View::kSweep && !data->timeline)) {
    std::fprintf(
        stderr, "offsim-gui: --view %s needs %s among the files\n", view_name.toStdString().c_str(),
        view == View::kSweep ? "a sweep file (.jsonl or .csv)" : "a timeline or trace (.json)");
    return 2;
  }
  window.resize(size);
  window.apply(std::move(*data));
  window.show_view(view);
  window.show();
  for (int i = 0; i < 3; ++i) QApplication::processEvents();
  const QPixmap pixmap = window.view_widget(view)->grab();
  if (!pixmap.save(out)) {
    std::fprintf(stderr, "offsim-gui: cannot write '%s'\n", out.toStdString().c_str());
    return 2;
  }
  switch (view) {
    case View::kTimeline: {
      const auto stats = window.timeline_view()->draw_stats();
      std::printf("timeline: lanes=%zu spans=%zu rectangles=%zu\n", stats.lanes, stats.spans,
                  stats.rectangles);
      break;
    }
    case View::kMemory:
      std::printf("memory: pools=%zu points=%zu\n", window.memory_view()->pool_count(),
                  window.memory_view()->points_drawn());
      break;
    case View::kSweep:
      std::printf("sweep: points=%zu pareto=%zu\n", window.sweep_view()->points_drawn(),
                  window.sweep_view()->front_size());
      break;
    case View::kScenario:
      break;
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Screenshots need no display: pick the offscreen platform before Qt starts.
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--screenshot" && qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) {
      qputenv("QT_QPA_PLATFORM", "offscreen");
    }
  }
  QApplication app(argc, argv);
  QApplication::setApplicationName("offsim-gui");
  QApplication::setApplicationVersion(OFFSIM_VERSION);
  QCommandLineParser parser;
  parser.setApplicationDescription("offsim timeline, memory and sweep explorer");
  parser.addHelpOption();
  parser.addVersionOption();
  QCommandLineOption shot("screenshot", "Render offscreen to OUT.png and exit.", "OUT.png");
  QCommandLineOption view("view", "View to render: timeline, memory or sweep.", "view", "timeline");
  QCommandLineOption size("size", "Window size for --screenshot, WIDTHxHEIGHT.", "size",
                          "1400x820");
  parser.addOptions({shot, view, size});
  parser.addPositionalArgument("files", "Timelines (.json), a sweep (.jsonl, .csv), a scenario.");
  parser.process(app);

  offsim::gui::MainWindow window;
  const QStringList files = parser.positionalArguments();
  if (parser.isSet(shot)) {
    const QStringList wh = parser.value(size).split('x');
    bool ok_w = false;
    bool ok_h = false;
    const int w = wh.size() == 2 ? wh[0].toInt(&ok_w) : 0;
    const int h = wh.size() == 2 ? wh[1].toInt(&ok_h) : 0;
    if (!ok_w || !ok_h || w < 200 || h < 150 || w > 8000 || h > 8000) {
      std::fprintf(stderr, "offsim-gui: --size '%s': expected WIDTHxHEIGHT, 200x150 to 8000x8000\n",
                   parser.value(size).toStdString().c_str());
      return 2;
    }
    if (files.isEmpty()) {
      std::fprintf(stderr, "offsim-gui: --screenshot needs at least one file\n");
      return 2;
    }
    return screenshot(window, parser.value(shot), parser.value(view), QSize(w, h), files);
  }
  window.show();
  if (!files.isEmpty()) window.open_files(files);
  return QApplication::exec();
}
