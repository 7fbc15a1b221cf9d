// legend_bar.cpp — painting the legend strip.
#include "tdpipe/viz/legend_bar.hpp"
#include "tdpipe/viz/side_names.hpp"

#include <QPainter>

namespace tdpipe::viz {
namespace {
constexpr int kSwatch = 12;
constexpr int kHeight = 22;
}  // namespace

LegendBar::LegendBar(QWidget* parent) : QWidget(parent) {
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Fixed);
  QFont f = font();
  f.setPixelSize(11);
  setFont(f);
}

void LegendBar::set_entries(std::vector<LegendEntry> entries, bool two_sides) {
  entries_ = std::move(entries);
  two_sides_ = two_sides;
  update();
}

QSize LegendBar::sizeHint() const { return {600, kHeight}; }

void LegendBar::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), QColor(0xfb, 0xfb, 0xfb));
  const QFontMetrics fm(font());
  int x = 8;
  const int y = (height() - kSwatch) / 2;
  for (const auto& e : entries_) {
    p.fillRect(QRect(x, y, kSwatch, kSwatch), e.color);
    p.setPen(e.color.darker(150));
    p.drawRect(QRect(x, y, kSwatch - 1, kSwatch - 1));
    x += kSwatch + 4;
    p.setPen(QColor(0x20, 0x20, 0x20));
    p.drawText(QRect(x, 0, fm.horizontalAdvance(e.text) + 2, height()), Qt::AlignVCenter, e.text);
    x += fm.horizontalAdvance(e.text) + 14;
  }
  if (!entries_.empty()) {
    // The ruler's markers.
    p.setPen(Qt::NoPen);
    p.setBrush(QColor(0x20, 0x20, 0x20));
    const int mid = height() / 2;
    p.drawPolygon(QPolygon{QPoint(x, mid - 4), QPoint(x + 10, mid - 4), QPoint(x + 5, mid + 4)});
    x += 14;
    const QString end = QStringLiteral("iteration end");
    p.setPen(QColor(0x20, 0x20, 0x20));
    p.drawText(QRect(x, 0, fm.horizontalAdvance(end) + 2, height()), Qt::AlignVCenter, end);
    x += fm.horizontalAdvance(end) + 14;
  }
  if (two_sides_) {
    // The lane labels carry the side; say so once, in the labels' own colours.
    const QString pred = QStringLiteral("%1 lanes (blue labels)").arg(side_names().short_name[0]);
    const QString meas = QStringLiteral("%1 lanes directly below").arg(side_names().short_name[1]);
    x += 10;
    p.setPen(QColor(0x1f, 0x4e, 0x9a));
    p.drawText(QRect(x, 0, fm.horizontalAdvance(pred) + 2, height()), Qt::AlignVCenter, pred);
    x += fm.horizontalAdvance(pred) + 12;
    p.setPen(QColor(0x20, 0x20, 0x20));
    p.drawText(QRect(x, 0, fm.horizontalAdvance(meas) + 2, height()), Qt::AlignVCenter, meas);
  }
}

}  // namespace tdpipe::viz
