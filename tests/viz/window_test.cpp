// window_test.cpp — the whole window: charts and table follow the traces, a malformed
// trace gives an error dialog (GUI) or a non-zero exit naming the problem (headless),
// export and the command line.
#include <QApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QMessageBox>
#include <QProcess>
#include <QRegularExpression>
#include <QTemporaryDir>
#include <QtCharts/QCategoryAxis>
#include <QtCharts/QChart>
#include <QtCharts/QChartView>
#include <catch2/catch.hpp>

#include "synthetic.hpp"
#include "tdpipe/traces/chrome_json.hpp"
#include "tdpipe/traces/trace_io.hpp"
#include "tdpipe/viz/charts_panel.hpp"
#include "tdpipe/viz/legend_bar.hpp"
#include "tdpipe/viz/metrics_table.hpp"
#include "tdpipe/viz/op_style.hpp"
#include "tdpipe/viz/timeline_view.hpp"
#include "tdpipe/viz/view_command.hpp"
#include "tdpipe/viz/trace_names.hpp"
#include "tdpipe/viz/viewer_window.hpp"

using namespace tdpipe;
using namespace tdpipe::viz;
using tdpipe::viz::testing::make_1f1b;
using tdpipe::viz::testing::OneFOneB;

namespace {

QString write_text(const QTemporaryDir& dir, const QString& name, const QByteArray& text) {
  const QString path = dir.filePath(name);
  QFile f(path);
  REQUIRE(f.open(QIODevice::WriteOnly));
  f.write(text);
  return path;
}

QString table_cell(const MetricsTable& t, const QString& metric, int column) {
  for (int r = 0; r < t.rowCount(); ++r)
    if (t.item(r, 0)->text() == metric) return t.item(r, column) ? t.item(r, column)->text() : QString();
  return {};
}

}  // namespace

TEST_CASE("window shows charts, legend and metrics for two traces", "[gui][window]") {
  const auto pred = make_1f1b({});
  OneFOneB c;
  c.seed = 21;
  const auto meas = make_1f1b(c);
  ViewerWindow w;
  w.set_traces({pred, meas}, {"pred.json", "meas.json"});
  CHECK(w.windowTitle() == "tdpipe-view — pred.json vs meas.json");
  CHECK(w.model().pairing().pairs == static_cast<int>(pred.events.size()));
  CHECK(w.charts()->scatter_points() == static_cast<int>(pred.events.size()));
  CHECK(w.charts()->bubble_view()->chart()->series().size() == 1);
  CHECK(w.charts()->scatter_view()->isVisibleTo(w.charts()));
  // Legend: the kinds present (F, BW, OPT, SEND, RECV) and the bubble shade.
  QStringList legend;
  for (const auto& e : w.legend()->entries()) legend << e.text;
  CHECK(legend == QStringList{"F", "BW", "OPT", "SEND", "RECV", "idle (bubble)"});
  // The table's iteration row agrees with the metrics of each side.
  const auto& mp = *w.metrics(0);
  CHECK(table_cell(*w.table(), "iteration time", 1) ==
        QString::number(mp.iteration_ns / 1e6, 'f', 2) + " ms");
  CHECK_FALSE(table_cell(*w.table(), "iteration time", 3).isEmpty());
  CHECK(table_cell(*w.table(), "ops (matched)", 3) == QString::number(pred.events.size()));

  w.resize(1400, 800);
  const QImage img = w.render_image();
  CHECK(img.size() == QSize(1400, 800));
}

