// op_style.hpp — how an op looks: fill colour by kind, label text, legend entries.
#pragma once

#include <QColor>
#include <QString>
#include <vector>

#include "tdpipe/traces/trace.hpp"

namespace tdpipe::viz {

/// Shade of idle (bubble) time in compute lanes.
inline const QColor kBubbleColor{0xf2, 0xb8, 0xb5};
/// Background of a lane's active window where idle time is not a bubble (comm lanes).
inline const QColor kCommLaneColor{0xee, 0xee, 0xee};
/// Background of the timeline outside any trace's iteration.
inline const QColor kTimelineBackground{Qt::white};

/// Fill colour of an op: by kind for tdpipe ops, a stable colour from the name for
/// foreign events.
QColor op_color(const traces::TraceEvent& e);
/// Label drawn inside the op when it fits: "F3", "BW2.c1:s0", or the foreign name.
QString op_label(const traces::TraceEvent& e);
/// A shorter label for narrow boxes: just the micro-batch number (or empty).
QString op_short_label(const traces::TraceEvent& e);
/// Black or white, whichever reads better on `fill`.
QColor text_color_on(const QColor& fill);

struct LegendEntry {
  QString text;
  QColor color;
};
/// Legend entries for the op kinds present in the given traces (plus "idle (bubble)").
std::vector<LegendEntry> legend_entries(const std::vector<const traces::Trace*>& traces);

/// The colour of trace `t` of `n` in the charts (bars, legends): one or two traces keep
/// predicted blue and measured dark grey; three or more take a hue each.
QColor trace_color(int t, int n);
/// Trace `t`'s colour for text: lane labels, the header's names, its iteration-end marker.
QColor trace_text_color(int t, int n);

/// "1.25 ms", "830 µs", "2.10 s" — a duration in the most readable unit.
QString format_duration(std::int64_t ns);

}  // namespace tdpipe::viz
