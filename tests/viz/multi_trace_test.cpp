// multi_trace_test.cpp — N traces side by side (issue 16 §6): the model's lane order and
// labels, default and user names, the command line, the window (header, table, charts,
// twins in every trace, reload of every file) and headless renders of three traces, from
// synthetic timelines and from schedules the tdpipe CLI predicts.
#include <QApplication>
#include <QDir>
#include <QFile>
#include <QImage>
#include <QLabel>
#include <QProcess>
#include <QTemporaryDir>
#include <QtCharts/QBarCategoryAxis>
#include <QtCharts/QBarSeries>
#include <QtCharts/QBarSet>
#include <QtCharts/QChart>
#include <QtCharts/QChartView>
#include <QtCharts/QHorizontalStackedBarSeries>
#include <catch2/catch.hpp>
#include <set>

#include "synthetic.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/traces/trace_io.hpp"
#include "tdpipe/viz/charts_panel.hpp"
#include "tdpipe/viz/metrics_table.hpp"
#include "tdpipe/viz/op_style.hpp"
#include "tdpipe/viz/timeline_model.hpp"
#include "tdpipe/viz/timeline_view.hpp"
#include "tdpipe/viz/trace_names.hpp"
#include "tdpipe/viz/view_command.hpp"
#include "tdpipe/viz/viewer_window.hpp"

using namespace tdpipe;
using namespace tdpipe::viz;
using tdpipe::viz::testing::find_event;
using tdpipe::viz::testing::make_1f1b;
using tdpipe::viz::testing::OneFOneB;

