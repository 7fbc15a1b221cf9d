// lane_item.hpp — one timeline lane as a QGraphicsItem that paints only the exposed
// time range. Level of detail: ops under two pixels wide are summed into per-pixel
// bins whose colour blends the ops' colour with the lane background by how busy the
// pixel is, so a lane with 100,000+ ops costs O(visible ops) + O(pixels) to draw and
// zoomed-out idle time still shows as bubble.
#pragma once

#include <QColor>
#include <QGraphicsItem>
#include <cstdint>
#include <vector>

namespace tdpipe::viz {

class TimelineView;

class LaneItem : public QGraphicsItem {
 public:
  LaneItem(const TimelineView* view, int lane);

  QRectF boundingRect() const override;
  void paint(QPainter* painter, const QStyleOptionGraphicsItem* option,
             QWidget* widget) override;
  /// Call before the view's time scale changes (the item's width follows it).
  void geometry_changing() { prepareGeometryChange(); }
  int lane() const { return lane_; }

  /// Paint statistics of the last paint() call, for the benchmark.
  struct Stats {
    long events_visited = 0;
    long boxes_drawn = 0;
    long labels_drawn = 0;
  };
  const Stats& last_stats() const { return stats_; }

 private:
  // The lane's ops packed in start order: painting walks this array, not the trace.
  struct PackedOp {
    std::int64_t start_ns, end_ns;
    QRgb color;
    int event;      ///< index into the trace's events (for labels)
    int depth = 0;  ///< ranges it lies inside on this lane (a foreign trace's nesting)
  };
  const TimelineView* view_;
  std::vector<PackedOp> ops_;
  int lane_;
  Stats stats_;
};

}  // namespace tdpipe::viz
