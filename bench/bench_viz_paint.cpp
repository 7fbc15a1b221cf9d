// bench_viz_paint.cpp — how long the viewer takes to lay out and paint large traces:
// model build, a full-window timeline paint at fit (every op in view, merged below a
// pixel) and zoomed in, and a pan step. Prints figures; never pass/fail.
//
//   QT_QPA_PLATFORM=offscreen bench_viz_paint [ops_per_rank=12500] [ranks=8]
#include "bench_help.hpp"
#include <QApplication>
#include <QImage>
#include <QScrollBar>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "tdpipe/viz/lane_item.hpp"
#include "tdpipe/viz/timeline_model.hpp"
#include "tdpipe/viz/timeline_view.hpp"

using namespace tdpipe;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Back-to-back compute ops with random lengths and gaps, plus a comm op per 4.
traces::Trace make_trace(int ranks, int per_rank, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dur(500, 3000), gap(0, 400);
  traces::Trace t;
  t.ranks = ranks;
  for (int r = 0; r < ranks; ++r) {
    std::int64_t now = r * 1000;
    for (int i = 0; i < per_rank; ++i) {
      traces::TraceEvent e;
      e.rank = r;
      e.kind = i % 3 == 0 ? ir::OpKind::F : (i % 3 == 1 ? ir::OpKind::B : ir::OpKind::W);
      e.mb = i / 3;
      e.name = std::string(i % 3 == 0 ? "F" : (i % 3 == 1 ? "B" : "W")) + std::to_string(i / 3);
      e.start_ns = now;
      e.dur_ns = dur(rng);
      now += e.dur_ns + gap(rng);
      t.events.push_back(e);
      if (i % 4 == 0) {
        traces::TraceEvent c = e;
        c.stream = 1;
        c.kind = ir::OpKind::SEND;
        c.name = "SEND(" + e.name + ">r" + std::to_string((r + 1) % ranks) + ")";
        c.peer = (r + 1) % ranks;
        c.dur_ns = 300;
        t.events.push_back(c);
      }
    }
  }
  return t;
}

// Paints the viewport through its paintEvent (as the screen would) `reps` times;
// returns ms per paint.
double paint_ms(viz::TimelineView& view, int reps) {
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) (void)view.viewport()->grab();
  return ms_since(t0) / reps;
}

}  // namespace

int main(int argc, char** argv) {
  if (tdpipe::bench::help_requested(argc, argv)) return 0;
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  int qt_argc = 1;
  QApplication app(qt_argc, argv);
  const int per_rank = argc > 1 ? std::atoi(argv[1]) : 12'500;
  const int ranks = argc > 2 ? std::atoi(argv[2]) : 8;

  auto pred = make_trace(ranks, per_rank, 1);
  auto meas = make_trace(ranks, per_rank, 2);
  const std::size_t n = pred.events.size() + meas.events.size();

  viz::TimelineModel model;
  auto t0 = Clock::now();
  std::vector<traces::Trace> both;
  both.push_back(std::move(pred));
  both.push_back(std::move(meas));
  model.set_traces(std::move(both));
  const double build_ms = ms_since(t0);

  viz::TimelineView view;
  view.resize(1600, 900);
  view.set_model(&model);
  view.fit();
  const double fit_ms = paint_ms(view, 5);
  long visited = 0, boxes = 0;
  for (auto* item : view.scene()->items()) {
    const auto* lane = static_cast<const viz::LaneItem*>(item);
    visited += lane->last_stats().events_visited;
    boxes += lane->last_stats().boxes_drawn;
  }
  view.zoom(200, 800);
  const double zoom_ms = paint_ms(view, 20);
  t0 = Clock::now();
  for (int i = 0; i < 20; ++i) {
    view.horizontalScrollBar()->setValue(view.horizontalScrollBar()->value() + 40);
    paint_ms(view, 1);
  }
  const double pan_ms = ms_since(t0) / 20;

  std::printf("bench_viz_paint: %zu ops (%d ranks x %d compute ops x 2 traces, + comm)\n", n, ranks,
              per_rank);
  std::printf("  model build (lanes, pairing)  %8.1f ms\n", build_ms);
  std::printf("  paint at fit 1600x900         %8.1f ms  (%ld ops visited, %ld boxes drawn)\n", fit_ms,
              visited, boxes);
  std::printf("  paint zoomed 200x             %8.2f ms\n", zoom_ms);
  std::printf("  pan step + paint (zoomed)     %8.2f ms\n", pan_ms);
  return 0;
}