namespace {

// Three "schedules" of one scenario: 1F1B timelines of different speeds, named as
// `tdpipe sim --engine simgrid` would name them.
std::vector<traces::Trace> three_schedules(int p = 3, int m = 4) {
  std::vector<traces::Trace> out;
  const char* schedules[] = {"gpipe", "1f1b", "zb-v"};
  const std::int64_t f_ns[] = {1'000'000, 1'200'000, 900'000};
  for (int i = 0; i < 3; ++i) {
    OneFOneB c;
    c.p = p;
    c.m = m;
    c.f_ns = f_ns[i];
    auto t = make_1f1b(c);
    t.schedule = schedules[i];
    t.origin = "simgrid";
    out.push_back(std::move(t));
  }
  return out;
}

QString cell_of(const MetricsTable& t, const QString& metric, int column) {
  for (int r = 0; r < t.rowCount(); ++r)
    if (t.item(r, 0)->text() == metric) return t.item(r, column) ? t.item(r, column)->text() : QString();
  return {};
}

// Writes `traces` as PREFIX0.json, PREFIX1.json, … in `dir`; their paths in order.
QStringList write_traces(const QTemporaryDir& dir, const char* prefix, const std::vector<traces::Trace>& traces) {
  QStringList paths;
  for (std::size_t i = 0; i < traces.size(); ++i) {
    paths << dir.filePath(QStringLiteral("%1%2.json").arg(QLatin1String(prefix)).arg(i));
    traces::write_trace(traces[i], paths.back().toStdString());
  }
  return paths;
}

}  // namespace

TEST_CASE("three traces: under each rank and stream a lane per trace, in trace order, labelled", "[model][multi]") {
  TimelineModel m;
  m.set_traces(three_schedules());
  REQUIRE(m.count() == 3);
  CHECK(m.names().name == std::vector<std::string>{"gpipe (simgrid)", "1f1b (simgrid)", "zb-v (simgrid)"});
  CHECK(m.names().short_name == std::vector<std::string>{"gpipe", "1f1b", "zb-v"});
  CHECK(m.names().difference.empty());  // no difference column but for two traces
  // 3 ranks × {compute, p2p} × 3 traces, in exactly this order.
  const char* streams[] = {"compute", "p2p"};
  const char* who[] = {"gpipe", "1f1b", "zb-v"};
  REQUIRE(m.lanes().size() == 18);
  for (std::size_t i = 0; i < m.lanes().size(); ++i) {
    const Lane& l = m.lanes()[i];
    INFO("lane " << i << ": " << l.label);
    CHECK(l.trace == static_cast<int>(i % 3));
    CHECK(l.stream == static_cast<int>((i / 3) % 2));
    CHECK(l.rank == static_cast<int>(i / 6));
    CHECK(l.label == "r" + std::to_string(i / 6) + " " + streams[(i / 3) % 2] + " · " + who[i % 3]);
    if (i > 0) CHECK(l.y > m.lanes()[i - 1].y);
  }
  // Each trace's events all sit in its own lanes.
  for (int t = 0; t < 3; ++t) {
    std::size_t n = 0;
    for (const Lane& l : m.lanes())
      if (l.trace == t) n += l.events.size();
    CHECK(n == m.trace(t).events.size());
  }
  CHECK(m.span_ns() == std::max({m.end_ns(0), m.end_ns(1), m.end_ns(2)}));
  CHECK(m.span_ns() == m.end_ns(1));  // the slowest

  // Compute lanes only: rank 0: gpipe, 1f1b, zb-v; rank 1: …; shorter lanes.
  m.set_compute_lanes_only(true);
  REQUIRE(m.lanes().size() == 9);
  for (std::size_t i = 0; i < 9; ++i) {
    const Lane& l = m.lanes()[i];
    CHECK(l.trace == static_cast<int>(i % 3));
    CHECK(l.rank == static_cast<int>(i / 3));
    CHECK(l.stream == static_cast<int>(ir::Stream::Compute));
    CHECK(l.height == kCompactLaneHeight);
    CHECK(l.label == "r" + std::to_string(i / 3) + " compute · " + who[i % 3]);
  }
  m.set_compute_lanes_only(false);
  CHECK(m.lanes().size() == 18);
}

TEST_CASE("three traces: an op's twins are the same op in every other trace", "[model][multi][pairing]") {
  TimelineModel m;
  m.set_traces(three_schedules());
  const int i = find_event(m.trace(1), 2, ir::OpKind::BW, 3);
  REQUIRE(i >= 0);
  const auto twins = m.twins({1, i});
  REQUIRE(twins.size() == 2);
  CHECK(twins[0].trace == 0);
  CHECK(twins[1].trace == 2);
  for (const OpId& t : twins) {
    const auto& e = m.event(t);
    CHECK(e.rank == 2);
    CHECK(e.kind == ir::OpKind::BW);
    CHECK(e.mb == 3);
    CHECK(m.twin(t, 1) == OpId{1, i});  // and back
  }
  // An op one trace lacks has no twin there.
  auto traces = three_schedules();
  traces[2].events.erase(traces[2].events.begin() +
                         find_event(traces[2], 2, ir::OpKind::BW, 3));
  m.set_traces(std::move(traces));
  const auto fewer = m.twins({1, find_event(m.trace(1), 2, ir::OpKind::BW, 3)});
  REQUIRE(fewer.size() == 1);
  CHECK(fewer[0].trace == 0);
}

TEST_CASE("the model takes at most eight traces", "[model][multi]") {
  TimelineModel m;
  std::vector<traces::Trace> eight(8, make_1f1b({}));
  m.set_traces(eight);
  CHECK(m.count() == 8);
  CHECK(m.lanes().size() == 4 * 2 * 8);
  eight.push_back(make_1f1b({}));
  try {
    m.set_traces(eight);
    FAIL("nine traces were taken");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "at most 8 traces side by side, got 9");
  }
  CHECK(m.count() == 8);  // unchanged
}

