// viewer_window.cpp — window layout, loading, file watching and export.
#include "tdpipe/viz/viewer_window.hpp"

#include <QAction>
#include <QApplication>
#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QFileSystemWatcher>
#include <QLabel>
#include <QMenuBar>
#include <QMessageBox>
#include <QSaveFile>
#include <QPainter>
#include <QSplitter>
#include <QStatusBar>
#include <QTimer>
#include <QToolBar>
#include <QVBoxLayout>
#include <algorithm>
#include <exception>
#include <functional>

#ifdef TDPIPE_VIZ_HAVE_SVG
#include <QSvgGenerator>
#endif

#include "tdpipe/ir/error.hpp"
#include "tdpipe/traces/chrome_json.hpp"
#include "tdpipe/traces/trace_io.hpp"
#include "tdpipe/viz/charts_panel.hpp"
#include "tdpipe/viz/comparison.hpp"
#include "tdpipe/viz/kv_cache_series.hpp"
#include "tdpipe/viz/legend_bar.hpp"
#include "tdpipe/viz/metrics_table.hpp"
#include "tdpipe/viz/op_style.hpp"
#include "tdpipe/viz/timeline_view.hpp"
#include "tdpipe/viz/trace_names.hpp"

namespace tdpipe::viz {
namespace {

// Reads one trace, turning every failure into a tdpipe::Error that names the file.
traces::Trace read_named(const QString& path) {
  const std::string p = path.toStdString();
  if (!QFileInfo(path).exists()) throw Error(p + ": no such file");
  if (!QFileInfo(path).isFile() && !QFileInfo(path).isDir())
    throw Error(p + ": not a regular file or a folder of per-rank Kineto traces");
  try {
    return traces::read_trace(p);
  } catch (const Error& e) {
    const std::string what = e.what();
    // Most reader messages already name the source; make sure they all do.
    if (what.find(p) != std::string::npos) throw;
    throw Error(p + ": " + what);
  } catch (const std::exception& e) {
    throw Error(p + ": cannot read trace: " + e.what());
  }
}

QString describe(const traces::Trace& t, const QString& name) {
  QStringList bits;
  if (!t.origin.empty()) bits << QString::fromStdString(t.origin);
  if (!t.schedule.empty()) bits << QString::fromStdString(t.schedule);
  if (!t.scenario.empty()) bits << QString::fromStdString(t.scenario);
  bits << QStringLiteral("%1 ops").arg(t.events.size());
  return QStringLiteral("%1 (%2)").arg(name.isEmpty() ? QStringLiteral("in memory") : name,
                                       bits.join(QStringLiteral(", ")));
}

}  // namespace

ViewerWindow::ViewerWindow(QWidget* parent) : QMainWindow(parent) {
  setWindowTitle(QStringLiteral("tdpipe-view"));
  auto* left = new QWidget;
  auto* left_layout = new QVBoxLayout(left);
  left_layout->setContentsMargins(0, 0, 0, 0);
  left_layout->setSpacing(0);
  header_ = new QLabel;
  header_->setTextFormat(Qt::RichText);
  header_->setWordWrap(true);  // many traces' names and files need not widen the window
  header_->setContentsMargins(8, 4, 8, 2);
  QFont hf = header_->font();
  hf.setPixelSize(12);
  header_->setFont(hf);
  legend_ = new LegendBar;
  timeline_ = new TimelineView;
  left_layout->addWidget(header_);
  left_layout->addWidget(legend_);
  left_layout->addWidget(timeline_, 1);

  // Left: the timeline above the metrics table (lanes rarely fill the height, the
  // table uses what they leave). Right: the three charts, one above the other.
  table_ = new MetricsTable;
  auto* left_split = new QSplitter(Qt::Vertical);
  left_split->addWidget(left);
  left_split->addWidget(table_);
  left_split->setStretchFactor(0, 3);
  left_split->setStretchFactor(1, 1);
  left_split->setSizes({600, 200});
  charts_ = new ChartsPanel;

  auto* split = new QSplitter(Qt::Horizontal);
  split->addWidget(left_split);
  split->addWidget(charts_);
  split->setStretchFactor(0, 5);
  split->setStretchFactor(1, 3);
  split->setSizes({1000, 600});
  setCentralWidget(split);

  watcher_ = new QFileSystemWatcher(this);
  reload_timer_ = new QTimer(this);
  reload_timer_->setSingleShot(true);
  reload_timer_->setInterval(300);  // writers replace files in steps; wait for quiet
  connect(watcher_, &QFileSystemWatcher::fileChanged, reload_timer_, qOverload<>(&QTimer::start));
  connect(reload_timer_, &QTimer::timeout, this, [this] { reload(); });
  connect(timeline_, &TimelineView::op_selected, this, [this](int trace, int index) {
    charts_->highlight_op(model_, trace, index);
    if (index < 0) {
      statusBar()->clearMessage();
      return;
    }
    const OpId id{trace, index};
    const auto& e = model_.event(id);
    QString msg = QStringLiteral("%1 %2 on rank %3: start %4, duration %5")
                      .arg(QString::fromStdString(model_.name(trace)), op_label(e))
                      .arg(e.rank)
                      .arg(format_duration(e.start_ns), format_duration(e.dur_ns));
    for (const OpId& twin : model_.twins(id)) {  // the same op in the other traces
      const auto& t = model_.event(twin);
      msg += QStringLiteral(" — %1: start %2, duration %3")
                 .arg(QString::fromStdString(model_.name(twin.trace)), format_duration(t.start_ns),
                      format_duration(t.dur_ns));
    }
    statusBar()->showMessage(msg);
  });
  build_menus();
  statusBar()->showMessage(QStringLiteral("wheel: zoom · drag: pan · double-click / F: fit · click: select"));
  resize(1600, 900);
  refresh();
}

ViewerWindow::~ViewerWindow() = default;

void ViewerWindow::build_menus() {
  QMenu* file = menuBar()->addMenu(QStringLiteral("&File"));
  QToolBar* tools = addToolBar(QStringLiteral("main"));
  tools->setMovable(false);
  auto add = [&](QMenu* menu, const QString& text, QKeySequence key, auto fn, bool toolbar) {
    QAction* a = menu->addAction(text);
    a->setShortcut(key);
    connect(a, &QAction::triggered, this, fn);
    if (toolbar) tools->addAction(a);
    return a;
  };
  // Open: one trace, predicted and measured, or up to eight side by side (in the order
  // picked); Add: one more beside those open.
  add(file, QStringLiteral("&Open traces…"), QKeySequence::Open, [this] { open_dialog(false); }, true);
  add(file, QStringLiteral("&Add trace…"), QKeySequence(Qt::CTRL | Qt::Key_M), [this] { open_dialog(true); }, true);
  add(file, QStringLiteral("&Reload"), QKeySequence::Refresh, [this] { reload(); }, true);
  file->addSeparator();
  add(file, QStringLiteral("Export P&NG…"), QKeySequence(Qt::CTRL | Qt::Key_E), [this] { export_dialog(false); }, true);
  QAction* svg = add(file, QStringLiteral("Export &SVG…"), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_E),
                     [this] { export_dialog(true); }, true);
#ifndef TDPIPE_VIZ_HAVE_SVG
  svg->setEnabled(false);
#else
  (void)svg;
#endif
  file->addSeparator();
  add(file, QStringLiteral("&Quit"), QKeySequence::Quit, [this] { close(); }, false);
  QMenu* view = menuBar()->addMenu(QStringLiteral("&View"));
  tools->addSeparator();
  add(view, QStringLiteral("&Fit to window"), QKeySequence(Qt::Key_F), [this] { timeline_->fit(); }, true);
  add(view, QStringLiteral("Zoom &in"), QKeySequence::ZoomIn,
      [this] { timeline_->zoom(1.5, timeline_->viewport()->width() / 2.0); }, true);
  add(view, QStringLiteral("Zoom &out"), QKeySequence::ZoomOut,
      [this] { timeline_->zoom(1 / 1.5, timeline_->viewport()->width() / 2.0); }, true);
  view->addSeparator();
  compute_lanes_action_ = view->addAction(QStringLiteral("&Compute lanes only"));
  compute_lanes_action_->setCheckable(true);
  compute_lanes_action_->setShortcut(QKeySequence(Qt::Key_C));
  connect(compute_lanes_action_, &QAction::toggled, this, [this](bool on) { set_compute_lanes_only(on); });
}

