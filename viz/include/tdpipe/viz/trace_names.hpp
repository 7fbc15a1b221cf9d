// trace_names.hpp — what the viewer calls its traces (indexed 0..N−1, in the order
// given), in lane labels, legends, charts, the metrics table, tooltips and the header
// alike. One or two traces: "predicted" and "measured", whose difference column is the
// prediction's error. Three or more: each trace's schedule and origin ("gpipe
// (simgrid)"), with the file's base name where two are still alike. Or the user's own
// names, one per trace (`tdpipe-view --labels gpipe,1f1b,zb-v A B C`); two named
// traces keep a difference column, the change (first − second) / second.
#pragma once

#include <string>
#include <vector>

#include "tdpipe/traces/trace.hpp"

namespace tdpipe::viz {

/// At most this many traces side by side.
inline constexpr int kMaxTraces = 8;

struct TraceNames {
  std::vector<std::string> name;        ///< full: header, chart legends, table columns, tooltips
  /// lane labels and chart categories: distinct, as the names are, at most about 18
  /// characters (a long name keeps its head and, where two would read alike, the part that
  /// tells it apart: "experiment-…name-A")
  std::vector<std::string> short_name;
  std::vector<std::string> tag;         ///< a character or two: per-rank chart categories ("r0 P")
  /// The difference column of exactly two traces: "error" (predicted vs measured) or
  /// "change" (the user's names); empty for any other number of traces.
  std::string difference;
  int size() const { return static_cast<int>(name.size()); }
};

/// The default names of these traces. `files` (empty, or one per trace): where each was
/// read from; its base name tells alike traces apart.
TraceNames default_trace_names(const std::vector<const traces::Trace*>& traces,
                               const std::vector<std::string>& files = {});
/// The name of the file or folder a trace was read from, as the header and the default
/// names show it: "runs/a.json" → "a.json"; a folder of per-rank Kineto files keeps its
/// name when given with trailing separators ("runs/meas/" → "meas").
std::string trace_file_name(const std::string& path);
/// The user's names, one per trace (see check_trace_labels).
TraceNames user_trace_names(const std::vector<std::string>& labels);
/// Empty when `labels` are `traces` distinct non-empty names; else what is wrong,
/// naming what was expected and what was given ("--labels needs three different names …").
std::string check_trace_labels(const std::vector<std::string>& labels, int traces);

}  // namespace tdpipe::viz
