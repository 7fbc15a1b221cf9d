// viewer_window.hpp — the tdpipe-view main window: header (each trace's name and file),
// legend and Gantt timeline above the metrics table on the left, Qt Charts panels on the
// right; open one or several traces (up to kMaxTraces), add one, reload on file change,
// export PNG/SVG.
#pragma once

#include <QImage>
#include <QMainWindow>
#include <QMessageBox>
#include <QPointer>
#include <QString>
#include <QStringList>
#include <optional>
#include <vector>

#include "tdpipe/traces/metrics.hpp"
#include "tdpipe/viz/timeline_model.hpp"

class QFileSystemWatcher;
class QLabel;
class QTimer;

class QAction;

namespace tdpipe::viz {

class ChartsPanel;
class LegendBar;
class MetricsTable;
class TimelineView;

class ViewerWindow : public QMainWindow {
  Q_OBJECT

 public:
  explicit ViewerWindow(QWidget* parent = nullptr);
  ~ViewerWindow() override;

  /// Reads and shows the traces at these paths (1..kMaxTraces, in this order; none
  /// clears the view). Throws tdpipe::Error naming the file and problem, or the limit;
  /// on error the view is unchanged.
  void load(const QStringList& paths);
  /// Shows traces already in memory (at most kMaxTraces); `files` (one per trace, or
  /// none) are shown in the header and tell alike traces' default names apart.
  void set_traces(std::vector<traces::Trace> traces, const QStringList& files = {});
  /// The user's names for the traces (`--labels`): used while there are as many traces
  /// as names (and they are distinct and non-empty), else the default names. Empty: defaults.
  /// Kept by load(), reload() and set_traces(); open() and add() replace them.
  void set_labels(const QStringList& labels);
  const QStringList& labels() const { return labels_; }

  /// load() for the GUI (File > Open traces…): on failure shows an error dialog
  /// (non-modal) and returns false, keeping the view and its names. The user's names
  /// of the traces open before are forgotten: these traces get `labels` (see set_labels;
  /// none: the default names).
  bool open(const QStringList& paths, const QStringList& labels = {});
  /// Opens one more trace beside the open ones (File > Add trace…), up to kMaxTraces,
  /// all under their default names (the user's names were for the traces without it).
  bool add(const QString& path);
  /// Reads the current files again, keeping the user's names; on failure keeps the view
  /// and reports in the status bar.
  bool reload();

  /// Only each rank's compute lane (View > Compute lanes only): many ranks on one screen.
  void set_compute_lanes_only(bool on);

  /// The whole window as an image at its current size.
  QImage render_image();
  bool export_png(const QString& path);
  /// False when built without Qt SVG or the file cannot be written.
  bool export_svg(const QString& path);

  TimelineView* timeline() const { return timeline_; }
  ChartsPanel* charts() const { return charts_; }
  MetricsTable* table() const { return table_; }
  LegendBar* legend() const { return legend_; }
  const TimelineModel& model() const { return model_; }
  /// Trace t's metrics; null when there is no trace t.
  const traces::Metrics* metrics(int t) const {
    return t >= 0 && t < static_cast<int>(metrics_.size()) ? &metrics_[static_cast<std::size_t>(t)] : nullptr;
  }
  /// The header line(s): each trace's name and file.
  QLabel* header() const { return header_; }
  /// The files shown (empty for traces set in memory).
  const QStringList& paths() const { return paths_; }
  /// The message of the last failed open/reload (empty if none).
  const QString& last_error() const { return last_error_; }
  /// The error dialog currently shown by open(), if any.
  QMessageBox* error_dialog() const { return error_box_; }
  /// The files being watched for changes.
  QStringList watched_files() const;

 private:
  void build_menus();
  void refresh();
  void watch(const QStringList& files);
  void show_error(const QString& title, const QString& message);
  void open_dialog(bool add);
  void export_dialog(bool svg);

  TimelineModel model_;
  QAction* compute_lanes_action_ = nullptr;
  std::vector<traces::Metrics> metrics_;  ///< one per trace
  QStringList paths_;                     ///< one per trace, when read from files
  QStringList files_;                     ///< one per trace: its file name, or empty
  QStringList labels_;                    ///< the user's names, if any
  QString last_error_;
  QLabel* header_ = nullptr;
  LegendBar* legend_ = nullptr;
  TimelineView* timeline_ = nullptr;
  ChartsPanel* charts_ = nullptr;
  MetricsTable* table_ = nullptr;
  QFileSystemWatcher* watcher_ = nullptr;
  QTimer* reload_timer_ = nullptr;
  QPointer<QMessageBox> error_box_;
};

}  // namespace tdpipe::viz
