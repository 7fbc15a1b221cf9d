// review_fixes_test.cpp — N traces after review: names that abbreviate alike stay apart
// (lane labels, chart categories: N traces, N bars in order), the user's names are for
// the files they were given with (open / add forget them, reload keeps them), a reload
// clears the selection everywhere it is shown, a Kineto folder given as "dir/" keeps its
// name, one definition of the two traces' difference (table and tooltip), and a
// --labels value that is a file is said to be one.
#include <QApplication>
#include <QDir>
#include <QLabel>
#include <QProcess>
#include <QStatusBar>
#include <QTemporaryDir>
#include <QtCharts/QBarCategoryAxis>
#include <QtCharts/QBarSet>
#include <QtCharts/QChart>
#include <QtCharts/QChartView>
#include <QtCharts/QHorizontalStackedBarSeries>
#include <QtCharts/QStackedBarSeries>
#include <catch2/catch.hpp>
#include <set>

#include "synthetic.hpp"
#include "tdpipe/traces/trace_io.hpp"
#include "tdpipe/viz/charts_panel.hpp"
#include "tdpipe/viz/comparison.hpp"
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

// `count` runs of one schedule (1F1B, 3 ranks), each a little slower than the one before,
// so that the iteration chart's rows tell which trace each is.
std::vector<traces::Trace> same_schedule(int count) {
  std::vector<traces::Trace> out;
  for (int i = 0; i < count; ++i) {
    OneFOneB c;
    c.p = 3;
    c.m = 4;
    c.f_ns = 1'000'000 + 100'000 * i;
    auto t = make_1f1b(c);
    t.schedule = "1f1b";
    t.origin = "simgrid";
    out.push_back(std::move(t));
  }
  return out;
}

template <class T>
bool all_distinct(const std::vector<T>& v) {
  return std::set<T>(v.begin(), v.end()).size() == v.size();
}

int chars(const std::string& s) { return static_cast<int>(QString::fromStdString(s).size()); }

// The window's lanes, charts and names for `n` traces all keep the traces apart, in order.
void check_apart(const ViewerWindow& w, int n) {
  const TraceNames& names = w.model().names();
  REQUIRE(names.size() == n);
  INFO("short names: " << QStringList([&] {
         QStringList l;
         for (const auto& s : names.short_name) l << QString::fromStdString(s);
         return l;
       }()).join(" | ").toStdString());
  CHECK(all_distinct(names.name));
  CHECK(all_distinct(names.short_name));
  CHECK(all_distinct(names.tag));
  for (const auto& s : names.short_name) CHECK(chars(s) <= 18);
  // Rank 0's compute lanes: one per trace, each its own label.
  std::vector<std::string> labels;
  for (const Lane& l : w.model().lanes())
    if (l.rank == 0 && l.stream == 0) labels.push_back(l.label);
  CHECK(static_cast<int>(labels.size()) == n);
  CHECK(all_distinct(labels));
  // Iteration chart: a row per trace, the first on top (categories run bottom-up).
  if (n > 2) {
    const auto axes = w.charts()->iteration_view()->chart()->axes(Qt::Vertical);
    REQUIRE(axes.size() == 1);
    const QStringList cats = qobject_cast<QBarCategoryAxis*>(axes[0])->categories();
    CHECK(cats.size() == n);
    auto* series = qobject_cast<QHorizontalStackedBarSeries*>(w.charts()->iteration_view()->chart()->series()[0]);
    REQUIRE(series);
    for (int t = 0; t < n; ++t) {
      const traces::Metrics& m = *w.metrics(t);
      const int row = n - 1 - t;
      CHECK(cats.value(row).contains(QString::fromStdString(names.short_name[static_cast<std::size_t>(t)])));
      CHECK(series->barSets()[0]->at(row) + series->barSets()[1]->at(row) == Approx(m.iteration_ns / 1e6));
    }
  }
  // Breakdown chart: a category per rank and trace.
  const auto x = w.charts()->breakdown_view()->chart()->axes(Qt::Horizontal);
  REQUIRE(x.size() == 1);
  if (auto* cat = qobject_cast<QBarCategoryAxis*>(x[0])) CHECK(cat->categories().size() == 3 * n);
}

}  // namespace

