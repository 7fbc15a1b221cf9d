// serving_test.cpp — serving traces in the viewer: PREFILL / DECODE colours and legend,
// the KV-cache step series (exact points, decimation keeping the peak), the KV chart
// (a series per trace and rank, none for training traces), a large trace, and a trace
// the tdpipe CLI predicts.
#include <QApplication>
#include <QElapsedTimer>
#include <QImage>
#include <QProcess>
#include <QTemporaryDir>
#include <QtCharts/QChart>
#include <QtCharts/QChartView>
#include <QtCharts/QLegend>
#include <QtCharts/QLegendMarker>
#include <QtCharts/QLineSeries>
#include <QtCharts/QValueAxis>
#include <algorithm>
#include <catch2/catch.hpp>
#include <random>
#include <set>

#include "synthetic.hpp"
#include "tdpipe/ir/op.hpp"
#include "tdpipe/traces/trace_io.hpp"
#include "tdpipe/viz/charts_panel.hpp"
#include "tdpipe/viz/kv_cache_series.hpp"
#include "tdpipe/viz/legend_bar.hpp"
#include "tdpipe/viz/op_style.hpp"
#include "tdpipe/viz/timeline_model.hpp"
#include "tdpipe/viz/viewer_window.hpp"

using namespace tdpipe;
using namespace tdpipe::viz;

namespace {

traces::TraceEvent serving_event(int rank, ir::OpKind kind, int batch, std::int64_t start_ns, std::int64_t dur_ns,
                                 std::int64_t kv_bytes) {
  traces::TraceEvent e;
  e.rank = rank;
  e.stream = static_cast<int>(ir::Stream::Compute);
  e.kind = kind;
  e.mb = batch;
  e.name = std::string(ir::to_string(kind)) + std::to_string(batch);
  e.start_ns = start_ns;
  e.dur_ns = dur_ns;
  e.bytes = kv_bytes;
  return e;
}

traces::TraceEvent send_event(int rank, int peer, int batch, std::int64_t start_ns, std::int64_t dur_ns) {
  traces::TraceEvent e;
  e.rank = rank;
  e.stream = static_cast<int>(ir::Stream::P2P);
  e.kind = ir::OpKind::SEND;
  e.mb = batch;
  e.peer = peer;
  e.name = "SEND(F" + std::to_string(batch) + ">r" + std::to_string(peer) + ")";
  e.start_ns = start_ns;
  e.dur_ns = dur_ns;
  e.bytes = 999'999;  // activation bytes: not KV, must not show in the chart
  return e;
}

// A hand-made serving run on two ranks, starting at `origin_ns` (the viewer shifts it to
// 0). Rank 0's KV after each op: 1000, 1200, 1200 (no change), 3000, 500 bytes; rank 1
// the same a stage later, its events listed out of time order.
traces::Trace small_serving_trace(std::int64_t origin_ns = 0) {
  traces::Trace t;
  t.origin = "analytic";
  t.schedule = "serve-tdpipe";
  t.scenario = "hand-made";
  t.ranks = 2;
  const std::int64_t o = origin_ns;
  using K = ir::OpKind;
  t.events = {
      serving_event(0, K::PREFILL, 0, o + 0, 100, 1000),   send_event(0, 1, 0, o + 100, 10),
      serving_event(0, K::DECODE, 1, o + 110, 40, 1200),   send_event(0, 1, 1, o + 150, 10),
      serving_event(0, K::DECODE, 2, o + 160, 40, 1200),   send_event(0, 1, 2, o + 200, 10),
      serving_event(0, K::PREFILL, 3, o + 250, 100, 3000), send_event(0, 1, 3, o + 350, 10),
      serving_event(0, K::DECODE, 4, o + 400, 50, 500),
      serving_event(1, K::DECODE, 4, o + 460, 50, 400),    serving_event(1, K::PREFILL, 0, o + 110, 100, 800),
      serving_event(1, K::DECODE, 1, o + 210, 40, 900),    serving_event(1, K::DECODE, 2, o + 250, 40, 900),
      serving_event(1, K::PREFILL, 3, o + 360, 90, 2500),
  };
  return t;
}

// A serving trace of `batches` ops per rank: KV climbing by a few blocks per batch, a
// drop now and then (requests done), and one peak at batch `peak_batch` of each rank.
traces::Trace large_serving_trace(int ranks, int batches, int peak_batch, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> grow(0, 4), drop(0, 40);
  traces::Trace t;
  t.origin = "analytic";
  t.schedule = "serve-tdpipe";
  t.ranks = ranks;
  t.events.reserve(static_cast<std::size_t>(ranks * batches));
  constexpr std::int64_t kBlock = 16 << 20;
  for (int r = 0; r < ranks; ++r) {
    std::int64_t kv = 0, now = r * 1'000'000;
    for (int b = 0; b < batches; ++b) {
      kv += grow(rng) * kBlock;
      if (drop(rng) == 0) kv /= 3;
      const std::int64_t bytes = b == peak_batch ? std::int64_t{40} << 30 : kv;
      const auto kind = b % 50 < 5 ? ir::OpKind::PREFILL : ir::OpKind::DECODE;
      t.events.push_back(serving_event(r, kind, b, now, 20'000'000, bytes));
      now += 25'000'000;
    }
  }
  return t;
}

std::vector<QLineSeries*> kv_lines(const ChartsPanel& charts) {
  std::vector<QLineSeries*> out;
  if (!charts.kv_view()->chart()) return out;
  for (QAbstractSeries* s : charts.kv_view()->chart()->series())
    if (auto* l = qobject_cast<QLineSeries*>(s)) out.push_back(l);
  return out;
}

QValueAxis* kv_axis(const ChartsPanel& charts, Qt::Orientation o) {
  const auto axes = charts.kv_view()->chart()->axes(o);
  return axes.isEmpty() ? nullptr : qobject_cast<QValueAxis*>(axes.front());
}

// The step line of `steps` ending at `end_ns`, as the chart draws it (seconds, y / scale).
QList<QPointF> step_points(const std::vector<KvStep>& steps, std::int64_t end_ns, double scale) {
  QList<QPointF> p;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const double x = static_cast<double>(steps[i].t_ns) / 1e9;
    if (i > 0) p.append(QPointF(x, static_cast<double>(steps[i - 1].bytes) / scale));
    p.append(QPointF(x, static_cast<double>(steps[i].bytes) / scale));
  }
  if (end_ns > steps.back().t_ns)
    p.append(QPointF(static_cast<double>(end_ns) / 1e9, static_cast<double>(steps.back().bytes) / scale));
  return p;
}

}  // namespace

