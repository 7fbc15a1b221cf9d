// timeline_render_test.cpp — render the timeline offscreen and check the pixels:
// ops at their lane rows and times, bubble shade where a rank idles, nothing past
// the iteration end, selection outlines on the op and its twin, level of detail.
#include <QApplication>
#include <QImage>
#include <QMouseEvent>
#include <QWheelEvent>
#include <QScrollBar>
#include <catch2/catch.hpp>

#include "synthetic.hpp"
#include "tdpipe/viz/lane_item.hpp"
#include "tdpipe/viz/op_style.hpp"
#include "tdpipe/viz/timeline_model.hpp"
#include "tdpipe/viz/timeline_view.hpp"

using namespace tdpipe;
using namespace tdpipe::viz;
using tdpipe::viz::testing::find_event;
using tdpipe::viz::testing::make_1f1b;
using tdpipe::viz::testing::OneFOneB;

namespace {

QColor pixel(const QImage& img, QPoint p) { return img.pixelColor(p); }

// The view laid out at a fixed size and rendered into an image.
struct Rendered {
  TimelineModel model;
  TimelineView view;
  QImage image;

  Rendered(const std::optional<traces::Trace>& pred, const std::optional<traces::Trace>& meas,
           QSize size = {1000, 420}) {
    std::vector<traces::Trace> present;  // the traces given, in order
    for (const auto* t : {&pred, &meas})
      if (*t) present.push_back(**t);
    model.set_traces(std::move(present));
    view.resize(size);
    view.set_model(&model);
    view.fit();
    image = view.grab().toImage();
  }
  void regrab() { image = view.grab().toImage(); }
  // Centre of the lane row at time t.
  QPoint at(int lane, std::int64_t t) const {
    const Lane& l = model.lanes()[static_cast<std::size_t>(lane)];
    return view.widget_point(t, l.y + l.height / 2.0);
  }
  QPoint mid_of(OpId id) const {
    const auto& e = model.event(id);
    return at(model.lane_of(id), e.start_ns + e.dur_ns / 2);
  }
};

}  // namespace