void ViewerWindow::load(const QStringList& paths) {
  if (paths.size() > kMaxTraces)
    throw Error("at most " + std::to_string(kMaxTraces) + " traces side by side, got " + std::to_string(paths.size()));
  std::vector<traces::Trace> traces;
  QStringList files;
  for (const QString& path : paths) {
    traces.push_back(read_named(path));
    // (not QFileInfo::fileName(): a Kineto folder given as "runs/meas/" would have none)
    files << QString::fromStdString(trace_file_name(QDir::fromNativeSeparators(path).toStdString()));
  }
  set_traces(std::move(traces), files);
  paths_ = paths;
  watch(paths);
}

void ViewerWindow::set_traces(std::vector<traces::Trace> traces, const QStringList& files) {
  if (static_cast<int>(traces.size()) > kMaxTraces)
    throw Error("at most " + std::to_string(kMaxTraces) + " traces side by side, got " + std::to_string(traces.size()));
  // Metrics and names first: if they throw on a strange trace, nothing has changed yet.
  std::vector<traces::Metrics> metrics;
  for (const auto& t : traces) metrics.push_back(traces::compute_metrics(t));
  std::vector<const traces::Trace*> ptrs;
  for (const auto& t : traces) ptrs.push_back(&t);
  std::vector<std::string> label_list, file_list;
  for (const auto& l : labels_) label_list.push_back(l.toStdString());
  for (int i = 0; i < static_cast<int>(traces.size()); ++i)
    file_list.push_back(i < files.size() ? files[i].toStdString() : std::string());
  TraceNames names = check_trace_labels(label_list, static_cast<int>(traces.size())).empty()
                         ? user_trace_names(label_list)
                         : default_trace_names(ptrs, file_list);
  model_.set_traces(std::move(traces), std::move(names));
  metrics_ = std::move(metrics);
  files_.clear();
  for (int i = 0; i < model_.count(); ++i) files_ << (i < files.size() ? files[i] : QString());
  paths_.clear();
  last_error_.clear();
  refresh();
}