TEST_CASE("PREFILL and DECODE: colours apart from each other and from F, named in the legend", "[serving][style]") {
  traces::TraceEvent f, prefill, decode;
  f.kind = ir::OpKind::F;
  prefill.kind = ir::OpKind::PREFILL;
  decode.kind = ir::OpKind::DECODE;
  auto distance = [](const QColor& a, const QColor& b) {
    return std::abs(a.red() - b.red()) + std::abs(a.green() - b.green()) + std::abs(a.blue() - b.blue());
  };
  CHECK(distance(op_color(prefill), op_color(decode)) > 120);
  CHECK(distance(op_color(prefill), op_color(f)) > 60);
  CHECK(distance(op_color(decode), op_color(f)) > 120);
  for (const auto* e : {&prefill, &decode}) CHECK(distance(op_color(*e), kBubbleColor) > 200);

  // The legend names the kinds a serving trace has, and no training kind it has not.
  const traces::Trace t = small_serving_trace();
  const auto entries = legend_entries({&t});
  std::set<QString> names;
  for (const auto& e : entries) names.insert(e.text);
  CHECK(names == std::set<QString>{"PREFILL", "DECODE", "SEND", "idle (bubble)"});
  for (const auto& e : entries) {
    if (e.text == "PREFILL") CHECK(e.color == op_color(prefill));
    if (e.text == "DECODE") CHECK(e.color == op_color(decode));
  }
  // And a training trace's legend has no serving kind.
  const traces::Trace training = testing::make_1f1b({});
  for (const auto& e : legend_entries({&training})) CHECK((e.text != "PREFILL" && e.text != "DECODE"));
}