TEST_CASE("at scale: compute lanes only, a rank label every few ranks, per-row units, the selection in the scatter",
          "[gui][window][scale]") {
  OneFOneB big;
  big.p = 40;
  big.m = 8;
  const auto pred = make_1f1b(big);
  big.seed = 5;
  const auto meas = make_1f1b(big);
  ViewerWindow w;
  w.set_traces({pred, meas}, {"pred.json", "meas.json"});
  const std::size_t all_lanes = w.model().lanes().size();
  w.set_compute_lanes_only(true);
  CHECK(w.model().lanes().size() == 2 * 40);  // one per rank and side
  CHECK(w.model().lanes().size() < all_lanes);
  for (const auto& lane : w.model().lanes()) CHECK(lane.stream == static_cast<int>(ir::Stream::Compute));
  w.set_compute_lanes_only(false);
  CHECK(w.model().lanes().size() == all_lanes);
  // Beside a foreign trace, that side keeps every lane of its own.
  {
    ViewerWindow mixed;
    mixed.set_traces({pred, tdpipe::viz::testing::make_foreign(0)}, {"pred.json", "profile.json"});
    mixed.set_compute_lanes_only(true);
    int foreign = 0;
    for (const auto& lane : mixed.model().lanes()) {
      if (lane.trace == 1) ++foreign;
      else CHECK(lane.stream == static_cast<int>(ir::Stream::Compute));
    }
    CHECK(foreign == 2);  // make_foreign: two ranks, one tid each
  }

  // 40 ranks: a rank label every 5 ranks at its bar, instead of 40 labels eliding to "…".
  for (QChartView* chart : {w.charts()->bubble_view(), w.charts()->breakdown_view()}) {
    const auto axes = chart->chart()->axes(Qt::Horizontal);
    REQUIRE(axes.size() == 1);
    auto* x = qobject_cast<QCategoryAxis*>(axes[0]);
    REQUIRE(x);
    CHECK(x->categoriesLabels() == QStringList{"r0", "r5", "r10", "r15", "r20", "r25", "r30", "r35"});
  }
  // The table's time rows pick their unit: ms for these traces' iteration.
  CHECK(table_cell(*w.table(), "iteration time", 1).endsWith(" ms"));
  CHECK(table_cell(*w.table(), "rank 39 bubble", 1).endsWith("%"));

  // Selecting an op in the timeline rings its pair's point in the duration scatter.
  CHECK_FALSE(w.charts()->highlighted());
  int i = 0;
  while (pred.events[static_cast<std::size_t>(i)].kind != ir::OpKind::BW) ++i;
  w.timeline()->select(OpId{0, i});
  const auto point = w.charts()->highlighted();
  REQUIRE(point);
  const int j = w.model().pairing().pred_to_meas[static_cast<std::size_t>(i)];
  REQUIRE(j >= 0);
  CHECK(point->x() / point->y() ==
        Approx(double(pred.events[static_cast<std::size_t>(i)].dur_ns) / double(meas.events[static_cast<std::size_t>(j)].dur_ns)));
  w.timeline()->select(OpId{1, j});  // from the measured side: the same point
  REQUIRE(w.charts()->highlighted());
  CHECK(*w.charts()->highlighted() == *point);
  w.timeline()->select(std::nullopt);
  CHECK_FALSE(w.charts()->highlighted());
  // Switching lanes clears a selection (and its ring) rather than leaving it behind.
  w.timeline()->select(OpId{0, i});
  REQUIRE(w.charts()->highlighted());
  w.set_compute_lanes_only(true);
  CHECK_FALSE(w.charts()->highlighted());
  CHECK_FALSE(w.timeline()->selected());
}

TEST_CASE("later chunks are lighter shades of their kind, and the legend says so", "[gui][style]") {
  traces::TraceEvent f0, f1, f2, send;
  f0.kind = f1.kind = f2.kind = ir::OpKind::F;
  f1.chunk = 1;
  f2.chunk = 2;
  send.kind = ir::OpKind::SEND;
  send.chunk = 1;
  CHECK(op_color(f1).lightness() > op_color(f0).lightness());
  CHECK(op_color(f2).lightness() > op_color(f1).lightness());
  CHECK(op_color(f1).hue() == op_color(f0).hue());
  traces::TraceEvent send0 = send;
  send0.chunk = 0;
  CHECK(op_color(send) == op_color(send0));  // communication keeps its kind's colour
  traces::Trace t;
  t.ranks = 1;
  t.events = {f0, f2};
  QStringList legend;
  for (const auto& e : legend_entries({&t})) legend << e.text;
  CHECK(legend == QStringList{"F", "chunks c1…c2: lighter", "idle (bubble)"});
}

TEST_CASE("window works with one trace", "[gui][window]") {
  ViewerWindow w;
  w.set_traces({make_1f1b({})}, {"pred.json"});
  CHECK(w.windowTitle() == "tdpipe-view — pred.json");
  CHECK(w.charts()->scatter_points() == 0);
  CHECK_FALSE(w.charts()->scatter_view()->isVisibleTo(w.charts()));  // nothing to compare
  CHECK(w.model().lanes().size() == 8);
  CHECK(w.table()->columnCount() == 2);  // metric and the one trace: no empty columns
  CHECK_FALSE(table_cell(*w.table(), "iteration time", 1).isEmpty());
  CHECK(table_cell(*w.table(), "ops (matched)", 0).isEmpty());  // no comparison rows
}