TEST_CASE("default trace names tell the traces apart, user names are used as given", "[names][multi]") {
  auto t = make_1f1b({});
  t.schedule = "1f1b";
  t.origin = "cpu";
  // One or two traces: predicted and measured, with the error column.
  auto two = default_trace_names({&t, &t});
  CHECK(two.name == std::vector<std::string>{"predicted", "measured"});
  CHECK(two.short_name == std::vector<std::string>{"pred", "meas"});
  CHECK(two.tag == std::vector<std::string>{"P", "M"});
  CHECK(two.difference == "error");
  CHECK(default_trace_names({&t}).name == std::vector<std::string>{"predicted"});
  // Three measured runs of one schedule: their files' base names tell them apart.
  auto three = default_trace_names({&t, &t, &t}, {"runs/a.json", "runs/b.json.gz", "c.json"});
  CHECK(three.name == std::vector<std::string>{"1f1b (cpu) a", "1f1b (cpu) b", "1f1b (cpu) c"});
  CHECK(three.short_name == three.name);
  CHECK(three.tag == std::vector<std::string>{"1", "2", "3"});
  CHECK(three.difference.empty());
  // No files: their numbers.
  CHECK(default_trace_names({&t, &t, &t}).name ==
        std::vector<std::string>{"1f1b (cpu) #1", "1f1b (cpu) #2", "1f1b (cpu) #3"});
  // Origins apart: schedule and origin suffice; only the alike get the file name.
  auto sim = t, analytic = t;
  sim.origin = "simgrid";
  analytic.origin = "analytic";
  CHECK(default_trace_names({&sim, &t, &analytic, &t}, {"s.json", "x.json", "a.json", "y.json"}).name ==
        std::vector<std::string>{"1f1b (simgrid)", "1f1b (cpu) x", "1f1b (analytic)", "1f1b (cpu) y"});
  // Long names are abbreviated in lane labels.
  auto user = user_trace_names({"gpipe", "a-very-long-schedule-name", "zb-v"});
  CHECK(user.name[1] == "a-very-long-schedule-name");
  CHECK(user.short_name[1] == "a-very-long-sched…");
  CHECK(user.tag == std::vector<std::string>{"G", "A", "Z"});
  CHECK(user.difference.empty());
  CHECK(user_trace_names({"balanced", "unbalanced"}).difference == "change");

  CHECK(check_trace_labels({"a", "b", "c"}, 3).empty());
  CHECK(check_trace_labels({"a", "b"}, 3) ==
        "--labels needs three different names separated by commas, one per trace (3 traces given), "
        "got 2 names in 'a,b'");
  CHECK(check_trace_labels({"a", "b", "a"}, 3) ==
        "--labels needs three different names separated by commas, one per trace (3 traces given), "
        "got a name twice in 'a,b,a'");
  CHECK(check_trace_labels({"a", "", "c"}, 3).find("got an empty name") != std::string::npos);
  CHECK(check_trace_labels({"only"}, 1).empty());
}

TEST_CASE("parse_view_args: up to eight traces, and --labels names each", "[cli][multi]") {
  auto ok = [](QStringList a) { return std::get<ViewArgs>(parse_view_args(a)); };
  auto err = [](QStringList a) { return std::get<std::string>(parse_view_args(a)); };
  const auto three = ok({"--render", "o.png", "a.json", "b.json", "--compute-lanes", "c.json"});
  CHECK(three.traces == QStringList{"a.json", "b.json", "c.json"});
  CHECK(three.compute_lanes);
  QStringList eight;
  for (int i = 0; i < 8; ++i) eight << QStringLiteral("t%1.json").arg(i);
  CHECK(ok(eight).traces == eight);
  CHECK(err(eight + QStringList{"t8.json"}) == "at most 8 traces side by side, got 9");
  const auto named = ok({"--labels", "gpipe, 1f1b ,zb-v", "a", "b", "c"});
  REQUIRE(named.labels);
  CHECK(*named.labels == QStringList{"gpipe", "1f1b", "zb-v"});
  CHECK(err({"--labels", "gpipe,1f1b", "a", "b", "c"}) ==
        "--labels needs three different names separated by commas, one per trace (3 traces given), "
        "got 2 names in 'gpipe,1f1b'");
  CHECK(err({"--labels", "a,b,c,d", "x", "y"}) ==
        "--labels needs two different names separated by a comma (e.g. --labels balanced,unbalanced), one per "
        "trace (2 traces given), got 4 names in 'a,b,c,d'");
  CHECK(ok({"--labels", "solo", "a"}).labels == QStringList{"solo"});
}

