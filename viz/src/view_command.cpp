// view_command.cpp — tdpipe-view's argument parsing, headless render and main loop.
#include "tdpipe/viz/view_command.hpp"

#include <QApplication>
#include <QFileInfo>
#include <cstdio>
#include <cstring>
#include <exception>

#include "tdpipe/viz/trace_names.hpp"
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

// Where the value of --labels (or one of its names) is a file or folder that exists
// ("gpipe.json" in `--labels gpipe.json 1f1b.json`): "'gpipe.json' … is a file"; else empty.
std::string labels_look_like_files(const QString& value, const QStringList& names) {
  QStringList candidates{value};
  for (const QString& n : names)
    if (n != value) candidates << n;
  for (const QString& c : candidates) {
    if (c.isEmpty()) continue;
    const QFileInfo info(c);
    if (info.exists())
      return "the --labels value '" + value.toStdString() + "' looks like a trace " +
             (info.isDir() ? "folder" : "file") +
             (c == value ? std::string(" (it exists)") : " ('" + c.toStdString() + "' exists)");
  }
  return {};
}

}  // namespace

std::string view_usage() {
  return "usage: tdpipe-view [TRACE…]\n"
         "       tdpipe-view --render OUT.png [--width W] [--height H] [--labels A,B,…] [--compute-lanes]\n"
         "                   TRACE…\n"
         "\n"
         "Shows up to 8 traces side by side: Gantt timeline (bubbles shaded; under each rank and\n"
         "stream a lane per trace, in the order given), bubble / breakdown charts and a metrics\n"
         "table with a column per trace. Two traces are a predicted and a measured one (their\n"
         "duration scatter and the error column); three or more are named by their schedule and\n"
         "origin (e.g. gpipe (simgrid)), or by --labels.\n"
         "Traces: tdpipe traces, any Chrome-trace JSON with X events, Kineto files or folders of\n"
         "per-rank files (PyTorch profiler), Nsight Systems SQLite exports.\n"
         "Bubble: the time a rank's compute stream does not run (exposed communication included),\n"
         "over the iteration; later chunks of a rank are drawn in lighter shades.\n"
         "Serving traces (tdpipe serve --trace-out): PREFILL and DECODE ops, and a KV-cache chart —\n"
         "each rank's KV bytes held over time, a line per trace and rank.\n"
         "  --render OUT.png  draw the window offscreen into OUT.png and exit\n"
         "  --width W         image width in pixels (default 1600)\n"
         "  --height H        image height in pixels (default 900)\n"
         "  --labels A,B,…    one name per trace, in order, instead of the default names (e.g. two\n"
         "                    measured runs: --labels balanced,unbalanced, whose difference column\n"
         "                    is then the change (A − B) / B; or --labels gpipe,1f1b,zb-v)\n"
         "  --compute-lanes   only the compute lane of each rank and trace, shorter (~30 ranks of\n"
         "                    one trace at once in 1600x900; View > Compute lanes only, key C)\n";
}

std::variant<ViewArgs, std::string> parse_view_args(const QStringList& args) {
  ViewArgs out;
  QStringList positional;
  std::optional<QString> labels_value;
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
      // Checked against the number of traces once all are known.
      const auto v = value();
      labels_value = v;
      QStringList names;
      if (v)
        for (const QString& name : v->split(QLatin1Char(','))) names << name.trimmed();
      out.labels = names;
    } else if (a == "--compute-lanes") {
      out.compute_lanes = true;
    } else if (a.startsWith("-") && a.size() > 1) {
      return "unknown option '" + a.toStdString() + "'";
    } else {
      positional << a;
    }
  }
  if (positional.size() > kMaxTraces)
    return "at most " + std::to_string(kMaxTraces) + " traces side by side, got " + std::to_string(positional.size());
  out.traces = positional;
  if (out.render_to && out.traces.isEmpty() && !out.help)
    return std::string("--render needs at least one trace file");
  if (out.labels && !out.help) {
    std::vector<std::string> names;
    for (const QString& name : *out.labels) names.push_back(name.toStdString());
    const std::string file = labels_value ? labels_look_like_files(*labels_value, *out.labels) : std::string();
    if (const std::string problem = check_trace_labels(names, static_cast<int>(out.traces.size())); !problem.empty())
      return file.empty() ? problem
                          : problem + "; " + file + ": --labels takes the names, separated by commas, and the "
                                                    "traces follow them (e.g. --labels A,B a.json b.json)";
    if (!file.empty())
      out.warnings.push_back(file + ", yet it was taken as the traces' names (--labels takes the names, separated "
                                    "by commas, and the traces follow them: --labels A,B a.json b.json)");
  }
  return out;
}

int render_headless(const ViewArgs& args) {
  ViewerWindow window;
  window.setAttribute(Qt::WA_DontShowOnScreen, true);
  window.set_compute_lanes_only(args.compute_lanes);
  if (args.labels) window.set_labels(*args.labels);
  try {
    window.load(args.traces);
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
  for (const std::string& w : args.warnings) std::fprintf(stderr, "tdpipe-view: warning: %s\n", w.c_str());
  if (args.help) {
    std::printf("%s", view_usage().c_str());
    return 0;
  }
  if (args.render_to) return render_headless(args);

  ViewerWindow window;
  window.set_compute_lanes_only(args.compute_lanes);
  window.show();
  if (!args.traces.isEmpty()) window.open(args.traces, args.labels.value_or(QStringList{}));
  return app.exec();
}

}  // namespace tdpipe::viz
