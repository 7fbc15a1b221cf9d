// timeline_view.cpp — layout, zoom/pan, ruler, lane labels, tooltips, selection.
#include "tdpipe/viz/timeline_view.hpp"

#include <QGraphicsScene>
#include <QHelpEvent>
#include <QKeyEvent>
#include <QMouseEvent>
#include <QFontMetrics>
#include <QPainter>
#include <QScrollBar>
#include <QToolTip>
#include <QWheelEvent>
#include <algorithm>
#include <cmath>

#include "tdpipe/ir/op.hpp"
#include "tdpipe/viz/comparison.hpp"
#include "tdpipe/viz/lane_item.hpp"
#include "tdpipe/viz/op_style.hpp"

namespace tdpipe::viz {
namespace {

// The longest scene the scroll bars (int) and painter can address comfortably.
constexpr double kMaxSceneWidthPx = 1e9;

// A tick step of 1, 2 or 5 × 10^k ns giving at least `min_px` pixels per step.
std::int64_t nice_step(double px_per_ns, double min_px) {
  const double raw = min_px / std::max(px_per_ns, 1e-18);
  double step = std::pow(10.0, std::floor(std::log10(std::max(raw, 1.0))));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (step * m >= raw) {
      step *= m;
      break;
    }
  }
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::llround(step)));
}