TEST_CASE("window with three traces: header, a table column and a bar set per trace, twins everywhere",
          "[gui][window][multi]") {
  const auto traces = three_schedules(4, 6);
  ViewerWindow w;
  w.set_traces(traces, {"gpipe.json", "1f1b.json", "zbv.json"});
  w.resize(1600, 900);
  CHECK(w.windowTitle() == "tdpipe-view — gpipe.json vs 1f1b.json vs zbv.json");
  // The header names every trace and its file.
  const QString header = w.header()->text();
  for (const char* s : {"gpipe (simgrid)", "gpipe.json", "1f1b (simgrid)", "1f1b.json", "zb-v (simgrid)", "zbv.json"})
    CHECK(header.contains(s));

  // Table: metric + a column per trace, headed by its short name (past two traces; the
  // full name in the tooltip), no difference column.
  const MetricsTable& t = *w.table();
  REQUIRE(t.columnCount() == 4);
  CHECK(t.horizontalHeaderItem(1)->text() == "gpipe");
  CHECK(t.horizontalHeaderItem(2)->text() == "1f1b");
  CHECK(t.horizontalHeaderItem(3)->text() == "zb-v");
  CHECK(t.horizontalHeaderItem(1)->toolTip() == "gpipe (simgrid)");
  CHECK(t.horizontalHeaderItem(3)->toolTip() == "zb-v (simgrid)");
  for (int i = 0; i < 3; ++i) {
    const traces::Metrics& m = *w.metrics(i);
    CHECK(m.iteration_ns == traces::compute_metrics(traces[static_cast<std::size_t>(i)]).iteration_ns);
    CHECK(cell_of(t, "iteration time", i + 1) == QString::number(m.iteration_ns / 1e6, 'f', 2) + " ms");
    CHECK(cell_of(t, "bubble (1 − mean compute / iteration)", i + 1) ==
          QString::number(100.0 * m.bubble_fraction, 'f', 2) + "%");
    CHECK(cell_of(t, "rank 3 bubble", i + 1) == QString::number(100.0 * m.ranks[3].idle_fraction, 'f', 2) + "%");
  }
  CHECK(w.metrics(3) == nullptr);
  CHECK(cell_of(t, "ops (matched)", 1).isEmpty());  // the two-trace comparison rows are not there

  // Bubble chart: one bar set per trace, named like the trace, in its colour.
  const auto series = w.charts()->bubble_view()->chart()->series();
  REQUIRE(series.size() == 1);
  auto* bars = qobject_cast<QBarSeries*>(series[0]);
  REQUIRE(bars);
  REQUIRE(bars->count() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(bars->barSets()[i]->label() == t.horizontalHeaderItem(i + 1)->toolTip());
    CHECK(bars->barSets()[i]->color() == trace_color(i, 3));
    CHECK(bars->barSets()[i]->count() == 4);  // a bar per rank
  }
  CHECK(trace_color(0, 3) != trace_color(1, 3));
  // No duration scatter (no one pair to plot); the iteration chart instead, a row per trace.
  CHECK_FALSE(w.charts()->scatter_view()->isVisibleTo(w.charts()));
  CHECK(w.charts()->scatter_points() == 0);
  REQUIRE(w.charts()->iteration_view()->isVisibleTo(w.charts()));
  const auto it_series = w.charts()->iteration_view()->chart()->series();
  REQUIRE(it_series.size() == 1);
  auto* stacked = qobject_cast<QHorizontalStackedBarSeries*>(it_series[0]);
  REQUIRE(stacked);
  REQUIRE(stacked->count() == 2);  // compute + bubble
  for (int i = 0; i < 3; ++i) {    // drawn bottom-up: the first trace is the top row
    const traces::Metrics& m = *w.metrics(i);
    const double sum = stacked->barSets()[0]->at(2 - i) + stacked->barSets()[1]->at(2 - i);
    CHECK(sum == Approx(m.iteration_ns / 1e6));
  }
  const auto axes = w.charts()->iteration_view()->chart()->axes(Qt::Vertical);
  REQUIRE(axes.size() == 1);
  CHECK(qobject_cast<QBarCategoryAxis*>(axes[0])->categories() == QStringList{"zb-v", "1f1b", "gpipe"});

  // Selecting an op outlines the same op in both other traces; the scatter has nothing to ring.
  const int i = find_event(w.model().trace(0), 1, ir::OpKind::F, 2);
  w.timeline()->select(OpId{0, i});
  REQUIRE(w.timeline()->selected_twins().size() == 2);
  CHECK(w.timeline()->selected_twins()[0].trace == 1);
  CHECK(w.timeline()->selected_twins()[1].trace == 2);
  CHECK_FALSE(w.charts()->highlighted());

  // Compute lanes only: a lane per rank and trace.
  w.set_compute_lanes_only(true);
  CHECK(w.model().lanes().size() == 4 * 3);
  const QImage img = w.render_image();
  CHECK(img.size() == QSize(1600, 900));
}

