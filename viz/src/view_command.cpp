// view_command.cpp — tdpipe-view's argument parsing, headless render and main loop.
#include "tdpipe/viz/view_command.hpp"

#include <QApplication>
#include <QFileInfo>
#include <cstdio>
#include <cstring>
#include <exception>

#include "tdpipe/viz/side_names.hpp"
#include "tdpipe/viz/viewer_window.hpp"

namespace tdpipe::viz {
namespace {

constexpr int kMinSide = 200, kMaxSide = 16384;

// The offscreen platform warns that it cannot resize windows on request; in a
// headless render that is expected and only hides real messages.
void quiet_offscreen_messages(QtMsgType type, const QMessageLogContext& ctx, const QString& msg) {
  if (msg.contains(QLatin1String("propagateSizeHints")) || msg.contains(QLatin1String("XDG_RUNTIME_DIR")))
    return;
  std::fprintf(stderr, "%s\n", qFormatLogMessage(type, ctx, msg).toLocal8Bit().constData());
}

}  // namespace

std::string view_usage() {
  return "usage: tdpipe-view [PREDICTED] [MEASURED]\n"
         "       tdpipe-view --render OUT.png [--width W] [--height H] [--labels A,B] [--compute-lanes]\n"
         "                   PREDICTED [MEASURED]\n"
         "\n"
         "Shows a predicted and (optionally) a measured trace side by side: Gantt timeline\n"
         "(bubbles shaded), bubble / breakdown / duration charts and a metrics table.\n"
         "Traces: tdpipe traces, any Chrome-trace JSON with X events, Kineto files or folders of\n"
         "per-rank files (PyTorch profiler), Nsight Systems SQLite exports.\n"
         "Bubble: the time a rank's compute stream does not run (exposed communication included),\n"
         "over the iteration; later chunks of a rank are drawn in lighter shades.\n"
         "  --render OUT.png  draw the window offscreen into OUT.png and exit\n"
         "  --width W         image width in pixels (default 1600)\n"
         "  --height H        image height in pixels (default 900)\n"
         "  --labels A,B      call the two traces A and B instead of predicted and measured\n"
         "                    (e.g. two measured runs: --labels balanced,unbalanced); the\n"
         "                    difference column is then the change (A − B) / B\n"
         "  --compute-lanes   only the compute lane of each rank, shorter (~30 ranks of one trace\n"
         "                    at once in 1600x900; View > Compute lanes only, key C)\n";
}

std::variant<ViewArgs, std::string> parse_view_args(const QStringList& args) {
  ViewArgs out;
  QStringList positional;
  for (int i = 0; i < args.size(); ++i) {
    const QString& a = args[i];
    auto value = [&]() -> std::optional<QString> {
      if (i + 1 >= args.size()) return std::nullopt;
      return args[++i];
    };
    if (a == "-h" || a == "--help") {
      out.help = true;
    } else if (a == "--render") {
      const auto v = value();
      if (!v || v->isEmpty()) return std::string("--render needs an output file (e.g. --render out.png)");
      out.render_to = *v;
    } else if (a == "--width" || a == "--height") {
      const auto v = value();
      bool ok = false;
      const int n = v ? v->toInt(&ok) : 0;
      if (!ok || n < kMinSide || n > kMaxSide)
        return a.toStdString() + " needs a whole number of pixels between " + std::to_string(kMinSide) +
               " and " + std::to_string(kMaxSide) + (v ? ", got '" + v->toStdString() + "'" : "");
      (a == "--width" ? out.width : out.height) = n;
    } else if (a == "--labels") {
      const auto v = value();
      const QStringList both = v ? v->split(QLatin1Char(',')) : QStringList();
      if (both.size() != 2 || both[0].trimmed().isEmpty() || both[1].trimmed().isEmpty() ||
          both[0].trimmed() == both[1].trimmed())
        return "--labels needs two different names separated by a comma (e.g. --labels balanced,unbalanced)" +
               (v ? ", got '" + v->toStdString() + "'" : std::string());
      out.labels = {both[0].trimmed(), both[1].trimmed()};
    } else if (a == "--compute-lanes") {
      out.compute_lanes = true;
    } else if (a.startsWith("-") && a.size() > 1) {
      return "unknown option '" + a.toStdString() + "'";
    } else {
      positional << a;
    }
  }
  if (positional.size() > 2)
    return "at most two traces (PREDICTED MEASURED), got " + std::to_string(positional.size());
  if (positional.size() > 0) out.predicted = positional[0];
  if (positional.size() > 1) out.measured = positional[1];
  if (out.render_to && out.predicted.isEmpty() && !out.help)
    return std::string("--render needs at least one trace file");
  return out;
}

int render_headless(const ViewArgs& args) {
  ViewerWindow window;
  window.setAttribute(Qt::WA_DontShowOnScreen, true);
  window.set_compute_lanes_only(args.compute_lanes);
  try {
    window.load(args.predicted, args.measured);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tdpipe-view: error: %s\n", e.what());
    return 2;
  }
  window.resize(args.width, args.height);
  window.show();
  QApplication::processEvents();
  window.resize(args.width, args.height);  // the platform may have adjusted it on show
  QApplication::processEvents();
  const QString out = *args.render_to;
  if (!window.export_png(out)) {
    std::fprintf(stderr, "tdpipe-view: error: cannot write image '%s'\n", out.toLocal8Bit().constData());
    return 2;
  }
  const QImage written(out);
  std::printf("tdpipe-view: wrote %s (%dx%d)\n", out.toLocal8Bit().constData(), written.width(),
              written.height());
  return 0;
}

int run_view(int argc, char** argv) {
  // Decide what needs a display before the QApplication exists: --help needs none,
  // and headless rendering gets the offscreen platform.
  bool render = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      std::printf("%s", view_usage().c_str());
      return 0;
    }
    render = render || std::strcmp(argv[i], "--render") == 0;
  }
  if (render) {
    qputenv("QT_QPA_PLATFORM", "offscreen");
    qInstallMessageHandler(quiet_offscreen_messages);
  } else if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM") && qEnvironmentVariableIsEmpty("DISPLAY") &&
             qEnvironmentVariableIsEmpty("WAYLAND_DISPLAY")) {
    // Without this, Qt aborts with a long plugin message; say what to do instead.
    std::fprintf(stderr,
                 "tdpipe-view: error: no display (DISPLAY and WAYLAND_DISPLAY are unset); "
                 "use --render OUT.png to draw without one\n");
    return 2;
  }
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("tdpipe-view"));
  const auto parsed = parse_view_args(QApplication::arguments().mid(1));
  if (const auto* err = std::get_if<std::string>(&parsed)) {
    std::fprintf(stderr, "tdpipe-view: error: %s\n%s", err->c_str(), view_usage().c_str());
    return 2;
  }
  const auto& args = std::get<ViewArgs>(parsed);
  if (args.help) {
    std::printf("%s", view_usage().c_str());
    return 0;
  }
  if (args.labels) set_side_names(args.labels->first, args.labels->second);
  if (args.render_to) return render_headless(args);

  ViewerWindow window;
  window.set_compute_lanes_only(args.compute_lanes);
  window.show();
  if (!args.predicted.isEmpty()) window.open(args.predicted, args.measured);
  return app.exec();
}

}  // namespace tdpipe::viz
