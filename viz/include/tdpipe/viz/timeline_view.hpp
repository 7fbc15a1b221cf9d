// timeline_view.hpp — the Gantt timeline: a QGraphicsView with one LaneItem per lane,
// a time ruler above and lane labels to the left; wheel zoom, drag pan, fit,
// hover tooltips and op selection that also highlights the same op in the other traces.
//
// Zoom is horizontal only and is applied by re-laying the scene out in pixels
// (scene x = kTimelinePad + t · px_per_ns), not by a view transform, so labels stay
// crisp and each lane paints only the pixels that are exposed.
#pragma once

#include <QGraphicsView>
#include <QPoint>
#include <cstdint>
#include <optional>
#include <vector>

#include "tdpipe/viz/timeline_model.hpp"

namespace tdpipe::viz {

class LaneItem;

inline constexpr int kTimelinePad = 8;       ///< scene pixels left of t = 0
inline constexpr int kRulerHeight = 28;      ///< pixels above the lanes
inline constexpr int kLaneLabelWidth = 128;  ///< pixels left of the lanes, at least

class TimelineView : public QGraphicsView {
  Q_OBJECT

 public:
  explicit TimelineView(QWidget* parent = nullptr);
  ~TimelineView() override;

  /// Shows `model` (not owned; must outlive the view or be replaced). Fits the view and
  /// clears the selection (emitting op_selected(0, −1) where there was one).
  void set_model(const TimelineModel* model);
  const TimelineModel* model() const { return model_; }

  double px_per_ns() const { return px_per_ns_; }
  /// Scene x of time t (ns since the trace start).
  double scene_x(std::int64_t t_ns) const;
  /// Time at scene x.
  std::int64_t time_at_scene_x(double x) const;
  /// Width of the laid-out scene in pixels.
  double scene_width() const;

  /// Scales time so the longer iteration fills the viewport width.
  void fit();
  /// Zooms by `factor` keeping the time under viewport x `anchor_x` in place.
  void zoom(double factor, double anchor_x);
  /// The visible time range [first, last] in ns.
  std::pair<std::int64_t, std::int64_t> visible_range() const;

  /// Zoom and scroll position, to keep across a reload.
  struct ViewState {
    double px_per_ns = 0;
    int h_scroll = 0, v_scroll = 0;
    bool fitted = true;
  };
  ViewState view_state() const;
  /// Restores a view_state(); a fitted state refits to the current traces.
  void restore_view_state(const ViewState& state);

  /// A point in this widget's coordinates (as in grab()) for time t at timeline y.
  QPoint widget_point(std::int64_t t_ns, double timeline_y) const;

  /// Selects an op (and highlights its twins: the same op in every other trace); nullopt clears.
  void select(std::optional<OpId> id);
  std::optional<OpId> selected() const { return selected_; }
  const std::vector<OpId>& selected_twins() const { return selected_twins_; }

  /// The op under a viewport point, if any.
  std::optional<OpId> op_at_viewport(QPoint pos) const;
  /// Tooltip text (HTML) for a viewport point; empty where nothing is under it.
  QString tooltip_at(QPoint pos) const;

 signals:
  void op_selected(int trace, int index);  ///< index −1: selection cleared
  void view_changed();                    ///< zoom or scroll changed

 protected:
  void wheelEvent(QWheelEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void mouseDoubleClickEvent(QMouseEvent* event) override;
  void keyPressEvent(QKeyEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;
  void scrollContentsBy(int dx, int dy) override;
  bool viewportEvent(QEvent* event) override;

 private:
  class Ruler;
  class LaneLabels;
  void relayout();
  void place_margins();
  int label_width_ = kLaneLabelWidth;  ///< the lane-label margin: kLaneLabelWidth or the longest label

  const TimelineModel* model_ = nullptr;
  std::vector<LaneItem*> items_;
  double px_per_ns_ = 1e-6;
  bool fitted_ = true;
  std::optional<OpId> selected_;
  std::vector<OpId> selected_twins_;
  Ruler* ruler_ = nullptr;
  LaneLabels* labels_ = nullptr;
  QPoint press_pos_;
  QPoint press_scroll_;
  bool pressed_ = false;
  bool dragging_ = false;
};

}  // namespace tdpipe::viz
