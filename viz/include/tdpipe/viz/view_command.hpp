// view_command.hpp — the tdpipe-view command line: interactive viewer, or headless
// `--render OUT.png [--width W --height H] [--labels A,B,…] TRACE…` — one trace, a
// predicted and a measured one, or up to kMaxTraces side by side.
#pragma once

#include <QString>
#include <QStringList>
#include <optional>
#include <utility>
#include <string>
#include <variant>
#include <vector>

namespace tdpipe::viz {

struct ViewArgs {
  QStringList traces;  ///< the trace files in the order given (0..kMaxTraces)
  std::optional<QString> render_to;
  int width = 1600, height = 900;
  bool help = false;
  std::optional<QStringList> labels;  ///< --labels A,B,…: one distinct name per trace
  bool compute_lanes = false;  ///< --compute-lanes: only compute lanes (many ranks)
  /// What the command line takes otherwise than it perhaps meant (a --labels value that
  /// names a file: `--labels a.json b.json`), for stderr; each without "warning: ".
  std::vector<std::string> warnings;
};

/// Parses arguments after the program name (Qt's own options already removed).
/// Returns the error message on a bad command line.
std::variant<ViewArgs, std::string> parse_view_args(const QStringList& args);

/// Usage text.
std::string view_usage();

/// Renders the window for these traces to args.render_to without a display. Returns
/// the process exit code: 0, or 2 with a message on stderr naming the problem. Needs
/// a QApplication.
int render_headless(const ViewArgs& args);

/// The whole program: picks the offscreen platform for --render, creates the
/// QApplication, then renders or runs the window.
int run_view(int argc, char** argv);

}  // namespace tdpipe::viz