void ViewerWindow::set_labels(const QStringList& labels) { labels_ = labels; }

void ViewerWindow::set_compute_lanes_only(bool on) {
  if (model_.compute_lanes_only() == on) return;  // (the action's toggled signal comes back here)
  if (compute_lanes_action_) compute_lanes_action_->setChecked(on);
  timeline_->select(std::nullopt);  // the selection may be in a lane that goes: cleared, and said
  model_.set_compute_lanes_only(on);
  timeline_->set_model(&model_);
}

void ViewerWindow::refresh() {
  // The header: each trace's name, in its label colour, and its file — on one line for
  // one or two traces, a line each for more.
  const int n = model_.count();
  QStringList parts;
  QStringList title;
  for (int t = 0; t < n; ++t) {
    const QString name = QString::fromStdString(model_.name(t));
    const QColor c = trace_text_color(t, n);
    const bool colour = n > 2 || t == 0;  // (two traces: the measured name in the text colour, as ever)
    // (three or more: each line starts with the trace's tag, as the per-rank bars are labelled)
    const QString tag = n > 2 ? QStringLiteral("<span style='color:%1'>[%2]</span> ")
                                    .arg(c.name(), QString::fromStdString(model_.names().tag[static_cast<std::size_t>(t)]).toHtmlEscaped())
                              : QString();
    parts << tag +
                 (colour ? QStringLiteral("<span style='color:%1'><b>%2</b></span>: ").arg(c.name(), name.toHtmlEscaped())
                         : QStringLiteral("<b>%1</b>: ").arg(name.toHtmlEscaped())) +
                 describe(model_.trace(t), files_[t]).toHtmlEscaped();
    title << (files_[t].isEmpty() ? name : files_[t]);
  }
  header_->setText(parts.isEmpty() ? QStringLiteral("No trace open — File ▸ Open traces…")
                                   : parts.join(n > 2 ? QStringLiteral("<br>") : QStringLiteral(" &nbsp;·&nbsp; ")));
  setWindowTitle(title.isEmpty() ? QStringLiteral("tdpipe-view")
                                 : QStringLiteral("tdpipe-view — ") + title.join(QStringLiteral(" vs ")));
  std::vector<const traces::Trace*> open;
  std::vector<LegendEntry> lanes;
  for (int t = 0; t < n; ++t) {
    open.push_back(&model_.trace(t));
    lanes.push_back({QString::fromStdString(model_.names().short_name[static_cast<std::size_t>(t)]),
                     trace_text_color(t, n)});
  }
  const bool all_serving = n > 0 && std::all_of(open.begin(), open.end(), [](const traces::Trace* t) {
    return has_serving_ops(*t);
  });
  legend_->set_end_label(all_serving ? QStringLiteral("end of run") : QStringLiteral("iteration end"));
  legend_->set_entries(legend_entries(open), n >= 2 ? lanes : std::vector<LegendEntry>{});
  timeline_->set_model(&model_);
  charts_->set_data(model_, metrics_);
  table_->set_rows(comparison_rows(model_, metrics_), model_.names());
}

bool ViewerWindow::open(const QStringList& paths, const QStringList& labels) {
  // The names given were for the files open before (or --labels for these, `labels`);
  // a failed open keeps the view and so its names.
  const QStringList before = labels_;
  labels_ = labels;
  try {
    load(paths);
    return true;
  } catch (const std::exception& e) {
    labels_ = before;
    last_error_ = QString::fromStdString(e.what());
    show_error(QStringLiteral("Cannot open trace"), last_error_);
    return false;
  }
}

bool ViewerWindow::add(const QString& path) {
  if (model_.count() > 0 && paths_.size() != model_.count()) {
    // Traces given in memory have no files to read again beside the new one.
    last_error_ = QStringLiteral("cannot add a trace beside traces that were not opened from files");
    show_error(QStringLiteral("Cannot add trace"), last_error_);
    return false;
  }
  return open(paths_ + QStringList{path});  // (the user's names were for the traces without it)
}

