#include "gui/app/sweep_view.h"

#include <QChart>
#include <QChartView>
#include <QComboBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineSeries>
#include <QScatterSeries>
#include <QVBoxLayout>
#include <QValueAxis>
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "gui/app/colours.h"

namespace offsim::gui {
namespace {

constexpr double kGiB = kBytesPerGiB;  // one unit with the CLI: GiB
constexpr int kNumericBuckets = 6;

SweepMetric metric_of(int which) {
  return which == 0 ? SweepMetric::kStepTime : SweepMetric::kTokensPerS;
}

// One scatter series per legend entry: categories, or buckets of a numeric axis; one "fits"
// series without colouring.
std::vector<QScatterSeries*> group_series(const AxisColouring& colouring, const std::string& axis) {
  int groups = 1;
  if (!colouring.value.empty()) {
    groups = colouring.numeric ? kNumericBuckets
                               : std::max<int>(1, static_cast<int>(colouring.categories.size()));
  }
  std::vector<QScatterSeries*> series;
  for (int g = 0; g < groups; ++g) {
    auto* s = new QScatterSeries;
    s->setMarkerSize(9);
    s->setBorderColor(Qt::transparent);
    if (colouring.value.empty()) {
      s->setName("fits");
      s->setColor(category_colour(0));
    } else if (colouring.numeric) {
      const double lo = colouring.min + (colouring.max - colouring.min) * g / kNumericBuckets;
      const double hi = colouring.min + (colouring.max - colouring.min) * (g + 1) / kNumericBuckets;
      s->setName(QString::fromStdString(fmt::format("{} {:.3g}–{:.3g}", axis, lo, hi)));
      s->setColor(gradient_colour((g + 0.5) / kNumericBuckets));
    } else {
      s->setName(QString::fromStdString(colouring.categories[static_cast<std::size_t>(g)]));
      s->setColor(category_colour(g));
    }
    series.push_back(s);
  }
  return series;
}

QScatterSeries* infeasible_series() {
  auto* infeasible = new QScatterSeries;
  infeasible->setName("does not fit (no step time)");
  infeasible->setMarkerShape(QScatterSeries::MarkerShapeRectangle);
  infeasible->setMarkerSize(8);
  infeasible->setColor(QColor(190, 190, 190));
  infeasible->setBorderColor(QColor(200, 0, 0));
  return infeasible;
}

// The Pareto front (time vs HBM) as a dashed line, in the metric `which` (0: step time).
QLineSeries* pareto_line(const SweepTable& table, const std::vector<std::size_t>& front,
                         int which) {
  auto* line = new QLineSeries;
  line->setName("Pareto front (time vs HBM)");
  QPen pen(QColor(40, 40, 40));
  pen.setWidthF(1.5);
  pen.setStyle(Qt::DashLine);
  line->setPen(pen);
  for (std::size_t i : front) {
    const SweepRow& row = table.rows[i];
    const auto y = which == 0 ? row.step_time_s : row.tokens_per_s;
    if (y) line->append(double(*row.hbm_peak_bytes) / kGiB, *y);
  }
  return line;
}

}  // namespace

SweepView::SweepView(QWidget* parent) : QWidget(parent) {
  view_ = new QChartView(new QChart);
  view_->setRenderHint(QPainter::Antialiasing);
  metric_box_ = new QComboBox;
  metric_box_->addItems({"step time (s)", "tokens/s"});
  colour_box_ = new QComboBox;
  details_ = new QLabel("Click a point to see its axes and report and to simulate it.");
  details_->setWordWrap(true);
  details_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  details_->setMinimumWidth(260);
  details_->setAlignment(Qt::AlignTop | Qt::AlignLeft);
  auto* controls = new QHBoxLayout;
  controls->addWidget(new QLabel("y:"));
  controls->addWidget(metric_box_);
  controls->addSpacing(16);
  controls->addWidget(new QLabel("colour by:"));
  controls->addWidget(colour_box_, 1);
  auto* left = new QVBoxLayout;
  left->addLayout(controls);
  left->addWidget(view_, 1);
  auto* layout = new QHBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->addLayout(left, 3);
  layout->addWidget(details_, 1);
  connect(metric_box_, &QComboBox::currentIndexChanged, this, [this](int) { rebuild(); });
  connect(colour_box_, &QComboBox::currentIndexChanged, this, [this](int) { rebuild(); });
  rebuild();
}

void SweepView::set_table(std::shared_ptr<const SweepTable> table) {
  table_ = std::move(table);
  colour_box_->blockSignals(true);
  colour_box_->clear();
  colour_box_->addItem("(none)");
  int policy = -1;
  bool preferred_is_policy = false;
  if (table_) {
    for (const std::string& axis : table_->axes) {
      colour_box_->addItem(QString::fromStdString(axis));
      if (axis.find("policy") != std::string::npos) {
        if (policy < 0 || !preferred_is_policy) policy = colour_box_->count() - 1;
        preferred_is_policy = true;
      } else if (policy < 0 && axis.starts_with("offload.")) {
        policy = colour_box_->count() - 1;
      }
    }
  }
  // Colour by an offload policy axis (else any offload axis) when there is one, else the first.
  colour_box_->setCurrentIndex(policy >= 0 ? policy : (colour_box_->count() > 1 ? 1 : 0));
  colour_box_->blockSignals(false);
  rebuild();
}

void SweepView::set_colour_axis(const QString& axis) {
  const int i = colour_box_->findText(axis);
  if (i >= 0) colour_box_->setCurrentIndex(i);
}

void SweepView::rebuild() {
  auto* chart = new QChart;
  chart->setMargins(QMargins(4, 4, 12, 4));
  chart->setBackgroundRoundness(0);
  chart->legend()->setAlignment(Qt::AlignBottom);
  auto* axis_x = new QValueAxis;
  axis_x->setTitleText("peak HBM per GPU (GiB)");
  axis_x->setLabelFormat("%.2f");
  auto* axis_y = new QValueAxis;
  const int which = metric_box_->currentIndex() < 0 ? 0 : metric_box_->currentIndex();
  axis_y->setTitleText(metric_box_->itemText(which));
  axis_y->setLabelFormat(which == 0 ? "%.3f" : "%.0f");
  chart->addAxis(axis_x, Qt::AlignBottom);
  chart->addAxis(axis_y, Qt::AlignLeft);
  points_drawn_ = 0;
  front_size_ = 0;
  double x_min = std::numeric_limits<double>::infinity();
  double x_max = -x_min;
  double y_min = x_min;
  double y_max = -x_min;
  std::vector<QScatterSeries*> series;
  auto add_series = [&](QScatterSeries* s) {
    chart->addSeries(s);
    s->attachAxis(axis_x);
    s->attachAxis(axis_y);
    connect(s, &QScatterSeries::clicked, this, &SweepView::point_clicked);
  };
  if (table_) {
    AxisColouring colouring;
    const std::string axis =
        colour_box_->currentIndex() > 0 ? colour_box_->currentText().toStdString() : std::string();
    if (!axis.empty()) {
      if (auto c = colour_by_axis(*table_, axis)) colouring = std::move(*c);
    }
    // One scatter series per legend entry: categories, or buckets of a numeric axis.
    auto group_of = [&](std::size_t row) -> int {
      if (colouring.value.empty() || colouring.value[row] < 0) return 0;
      if (colouring.numeric) {
        return std::min(kNumericBuckets - 1,
                        static_cast<int>(colouring.value[row] * kNumericBuckets));
      }
      return static_cast<int>(colouring.value[row]);
    };
    series = group_series(colouring, axis);
    QScatterSeries* infeasible = infeasible_series();
    // Points that do not fit sit at the slow end (plot_points), never among the fast ones.
    for (const PlotPoint& p : plot_points(*table_, metric_of(which))) {
      const double x = p.hbm_peak_bytes / kGiB;
      (p.fits ? series[static_cast<std::size_t>(group_of(p.row))] : infeasible)->append(x, p.y);
      x_min = std::min(x_min, x);
      x_max = std::max(x_max, x);
      y_min = std::min(y_min, p.y);
      y_max = std::max(y_max, p.y);
      ++points_drawn_;
    }
    for (QScatterSeries* s : series) {
      if (s->count() > 0) {
        add_series(s);
      } else {
        delete s;
      }
    }
    if (infeasible->count() > 0) {
      add_series(infeasible);
    } else {
      delete infeasible;
    }
    const std::vector<std::size_t> front = pareto_front(*table_);
    front_size_ = front.size();
    if (!front.empty()) {
      QLineSeries* line = pareto_line(*table_, front, which);
      chart->addSeries(line);
      line->attachAxis(axis_x);
      line->attachAxis(axis_y);
    }
  }
  if (points_drawn_ == 0) {
    x_min = 0;
    x_max = 1;
    y_min = 0;
    y_max = 1;
  }
  const double x_pad = std::max((x_max - x_min) * 0.06, std::fabs(x_max) * 0.02 + 1e-9);
  const double y_pad = std::max((y_max - y_min) * 0.08, std::fabs(y_max) * 0.02 + 1e-9);
  axis_x->setRange(std::max(0.0, x_min - x_pad), x_max + x_pad);
  axis_y->setRange(std::max(0.0, y_min - y_pad), y_max + y_pad);
  QChart* old = view_->chart();
  view_->setChart(chart);
  delete old;
}

void SweepView::point_clicked(const QPointF& value) {
  if (!table_) return;
  const int which = metric_box_->currentIndex() < 0 ? 0 : metric_box_->currentIndex();
  // The row nearest the clicked point, in axis-normalised distance.
  int best = -1;
  double best_d = std::numeric_limits<double>::infinity();
  for (const PlotPoint& p : plot_points(*table_, metric_of(which))) {
    const double dx =
        (p.hbm_peak_bytes / kGiB - value.x()) / std::max(1e-12, std::fabs(value.x()) + 1e-9);
    const double dy = (p.y - value.y()) / std::max(1e-12, std::fabs(value.y()) + 1e-9);
    const double d = dx * dx + dy * dy;
    if (d < best_d) {
      best_d = d;
      best = static_cast<int>(p.row);
    }
  }
  if (best < 0) return;
  const SweepRow& row = table_->rows[static_cast<std::size_t>(best)];
  std::string text = fmt::format("<b>point {}</b> ({})<br>", row.index, row.scenario);
  for (std::size_t a = 0; a < table_->axes.size(); ++a) {
    text += fmt::format("{} = {}<br>", table_->axes[a], row.axis_values[a]);
  }
  text += "<br>";
  if (row.step_time_s && row.fits) text += fmt::format("step time {:.4f} s<br>", *row.step_time_s);
  if (row.tokens_per_s && row.fits) text += fmt::format("{:.0f} tokens/s<br>", *row.tokens_per_s);
  if (row.hbm_peak_bytes) {
    text += fmt::format("peak HBM {}<br>", format_bytes(double(*row.hbm_peak_bytes)));
  }
  text += row.fits ? "fits<br>" : "<font color=#c00000>does not fit</font><br>";
  details_->setText(QString::fromStdString(text));
  emit point_activated(best);
}

}  // namespace offsim::gui
