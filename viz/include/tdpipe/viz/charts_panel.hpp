// charts_panel.hpp — the Qt Charts panels beside the timeline: bubble fraction per
// rank (a bar per trace), compute / exposed comm / idle per rank and trace (stacked
// bars), and below them, for two traces, the first vs the second trace's op durations
// (scatter with the y = x line); for three or more, each trace's iteration time split
// into mean compute and bubble (stacked bars, a row per trace). Serving traces (PREFILL /
// DECODE ops) add a KV-cache chart: each rank's KV bytes over time, a step line per
// (trace, rank).
#pragma once

#include <QPointF>
#include <QWidget>
#include <optional>
#include <vector>

#include "tdpipe/traces/metrics.hpp"
#include "tdpipe/viz/timeline_model.hpp"

QT_BEGIN_NAMESPACE
class QBoxLayout;
class QChartView;
class QChart;
class QScatterSeries;
QT_END_NAMESPACE

namespace tdpipe::viz {

class ChartsPanel : public QWidget {
  Q_OBJECT

 public:
  explicit ChartsPanel(QWidget* parent = nullptr);

  /// Rebuilds the charts; `metrics` holds one entry per trace of the model.
  void set_data(const TimelineModel& model, const std::vector<traces::Metrics>& metrics);

  QChartView* bubble_view() const { return bubble_; }
  /// Shown for exactly two traces.
  QChartView* scatter_view() const { return scatter_; }
  QChartView* breakdown_view() const { return breakdown_; }
  /// Shown for three traces or more: iteration time per trace (compute + bubble).
  QChartView* iteration_view() const { return iteration_; }
  /// Number of points in the duration scatter (after thinning).
  int scatter_points() const { return scatter_points_; }
  /// Shown where a trace has serving ops: KV-cache bytes held over time, a step line
  /// (QLineSeries) per (trace, rank) named "TRACE r<rank>", in the trace's colour (earlier
  /// ranks lighter); x in seconds, y in GiB, MiB or KiB by the largest value. It then
  /// takes the room of two charts, and the bubble and breakdown charts share a row.
  QChartView* kv_view() const { return kv_; }
  /// Points in the KV chart's line series, all together (after decimation).
  int kv_points() const { return kv_points_; }

  /// Marks the op selected in the timeline (in either of two traces; `index` −1 clears)
  /// in the duration scatter: its pair's point, ringed, whether or not thinning kept it.
  void highlight_op(const TimelineModel& model, int trace, int index);
  /// The marked point (predicted, measured duration in the scatter's unit), if any.
  std::optional<QPointF> highlighted() const;

 private:
  /// The KV-cache chart of the model's serving traces (hidden where there are none).
  void set_kv_data(const TimelineModel& model);

  QChartView* bubble_;
  QChartView* scatter_;
  QChartView* breakdown_;
  QChartView* iteration_;
  QChartView* kv_;
  QBoxLayout* column_;  ///< the charts, one above the other
  QBoxLayout* top_row_;  ///< the bubble chart, and beside it the breakdown where serving
  int scatter_points_ = 0;
  int kv_points_ = 0;
  QScatterSeries* selected_ = nullptr;  ///< owned by the scatter's chart
  double scatter_scale_ = 1;
};

}  // namespace tdpipe::viz