bool ViewerWindow::reload() {
  if (paths_.isEmpty()) return false;
  const QStringList paths = paths_;
  const auto state = timeline_->view_state();  // a reload keeps zoom and scroll
  try {
    load(paths);
    timeline_->restore_view_state(state);
    statusBar()->showMessage(QStringLiteral("reloaded"), 3000);
    return true;
  } catch (const std::exception& e) {
    // A file mid-write is often malformed for a moment: report, keep the view, and
    // keep watching so the next change reloads.
    last_error_ = QString::fromStdString(e.what());
    statusBar()->showMessage(QStringLiteral("reload failed: ") + last_error_);
    paths_ = paths;
    watch(paths);
    return false;
  }
}

void ViewerWindow::watch(const QStringList& files) {
  if (!watcher_->files().isEmpty()) watcher_->removePaths(watcher_->files());
  for (const auto& f : files)
    if (!f.isEmpty() && QFileInfo::exists(f)) watcher_->addPath(f);
}

QStringList ViewerWindow::watched_files() const { return watcher_->files(); }

void ViewerWindow::show_error(const QString& title, const QString& message) {
  if (error_box_) error_box_->close();
  // Non-modal so a headless caller (or a test) is never blocked by it.
  auto* box = new QMessageBox(QMessageBox::Critical, title, message, QMessageBox::Ok, this);
  box->setAttribute(Qt::WA_DeleteOnClose);
  box->setObjectName(QStringLiteral("tdpipe_view_error"));
  error_box_ = box;
  box->open();
}

void ViewerWindow::open_dialog(bool add_one) {
  const QString filter = QStringLiteral("Traces (*.json *.json.gz *.sqlite);;All files (*)");
  if (add_one) {
    const QString path = QFileDialog::getOpenFileName(this, QStringLiteral("Add a trace"), {}, filter);
    if (!path.isEmpty()) add(path);
    return;
  }
  // Several files: side by side in the order picked (one: predicted; two: predicted, measured).
  const QStringList paths = QFileDialog::getOpenFileNames(
      this, QStringLiteral("Open traces (up to %1, shown in this order)").arg(kMaxTraces), {}, filter);
  if (!paths.isEmpty()) open(paths);
}

void ViewerWindow::export_dialog(bool svg) {
  const QString path = QFileDialog::getSaveFileName(
      this, svg ? QStringLiteral("Export SVG") : QStringLiteral("Export PNG"), {},
      svg ? QStringLiteral("SVG (*.svg)") : QStringLiteral("PNG (*.png)"));
  if (path.isEmpty()) return;
  const bool ok = svg ? export_svg(path) : export_png(path);
  if (!ok) show_error(QStringLiteral("Export failed"), QStringLiteral("Cannot write ") + path);
}

QImage ViewerWindow::render_image() { return grab().toImage(); }

namespace {

// Exports go through QSaveFile (a temporary beside the file, renamed on commit), so a
// failed or interrupted export never leaves half an image where the old one was. A
// path that exists and is not a regular file (/dev/stdout, a FIFO, /dev/full) is
// written in place, unbuffered so every failed write is seen: renaming over a device
// node would replace it (as root, QSaveFile would happily do so).
bool write_output(const QString& path, const std::function<bool(QIODevice&)>& write) {
  const QFileInfo info(path);
  if (info.exists() && !info.isFile()) {
    if (info.isDir()) return false;
    QFile file(path);
    if (!file.open(QIODevice::WriteOnly | QIODevice::Unbuffered)) return false;
    const bool ok = write(file) && file.error() == QFileDevice::NoError;
    file.close();
    return ok && file.error() == QFileDevice::NoError;
  }
  QSaveFile file(path);
  if (!file.open(QIODevice::WriteOnly)) return false;
  if (!write(file) || !file.flush()) {
    file.cancelWriting();
    return false;
  }
  return file.commit();
}

}  // namespace

bool ViewerWindow::export_png(const QString& path) {
  const QImage image = render_image();
  return write_output(path, [&](QIODevice& out) { return image.save(&out, "PNG"); });
}

bool ViewerWindow::export_svg(const QString& path) {
#ifdef TDPIPE_VIZ_HAVE_SVG
  return write_output(path, [&](QIODevice& out) {
    QSvgGenerator gen;
    gen.setOutputDevice(&out);
    gen.setSize(size());
    gen.setViewBox(rect());
    gen.setTitle(windowTitle());
    QPainter painter;
    if (!painter.begin(&gen)) return false;
    render(&painter);
    painter.end();
    return out.pos() > 0;
  });
#else
  (void)path;
  return false;
#endif
}

}  // namespace tdpipe::viz
