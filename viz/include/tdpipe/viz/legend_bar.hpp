// legend_bar.hpp — the strip above the timeline: colour of each op kind present,
// the bubble shade, and how predicted and measured lanes are told apart.
#pragma once

#include <QWidget>
#include <vector>

#include "tdpipe/viz/op_style.hpp"

namespace tdpipe::viz {

class LegendBar : public QWidget {
  Q_OBJECT

 public:
  explicit LegendBar(QWidget* parent = nullptr);
  void set_entries(std::vector<LegendEntry> entries, bool two_sides);
  const std::vector<LegendEntry>& entries() const { return entries_; }
  QSize sizeHint() const override;

 protected:
  void paintEvent(QPaintEvent* event) override;

 private:
  std::vector<LegendEntry> entries_;
  bool two_sides_ = false;
};

}  // namespace tdpipe::viz