TEST_CASE("open several trace files: all watched, reloaded, one more added", "[gui][window][multi]") {
  QTemporaryDir dir;
  REQUIRE(dir.isValid());
  const QStringList paths = write_traces(dir, "s", three_schedules());
  ViewerWindow w;
  REQUIRE(w.open(paths));
  CHECK(w.model().count() == 3);
  QStringList watched = w.watched_files();
  watched.sort();
  CHECK(watched == paths);
  CHECK(w.paths() == paths);
  // The middle file changes: a reload reads all three again.
  OneFOneB longer;
  longer.p = 3;
  longer.m = 7;
  auto changed = make_1f1b(longer);
  changed.schedule = "1f1b";
  changed.origin = "simgrid";
  traces::write_trace(changed, paths[1].toStdString());
  REQUIRE(w.reload());
  CHECK(w.model().trace(1).events.size() == changed.events.size());
  CHECK(w.model().count() == 3);
  // Add a fourth (File > Add trace…): now watched too, and named apart from the others.
  const QString fourth = dir.filePath("s3.json");
  traces::write_trace(make_1f1b({}), fourth.toStdString());
  REQUIRE(w.add(fourth));
  CHECK(w.model().count() == 4);
  CHECK(w.watched_files().size() == 4);
  CHECK(w.table()->columnCount() == 5);
  // More than eight is refused with the limit named, and the view stays.
  QStringList nine;
  for (int i = 0; i < 9; ++i) nine << paths[0];
  CHECK_FALSE(w.open(nine));
  CHECK(w.last_error() == "at most 8 traces side by side, got 9");
  CHECK(w.model().count() == 4);
  if (w.error_dialog()) w.error_dialog()->close();
  // --labels for as many traces as open name them; a count that no longer fits falls back.
  w.set_labels({"a", "b", "c", "d"});
  REQUIRE(w.reload());
  CHECK(w.model().names().name == std::vector<std::string>{"a", "b", "c", "d"});
  CHECK(w.model().lanes()[0].label == "r0 compute · a");
  REQUIRE(w.open(paths));
  CHECK(w.model().name(0) == "gpipe (simgrid)");
}

TEST_CASE("headless render of three traces writes a PNG of the size asked", "[gui][headless][multi]") {
  QTemporaryDir dir;
  REQUIRE(dir.isValid());
  ViewArgs args;
  args.traces = write_traces(dir, "t", three_schedules());
  args.render_to = dir.filePath("three.png");
  args.width = 1300;
  args.height = 760;
  args.labels = QStringList{"gpipe", "1f1b", "zb-v"};
  REQUIRE(render_headless(args) == 0);
  const QImage img(*args.render_to);
  CHECK(img.size() == QSize(1300, 760));
  // Not blank: many colours (ops of several kinds, bubble shade, trace colours).
  std::set<QRgb> colours;
  for (int y = 0; y < img.height(); y += 7)
    for (int x = 0; x < img.width(); x += 7) colours.insert(img.pixel(x, y));
  CHECK(colours.size() > 50);
}