TEST_CASE("KV series of a hand-made serving trace: a step at each op end, change points only", "[serving][kv]") {
  const traces::Trace t = small_serving_trace();
  CHECK(has_serving_ops(t));
  CHECK_FALSE(has_serving_ops(testing::make_1f1b({})));
  const auto series = kv_cache_series(t);
  REQUIRE(series.size() == 2);
  CHECK(series[0].rank == 0);
  CHECK(series[0].steps == std::vector<KvStep>{{0, 0}, {100, 1000}, {150, 1200}, {350, 3000}, {450, 500}});
  CHECK(series[0].end_ns == 510);  // the trace's end: rank 1's last op
  CHECK(series[1].rank == 1);
  CHECK(series[1].steps == std::vector<KvStep>{{0, 0}, {210, 800}, {250, 900}, {450, 2500}, {510, 400}});
  CHECK(series[1].end_ns == 510);
  // Fewer steps than the cap: unchanged.
  CHECK(decimate_kv_steps(series[0].steps, 100) == series[0].steps);
}

TEST_CASE("KV chart of a hand-made serving trace: the exact step points, in KiB and seconds", "[gui][serving][kv]") {
  // The trace starts 5 ms in: the chart, like the timeline, starts it at 0.
  ViewerWindow w;
  w.set_traces({small_serving_trace(5'000'000)});
  const ChartsPanel& charts = *w.charts();
  CHECK_FALSE(charts.kv_view()->isHidden());
  const auto lines = kv_lines(charts);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0]->name() == "predicted r0");
  CHECK(lines[1]->name() == "predicted r1");
  const double kib = 1024;
  const QList<QPointF> r0{{0, 0},
                          {100 / 1e9, 0},
                          {100 / 1e9, 1000 / kib},
                          {150 / 1e9, 1000 / kib},
                          {150 / 1e9, 1200 / kib},
                          {350 / 1e9, 1200 / kib},
                          {350 / 1e9, 3000 / kib},
                          {450 / 1e9, 3000 / kib},
                          {450 / 1e9, 500 / kib},
                          {510 / 1e9, 500 / kib}};
  CHECK(lines[0]->points() == r0);
  CHECK(lines[1]->points() ==
        step_points({{0, 0}, {210, 800}, {250, 900}, {450, 2500}, {510, 400}}, 510, kib));
  CHECK(lines[1]->count() == 9);  // rank 1's last op ends the trace: no stretch to the end
  CHECK(charts.kv_points() == 19);
  // Each rank's line in its trace's colour, the earlier rank lighter (the last on top).
  CHECK(lines[1]->pen().color() == trace_color(0, 1));
  CHECK(lines[0]->pen().color().lightness() > lines[1]->pen().color().lightness());
  REQUIRE(kv_axis(charts, Qt::Vertical));
  CHECK(kv_axis(charts, Qt::Vertical)->titleText() == "KV cache (KiB)");
  CHECK(kv_axis(charts, Qt::Vertical)->max() >= 3000 / kib);
  CHECK(kv_axis(charts, Qt::Horizontal)->titleText() == "time (s)");
  CHECK(kv_axis(charts, Qt::Horizontal)->max() >= 510 / 1e9);
}

