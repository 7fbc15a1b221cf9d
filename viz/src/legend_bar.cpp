// legend_bar.cpp — painting the legend strip.
#include "tdpipe/viz/legend_bar.hpp"

#include <QPainter>

namespace tdpipe::viz {
namespace {
constexpr int kSwatch = 12;
constexpr int kHeight = 22;
}  // namespace

LegendBar::LegendBar(QWidget* parent) : QWidget(parent) {
  QSizePolicy policy(QSizePolicy::Expanding, QSizePolicy::Fixed);
  policy.setHeightForWidth(true);  // a second row where the entries do not fit one
  setSizePolicy(policy);
  QFont f = font();
  f.setPixelSize(11);
  setFont(f);
}

void LegendBar::set_entries(std::vector<LegendEntry> entries, std::vector<LegendEntry> traces) {
  entries_ = std::move(entries);
  traces_ = std::move(traces);
  updateGeometry();
  update();
}

void LegendBar::set_end_label(const QString& label) {
  if (label == end_label_) return;
  end_label_ = label;
  updateGeometry();
  update();
}

// The strip's pieces in order: op-kind swatches, the iteration-end marker, and how the
// traces' lanes are told apart. A piece starting a group moves to a new row with its
// group where the group does not fit the rest of the row.
struct LegendBar::Piece {
  enum Kind { Swatch, Marker, Text } kind;
  QString text;
  QColor color;
  bool bold = false;
  bool group = false;  ///< starts a group kept on one row where it can be
  int gap = 14;        ///< space after the piece
};

std::vector<LegendBar::Piece> LegendBar::pieces() const {
  std::vector<Piece> out;
  for (const auto& e : entries_) out.push_back({Piece::Swatch, e.text, e.color});
  if (!entries_.empty()) out.push_back({Piece::Marker, end_label_, QColor(0x20, 0x20, 0x20)});
  if (traces_.size() == 2) {
    // The lane labels carry the trace; say so once, in the labels' own colours.
    out.push_back({Piece::Text, QStringLiteral("%1 lanes (blue labels)").arg(traces_[0].text), traces_[0].color,
                   false, true, 12});
    out.push_back({Piece::Text, QStringLiteral("%1 lanes directly below").arg(traces_[1].text), traces_[1].color});
  } else if (traces_.size() > 2) {
    // Each rank's lanes, one per trace in this order, labelled in these colours.
    out.push_back({Piece::Text, QStringLiteral("lanes of each rank, top to bottom:"), QColor(0x20, 0x20, 0x20),
                   false, true, 6});
    for (const auto& t : traces_) out.push_back({Piece::Text, t.text, t.color, true, false, 8});
  }
  return out;
}

int LegendBar::piece_width(const Piece& piece) const {
  QFont f = font();
  f.setBold(piece.bold);
  const int text = QFontMetrics(f).horizontalAdvance(piece.text) + 2;
  if (piece.kind == Piece::Swatch) return kSwatch + 4 + text;
  if (piece.kind == Piece::Marker) return 14 + text;
  return text;
}

std::vector<QPoint> LegendBar::layout(int width, int* rows) const {
  const auto all = pieces();
  std::vector<QPoint> at;
  int x = 8, row = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    int need = piece_width(all[i]);
    if (all[i].group)
      for (std::size_t j = i + 1; j < all.size() && !all[j].group; ++j) need += all[i].gap + piece_width(all[j]);
    if (x > 8 && x + std::min(need, width - 16) > width - 8) {
      x = 8;
      ++row;
    }
    at.emplace_back(x, row * kHeight);
    x += piece_width(all[i]) + all[i].gap;
  }
  if (rows) *rows = all.empty() ? 1 : row + 1;
  return at;
}

QSize LegendBar::sizeHint() const { return {600, heightForWidth(width() > 0 ? width() : 600)}; }

int LegendBar::heightForWidth(int width) const {
  int rows = 1;
  layout(width, &rows);
  return rows * kHeight;
}

void LegendBar::resizeEvent(QResizeEvent*) {
  if (heightForWidth(width()) != height()) updateGeometry();
}

void LegendBar::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), QColor(0xfb, 0xfb, 0xfb));
  const auto all = pieces();
  const auto at = layout(width());
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Piece& piece = all[i];
    int x = at[i].x();
    const int top = at[i].y();
    const int mid = top + kHeight / 2;
    QFont f = font();
    f.setBold(piece.bold);
    p.setFont(f);
    const QFontMetrics fm(f);
    if (piece.kind == Piece::Swatch) {
      const int y = top + (kHeight - kSwatch) / 2;
      p.fillRect(QRect(x, y, kSwatch, kSwatch), piece.color);
      p.setPen(piece.color.darker(150));
      p.drawRect(QRect(x, y, kSwatch - 1, kSwatch - 1));
      x += kSwatch + 4;
      p.setPen(QColor(0x20, 0x20, 0x20));
    } else if (piece.kind == Piece::Marker) {
      // The ruler's markers.
      p.setPen(Qt::NoPen);
      p.setBrush(piece.color);
      p.drawPolygon(QPolygon{QPoint(x, mid - 4), QPoint(x + 10, mid - 4), QPoint(x + 5, mid + 4)});
      x += 14;
      p.setPen(piece.color);
    } else {
      p.setPen(piece.color);
    }
    p.drawText(QRect(x, top, fm.horizontalAdvance(piece.text) + 2, kHeight), Qt::AlignVCenter, piece.text);
  }
}

}  // namespace tdpipe::viz
