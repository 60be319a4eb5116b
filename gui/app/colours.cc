#include "gui/app/colours.h"

#include <algorithm>
#include <array>

namespace offsim::gui {

QColor kind_colour(sim::OpKind kind) {
  switch (kind) {
    case sim::OpKind::kGemm:
      return QColor(31, 119, 180);
    case sim::OpKind::kAttention:
      return QColor(148, 103, 189);
    case sim::OpKind::kElementwise:
      return QColor(23, 190, 207);
    case sim::OpKind::kCopy:
      return QColor(44, 160, 44);
    case sim::OpKind::kCollective:
      return QColor(214, 39, 40);
    case sim::OpKind::kP2P:
      return QColor(227, 119, 194);
    case sim::OpKind::kHostCompute:
      return QColor(140, 86, 75);
    case sim::OpKind::kAlloc:
    case sim::OpKind::kFree:
    case sim::OpKind::kMarker:
      return QColor(127, 127, 127);
  }
  return QColor(127, 127, 127);
}

QColor busy_shade(const QColor& colour, double busy) {
  const double f = 0.15 + 0.85 * std::clamp(busy, 0.0, 1.0);
  auto mix = [f](float c) { return static_cast<float>(1.0 - (1.0 - c) * f); };
  return QColor::fromRgbF(mix(colour.redF()), mix(colour.greenF()), mix(colour.blueF()));
}

QColor category_colour(int index) {
  // Tableau 10.
  static constexpr std::array<QRgb, 10> kPalette = {0x4e79a7, 0xf28e2b, 0xe15759, 0x76b7b2,
                                                    0x59a14f, 0xedc948, 0xb07aa1, 0xff9da7,
                                                    0x9c755f, 0xbab0ac};
  const auto i = static_cast<std::size_t>(index < 0 ? 0 : index) % kPalette.size();
  return QColor::fromRgb(kPalette[i]);
}

QColor gradient_colour(double t) {
  // Viridis-like: dark blue → teal → yellow.
  t = std::clamp(t, 0.0, 1.0);
  const QColor a(68, 1, 84);
  const QColor b(33, 145, 140);
  const QColor c(253, 231, 37);
  auto mix = [](const QColor& x, const QColor& y, double f) {
    return QColor::fromRgbF(static_cast<float>(x.redF() + (y.redF() - x.redF()) * f),
                            static_cast<float>(x.greenF() + (y.greenF() - x.greenF()) * f),
                            static_cast<float>(x.blueF() + (y.blueF() - x.blueF()) * f));
  };
  return t < 0.5 ? mix(a, b, t * 2.0) : mix(b, c, (t - 0.5) * 2.0);
}

}  // namespace offsim::gui