TEST_CASE("rendered timeline: ops at their lane rows, bubbles where ranks idle", "[gui][render]") {
  const auto pred = make_1f1b({});
  Rendered r(pred, std::nullopt);
  const auto& model = r.model;
  REQUIRE(r.image.width() == 1000);

  // Every compute op of every rank is drawn in its kind's colour at its row and time.
  for (int rank = 0; rank < 4; ++rank) {
    for (int mb = 0; mb < 8; ++mb) {
      for (auto kind : {ir::OpKind::F, ir::OpKind::BW}) {
        const int i = find_event(model.trace(0), rank, kind, mb);
        REQUIRE(i >= 0);
        const OpId id{0, i};
        CHECK(model.lanes()[static_cast<std::size_t>(model.lane_of(id))].rank == rank);
        const QPoint pt = r.mid_of(id);
        // Labels are drawn at the centre; sample just above them, inside the box.
        const QPoint probe(pt.x(), pt.y() - 7);
        INFO("rank " << rank << " mb " << mb << " kind " << static_cast<int>(kind));
        CHECK(pixel(r.image, probe) == op_color(model.event(id)));
      }
    }
  }
  // Rank 3 (lane 6) idles for (p−1)(F + comm) = 3.3 ms before its first forward:
  // bubble pixels there, and in the same lane's gaps of the steady state.
  const QPoint early = r.at(6, 1'500'000);
  CHECK(pixel(r.image, early) == kBubbleColor);
  // Rank 0 (lane 0) is busy at that time: no bubble.
  CHECK(pixel(r.image, r.at(0, 1'500'000)) != kBubbleColor);
  // The comm lane of rank 0 is grey where idle, not a bubble.
  CHECK(pixel(r.image, r.at(1, 500'000)) == kCommLaneColor);
}

TEST_CASE("rendered timeline: nothing is drawn past the iteration end", "[gui][render]") {
  const auto pred = make_1f1b({});
  OneFOneB slow;
  slow.seed = 5;
  slow.f_ns = 1'300'000;  // the measured run is slower: its end is later
  const auto meas = make_1f1b(slow);
  Rendered r(pred, meas);
  const auto& m = r.model;
  REQUIRE(m.end_ns(1) > m.end_ns(0));
  const QColor white(Qt::white);
  for (int lane = 0; lane < static_cast<int>(m.lanes().size()); ++lane) {
    const Lane& l = m.lanes()[static_cast<std::size_t>(lane)];
    const std::int64_t end = m.end_ns(l.trace);
    const int x_end = r.at(lane, end).x();
    const int y = r.at(lane, 0).y();
    INFO("lane " << l.label);
    // Just before the end something is drawn (the last op or the lane background)…
    CHECK(pixel(r.image, {x_end - 2, y}) != white);
    // …and from the end's next pixel to the right edge, only the background.
    int drawn = 0;
    for (int x = x_end + 1; x < r.image.width(); ++x)
      if (pixel(r.image, {x, y}) != white) ++drawn;
    CHECK(drawn == 0);
  }
  // The shorter predicted run leaves a visible empty stretch before the measured end.
  const int x_pred_end = r.at(0, m.end_ns(0)).x();
  const int x_meas_end = r.at(1, m.end_ns(1)).x();
  CHECK(x_meas_end - x_pred_end > 20);
}

TEST_CASE("selecting an op outlines it and its twin in the other trace", "[gui][render][pairing]") {
  const auto pred = make_1f1b({});
  OneFOneB c;
  c.seed = 9;
  const auto meas = make_1f1b(c);
  Rendered r(pred, meas);
  const int i = find_event(r.model.trace(0), 1, ir::OpKind::BW, 3);
  const OpId id{0, i};
  const auto twin = r.model.twin(id, 1);
  REQUIRE(twin);

  // Click on the op (press and release without moving) selects it.
  int signalled_index = -2;
  QObject::connect(&r.view, &TimelineView::op_selected, [&](int, int index) { signalled_index = index; });
  const QPoint click = r.view.viewport()->mapFrom(&r.view, r.mid_of(id));
  CHECK(r.view.op_at_viewport(click) == id);
  QMouseEvent press(QEvent::MouseButtonPress, QPointF(click), QPointF(r.view.viewport()->mapToGlobal(click)),
                    Qt::LeftButton, Qt::LeftButton, Qt::NoModifier);
  QMouseEvent release(QEvent::MouseButtonRelease, QPointF(click), QPointF(r.view.viewport()->mapToGlobal(click)),
                      Qt::LeftButton, Qt::NoButton, Qt::NoModifier);
  QApplication::sendEvent(r.view.viewport(), &press);
  QApplication::sendEvent(r.view.viewport(), &release);
  CHECK(signalled_index == i);
  REQUIRE(r.view.selected() == id);
  REQUIRE(r.view.selected_twins() == std::vector<OpId>{*twin});
  r.regrab();

  // The outline runs along the top of both boxes, one pixel below the lane top.
  for (const OpId& o : {id, *twin}) {
    const auto& e = r.model.event(o);
    const Lane& lane = r.model.lanes()[static_cast<std::size_t>(r.model.lane_of(o))];
    const QPoint top = r.view.widget_point(e.start_ns + e.dur_ns / 2, lane.y + 1);
    const QColor c = pixel(r.image, top);
    INFO("trace " << o.trace);
    // Solid outline on the selection; the twin's outline is dashed, so look along it.
    bool dark = false;
    for (int dx = -6; dx <= 6 && !dark; ++dx)
      dark = pixel(r.image, top + QPoint(dx, 0)).lightness() < 40;
    CHECK(dark);
    (void)c;
  }
  // A different op shows no outline.
  const int other = find_event(r.model.trace(0), 1, ir::OpKind::F, 6);
  const auto& oe = r.model.event({0, other});
  const Lane& lane0 = r.model.lanes()[static_cast<std::size_t>(r.model.lane_of({0, other}))];
  CHECK(pixel(r.image, r.view.widget_point(oe.start_ns + oe.dur_ns / 2, lane0.y + 1)).lightness() > 40);

  r.view.select(std::nullopt);
  CHECK(r.view.selected_twins().empty());
  CHECK(signalled_index == -1);
}

TEST_CASE("tooltip shows the op's fields and predicted vs measured timing", "[gui]") {
  const auto pred = make_1f1b({});
  OneFOneB c;
  c.seed = 4;
  const auto meas = make_1f1b(c);
  Rendered r(pred, meas);
  const int i = find_event(r.model.trace(1), 2, ir::OpKind::F, 4);
  const OpId id{1, i};
  const QPoint vp = r.view.viewport()->mapFrom(&r.view, r.mid_of(id));
  const QString tip = r.view.tooltip_at(vp);
  CHECK(tip.contains("F4"));
  CHECK(tip.contains("measured"));
  CHECK(tip.contains("micro-batch"));
  const auto& pe = r.model.event(*r.model.twin(id, 0));
  CHECK(tip.contains(format_duration(pe.start_ns)));
  CHECK(tip.contains(format_duration(r.model.event(id).dur_ns)));
  // Over a bubble: the idle gap and its length.
  const QPoint bubble = r.view.viewport()->mapFrom(&r.view, r.at(12, 1'000'000));
  REQUIRE(r.model.lanes()[12].rank == 3);
  const QString idle = r.view.tooltip_at(bubble);
  CHECK(idle.contains("idle (bubble)"));
  CHECK(idle.contains(format_duration(3'300'000)));
}

TEST_CASE("zoom keeps the time under the cursor and fit shows the whole iteration", "[gui]") {
  const auto pred = make_1f1b({});
  Rendered r(pred, std::nullopt);
  const double fit_scale = r.view.px_per_ns();
  const auto [a, b] = r.view.visible_range();
  CHECK(a <= 0);
  CHECK(b >= r.model.end_ns(0));
  const double anchor = 400;
  const auto t_before = r.view.time_at_scene_x(r.view.mapToScene(QPoint(400, 0)).x());
  r.view.zoom(8.0, anchor);
  CHECK(r.view.px_per_ns() == Approx(fit_scale * 8));
  const auto t_after = r.view.time_at_scene_x(r.view.mapToScene(QPoint(400, 0)).x());
  CHECK(std::llabs(t_after - t_before) <= static_cast<long long>(2 / r.view.px_per_ns()));
  const auto [c0, c1] = r.view.visible_range();
  CHECK(c1 - c0 < (b - a) / 6);
  r.view.fit();
  CHECK(r.view.px_per_ns() == Approx(fit_scale));
}

TEST_CASE("level of detail: 100,000 ops at fit draw at most a few boxes per pixel", "[gui][lod]") {
  // 4 ranks × 25,000 tiny ops with small gaps.
  traces::Trace t;
  t.ranks = 4;
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 25'000; ++i) {
      traces::TraceEvent e;
      e.rank = r;
      e.kind = i % 2 ? ir::OpKind::BW : ir::OpKind::F;
      e.mb = i;
      e.start_ns = i * 1'000 + r * 10;
      e.dur_ns = 800;
      e.name = "op";
      t.events.push_back(e);
    }
  TimelineModel model;
  model.set_traces({t});
  TimelineView view;
  view.resize(1200, 300);
  view.set_model(&model);
  view.fit();
  QImage img = view.grab().toImage();
  const auto items = view.scene()->items();
  REQUIRE(items.size() == 4);
  for (auto* gi : items) {
    const auto* lane = static_cast<const LaneItem*>(gi);
    CHECK(lane->last_stats().events_visited == 25'000);
    CHECK(lane->last_stats().boxes_drawn <= view.viewport()->width());
    CHECK(lane->last_stats().labels_drawn == 0);
  }
  // Zoomed out, a pixel shows how busy it is: the ops' mixed colour blended with
  // the bubble shade by occupancy (80 % here), not a solid bar that hides idle time.
  {
    traces::TraceEvent f, bw;
    f.kind = ir::OpKind::F;
    bw.kind = ir::OpKind::BW;
    const QColor cf = op_color(f), cb = op_color(bw);
    auto expect = [&](int a, int b, int bubble) { return 0.8 * (a + b) / 2.0 + 0.2 * bubble; };
    const Lane& l0 = model.lanes()[0];
    const QColor got = img.pixelColor(view.widget_point(12'500'000, l0.y + l0.height / 2.0));
    CHECK(std::abs(got.red() - expect(cf.red(), cb.red(), kBubbleColor.red())) <= 8);
    CHECK(std::abs(got.green() - expect(cf.green(), cb.green(), kBubbleColor.green())) <= 8);
    CHECK(std::abs(got.blue() - expect(cf.blue(), cb.blue(), kBubbleColor.blue())) <= 8);
  }
  // Zoomed far in, only the ops in view are visited and they get labels.
  view.zoom(2000, 0);
  img = view.grab().toImage();
  for (auto* gi : view.scene()->items()) {
    const auto* lane = static_cast<const LaneItem*>(gi);
    CHECK(lane->last_stats().events_visited < 200);
    CHECK(lane->last_stats().events_visited > 0);
    CHECK(lane->last_stats().labels_drawn > 0);
  }
}

TEST_CASE("wheel zooms at the cursor, drag pans, double-click fits", "[gui]") {
  const auto pred = make_1f1b({});
  Rendered r(pred, std::nullopt, {900, 300});
  const double fit_scale = r.view.px_per_ns();
  QWidget* vp = r.view.viewport();
  const QPointF at(300, 40);
  const auto t_at = r.view.time_at_scene_x(r.view.mapToScene(at.toPoint()).x());
  QWheelEvent wheel(at, vp->mapToGlobal(at), QPoint(), QPoint(0, 240), Qt::NoButton, Qt::NoModifier,
                    Qt::NoScrollPhase, false);
  QApplication::sendEvent(vp, &wheel);
  CHECK(r.view.px_per_ns() == Approx(fit_scale * 1.25 * 1.25));
  CHECK(std::llabs(r.view.time_at_scene_x(r.view.mapToScene(at.toPoint()).x()) - t_at) <=
        static_cast<long long>(2 / r.view.px_per_ns()));

  // Drag 120 px to the left: the view scrolls 120 px to the right.
  const int before = r.view.horizontalScrollBar()->value();
  auto mouse = [&](QEvent::Type type, QPointF pos, Qt::MouseButton button, Qt::MouseButtons buttons) {
    QMouseEvent ev(type, pos, vp->mapToGlobal(pos), button, buttons, Qt::NoModifier);
    QApplication::sendEvent(vp, &ev);
  };
  mouse(QEvent::MouseButtonPress, {400, 40}, Qt::LeftButton, Qt::LeftButton);
  mouse(QEvent::MouseMove, {340, 40}, Qt::NoButton, Qt::LeftButton);
  mouse(QEvent::MouseMove, {280, 40}, Qt::NoButton, Qt::LeftButton);
  mouse(QEvent::MouseButtonRelease, {280, 40}, Qt::LeftButton, Qt::NoButton);
  CHECK(r.view.horizontalScrollBar()->value() == before + 120);
  CHECK_FALSE(r.view.selected());  // a drag is not a click

  // Double-click on empty space (below the lanes) fits again.
  const QPointF empty(300, r.model.total_height() + 20);
  mouse(QEvent::MouseButtonDblClick, empty, Qt::LeftButton, Qt::LeftButton);
  CHECK(r.view.px_per_ns() == Approx(fit_scale));
}

TEST_CASE("rendered timeline: a foreign trace's nested ranges draw inset in their outer range",
          "[gui][render][nesting]") {
  traces::Trace t;
  t.origin = "chrome";
  t.ranks = 1;
  auto add = [&](const char* name, std::int64_t start, std::int64_t dur) {
    traces::TraceEvent e;
    e.stream = 3;
    e.name = name;
    e.start_ns = start;
    e.dur_ns = dur;
    t.events.push_back(e);
  };
  add("train_step", 0, 1'000'000);     // outer
  add("matmul", 200'000, 300'000);     // inside it
  add("softmax", 600'000, 200'000);    // inside it, after
  Rendered r(t, std::nullopt);
  const QColor outer = op_color(t.events[0]), inner = op_color(t.events[1]);
  REQUIRE(outer.rgb() != inner.rgb());
  const Lane& lane = r.model.lanes()[0];
  const std::int64_t mid = 230'000;  // inside matmul, clear of its centred label
  // Top rows of the lane inside matmul's span: still the outer range (inset); lower rows: matmul.
  const QPoint top = r.view.widget_point(mid, lane.y + 3.5);
  const QPoint low = r.view.widget_point(mid, lane.y + lane.height - 4.5);
  // (compared as RGB: op_color gives foreign ops an HSV colour)
  CHECK(pixel(r.image, top).rgb() == outer.rgb());
  CHECK(pixel(r.image, low).rgb() == inner.rgb());
  // Outside the inner ranges the outer range fills the lane's rows.
  CHECK(pixel(r.image, r.view.widget_point(100'000, lane.y + lane.height - 4.5)).rgb() == outer.rgb());
}