TEST_CASE("the same schedule three times: names abbreviated apart, three bars in order", "[names][multi][gui]") {
  auto t = make_1f1b({});
  t.schedule = "1f1b";
  t.origin = "simgrid";
  const auto n = default_trace_names({&t, &t, &t}, {"runs/run-a.json", "runs/run-b.json", "runs/run-c.json"});
  CHECK(n.name == std::vector<std::string>{"1f1b (simgrid) run-a", "1f1b (simgrid) run-b", "1f1b (simgrid) run-c"});
  REQUIRE(n.short_name.size() == 3);
  CHECK(all_distinct(n.short_name));
  const char* tails[] = {"run-a", "run-b", "run-c"};
  for (int i = 0; i < 3; ++i) {
    const std::string& s = n.short_name[static_cast<std::size_t>(i)];
    CHECK(chars(s) <= 18);
    CHECK(s.rfind(tails[i]) == s.size() - 5);  // the distinguishing tail kept
    CHECK(s.rfind("1f1b", 0) == 0);            // and the head
  }

  ViewerWindow w;
  w.set_traces(same_schedule(3), {"run-a.json", "run-b.json", "run-c.json"});
  w.resize(1600, 900);
  check_apart(w, 3);

  // Eight runs of it, their file names alike for their first 18 characters.
  QStringList files;
  for (int i = 0; i < 8; ++i) files << QStringLiteral("pipeline-experiment-run-%1.json").arg(i + 1);
  w.set_traces(same_schedule(8), files);
  check_apart(w, 8);
  for (int i = 0; i < 8; ++i)
    CHECK(w.model().names().short_name[static_cast<std::size_t>(i)].find("run-" + std::to_string(i + 1)) !=
          std::string::npos);
}

TEST_CASE("long user names alike for their first 18 characters stay apart", "[names][multi][gui]") {
  const auto n = user_trace_names({"experiment-long-name-A", "experiment-long-name-B", "experiment-long-name-C"});
  CHECK(n.name[0] == "experiment-long-name-A");
  CHECK(all_distinct(n.short_name));
  for (int i = 0; i < 3; ++i) {
    const std::string& s = n.short_name[static_cast<std::size_t>(i)];
    CHECK(chars(s) <= 18);
    CHECK(s.back() == "ABC"[i]);
  }
  // A short name and a long one are left as they were.
  const auto mixed = user_trace_names({"gpipe", "a-very-long-schedule-name", "zb-v"});
  CHECK(mixed.short_name == std::vector<std::string>{"gpipe", "a-very-long-sched…", "zb-v"});
  // Apart in the middle only, and a long common tail: still apart.
  const auto middle = user_trace_names({"experiment-long-name-A-with-the-same-long-tail",
                                        "experiment-long-name-B-with-the-same-long-tail",
                                        "experiment-long-name-C-with-the-same-long-tail"});
  CHECK(all_distinct(middle.short_name));
  for (const auto& s : middle.short_name) CHECK(chars(s) <= 18);
  // Apart only where one name goes on.
  CHECK(all_distinct(user_trace_names({"experiment-long-name", "experiment-long-name-2", "experiment-long-name-22"})
                         .short_name));

  ViewerWindow w;
  QStringList eight;
  for (int i = 0; i < 8; ++i) eight << QStringLiteral("experiment-long-name-%1").arg(QChar('A' + i));
  w.set_labels(eight.mid(0, 3));
  w.set_traces(same_schedule(3));
  w.resize(1600, 900);
  CHECK(w.model().name(2) == "experiment-long-name-C");
  check_apart(w, 3);
  w.set_labels(eight);
  w.set_traces(same_schedule(8));
  check_apart(w, 8);
}

