// legend_bar.hpp — the strip above the timeline: colour of each op kind present,
// the bubble shade, and how the traces' lanes are told apart (their order under each
// rank, in their label colours).
#pragma once

#include <QPoint>
#include <QWidget>
#include <vector>

#include "tdpipe/viz/op_style.hpp"

namespace tdpipe::viz {

class LegendBar : public QWidget {
  Q_OBJECT

 public:
  explicit LegendBar(QWidget* parent = nullptr);
  /// `traces`: each trace's short name in its label colour, in trace order (empty or one:
  /// nothing to tell apart).
  void set_entries(std::vector<LegendEntry> entries, std::vector<LegendEntry> traces = {});
  const std::vector<LegendEntry>& entries() const { return entries_; }
  /// What the ruler's end markers are called: "iteration end" (training), or for serving
  /// traces, which run once through their requests, "end of run".
  void set_end_label(const QString& label);
  const QString& end_label() const { return end_label_; }
  QSize sizeHint() const override;
  bool hasHeightForWidth() const override { return true; }
  /// One 22-pixel row, or more where the entries do not fit the width.
  int heightForWidth(int width) const override;

 protected:
  void paintEvent(QPaintEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;

 private:
  struct Piece;
  std::vector<Piece> pieces() const;
  int piece_width(const Piece& piece) const;
  /// Each piece's top-left at this width; `rows`: how many rows they take.
  std::vector<QPoint> layout(int width, int* rows = nullptr) const;

  std::vector<LegendEntry> entries_;
  std::vector<LegendEntry> traces_;
  QString end_label_ = QStringLiteral("iteration end");
};

}  // namespace tdpipe::viz
