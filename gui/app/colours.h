// Colours shared by the views: one per op kind, the marks for exposed copies and the critical
// path, and a palette for categories (pools, sweep axis values).
//
//   painter.fillRect(rect, gui::kind_colour(sim::OpKind::kGemm));
//   series->setColor(gui::category_colour(3));
//   QColor c = gui::gradient_colour(0.25);  // numeric axis values scaled to [0, 1]
#pragma once

#include <QColor>

#include "sim/plan/plan.h"

namespace offsim::gui {

QColor kind_colour(sim::OpKind kind);
QColor category_colour(int index);
QColor gradient_colour(double t);
inline QColor exposed_colour() { return QColor(150, 0, 60); }
inline QColor critical_colour() { return QColor(255, 150, 0); }

}  // namespace offsim::gui