TEST_CASE("the user's names: open and add forget them, reload keeps them", "[gui][window][multi]") {
  QTemporaryDir dir;
  REQUIRE(dir.isValid());
  QStringList first, second;
  const auto traces = same_schedule(3);
  for (int i = 0; i < 3; ++i) {
    first << dir.filePath(QStringLiteral("a%1.json").arg(i));
    second << dir.filePath(QStringLiteral("b%1.json").arg(i));
    traces::write_trace(traces[static_cast<std::size_t>(i)], first.back().toStdString());
    traces::write_trace(traces[static_cast<std::size_t>(i)], second.back().toStdString());
  }
  ViewerWindow w;
  REQUIRE(w.open(first, {"x", "y", "z"}));  // as the command line opens them
  CHECK(w.model().names().name == std::vector<std::string>{"x", "y", "z"});
  REQUIRE(w.reload());
  CHECK(w.model().names().name == std::vector<std::string>{"x", "y", "z"});
  CHECK(w.labels() == QStringList{"x", "y", "z"});
  // A failed open keeps the view and its names.
  CHECK_FALSE(w.open({dir.filePath("missing.json"), first[1], first[2]}));
  if (w.error_dialog()) w.error_dialog()->close();
  REQUIRE(w.reload());
  CHECK(w.model().name(0) == "x");
  // File > Open traces…: other files, as many: their own default names.
  REQUIRE(w.open(second));
  CHECK(w.labels().isEmpty());
  CHECK(w.model().name(0) == "1f1b (simgrid) b0");
  CHECK(w.model().name(2) == "1f1b (simgrid) b2");
  // Names given for four while three are open, then a fourth added: not theirs either.
  w.set_labels({"p", "q", "r", "s"});
  REQUIRE(w.reload());
  CHECK(w.model().name(0) == "1f1b (simgrid) b0");
  REQUIRE(w.add(first[0]));
  REQUIRE(w.model().count() == 4);
  CHECK(w.labels().isEmpty());
  CHECK(w.model().name(3) == "1f1b (simgrid) a0");
}

TEST_CASE("a reload clears the selection and says so: status bar and selection", "[gui][window]") {
  QTemporaryDir dir;
  REQUIRE(dir.isValid());
  const QString pred = dir.filePath("pred.json"), meas = dir.filePath("meas.json");
  OneFOneB c;
  traces::write_trace(make_1f1b(c), pred.toStdString());
  c.seed = 3;
  traces::write_trace(make_1f1b(c), meas.toStdString());
  ViewerWindow w;
  w.resize(1600, 900);
  REQUIRE(w.open({pred, meas}));
  int signalled = 0, last_index = 0;
  QObject::connect(w.timeline(), &TimelineView::op_selected, [&](int, int index) {
    ++signalled;
    last_index = index;
  });
  auto select_one = [&] {
    const int i = find_event(w.model().trace(0), 1, ir::OpKind::F, 2);
    w.timeline()->select(OpId{0, i});
    REQUIRE(w.statusBar()->currentMessage().contains("rank 1"));
    REQUIRE(w.charts()->highlighted());
  };
  select_one();
  // Open (the same files again): nothing selected, nothing said of the old selection.
  signalled = 0;
  REQUIRE(w.open({pred, meas}));
  CHECK_FALSE(w.timeline()->selected());
  CHECK(signalled == 1);
  CHECK(last_index == -1);
  CHECK(w.statusBar()->currentMessage().isEmpty());
  CHECK_FALSE(w.charts()->highlighted());
  // Reload: the same, and "reloaded" said.
  select_one();
  signalled = 0;
  REQUIRE(w.reload());
  CHECK_FALSE(w.timeline()->selected());
  CHECK(signalled == 1);
  CHECK(last_index == -1);
  CHECK_FALSE(w.statusBar()->currentMessage().contains("rank 1"));
  // Without a selection a new model says nothing (the status bar keeps its message).
  signalled = 0;
  w.statusBar()->showMessage("kept");
  REQUIRE(w.reload());
  CHECK(signalled == 0);

  // The view alone: set_model clears the selection with op_selected(…, −1).
  TimelineModel m;
  m.set_traces({make_1f1b({})});
  TimelineView v;
  v.resize(800, 400);
  v.set_model(&m);
  int got = 0, index = 0;
  QObject::connect(&v, &TimelineView::op_selected, [&](int, int i) {
    ++got;
    index = i;
  });
  v.select(OpId{0, 0});
  REQUIRE(got == 1);
  v.set_model(&m);
  CHECK(got == 2);
  CHECK(index == -1);
  CHECK_FALSE(v.selected());
}

