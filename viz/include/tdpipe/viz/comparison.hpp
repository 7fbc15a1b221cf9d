// comparison.hpp — the numbers the metrics table shows: per side iteration time,
// bubble fraction, compute and exposed communication, and predicted-vs-measured
// errors (iteration, bubble, per-op duration over the paired ops).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tdpipe/traces/metrics.hpp"
#include "tdpipe/viz/timeline_model.hpp"

namespace tdpipe::viz {

/// One table row. Values are already in display units (a time row in ns, µs, ms or s,
/// whichever reads best for its larger side; %); absent cells are nullopt.
struct ComparisonRow {
  std::string metric;
  std::string unit;
  std::optional<double> predicted, measured, error;
  std::string error_unit;  ///< "%" (relative) or "pp" (percentage points)
};

/// Rows for the metrics table; errors only when both sides are present.
std::vector<ComparisonRow> comparison_rows(const TimelineModel& model,
                                           const std::optional<traces::Metrics>& pred,
                                           const std::optional<traces::Metrics>& meas);

}  // namespace tdpipe::viz
