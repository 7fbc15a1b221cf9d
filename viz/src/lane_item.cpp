// lane_item.cpp — painting one lane: active-window background (bubble shade on
// compute lanes), ops as boxes with labels where they fit, sub-pixel ops binned per
// pixel column and blended by occupancy.
#include "tdpipe/viz/lane_item.hpp"

#include <QFontMetrics>
#include <QPainter>
#include <QStyleOptionGraphicsItem>
#include <algorithm>
#include <cmath>
#include <vector>

#include "tdpipe/viz/op_style.hpp"
#include "tdpipe/viz/timeline_view.hpp"

namespace tdpipe::viz {
namespace {

// Ops narrower than this many pixels are not drawn as boxes: their busy time is
// summed into per-pixel bins instead (level of detail).
constexpr double kMergeBelowPx = 2.0;
// More exposed pixels than this are never painted at once (guards the bins).
constexpr double kMaxPaintWidthPx = 1 << 16;

// Busy time and duration-weighted colour of the sub-pixel ops in one pixel column.
struct Bin {
  double busy = 0;  ///< in pixels, 0..1 (more when ops overlap)
  double r = 0, g = 0, b = 0;
};

// Mix of the bin's ops' colour and the lane background by how busy the pixel is, so a
// zoomed-out lane that is 40 % idle looks 40 % bubble rather than solid.
QRgb bin_color(const Bin& bin, const QColor& bg) {
  // Occupancy in 1/32 steps: invisible as colour, and neighbours merge into one rect.
  const double occ = std::ceil(std::min(1.0, bin.busy) * 32) / 32;
  const double w = bin.busy > 0 ? 1.0 / bin.busy : 0;
  auto mix = [&](double c, int back) { return int(std::lround(c * w * occ + back * (1 - occ))); };
  return qRgb(mix(bin.r, bg.red()), mix(bin.g, bg.green()), mix(bin.b, bg.blue()));
}

}  // namespace

LaneItem::LaneItem(const TimelineView* view, int lane) : view_(view), lane_(lane) {
  setFlag(QGraphicsItem::ItemUsesExtendedStyleOption, true);
  const TimelineModel& model = *view_->model();
  const Lane& l = model.lanes()[static_cast<std::size_t>(lane_)];
  const auto& events = model.trace(l.trace).events;
  ops_.reserve(l.events.size());
  // Nesting (a profiler's ranges inside ranges on one thread): each op's depth is the
  // number of ranges still open around it, so that inner ranges draw inset in their outer.
  std::vector<std::pair<std::int64_t, std::int64_t>> open;  // [start, end) of enclosing ranges
  for (int i : l.events) {
    const auto& e = events[static_cast<std::size_t>(i)];
    while (!open.empty() && !(open.back().first <= e.start_ns && e.end_ns() <= open.back().second &&
                              (open.back().first < e.start_ns || e.end_ns() < open.back().second)))
      open.pop_back();
    ops_.push_back({e.start_ns, e.end_ns(), op_color(e).rgb(), i, static_cast<int>(open.size())});
    open.emplace_back(e.start_ns, e.end_ns());
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
  const auto& events = model.trace(lane.trace).events;
  QRectF exposed = option->exposedRect.isValid() ? option->exposedRect : boundingRect();
  if (exposed.width() > kMaxPaintWidthPx) {
    // Painted whole (not through a view): keep to the part the view shows.
    const double left = view_->mapToScene(QPoint(0, 0)).x();
    exposed.setLeft(std::max(exposed.left(), left));
    exposed.setRight(std::min(exposed.right(), left + std::min(kMaxPaintWidthPx, double(view_->viewport()->width()))));
  }
  const double y = lane.y, h = lane.height;

  // Active window [0, end): bubble shade on compute lanes, grey on comm lanes. Nothing
  // is drawn past the trace's iteration end.
  const double end_x = std::floor(view_->scene_x(model.end_ns(lane.trace)));
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

  // Pass 1: sub-pixel ops into bins, wide ops into a list drawn on top.
  const double bin0 = std::floor(exposed.left()) - 2;
  const auto nbins = static_cast<std::size_t>(std::ceil(exposed.right()) + 3 - bin0);
  std::vector<Bin> bins(nbins);
  std::vector<const PackedOp*> wide;
  for (; it != ops_.end(); ++it) {
    const PackedOp& op = *it;
    if (op.start_ns > t1) break;
    if (op.end_ns < t0) continue;
    ++stats_.events_visited;
    const double fx0 = view_->scene_x(op.start_ns), fx1 = view_->scene_x(op.end_ns);
    if (std::floor(fx1) - std::floor(fx0) >= kMergeBelowPx) {
      wide.push_back(&op);
      continue;
    }
    // Spread the op's extent over the pixel columns it touches; an instant (zero
    // duration) still leaves a trace.
    const double a = std::max(fx0, bin0);
    const double b = std::min(op.end_ns > op.start_ns ? fx1 : fx0 + 0.05, bin0 + double(nbins));
    for (double col = std::floor(a); col < b; col += 1) {
      const double overlap = std::min(b, col + 1) - std::max(a, col);
      if (overlap <= 0) continue;
      Bin& bin = bins[static_cast<std::size_t>(col - bin0)];
      bin.busy += overlap;
      bin.r += qRed(op.color) * overlap;
      bin.g += qGreen(op.color) * overlap;
      bin.b += qBlue(op.color) * overlap;
    }
  }
  // Pass 2: the bins, neighbours of one colour as one rectangle.
  const QColor bg = lane.compute ? kBubbleColor : kCommLaneColor;
  for (std::size_t i = 0; i < nbins;) {
    if (bins[i].busy <= 0) {
      ++i;
      continue;
    }
    const QRgb c = bin_color(bins[i], bg);
    std::size_t j = i + 1;
    while (j < nbins && bins[j].busy > 0 && bin_color(bins[j], bg) == c) ++j;
    p->fillRect(QRectF(bin0 + double(i), box_y, double(j - i), box_h), QColor::fromRgb(c));
    ++stats_.boxes_drawn;
    i = j;
  }
  // Pass 3: ops at least two pixels wide, with a border and a label where it fits;
  // nested ones inset from the top by their depth, drawn after (on) their outer range.
  const double step = std::max(2.0, std::floor(box_h / 6));
  for (const PackedOp* op : wide) {
    const double x0 = std::floor(view_->scene_x(op->start_ns));
    const double x1 = std::floor(view_->scene_x(op->end_ns));
    const QColor fill = QColor::fromRgb(op->color);
    const double down = std::min(box_h - 4, step * op->depth);
    const QRectF box(x0, box_y + down, x1 - x0, box_h - down);
    p->fillRect(box, fill);
    ++stats_.boxes_drawn;
    if (box.width() >= 5) {
      p->setPen(fill.darker(150));
      p->drawRect(box.adjusted(0, 0, -1, -1));
    }
    if (room_for_text && box.width() >= 12) {
      const auto& e = events[static_cast<std::size_t>(op->event)];
      QString text = op_label(e);
      if (fm.horizontalAdvance(text) + 4 > box.width()) text = op_short_label(e);
      if (!text.isEmpty() && fm.horizontalAdvance(text) + 4 <= box.width()) {
        p->setPen(text_color_on(fill));
        p->drawText(box, Qt::AlignCenter, text);
        ++stats_.labels_drawn;
      }
    }
  }

  // The selected op and its twins: a dark outline, solid for the selection, dashed
  // for the twins, drawn last so neighbours cannot cover it.
  std::vector<std::pair<std::optional<OpId>, bool>> marked{{view_->selected(), false}};
  for (const OpId& t : view_->selected_twins()) marked.emplace_back(t, true);
  for (const auto& [id, dashed] : marked) {
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