TEST_CASE("a malformed trace shows an error dialog and keeps the view", "[gui][window][errors]") {
  QTemporaryDir dir;
  REQUIRE(dir.isValid());
  const QString bad = write_text(dir, "broken.json", "{\"traceEvents\": [ {\"ph\": \"X\", \"ts\": ");
  ViewerWindow w;
  w.set_traces({make_1f1b({})}, {"good.json"});
  const auto lanes_before = w.model().lanes().size();
  CHECK_FALSE(w.open({bad}));
  REQUIRE(w.error_dialog() != nullptr);
  CHECK(w.error_dialog()->isVisible());
  CHECK(w.error_dialog()->text().contains("broken.json"));
  CHECK(w.last_error().contains("broken.json"));
  CHECK(w.model().lanes().size() == lanes_before);
  w.error_dialog()->close();

  // A missing file names the file too.
  CHECK_FALSE(w.open({dir.filePath("missing.json")}));
  CHECK(w.last_error().contains("missing.json"));
  CHECK(w.last_error().contains("no such file"));
}

TEST_CASE("headless render: malformed trace exits non-zero, good traces write a PNG", "[gui][headless]") {
  QTemporaryDir dir;
  REQUIRE(dir.isValid());
  const QString bad = write_text(dir, "bad.json", "[{\"ph\": \"X\", \"name\": \"x\", \"ts\": \"soon\"}]");
  ViewArgs args;
  args.traces = {bad};
  args.render_to = dir.filePath("out.png");
  CHECK(render_headless(args) == 2);
  CHECK_FALSE(QFile::exists(*args.render_to));

  const QString pred = dir.filePath("pred.json");
  const QString meas = dir.filePath("meas.json");
  OneFOneB c;
  traces::write_trace(make_1f1b(c), pred.toStdString());
  c.seed = 2;
  traces::write_trace(make_1f1b(c), meas.toStdString());
  args.traces = {pred, meas};
  args.width = 1200;
  args.height = 700;
  CHECK(render_headless(args) == 0);
  const QImage img(*args.render_to);
  CHECK(img.size() == QSize(1200, 700));
}

TEST_CASE("headless render: a Kineto folder and the shipped torch.profiler trace as the measured side",
          "[gui][headless]") {
  QTemporaryDir dir;
  REQUIRE(dir.isValid());
  const QString pred = dir.filePath("pred.json");
  OneFOneB c;
  traces::write_trace(make_1f1b(c), pred.toStdString());
  c.seed = 2;
  traces::write_trace(make_1f1b(c), dir.filePath("meas").toStdString(), traces::TraceFormat::Kineto);
  ViewArgs args;
  args.traces = {pred, dir.filePath("meas")};
  args.render_to = dir.filePath("kineto.png");
  CHECK(render_headless(args) == 0);
  CHECK(QImage(*args.render_to).width() > 0);
  args.traces[1] = QStringLiteral(TDPIPE_SOURCE_DIR "/traces/samples/torch-cpu/tiny-gpt-cpu-1f1b");
  args.render_to = dir.filePath("torch.png");
  CHECK(render_headless(args) == 0);
  CHECK(QImage(*args.render_to).width() > 0);
}

