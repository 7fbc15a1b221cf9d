// lane_item.cpp — painting one lane: active-window background (bubble shade on
// compute lanes), ops as boxes with labels where they fit, sub-pixel ops merged.
#include "tdpipe/viz/lane_item.hpp"

#include <QFontMetrics>
#include <QPainter>
#include <QStyleOptionGraphicsItem>
#include <algorithm>
#include <cmath>

#include "tdpipe/viz/op_style.hpp"
#include "tdpipe/viz/timeline_view.hpp"

namespace tdpipe::viz {
namespace {

// Ops narrower than this many pixels are merged with their neighbours.
constexpr double kMergeBelowPx = 2.0;

// A run of merged sub-pixel ops: its pixel extent and duration-weighted colour.
struct Run {
  double x0 = 0, x1 = 0;
  double r = 0, g = 0, b = 0, w = 0;
  bool open = false;

  void add(double a0, double a1, QRgb c, double weight) {
    if (!open) {
      x0 = a0;
      x1 = a1;
      r = g = b = w = 0;
      open = true;
    }
    x1 = std::max(x1, a1);
    r += qRed(c) * weight;
    g += qGreen(c) * weight;
    b += qBlue(c) * weight;
    w += weight;
  }
  QColor color() const {
    return QColor(int(std::lround(r / w)), int(std::lround(g / w)), int(std::lround(b / w)));
  }
};

}  // namespace

LaneItem::LaneItem(const TimelineView* view, int lane) : view_(view), lane_(lane) {
  setFlag(QGraphicsItem::ItemUsesExtendedStyleOption, true);
  const TimelineModel& model = *view_->model();
  const Lane& l = model.lanes()[static_cast<std::size_t>(lane_)];
  const auto& events = model.trace(l.side).events;
  ops_.reserve(l.events.size());
  for (int i : l.events) {
    const auto& e = events[static_cast<std::size_t>(i)];
    ops_.push_back({e.start_ns, e.end_ns(), op_color(e).rgb(), i});
  }
}

QRectF LaneItem::boundingRect() const {
  const Lane& l = view_->model()->lanes()[static_cast<std::size_t>(lane_)];
  return {0.0, static_cast<double>(l.y), view_->scene_width(), static_cast<double>(l.height)};
}

void LaneItem::paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) {
  stats_ = {};
  const TimelineModel& model = *view_->model();
  const Lane& lane = model.lanes()[static_cast<std::size_t>(lane_)];
  const auto& events = model.trace(lane.side).events;
  const QRectF exposed = option->exposedRect.isValid() ? option->exposedRect : boundingRect();
  const double y = lane.y, h = lane.height;

  // Active window [0, end): bubble shade on compute lanes, grey on comm lanes. Nothing
  // is drawn past the side's iteration end.
  const double end_x = std::floor(view_->scene_x(model.end_ns(lane.side)));
  const double start_x = std::floor(view_->scene_x(0));
  {
    const double a = std::max(start_x, std::floor(exposed.left()));
    const double b = std::min(end_x, std::ceil(exposed.right()) + 1);
    if (b > a)
      p->fillRect(QRectF(a, y, b - a, h), lane.compute ? kBubbleColor : kCommLaneColor);
  }

  // Visible time range, widened by a pixel so boxes cut by the edge are drawn.
  const std::int64_t t0 = view_->time_at_scene_x(exposed.left() - 2);
  const std::int64_t t1 = view_->time_at_scene_x(exposed.right() + 2);
  const std::int64_t lo = t0 - lane.max_dur_ns;
  auto it = std::lower_bound(ops_.begin(), ops_.end(), lo,
                             [](const PackedOp& o, std::int64_t v) { return o.start_ns < v; });

  const double inset = lane.compute ? 2.0 : 1.0;
  const double box_y = y + inset, box_h = h - 2 * inset;
  QFont font = p->font();
  font.setPixelSize(lane.compute ? 11 : 9);
  p->setFont(font);
  const QFontMetrics fm(font);
  const bool room_for_text = box_h >= fm.ascent();

  p->setBrush(Qt::NoBrush);
  Run run;
  auto flush = [&] {
    if (!run.open) return;
    p->fillRect(QRectF(run.x0, box_y, std::max(1.0, run.x1 - run.x0), box_h), run.color());
    ++stats_.boxes_drawn;
    run.open = false;
  };

  for (; it != ops_.end(); ++it) {
    const PackedOp& op = *it;
    if (op.start_ns > t1) break;
    if (op.end_ns < t0) continue;
    ++stats_.events_visited;
    const double x0 = std::floor(view_->scene_x(op.start_ns));
    const double x1 = std::floor(view_->scene_x(op.end_ns));
    if (x1 - x0 < kMergeBelowPx) {
      // Sub-pixel op: extend the open run when it touches it, else start a new one.
      if (run.open && x0 > run.x1 + 1) flush();
      run.add(x0, std::max(x1, x0 + 1), op.color,
              static_cast<double>(std::max<std::int64_t>(op.end_ns - op.start_ns, 1)));
      continue;
    }
    const QColor fill = QColor::fromRgb(op.color);
    const auto& e = events[static_cast<std::size_t>(op.event)];
    flush();
    const QRectF box(x0, box_y, x1 - x0, box_h);
    p->fillRect(box, fill);
    ++stats_.boxes_drawn;
    if (box.width() >= 5) {
      p->setPen(fill.darker(150));
      p->drawRect(box.adjusted(0, 0, -1, -1));
    }
    if (room_for_text && box.width() >= 12) {
      QString text = op_label(e);
      if (fm.horizontalAdvance(text) + 4 > box.width()) text = op_short_label(e);
      if (!text.isEmpty() && fm.horizontalAdvance(text) + 4 <= box.width()) {
        p->setPen(text_color_on(fill));
        p->drawText(box, Qt::AlignCenter, text);
        ++stats_.labels_drawn;
      }
    }
  }
  flush();

  // The selected op and its twin: a dark outline, solid for the selection, dashed
  // for the twin, drawn last so neighbours cannot cover it.
  for (const auto& [id, dashed] : {std::pair{view_->selected(), false},
                                   std::pair{view_->selected_twin(), true}}) {
    if (!id || model.lane_of(*id) != lane_) continue;
    const auto& e = model.event(*id);
    const double x0 = std::floor(view_->scene_x(e.start_ns));
    const double x1 = std::max(x0 + 3, std::floor(view_->scene_x(e.end_ns())));
    QPen pen(QColor(0x10, 0x10, 0x10), 2, dashed ? Qt::DashLine : Qt::SolidLine);
    p->setPen(pen);
    p->setBrush(Qt::NoBrush);
    p->drawRect(QRectF(x0, y + 1, x1 - x0, h - 2));
  }
}

}  // namespace tdpipe::viz
