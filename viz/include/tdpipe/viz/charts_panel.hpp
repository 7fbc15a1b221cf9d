// charts_panel.hpp — the Qt Charts panels beside the timeline: bubble fraction per
// rank (predicted vs measured bars), predicted vs measured op duration (scatter with
// the y = x line), and compute / exposed comm / idle per rank (stacked bars).
#pragma once

#include <QPointF>
#include <QWidget>
#include <optional>

#include "tdpipe/traces/metrics.hpp"
#include "tdpipe/viz/timeline_model.hpp"

QT_BEGIN_NAMESPACE
class QChartView;
class QChart;
class QScatterSeries;
QT_END_NAMESPACE

namespace tdpipe::viz {

/// Colours of the two sides in every chart: predicted blue, measured dark grey.
QColor side_color(Side side);

class ChartsPanel : public QWidget {
  Q_OBJECT

 public:
  explicit ChartsPanel(QWidget* parent = nullptr);

  /// Rebuilds the three charts. `pred` / `meas` are the metrics of the model's
  /// sides (absent where the side is not open).
  void set_data(const TimelineModel& model, const std::optional<traces::Metrics>& pred,
                const std::optional<traces::Metrics>& meas);

  QChartView* bubble_view() const { return bubble_; }
  QChartView* scatter_view() const { return scatter_; }
  QChartView* breakdown_view() const { return breakdown_; }
  /// Number of points in the duration scatter (after thinning).
  int scatter_points() const { return scatter_points_; }

  /// Marks the op selected in the timeline (either side; `index` −1 clears) in the
  /// duration scatter: its pair's point, ringed, whether or not thinning kept it.
  void highlight_op(const TimelineModel& model, Side side, int index);
  /// The marked point (predicted, measured duration in the scatter's unit), if any.
  std::optional<QPointF> highlighted() const;

 private:
  QChartView* bubble_;
  QChartView* scatter_;
  QChartView* breakdown_;
  int scatter_points_ = 0;
  QScatterSeries* selected_ = nullptr;  ///< owned by the scatter's chart
  double scatter_scale_ = 1;
};

}  // namespace tdpipe::viz
