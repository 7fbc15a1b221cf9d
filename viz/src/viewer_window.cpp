// viewer_window.cpp — window layout, loading, file watching and export.
#include "tdpipe/viz/viewer_window.hpp"
#include "tdpipe/viz/side_names.hpp"

#include <QAction>
#include <QApplication>
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
#include "tdpipe/viz/legend_bar.hpp"
#include "tdpipe/viz/metrics_table.hpp"
#include "tdpipe/viz/op_style.hpp"
#include "tdpipe/viz/timeline_view.hpp"

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
  connect(timeline_, &TimelineView::op_selected, this, [this](int side, int index) {
    charts_->highlight_op(model_, static_cast<Side>(side), index);
    if (index < 0) {
      statusBar()->clearMessage();
      return;
    }
    const OpId id{static_cast<Side>(side), index};
    const auto& e = model_.event(id);
    QString msg = QStringLiteral("%1 %2 on rank %3: start %4, duration %5")
                      .arg(side_name(static_cast<Side>(side)), op_label(e))
                      .arg(e.rank)
                      .arg(format_duration(e.start_ns), format_duration(e.dur_ns));
    if (const auto twin = model_.twin(id)) {
      const auto& t = model_.event(*twin);
      msg += QStringLiteral(" — %1: start %2, duration %3")
                 .arg(side_name(twin->side), format_duration(t.start_ns), format_duration(t.dur_ns));
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
  add(file, QStringLiteral("Open &predicted…"), QKeySequence::Open, [this] { open_dialog(Side::Predicted); }, true);
  add(file, QStringLiteral("Open &measured…"), QKeySequence(Qt::CTRL | Qt::Key_M),
      [this] { open_dialog(Side::Measured); }, true);
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

void ViewerWindow::load(const QString& predicted, const QString& measured) {
  std::optional<traces::Trace> p, m;
  if (!predicted.isEmpty()) p = read_named(predicted);
  if (!measured.isEmpty()) m = read_named(measured);
  set_traces(std::move(p), std::move(m), predicted.isEmpty() ? QString() : QFileInfo(predicted).fileName(),
             measured.isEmpty() ? QString() : QFileInfo(measured).fileName());
  paths_[0] = predicted;
  paths_[1] = measured;
  watch({predicted, measured});
}

void ViewerWindow::set_traces(std::optional<traces::Trace> predicted,
                              std::optional<traces::Trace> measured, const QString& predicted_name,
                              const QString& measured_name) {
  // Metrics first: if they throw on a strange trace, nothing has changed yet.
  std::optional<traces::Metrics> mp, mm;
  if (predicted) mp = traces::compute_metrics(*predicted);
  if (measured) mm = traces::compute_metrics(*measured);
  model_.set_traces(std::move(predicted), std::move(measured));
  metrics_[0] = std::move(mp);
  metrics_[1] = std::move(mm);
  names_[0] = predicted_name;
  names_[1] = measured_name;
  paths_[0].clear();
  paths_[1].clear();
  last_error_.clear();
  refresh();
}

void ViewerWindow::set_compute_lanes_only(bool on) {
  if (model_.compute_lanes_only() == on) return;  // (the action's toggled signal comes back here)
  if (compute_lanes_action_) compute_lanes_action_->setChecked(on);
  timeline_->select(std::nullopt);  // the selection may be in a lane that goes: cleared, and said
  model_.set_compute_lanes_only(on);
  timeline_->set_model(&model_);
}

void ViewerWindow::refresh() {
  QStringList parts;
  QStringList title;
  if (model_.has(Side::Predicted)) {
    parts << QStringLiteral("<span style='color:#1f4e9a'><b>%1</b></span>: ").arg(side_name(Side::Predicted).toHtmlEscaped()) +
                 describe(model_.trace(Side::Predicted), names_[0]).toHtmlEscaped();
    title << (names_[0].isEmpty() ? side_name(Side::Predicted) : names_[0]);
  }
  if (model_.has(Side::Measured)) {
    parts << QStringLiteral("<b>%1</b>: ").arg(side_name(Side::Measured).toHtmlEscaped()) +
                 describe(model_.trace(Side::Measured), names_[1]).toHtmlEscaped();
    title << (names_[1].isEmpty() ? side_name(Side::Measured) : names_[1]);
  }
  header_->setText(parts.isEmpty() ? QStringLiteral("No trace open — File ▸ Open predicted…")
                                   : parts.join(QStringLiteral(" &nbsp;·&nbsp; ")));
  setWindowTitle(title.isEmpty() ? QStringLiteral("tdpipe-view")
                                 : QStringLiteral("tdpipe-view — ") + title.join(QStringLiteral(" vs ")));
  std::vector<const traces::Trace*> open;
  for (Side s : {Side::Predicted, Side::Measured})
    if (model_.has(s)) open.push_back(&model_.trace(s));
  legend_->set_entries(legend_entries(open), open.size() == 2);
  timeline_->set_model(&model_);
  charts_->set_data(model_, metrics_[0], metrics_[1]);
  table_->set_rows(comparison_rows(model_, metrics_[0], metrics_[1]));
}

bool ViewerWindow::open(const QString& predicted, const QString& measured) {
  try {
    load(predicted, measured);
    return true;
  } catch (const std::exception& e) {
    last_error_ = QString::fromStdString(e.what());
    show_error(QStringLiteral("Cannot open trace"), last_error_);
    return false;
  }
}

bool ViewerWindow::reload() {
  if (paths_[0].isEmpty() && paths_[1].isEmpty()) return false;
  const QString p = paths_[0], m = paths_[1];
  const auto state = timeline_->view_state();  // a reload keeps zoom and scroll
  try {
    load(p, m);
    timeline_->restore_view_state(state);
    statusBar()->showMessage(QStringLiteral("reloaded"), 3000);
    return true;
  } catch (const std::exception& e) {
    // A file mid-write is often malformed for a moment: report, keep the view, and
    // keep watching so the next change reloads.
    last_error_ = QString::fromStdString(e.what());
    statusBar()->showMessage(QStringLiteral("reload failed: ") + last_error_);
    paths_[0] = p;
    paths_[1] = m;
    watch({p, m});
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

void ViewerWindow::open_dialog(Side side) {
  const QString path = QFileDialog::getOpenFileName(
      this, side == Side::Predicted ? QStringLiteral("Open predicted trace") : QStringLiteral("Open measured trace"),
      {}, QStringLiteral("Traces (*.json *.json.gz *.sqlite);;All files (*)"));
  if (path.isEmpty()) return;
  // Opening one side keeps the other side's file.
  if (side == Side::Predicted)
    open(path, paths_[1]);
  else
    open(paths_[0], path);
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