#ifdef TDPIPE_VIEW_EXE
TEST_CASE("tdpipe-view --render: exit status and message name the problem", "[gui][headless][cli]") {
  QTemporaryDir dir;
  REQUIRE(dir.isValid());
  const QString bad = write_text(dir, "garbage.json", "this is not json");
  QProcess proc;
  proc.start(QStringLiteral(TDPIPE_VIEW_EXE), {"--render", dir.filePath("x.png"), bad});
  REQUIRE(proc.waitForFinished(60'000));
  CHECK(proc.exitCode() == 2);
  const QString err = QString::fromLocal8Bit(proc.readAllStandardError());
  CHECK(err.contains("garbage.json"));
  CHECK(QRegularExpression("(^|\\n)tdpipe-view: error: [^\\n]*garbage\\.json").match(err).hasMatch());
  CHECK_FALSE(QFile::exists(dir.filePath("x.png")));

  proc.start(QStringLiteral(TDPIPE_VIEW_EXE), {"--render", dir.filePath("x.png"), "--width", "12"});
  REQUIRE(proc.waitForFinished(60'000));
  CHECK(proc.exitCode() == 2);
  CHECK(QString::fromLocal8Bit(proc.readAllStandardError()).contains("--width"));

  // An image that cannot be written whole is an error, and an old image stays as it was.
  const QString good = dir.filePath("good.json");
  tdpipe::traces::write_trace(make_1f1b({}), good.toStdString());
  proc.start(QStringLiteral(TDPIPE_VIEW_EXE), {"--render", "/dev/full", good});
  REQUIRE(proc.waitForFinished(60'000));
  CHECK(proc.exitCode() == 2);
  CHECK(QString::fromLocal8Bit(proc.readAllStandardError()).contains("cannot write image '/dev/full'"));
  proc.start(QStringLiteral(TDPIPE_VIEW_EXE), {"--render", dir.filePath("no/such/dir/x.png"), good});
  REQUIRE(proc.waitForFinished(60'000));
  CHECK(proc.exitCode() == 2);
  proc.start(QStringLiteral(TDPIPE_VIEW_EXE), {"--render", dir.filePath("ok.png"), good});
  REQUIRE(proc.waitForFinished(60'000));
  CHECK(proc.exitCode() == 0);
  CHECK(QImage(dir.filePath("ok.png")).width() > 0);
  CHECK(QDir(dir.path()).entryList(QDir::Files | QDir::Hidden).filter("ok.png").size() == 1);  // no temporary
}

#endif

TEST_CASE("parse_view_args", "[cli]") {
  auto ok = [](QStringList a) { return std::get<ViewArgs>(parse_view_args(a)); };
  auto err = [](QStringList a) { return std::get<std::string>(parse_view_args(a)); };
  const auto a = ok({"--render", "o.png", "--width", "800", "p.json", "m.json"});
  CHECK(a.render_to == QString("o.png"));
  CHECK(a.width == 800);
  CHECK(a.height == 900);
  CHECK(a.traces == QStringList{"p.json", "m.json"});
  CHECK(ok({}).traces.isEmpty());
  CHECK(ok({"-h"}).help);
  CHECK(err({"--render"}) == "--render needs an output file (e.g. --render out.png)");
  CHECK(err({"--render", "o.png"}) == "--render needs at least one trace file");
  CHECK(ok({"a", "b", "c"}).traces.size() == 3);  // N traces side by side (multi_trace_test.cpp)
  CHECK(err({"1", "2", "3", "4", "5", "6", "7", "8", "9"}) == "at most 8 traces side by side, got 9");
  CHECK(err({"--bogus"}) == "unknown option '--bogus'");
  CHECK(err({"--height", "x", "a"}).find("--height needs a whole number") == 0);
  const auto l = ok({"--labels", "balanced, unbalanced", "b.json", "u.json"});
  REQUIRE(l.labels);
  CHECK(*l.labels == QStringList{"balanced", "unbalanced"});
  CHECK(!ok({"p.json"}).labels);
  CHECK(err({"--labels", "one", "a", "b"}).find("--labels needs two different names") == 0);
  CHECK(err({"--labels", "a,a", "x", "y"}).find("--labels needs two different names") == 0);
  CHECK(err({"--labels", "a,", "x", "y"}).find("--labels needs two different names") == 0);
  CHECK(err({"x", "y", "--labels"}).find("--labels needs two different names") == 0);
  CHECK(err({"--labels"}) == "--labels names the traces, one name each, but no trace file was given");
}

TEST_CASE("two measured runs under their own names (--labels)", "[gui][window]") {
  ViewerWindow w;
  w.set_labels({"balanced", "unbalanced"});
  OneFOneB slow;
  slow.seed = 7;
  slow.jitter = 0.2;
  w.set_traces({make_1f1b({}), make_1f1b(slow)});
  w.resize(1600, 900);
  const auto& lanes = w.model().lanes();
  REQUIRE(!lanes.empty());
  CHECK(lanes[0].label == "r0 compute · balanced");
  CHECK(lanes[1].label == "r0 compute · unbalanced");
  CHECK(w.table()->horizontalHeaderItem(1)->text() == "balanced");
  CHECK(w.table()->horizontalHeaderItem(3)->text() == "change");
  // Without them, the default names come back.
  w.set_labels({});
  w.set_traces({make_1f1b({}), make_1f1b(slow)});
  CHECK(w.model().name(0) == "predicted");
  CHECK(w.table()->horizontalHeaderItem(1)->text() == "predicted");
  CHECK(w.table()->horizontalHeaderItem(3)->text() == "error");
}

TEST_CASE("export PNG and SVG", "[gui][window]") {
  QTemporaryDir dir;
  ViewerWindow w;
  w.set_traces({make_1f1b({})});
  w.resize(900, 600);
  const QString png = dir.filePath("v.png");
  REQUIRE(w.export_png(png));
  CHECK(QImage(png).size() == QSize(900, 600));
#ifdef TDPIPE_VIZ_TEST_SVG
  w.resize(1600, 900);  // wide enough for full op labels
  const QString svg = dir.filePath("v.svg");
  REQUIRE(w.export_svg(svg));
  QFile f(svg);
  REQUIRE(f.open(QIODevice::ReadOnly));
  const QByteArray text = f.readAll();
  CHECK(text.contains("<svg"));
  CHECK(text.contains(">BW7<"));  // timeline op labels are text in the SVG
  CHECK(text.contains("r3 compute · pred"));
#endif
}

TEST_CASE("reload follows a changed file", "[gui][window]") {
  QTemporaryDir dir;
  const QString path = dir.filePath("t.json");
  OneFOneB c;
  c.m = 4;
  traces::write_trace(make_1f1b(c), path.toStdString());
  ViewerWindow w;
  REQUIRE(w.open({path}));
  CHECK(w.watched_files() == QStringList{path});
  const auto n4 = w.model().trace(0).events.size();
  c.m = 6;
  traces::write_trace(make_1f1b(c), path.toStdString());
  w.timeline()->zoom(3, 100);
  const double zoomed = w.timeline()->px_per_ns();
  REQUIRE(w.reload());
  CHECK(w.model().trace(0).events.size() > n4);
  CHECK(w.timeline()->px_per_ns() == zoomed);  // the reload kept the zoom
  // A reload that fails keeps the view and the watch.
  write_text(dir, "t.json", "{");
  CHECK_FALSE(w.reload());
  CHECK(w.model().trace(0).events.size() > n4);
  CHECK(w.watched_files() == QStringList{path});
}

TEST_CASE("any Chrome trace with X events opens: lanes per pid and tid", "[gui][window]") {
  QTemporaryDir dir;
  // A profiler-style trace: absolute µs timestamps, string pids, metadata and
  // begin/end events that are not intervals.
  const QString path = write_text(dir, "profile.json", R"({"traceEvents": [
    {"ph": "M", "name": "process_name", "pid": "gpu0", "tid": 0, "args": {"name": "GPU 0"}},
    {"ph": "M", "name": "thread_name", "pid": "gpu0", "tid": 2, "args": {"name": "nccl stream"}},
    {"ph": "X", "name": "gemm", "pid": "gpu0", "tid": 1, "ts": 1700000000000.0, "dur": 250.5},
    {"ph": "X", "name": "gemm", "pid": "gpu0", "tid": 1, "ts": 1700000000400.0, "dur": 250},
    {"ph": "X", "name": "nccl:all_reduce", "pid": "gpu0", "tid": 2, "ts": 1700000000300.0, "dur": 500},
    {"ph": "B", "name": "step", "pid": "gpu0", "tid": 1, "ts": 1700000000000.0},
    {"ph": "X", "name": "gemm", "pid": "gpu1", "tid": 1, "ts": 1700000000100.0, "dur": 250}
  ]})");
  ViewerWindow w;
  REQUIRE(w.open({path}));
  const auto& m = w.model();
  REQUIRE(m.lanes().size() == 3);  // gpu0/tid1, gpu0/tid2, gpu1/tid1
  // Lanes keep the profiler's names: its process and thread names, else its pid and tid.
  CHECK(m.lanes()[0].label == "GPU 0 · tid 1 · pred");
  CHECK(m.lanes()[1].label == "GPU 0 · nccl stream · pred");
  CHECK(m.lanes()[2].label == "pid gpu1 · tid 1 · pred");
  CHECK(m.end_ns(0) == 800'000);
  CHECK(m.lanes()[0].events.size() == 2);
  CHECK(m.lanes()[0].compute);
  // Foreign events are coloured by name: both gemms alike, the all-reduce apart.
  const auto& t = m.trace(0);
  CHECK(op_color(t.events[0]) == op_color(t.events[1]));
  CHECK(op_color(t.events[0]) != op_color(t.events[2]));
  QStringList legend;
  for (const auto& e : w.legend()->entries()) legend << e.text;
  CHECK(legend == QStringList{"other (by name)", "idle (bubble)"});
  // The same file as "measured" pairs every op with itself.
  REQUIRE(w.open({path, path}));
  CHECK(w.model().pairing().pairs == 4);
}

TEST_CASE("a watched trace file reloads by itself when it changes", "[gui][window]") {
  QTemporaryDir dir;
  const QString path = dir.filePath("live.json");
  OneFOneB c;
  c.m = 2;
  traces::write_trace(make_1f1b(c), path.toStdString());
  ViewerWindow w;
  REQUIRE(w.open({path}));
  const auto before = w.model().trace(0).events.size();
  c.m = 5;
  traces::write_trace(make_1f1b(c), path.toStdString());
  // The watcher fires, then a short quiet period, then the reload.
  QElapsedTimer timer;
  timer.start();
  while (w.model().trace(0).events.size() == before && timer.elapsed() < 10'000)
    QApplication::processEvents(QEventLoop::AllEvents, 50);
  CHECK(w.model().trace(0).events.size() > before);
}