TEST_CASE("a Kineto folder given with a trailing '/' keeps its name", "[names][gui][window][multi]") {
  CHECK(trace_file_name("runs/meas/") == "meas");
  CHECK(trace_file_name("runs/meas//") == "meas");
  CHECK(trace_file_name("runs/meas") == "meas");
  CHECK(trace_file_name("runs/a.json.gz") == "a.json.gz");
  CHECK(trace_file_name("a.json") == "a.json");
  CHECK(trace_file_name("/") == "/");
  auto t = make_1f1b({});
  const auto n = default_trace_names({&t, &t, &t}, {trace_file_name("runs/k1/"), trace_file_name("runs/k2/"),
                                                    trace_file_name("runs/k3/")});
  CHECK(n.name == std::vector<std::string>{"1f1b (analytic) k1", "1f1b (analytic) k2", "1f1b (analytic) k3"});

  // The window: three folders of per-rank Kineto files, given as "…/kN/".
  QTemporaryDir dir;
  REQUIRE(dir.isValid());
  QStringList folders;
  for (int i = 1; i <= 3; ++i) {
    traces::write_trace(make_1f1b({}), dir.filePath(QStringLiteral("k%1").arg(i)).toStdString(),
                        traces::TraceFormat::Kineto);
    folders << dir.filePath(QStringLiteral("k%1").arg(i)) + "/";
  }
  ViewerWindow w;
  REQUIRE(w.open(folders));
  REQUIRE(w.model().count() == 3);
  for (int i = 0; i < 3; ++i) {
    const std::string name = w.model().name(i);
    INFO(name);
    CHECK(name.size() > 3);
    CHECK(name.compare(name.size() - 3, 3, " k" + std::to_string(i + 1)) == 0);
  }
  CHECK(w.windowTitle() == "tdpipe-view — k1 vs k2 vs k3");
  CHECK(w.header()->text().contains("k2 ("));
}

