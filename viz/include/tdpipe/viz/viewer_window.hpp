// viewer_window.hpp — the tdpipe-view main window: legend and Gantt timeline on the
// left, Qt Charts panels and the metrics table on the right; open, reload on file
// change, export PNG/SVG.
#pragma once

#include <QImage>
#include <QMainWindow>
#include <QMessageBox>
#include <QPointer>
#include <QString>
#include <optional>

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

  /// Reads and shows the traces at these paths (empty: that side absent). Throws
  /// tdpipe::Error naming the file and problem; on error the view is unchanged.
  void load(const QString& predicted, const QString& measured);
  /// Shows traces already in memory; names are shown in the header.
  void set_traces(std::optional<traces::Trace> predicted, std::optional<traces::Trace> measured,
                  const QString& predicted_name = {}, const QString& measured_name = {});

  /// load() for the GUI: on failure shows an error dialog (non-modal) and returns false.
  bool open(const QString& predicted, const QString& measured);
  /// Reads the current files again; on failure keeps the view and reports in the status bar.
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
  const std::optional<traces::Metrics>& metrics(Side side) const {
    return metrics_[static_cast<std::size_t>(side)];
  }
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
  void open_dialog(Side side);
  void export_dialog(bool svg);

  TimelineModel model_;
  QAction* compute_lanes_action_ = nullptr;
  std::optional<traces::Metrics> metrics_[2];
  QString paths_[2];
  QString names_[2];
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