// Tick label in the unit of the step, so labels of one ruler read alike.
QString tick_label(std::int64_t t, std::int64_t step) {
  if (step >= 1'000'000'000) return QStringLiteral("%1 s").arg(double(t) / 1e9, 0, 'g', 6);
  if (step >= 1'000'000) return QStringLiteral("%1 ms").arg(double(t) / 1e6, 0, 'g', 9);
  if (step >= 1'000) return QStringLiteral("%1 µs").arg(double(t) / 1e3, 0, 'g', 9);
  return QStringLiteral("%1 ns").arg(t);
}

}  // namespace

// The time ruler in the top viewport margin: ticks, labels and the iteration ends.
class TimelineView::Ruler : public QWidget {
 public:
  explicit Ruler(TimelineView* v) : QWidget(v), view_(v) {}

 protected:
  void paintEvent(QPaintEvent*) override {
    QPainter p(this);
    p.fillRect(rect(), QColor(0xf7, 0xf7, 0xf7));
    p.setPen(QColor(0xc0, 0xc0, 0xc0));
    p.drawLine(0, height() - 1, width(), height() - 1);
    if (!view_->model() || view_->model()->empty()) return;
    QFont f = font();
    f.setPixelSize(11);
    p.setFont(f);
    const double left = view_->mapToScene(QPoint(0, 0)).x();
    auto x_of = [&](std::int64_t t) { return view_->scene_x(t) - left; };
    const std::int64_t step = nice_step(view_->px_per_ns(), 90);
    const auto [t0, t1] = view_->visible_range();
    const std::int64_t first = std::max<std::int64_t>(0, (t0 / step) * step);
    p.setPen(QColor(0x40, 0x40, 0x40));
    for (std::int64_t t = first; t <= t1 + step; t += step) {
      const double x = std::floor(x_of(t));
      if (x < -60 || x > width() + 60) continue;
      p.drawLine(QPointF(x, height() - 8), QPointF(x, height() - 1));
      p.drawText(QRectF(x + 3, 2, 120, height() - 10), Qt::AlignLeft | Qt::AlignVCenter,
                 tick_label(t, step));
      // Minor ticks: five per step.
      for (int k = 1; k < 5; ++k) {
        const double xm = std::floor(x_of(t + step * k / 5));
        p.drawLine(QPointF(xm, height() - 4), QPointF(xm, height() - 1));
      }
    }
    // Iteration ends: a small marker per open trace.
    const TimelineModel& m = *view_->model();
    for (int t = 0; t < m.count(); ++t) {
      const double x = std::floor(x_of(m.end_ns(t)));
      const QColor c = trace_text_color(t, m.count());
      p.setPen(Qt::NoPen);
      p.setBrush(c);
      const QPolygonF tri{QPointF(x - 5, height() - 9), QPointF(x + 5, height() - 9),
                          QPointF(x, height() - 1)};
      p.drawPolygon(tri);
    }
  }

 private:
  TimelineView* view_;
};

// Lane names in the left viewport margin, following the vertical scroll.
class TimelineView::LaneLabels : public QWidget {
 public:
  explicit LaneLabels(TimelineView* v) : QWidget(v), view_(v) {}

 protected:
  void paintEvent(QPaintEvent*) override {
    QPainter p(this);
    p.fillRect(rect(), QColor(0xf7, 0xf7, 0xf7));
    p.setPen(QColor(0xc0, 0xc0, 0xc0));
    p.drawLine(width() - 1, 0, width() - 1, height());
    if (!view_->model()) return;
    const double top = view_->mapToScene(QPoint(0, 0)).y();
    QFont f = font();
    int prev_rank = -1;
    const int n = view_->model()->count();
    for (const Lane& lane : view_->model()->lanes()) {
      const double y = lane.y - top;
      if (y + lane.height < 0 || y > height()) continue;
      f.setPixelSize(lane.compute ? 11 : 9);
      // Two traces: predicted bold blue, measured near-black; more: each in its own colour,
      // the chart's, compute lanes bold.
      f.setBold(lane.compute && (n > 2 || lane.trace == 0));
      p.setFont(f);
      p.setPen(trace_text_color(lane.trace, n));
      p.drawText(QRectF(4, y, width() - 10, lane.height), Qt::AlignRight | Qt::AlignVCenter,
                 QString::fromStdString(lane.label));
      if (lane.rank != prev_rank && prev_rank != -1) {
        p.setPen(QColor(0xd0, 0xd0, 0xd0));
        p.drawLine(QPointF(0, y - kRankGap / 2.0), QPointF(width(), y - kRankGap / 2.0));
      }
      prev_rank = lane.rank;
    }
  }

 private:
  TimelineView* view_;
};

TimelineView::TimelineView(QWidget* parent) : QGraphicsView(parent) {
  auto* scene = new QGraphicsScene(this);
  // One item per lane and they move on every zoom: an index costs more than it saves.
  scene->setItemIndexMethod(QGraphicsScene::NoIndex);
  setScene(scene);
  setBackgroundBrush(kTimelineBackground);
  setFrameShape(QFrame::NoFrame);
  setAlignment(Qt::AlignLeft | Qt::AlignTop);
  setViewportUpdateMode(QGraphicsView::MinimalViewportUpdate);
  setOptimizationFlag(QGraphicsView::DontAdjustForAntialiasing, true);
  setHorizontalScrollBarPolicy(Qt::ScrollBarAsNeeded);
  setMouseTracking(true);
  setFocusPolicy(Qt::StrongFocus);
  setTransformationAnchor(QGraphicsView::NoAnchor);
  ruler_ = new Ruler(this);
  labels_ = new LaneLabels(this);
  setViewportMargins(kLaneLabelWidth, kRulerHeight, 0, 0);
  connect(horizontalScrollBar(), &QScrollBar::valueChanged, this, [this] { ruler_->update(); });
  connect(verticalScrollBar(), &QScrollBar::valueChanged, this, [this] { labels_->update(); });
}

TimelineView::~TimelineView() = default;

void TimelineView::set_model(const TimelineModel* model) {
  // The selection was an op of the traces before: cleared, and said (the status bar and
  // the scatter's ring show it until they hear so).
  const bool had_selection = selected_.has_value();
  selected_.reset();
  selected_twins_.clear();
  scene()->clear();
  items_.clear();
  model_ = model;
  // The label margin fits the longest lane label (bold 11 px for compute lanes).
  label_width_ = kLaneLabelWidth;
  if (model_) {
    QFont f = font();
    f.setPixelSize(11);
    f.setBold(true);
    const QFontMetrics fm(f);
    for (const Lane& lane : model_->lanes())
      label_width_ = std::max(label_width_, fm.horizontalAdvance(QString::fromStdString(lane.label)) + 14);
  }
  setViewportMargins(label_width_, kRulerHeight, 0, 0);
  place_margins();
  if (model_) {
    for (int i = 0; i < static_cast<int>(model_->lanes().size()); ++i) {
      auto* item = new LaneItem(this, i);
      scene()->addItem(item);
      items_.push_back(item);
    }
  }
  fit();
  if (had_selection) emit op_selected(0, -1);
}

double TimelineView::scene_x(std::int64_t t) const {
  return kTimelinePad + static_cast<double>(t) * px_per_ns_;
}

std::int64_t TimelineView::time_at_scene_x(double x) const {
  return static_cast<std::int64_t>(std::floor((x - kTimelinePad) / px_per_ns_));
}

double TimelineView::scene_width() const {
  const std::int64_t span = model_ ? model_->span_ns() : 0;
  return 2 * kTimelinePad + static_cast<double>(span) * px_per_ns_;
}

void TimelineView::relayout() {
  for (auto* item : items_) item->geometry_changing();
  const double h = model_ ? model_->total_height() : 0;
  scene()->setSceneRect(0, 0, scene_width(), h);
  viewport()->update();
  ruler_->update();
  labels_->update();
  emit view_changed();
}

void TimelineView::fit() {
  const std::int64_t span = model_ ? model_->span_ns() : 0;
  const double avail = std::max(50, viewport()->width() - 2 * kTimelinePad - 1);
  for (auto* item : items_) item->geometry_changing();
  px_per_ns_ = span > 0 ? avail / static_cast<double>(span) : 1e-6;
  fitted_ = true;
  relayout();
  horizontalScrollBar()->setValue(0);
}

void TimelineView::zoom(double factor, double anchor_x) {
  if (!model_ || model_->span_ns() <= 0) return;
  const double span = static_cast<double>(model_->span_ns());
  const double fit_scale = std::max(50, viewport()->width() - 2 * kTimelinePad - 1) / span;
  const double max_scale = std::max(fit_scale, std::min(10.0, kMaxSceneWidthPx / span));
  const double anchor_scene = mapToScene(QPoint(static_cast<int>(anchor_x), 0)).x();
  const double t = (anchor_scene - kTimelinePad) / px_per_ns_;
  for (auto* item : items_) item->geometry_changing();
  px_per_ns_ = std::clamp(px_per_ns_ * factor, fit_scale * 0.5, max_scale);
  fitted_ = false;
  relayout();
  horizontalScrollBar()->setValue(static_cast<int>(std::lround(kTimelinePad + t * px_per_ns_ - anchor_x)));
}

std::pair<std::int64_t, std::int64_t> TimelineView::visible_range() const {
  const double left = mapToScene(QPoint(0, 0)).x();
  return {time_at_scene_x(left), time_at_scene_x(left + viewport()->width())};
}

TimelineView::ViewState TimelineView::view_state() const {
  return {px_per_ns_, horizontalScrollBar()->value(), verticalScrollBar()->value(), fitted_};
}

void TimelineView::restore_view_state(const ViewState& state) {
  if (state.fitted || state.px_per_ns <= 0) {
    fit();
  } else {
    for (auto* item : items_) item->geometry_changing();
    px_per_ns_ = state.px_per_ns;
    fitted_ = false;
    relayout();
    horizontalScrollBar()->setValue(state.h_scroll);
  }
  verticalScrollBar()->setValue(state.v_scroll);
}

QPoint TimelineView::widget_point(std::int64_t t, double timeline_y) const {
  const QPoint vp = mapFromScene(QPointF(scene_x(t), timeline_y));
  return viewport()->mapTo(this, vp);
}

void TimelineView::select(std::optional<OpId> id) {
  if (id && (!model_ || model_->lane_of(*id) < 0)) id.reset();
  selected_ = id;
  selected_twins_ = id && model_ ? model_->twins(*id) : std::vector<OpId>{};
  viewport()->update();
  emit op_selected(id ? id->trace : 0, id ? id->index : -1);
}

std::optional<OpId> TimelineView::op_at_viewport(QPoint pos) const {
  if (!model_) return std::nullopt;
  const QPointF s = mapToScene(pos);
  const int lane = model_->lane_at_y(s.y());
  if (lane < 0) return std::nullopt;
  const auto slack = static_cast<std::int64_t>(std::ceil(2.0 / px_per_ns_));
  return model_->op_at(lane, time_at_scene_x(s.x()), slack);
}

QString TimelineView::tooltip_at(QPoint pos) const {
  if (!model_) return {};
  const QPointF s = mapToScene(pos);
  const int lane_index = model_->lane_at_y(s.y());
  if (lane_index < 0) return {};
  const Lane& lane = model_->lanes()[static_cast<std::size_t>(lane_index)];
  const auto id = op_at_viewport(pos);
  if (!id) {
    const auto gap = model_->gap_at(lane_index, time_at_scene_x(s.x()));
    if (!gap) return {};
    return QStringLiteral("<b>idle (bubble)</b> on %1<br>%2 → %3 (%4)")
        .arg(QString::fromStdString(lane.label).toHtmlEscaped(), format_duration(gap->first),
             format_duration(gap->second), format_duration(gap->second - gap->first));
  }
  const auto& e = model_->event(*id);
  const int n = model_->count();
  auto name_of = [&](int t) { return QString::fromStdString(model_->name(t)).toHtmlEscaped(); };
  QString html = QStringLiteral("<b>%1</b> &nbsp;(%2)<table>")
                     .arg(QString::fromStdString(e.name.empty() ? op_label(e).toStdString() : e.name)
                              .toHtmlEscaped(),
                          name_of(id->trace));
  auto row = [&](const QString& k, const QString& v) {
    html += QStringLiteral("<tr><td>%1</td><td>%2</td></tr>").arg(k, v.toHtmlEscaped());
  };
  if (e.kind) {
    const auto k = ir::to_string(*e.kind);
    row(QStringLiteral("kind"), QString::fromUtf8(k.data(), static_cast<qsizetype>(k.size())));
  }
  row(QStringLiteral("rank"), QString::number(e.rank));
  row(QStringLiteral("stream"), QString::fromStdString(stream_name(e.stream, e.kind.has_value())));
  if (e.mb >= 0) row(QStringLiteral("micro-batch"), QString::number(e.mb));
  if (e.chunk > 0) row(QStringLiteral("chunk"), QString::number(e.chunk));
  if (e.slice > 0) row(QStringLiteral("slice"), QString::number(e.slice));
  if (e.peer >= 0) row(QStringLiteral("peer"), QString::number(e.peer));
  if (e.bytes > 0) row(QStringLiteral("bytes"), QString::number(e.bytes));
  row(QStringLiteral("start"), format_duration(e.start_ns));
  row(QStringLiteral("duration"), format_duration(e.dur_ns));
  row(QStringLiteral("end"), format_duration(e.end_ns()));
  html += QStringLiteral("</table>");
  const auto twins = model_->twins(*id);
  if (!twins.empty()) {
    // The op in every trace that has it, in trace order; with two, the difference too.
    std::vector<OpId> all = twins;
    all.push_back(*id);
    std::sort(all.begin(), all.end(), [](const OpId& a, const OpId& b) { return a.trace < b.trace; });
    html += QStringLiteral("<hr><table><tr><td></td><td><b>start</b></td><td><b>duration</b></td></tr>");
    for (const OpId& o : all) {
      const auto& oe = model_->event(o);
      html += QStringLiteral("<tr><td>%1</td><td>%2</td><td>%3</td></tr>")
                  .arg(name_of(o.trace), format_duration(oe.start_ns), format_duration(oe.dur_ns));
    }
    if (all.size() == 2 && n == 2) {
      // The difference as the table's column has it: first − second, relative to the second.
      const auto& a = model_->event(all[0]);
      const auto& b = model_->event(all[1]);
      const auto rel = relative_difference_pct(double(a.dur_ns), double(b.dur_ns));
      const QString diff = model_->names().difference.empty() ? QStringLiteral("Δ")
                                                                : QString::fromStdString(model_->names().difference);
      html += QStringLiteral("<tr><td>%1</td><td>%2</td><td>%3%4</td></tr>")
                  .arg(diff.toHtmlEscaped(), format_duration(a.start_ns - b.start_ns),
                       format_duration(a.dur_ns - b.dur_ns),
                       rel ? QStringLiteral(" (%1%)").arg(*rel, 0, 'f', 1) : QString());
    }
    html += QStringLiteral("</table>");
  } else if (n == 2) {
    html += QStringLiteral("<hr><i>no matching op in the %1 trace</i>").arg(name_of(1 - id->trace));
  } else if (n > 2) {
    html += QStringLiteral("<hr><i>no matching op in the other traces</i>");
  }
  return html;
}

void TimelineView::wheelEvent(QWheelEvent* event) {
  if (event->modifiers() & Qt::ShiftModifier) {
    QGraphicsView::wheelEvent(event);  // Shift+wheel scrolls the lanes
    return;
  }
  const double steps = event->angleDelta().y() / 120.0;
  if (steps == 0) return;
  zoom(std::pow(1.25, steps), event->position().x());
  event->accept();
}

void TimelineView::mousePressEvent(QMouseEvent* event) {
  if (event->button() != Qt::LeftButton) return QGraphicsView::mousePressEvent(event);
  pressed_ = true;
  dragging_ = false;
  press_pos_ = event->pos();
  press_scroll_ = {horizontalScrollBar()->value(), verticalScrollBar()->value()};
  event->accept();
}

void TimelineView::mouseMoveEvent(QMouseEvent* event) {
  if (!pressed_) return QGraphicsView::mouseMoveEvent(event);
  const QPoint d = event->pos() - press_pos_;
  if (!dragging_ && d.manhattanLength() >= 4) {
    dragging_ = true;
    viewport()->setCursor(Qt::ClosedHandCursor);
  }
  if (dragging_) {
    horizontalScrollBar()->setValue(press_scroll_.x() - d.x());
    verticalScrollBar()->setValue(press_scroll_.y() - d.y());
  }
  event->accept();
}

void TimelineView::mouseReleaseEvent(QMouseEvent* event) {
  if (!pressed_ || event->button() != Qt::LeftButton) return QGraphicsView::mouseReleaseEvent(event);
  pressed_ = false;
  if (dragging_) {
    viewport()->unsetCursor();
    dragging_ = false;
  } else {
    select(op_at_viewport(event->pos()));  // a click: select (or clear)
  }
  event->accept();
}

void TimelineView::mouseDoubleClickEvent(QMouseEvent* event) {
  if (!op_at_viewport(event->pos())) fit();
  event->accept();
}

void TimelineView::keyPressEvent(QKeyEvent* event) {
  const double mid = viewport()->width() / 2.0;
  switch (event->key()) {
    case Qt::Key_F: fit(); break;
    case Qt::Key_Plus:
    case Qt::Key_Equal: zoom(1.5, mid); break;
    case Qt::Key_Minus: zoom(1 / 1.5, mid); break;
    case Qt::Key_Escape: select(std::nullopt); break;
    default: QGraphicsView::keyPressEvent(event); return;
  }
  event->accept();
}

void TimelineView::place_margins() {
  const QRect vp = viewport()->geometry();
  ruler_->setGeometry(vp.left(), 0, vp.width(), kRulerHeight);
  labels_->setGeometry(0, vp.top(), label_width_, vp.height());
}

void TimelineView::resizeEvent(QResizeEvent* event) {
  QGraphicsView::resizeEvent(event);
  place_margins();
  if (fitted_) fit();
}

void TimelineView::scrollContentsBy(int dx, int dy) {
  QGraphicsView::scrollContentsBy(dx, dy);
  if (dx) ruler_->update();
  if (dy) labels_->update();
  emit view_changed();
}

bool TimelineView::viewportEvent(QEvent* event) {
  if (event->type() == QEvent::ToolTip) {
    auto* help = static_cast<QHelpEvent*>(event);
    const QString text = tooltip_at(help->pos());
    if (text.isEmpty())
      QToolTip::hideText();
    else
      QToolTip::showText(help->globalPos(), text, viewport());
    return true;
  }
  return QGraphicsView::viewportEvent(event);
}

}  // namespace tdpipe::viz