TEST_CASE("two named traces: the tooltip's difference is the table's, (first − second) / second", "[gui][window]") {
  CHECK(*relative_difference_pct(1.0, 1.25) == Approx(-20.0));
  CHECK(*relative_difference_pct(1.5, 1.0) == Approx(50.0));
  CHECK_FALSE(relative_difference_pct(1.0, 0.0));

  OneFOneB slow;
  slow.f_ns = 1'250'000;  // every forward 25 % longer in the second trace
  ViewerWindow w;
  w.set_labels({"balanced", "unbalanced"});
  w.set_traces({make_1f1b({}), make_1f1b(slow)});
  w.resize(1600, 900);
  w.show();
  QApplication::processEvents();
  REQUIRE(w.table()->horizontalHeaderItem(3)->text() == "change");
  // The table: iteration time, (first − second) / second.
  const double a = static_cast<double>(w.metrics(0)->iteration_ns), b = static_cast<double>(w.metrics(1)->iteration_ns);
  const double change = *relative_difference_pct(a, b);
  CHECK(change < 0);
  const auto rows = comparison_rows(w.model(), {*w.metrics(0), *w.metrics(1)});
  REQUIRE(rows[0].metric == "iteration time");
  CHECK(*rows[0].error == Approx(change));
  QString cell;
  for (int r = 0; r < w.table()->rowCount(); ++r)
    if (w.table()->item(r, 0)->text() == "iteration time") cell = w.table()->item(r, 3)->text();
  CHECK(cell == QString::number(change, 'f', 2) + "%");
  // The tooltip of a forward op, from either trace: (1 ms − 1.25 ms) / 1.25 ms = −20 %.
  TimelineView& v = *w.timeline();
  for (int trace : {0, 1}) {
    const int i = find_event(w.model().trace(trace), 1, ir::OpKind::F, 2);
    const OpId id{trace, i};
    const Lane& lane = w.model().lanes()[static_cast<std::size_t>(w.model().lane_of(id))];
    const auto& e = w.model().event(id);
    const QPoint at = v.viewport()->mapFrom(&v, v.widget_point(e.start_ns + e.dur_ns / 2, lane.y + lane.height / 2.0));
    const QString tip = v.tooltip_at(at);
    INFO(tip.toStdString());
    CHECK(tip.contains("<td>change</td>"));
    CHECK(tip.contains("(-20.0%)"));
    CHECK(tip.contains(format_duration(-250'000)));
    CHECK_FALSE(tip.contains("25.0%"));
  }
}

TEST_CASE("a --labels value that is a file: a warning, or an error that says so", "[cli][multi]") {
  QTemporaryDir dir;
  REQUIRE(dir.isValid());
  const QString gpipe = dir.filePath("gpipe.json"), ofob = dir.filePath("1f1b.json"), zbv = dir.filePath("zbv.json");
  for (const QString& f : {gpipe, ofob, zbv}) traces::write_trace(make_1f1b({}), f.toStdString());
  // `--labels gpipe.json 1f1b.json`: one name, one trace — taken, with a warning.
  const auto parsed = parse_view_args({"--labels", gpipe, ofob});
  REQUIRE(std::holds_alternative<ViewArgs>(parsed));
  const ViewArgs& args = std::get<ViewArgs>(parsed);
  CHECK(args.traces == QStringList{ofob});
  REQUIRE(args.warnings.size() == 1);
  CHECK(args.warnings[0].find("the --labels value '" + gpipe.toStdString() + "' looks like a trace file") == 0);
  CHECK(args.warnings[0].find("taken as the traces' names") != std::string::npos);
  // Three files after --labels: two traces for one name, and the error says why.
  const auto bad = parse_view_args({"--labels", gpipe, ofob, zbv});
  REQUIRE(std::holds_alternative<std::string>(bad));
  const std::string err = std::get<std::string>(bad);
  CHECK(err.find("--labels needs two different names") == 0);
  CHECK(err.find("looks like a trace file") != std::string::npos);
  // Names that are not files: no warning.
  CHECK(std::get<ViewArgs>(parse_view_args({"--labels", "g,o", gpipe, ofob})).warnings.empty());

#ifdef TDPIPE_VIEW_EXE
  QProcess proc;
  const QString out = dir.filePath("one.png");
  proc.start(QStringLiteral(TDPIPE_VIEW_EXE), QStringList{"--render", out, "--labels", gpipe, ofob});
  REQUIRE(proc.waitForFinished(60'000));
  CHECK(proc.exitCode() == 0);
  const QString stderr_text = QString::fromLocal8Bit(proc.readAllStandardError());
  CHECK(stderr_text.contains("tdpipe-view: warning: the --labels value '" + gpipe + "' looks like a trace file"));
  proc.start(QStringLiteral(TDPIPE_VIEW_EXE), QStringList{"--render", out, "--labels", gpipe, ofob, zbv});
  REQUIRE(proc.waitForFinished(60'000));
  CHECK(proc.exitCode() == 2);
  CHECK(QString::fromLocal8Bit(proc.readAllStandardError()).contains("looks like a trace file"));
#endif
}