TEST_CASE("KV decimation: at most the cap, a subset of the steps, the peak kept exactly", "[serving][kv]") {
  std::mt19937 rng(42);
  std::uniform_int_distribution<std::int64_t> value(0, 1'000'000), gap(1, 5'000);
  std::vector<KvStep> steps{{0, 0}};
  for (int i = 1; i < 20'000; ++i) steps.push_back({steps.back().t_ns + gap(rng), value(rng)});
  const std::size_t peak_at = 12'345;
  steps[peak_at].bytes = 5'000'000;
  for (int cap : {4, 100, 1999, 4000}) {
    const auto kept = decimate_kv_steps(steps, cap);
    INFO("cap " << cap);
    CHECK(static_cast<int>(kept.size()) <= cap);
    CHECK(kept.front() == steps.front());
    CHECK(std::find(kept.begin(), kept.end(), steps[peak_at]) != kept.end());
    // Every kept step is a true one, in time order, and no two consecutive alike.
    CHECK(std::includes(steps.begin(), steps.end(), kept.begin(), kept.end(),
                        [](const KvStep& a, const KvStep& b) { return a.t_ns < b.t_ns; }));
    for (const KvStep& k : kept) CHECK(std::binary_search(steps.begin(), steps.end(), k, [](const KvStep& a, const KvStep& b) {
      return a.t_ns < b.t_ns;
    }));
    for (std::size_t i = 1; i < kept.size(); ++i) CHECK(kept[i].bytes != kept[i - 1].bytes);
  }
  // The lowest value of the run survives too (M4 keeps each bucket's low).
  const auto low = *std::min_element(steps.begin() + 1, steps.end(),
                                     [](const KvStep& a, const KvStep& b) { return a.bytes < b.bytes; });
  const auto kept = decimate_kv_steps(steps, 2000);
  CHECK(std::any_of(kept.begin(), kept.end(), [&](const KvStep& k) { return k.bytes == low.bytes; }));
}

TEST_CASE("no KV chart for training traces", "[gui][serving][kv]") {
  ViewerWindow w;
  w.resize(1600, 900);
  w.setAttribute(Qt::WA_DontShowOnScreen, true);
  w.show();
  const ChartsPanel& charts = *w.charts();
  auto settle = [] { QApplication::processEvents(); };
  w.set_traces({testing::make_1f1b({})});
  settle();
  CHECK(charts.kv_view()->isHidden());
  CHECK(kv_lines(charts).empty());
  CHECK(charts.kv_points() == 0);
  // Training: the charts one above the other, as ever, and "iteration end" in the legend.
  CHECK(charts.breakdown_view()->y() > charts.bubble_view()->y() + charts.bubble_view()->height() - 1);
  CHECK(charts.bubble_view()->width() == charts.width());
  CHECK(w.legend()->end_label() == "iteration end");
  // A serving trace shows it, the KV chart the tallest, with the breakdown beside the
  // bubble chart to make room; going back to training traces hides it again.
  w.set_traces({small_serving_trace()});
  settle();
  CHECK_FALSE(charts.kv_view()->isHidden());
  CHECK(charts.breakdown_view()->y() == charts.bubble_view()->y());
  CHECK(charts.breakdown_view()->x() > charts.bubble_view()->x());
  CHECK(charts.kv_view()->height() > charts.bubble_view()->height());
  CHECK(w.legend()->end_label() == "end of run");
  w.set_traces({testing::make_1f1b({}), testing::make_1f1b({})});
  settle();
  CHECK(charts.kv_view()->isHidden());
  CHECK(kv_lines(charts).empty());
  CHECK(charts.breakdown_view()->y() > charts.bubble_view()->y() + charts.bubble_view()->height() - 1);
  CHECK(charts.bubble_view()->width() == charts.width());
  CHECK(w.legend()->end_label() == "iteration end");
  // Beside a training trace, only the serving trace has lines.
  w.set_traces({testing::make_1f1b({}), small_serving_trace()});
  const auto lines = kv_lines(*w.charts());
  REQUIRE(lines.size() == 2);
  CHECK(lines[0]->name() == "measured r0");
}

TEST_CASE("two serving traces: a set of KV series each, named and coloured as the traces", "[gui][serving][kv]") {
  ViewerWindow w;
  auto second = small_serving_trace();
  second.origin = "simgrid";
  for (auto& e : second.events) e.dur_ns += 10;
  w.set_traces({small_serving_trace(), second});
  auto lines = kv_lines(*w.charts());
  REQUIRE(lines.size() == 4);
  CHECK(lines[0]->name() == "predicted r0");
  CHECK(lines[1]->name() == "predicted r1");
  CHECK(lines[2]->name() == "measured r0");
  CHECK(lines[3]->name() == "measured r1");
  CHECK(lines[1]->pen().color() == trace_color(0, 2));
  CHECK(lines[3]->pen().color() == trace_color(1, 2));
  // Every series has its legend entry.
  for (auto* l : lines) {
    const auto markers = w.charts()->kv_view()->chart()->legend()->markers(l);
    REQUIRE(markers.size() == 1);
    CHECK(markers.front()->isVisible());
  }

  // The user's names name the series.
  w.set_labels({"analytic", "simgrid"});
  w.set_traces({small_serving_trace(), second});
  lines = kv_lines(*w.charts());
  REQUIRE(lines.size() == 4);
  CHECK(lines[0]->name() == "analytic r0");
  CHECK(lines[3]->name() == "simgrid r1");
}

TEST_CASE("a large serving trace: three traces of 20,000 batches on 4 ranks, decimated, peak kept",
          "[gui][serving][kv][large]") {
  constexpr int kRanks = 4, kBatches = 20'000, kPeak = 13'000;
  std::vector<traces::Trace> traces;
  const char* schedules[] = {"serve-pp", "serve-tp", "serve-tdpipe"};
  for (std::uint32_t i = 0; i < 3; ++i) {
    traces.push_back(large_serving_trace(kRanks, kBatches, kPeak, 7 + i));
    traces.back().schedule = schedules[i];
  }
  ViewerWindow w;
  w.resize(1600, 900);
  QElapsedTimer timer;
  timer.start();
  w.set_traces(traces);
  const qint64 set_ms = timer.elapsed();
  const auto lines = kv_lines(*w.charts());
  REQUIRE(lines.size() == 3 * kRanks);
  CHECK(kv_axis(*w.charts(), Qt::Vertical)->titleText() == "KV cache (GiB)");
  for (auto* l : lines) {
    INFO(l->name().toStdString());
    CHECK(l->count() <= 4000);
    CHECK(l->count() > 1000);  // decimated, not flattened
    double top = 0;
    for (const QPointF& p : l->points()) top = std::max(top, p.y());
    CHECK(top == 40.0);  // the peak batch (40 GiB) survives decimation
  }
  CHECK(w.charts()->kv_points() <= 60'000);
  // Twelve series: too many to name each, a legend entry per trace, at its last rank's line.
  QStringList visible;
  for (auto* l : lines)
    for (QLegendMarker* m : w.charts()->kv_view()->chart()->legend()->markers(l))
      if (m->isVisible()) {
        visible << m->label();
        CHECK(l->name().endsWith(" r3"));
      }
  CHECK(visible == QStringList{"serve-pp (analytic) r0–r3", "serve-tp (analytic) r0–r3", "serve-tdpipe (analytic) r0–r3"});
  timer.restart();
  const QImage image = w.render_image();
  const qint64 render_ms = timer.elapsed();
  CHECK_FALSE(image.isNull());
  // Timing is reported, never judged (machines differ): see the test's output with -s.
  WARN("3 serving traces × 4 ranks × 20,000 batches: set_traces " << set_ms << " ms, render " << render_ms
                                                                   << " ms");
}

#if defined(TDPIPE_EXE)
TEST_CASE("a serving plan predicted by tdpipe serve: KV chart per rank", "[gui][serving][kv][cli]") {
  QTemporaryDir dir;
  REQUIRE(dir.isValid());
  const QString out = dir.filePath("s.json");
  QProcess proc;
  proc.start(QStringLiteral(TDPIPE_EXE),
             QStringList{"serve", QStringLiteral(TDPIPE_SOURCE_DIR "/scenarios/serve-tiny-cpu.yaml"), "--planner",
                         "all", "--engine", "analytic", "--trace-out", out});
  REQUIRE(proc.waitForFinished(120'000));
  INFO(proc.readAllStandardError().toStdString());
  REQUIRE(proc.exitCode() == 0);
  const QString tdpipe = dir.filePath("s-tdpipe.json"), pp = dir.filePath("s-pp.json");
  ViewerWindow w;
  REQUIRE(w.open({pp, tdpipe}, {"pp", "tdpipe"}));
  const auto lines = kv_lines(*w.charts());
  REQUIRE(lines.size() == 4);  // 2 traces × 2 pipeline ranks
  CHECK(lines[0]->name() == "pp r0");
  CHECK(lines[3]->name() == "tdpipe r1");
  // The chart's steps are the trace's own: the highest point is the largest KV any
  // PREFILL / DECODE of that rank reports.
  const QString y_title = kv_axis(*w.charts(), Qt::Vertical)->titleText();
  const double scale = y_title.contains("GiB") ? 1024.0 * 1024 * 1024 : y_title.contains("MiB") ? 1024.0 * 1024 : 1024.0;
  for (int t = 0; t < 2; ++t)
    for (int r = 0; r < 2; ++r) {
      std::int64_t most = 0;
      for (const auto& e : w.model().trace(t).events)
        if (e.rank == r && e.kind && ir::is_serving(*e.kind)) most = std::max(most, e.bytes);
      REQUIRE(most > 0);
      double top = 0;
      for (const QPointF& p : lines[static_cast<std::size_t>(2 * t + r)]->points()) top = std::max(top, p.y());
      CHECK(top == Approx(static_cast<double>(most) / scale));
    }
  // The legend strip names the serving kinds.
  std::set<QString> kinds;
  for (const auto& e : w.legend()->entries()) kinds.insert(e.text);
  CHECK(kinds.count("PREFILL") == 1);
  CHECK(kinds.count("DECODE") == 1);
  CHECK(kinds.count("F") == 0);
}
#endif
