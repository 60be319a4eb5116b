// Colours shared by the views: one per op kind, the marks for exposed copies and the critical
// path, and a palette for categories (pools, sweep axis values).
//
//   painter.fillRect(rect, gui::kind_colour(sim::OpKind::kGemm));
//   painter.fillRect(merged, gui::busy_shade(gui::kind_colour(r.kind), r.busy));
//   series->setColor(gui::category_colour(3));
//   QColor c = gui::gradient_colour(0.25);  // numeric axis values scaled to [0, 1]
#pragma once

#include <QColor>

#include "sim/plan/plan.h"

namespace offsim::gui {

QColor kind_colour(sim::OpKind kind);
// `colour` lightened towards white by how idle a merged rectangle is: busy 1 gives the colour
// itself, busy 0 a pale tint (15% of it) that still shows the kind.
QColor busy_shade(const QColor& colour, double busy);
QColor category_colour(int index);
QColor gradient_colour(double t);
inline QColor exposed_colour() { return QColor(150, 0, 60); }
inline QColor critical_colour() { return QColor(255, 150, 0); }

}  // namespace offsim::gui
