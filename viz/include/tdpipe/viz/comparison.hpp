// comparison.hpp — the numbers the metrics table shows: per trace iteration time,
// bubble fraction, compute and exposed communication, and, for exactly two traces,
// their differences (iteration, bubble, per-op duration over the paired ops).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tdpipe/traces/metrics.hpp"
#include "tdpipe/viz/timeline_model.hpp"

namespace tdpipe::viz {

/// One table row. Values are already in display units (a time row in ns, µs, ms or s,
/// whichever reads best for its largest value; %); absent cells are nullopt.
struct ComparisonRow {
  std::string metric;
  std::string unit;
  std::vector<std::optional<double>> values;  ///< one per trace, in trace order
  std::optional<double> error;                ///< the difference column (two traces only)
  std::string error_unit;  ///< "%" (relative) or "pp" (percentage points)
};

/// The difference of two traces, one definition for the table's difference column and
/// the tooltips alike (as `tdpipe compare` and the README have it): the first trace's
/// value against the second's, 100 · (first − second) / second, in percent; nullopt
/// where the second is 0.
std::optional<double> relative_difference_pct(double first, double second);

/// Rows for the metrics table; `metrics` holds one entry per trace of the model.
/// Differences only when the model has exactly two traces.
std::vector<ComparisonRow> comparison_rows(const TimelineModel& model,
                                           const std::vector<traces::Metrics>& metrics);

}  // namespace tdpipe::viz