#ifdef TDPIPE_VIEW_EXE
TEST_CASE("tdpipe-view --render with three traces and their labels, nine are refused", "[gui][headless][cli][multi]") {
  QTemporaryDir dir;
  REQUIRE(dir.isValid());
  QStringList files = write_traces(dir, "t", three_schedules());
  QProcess proc;
  const QString out = dir.filePath("cli3.png");
  proc.start(QStringLiteral(TDPIPE_VIEW_EXE),
             QStringList{"--render", out, "--width", "1200", "--height", "700", "--labels", "g,o,z"} + files);
  REQUIRE(proc.waitForFinished(60'000));
  CHECK(proc.exitCode() == 0);
  CHECK(QImage(out).size() == QSize(1200, 700));

  proc.start(QStringLiteral(TDPIPE_VIEW_EXE), QStringList{"--render", out, "--labels", "g,o"} + files);
  REQUIRE(proc.waitForFinished(60'000));
  CHECK(proc.exitCode() == 2);
  CHECK(QString::fromLocal8Bit(proc.readAllStandardError())
            .contains("--labels needs three different names separated by commas, one per trace (3 traces given), "
                      "got 2 names in 'g,o'"));

  QStringList nine;
  for (int i = 0; i < 9; ++i) nine << files[0];
  proc.start(QStringLiteral(TDPIPE_VIEW_EXE), QStringList{"--render", out} + nine);
  REQUIRE(proc.waitForFinished(60'000));
  CHECK(proc.exitCode() == 2);
  CHECK(QString::fromLocal8Bit(proc.readAllStandardError()).contains("at most 8 traces side by side, got 9"));
}
#endif

#if defined(TDPIPE_EXE) && defined(TDPIPE_VIEW_EXE)
TEST_CASE("four schedules predicted by tdpipe sim, side by side", "[gui][headless][cli][multi][sim]") {
  QTemporaryDir dir;
  REQUIRE(dir.isValid());
  struct Run {
    const char* schedule;
    QStringList extra;
  };
  const Run runs[] = {{"gpipe", {}}, {"1f1b", {}}, {"zb-v", {}}, {"tdpipe", {"--slices", "2"}}};
  QStringList files;
  QProcess proc;
  for (const Run& r : runs) {
    files << dir.filePath(QStringLiteral("%1.json").arg(r.schedule));
    proc.start(QStringLiteral(TDPIPE_EXE),
               QStringList{"sim", QStringLiteral(TDPIPE_SOURCE_DIR "/scenarios/tiny-gpt-cpu.yaml"), "--schedule",
                           r.schedule, "--engine", "simgrid", "--trace-out", files.back()} +
                   r.extra);
    REQUIRE(proc.waitForFinished(120'000));
    INFO(proc.readAllStandardError().toStdString());
    REQUIRE(proc.exitCode() == 0);
  }
  ViewerWindow w;
  REQUIRE(w.open(files));
  REQUIRE(w.model().count() == 4);
  // Default names: the schedule and the origin, the schedule alone in lane labels.
  CHECK(w.model().names().name[0] == "gpipe (simgrid)");
  CHECK(w.model().names().short_name[2] == "zb-v");
  CHECK(w.model().names().name[3] == "tdpipe S=2 (simgrid)");  // the slice count, read from the ops
  CHECK(w.model().names().short_name[3] == "tdpipe S=2");
  for (int i = 0; i < 4; ++i) {
    CHECK(w.table()->horizontalHeaderItem(i + 1)->toolTip() == QString::fromStdString(w.model().name(i)));
    CHECK(w.table()->horizontalHeaderItem(i + 1)->text() ==
          QString::fromStdString(w.model().names().short_name[static_cast<std::size_t>(i)]));
  }
  auto* bars = qobject_cast<QBarSeries*>(w.charts()->bubble_view()->chart()->series()[0]);
  REQUIRE(bars);
  CHECK(bars->count() == 4);
  // Under rank 0, one compute lane per schedule, in the order given.
  w.set_compute_lanes_only(true);
  const int ranks = w.model().ranks();
  REQUIRE(static_cast<int>(w.model().lanes().size()) == 4 * ranks);
  for (int i = 0; i < 4; ++i) CHECK(w.model().lanes()[static_cast<std::size_t>(i)].trace == i);

  const QString out = dir.filePath("schedules.png");
  proc.start(QStringLiteral(TDPIPE_VIEW_EXE), QStringList{"--render", out, "--width", "1600", "--height", "900",
                                                          "--labels", "gpipe,1f1b,zb-v,tdpipe-S2"} + files);
  REQUIRE(proc.waitForFinished(60'000));
  CHECK(proc.exitCode() == 0);
  CHECK(QImage(out).size() == QSize(1600, 900));
}
#endif
