// compare.hpp — prediction against measurement: pairs the ops of two traces of the
// same plan by (rank, name, occurrence) and reports how far apart they are
// (`tdpipe compare`, the viewer's comparison panel).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tdpipe/traces/trace.hpp"

namespace tdpipe::traces {

/// One op present in both traces. Starts are relative to each trace's first event.
struct OpPair {
  int rank = 0;
  std::string name;
  std::int64_t predicted_start_ns = 0, measured_start_ns = 0;
  std::int64_t predicted_dur_ns = 0, measured_dur_ns = 0;
  std::int64_t drift_ns() const { return measured_start_ns - predicted_start_ns; }
};

struct RankComparison {
  int rank = 0;
  double predicted_idle = 0, measured_idle = 0;  ///< idle fraction (compute_metrics)
  double bubble_error_pp = 0;                     ///< (predicted − measured) · 100
};

/// |relative error| of per-op durations: |predicted − measured| / measured.
struct ErrorDistribution {
  int count = 0;
  double median = 0, p90 = 0, max = 0;
};

struct Comparison {
  std::string predicted_origin, measured_origin, schedule, scenario;
  std::int64_t predicted_iteration_ns = 0, measured_iteration_ns = 0;
  double iteration_error = 0;  ///< (predicted − measured) / measured
  double predicted_bubble = 0, measured_bubble = 0;
  double bubble_error_pp = 0;  ///< of the bubble fraction, percentage points
  std::vector<RankComparison> ranks;
  ErrorDistribution compute_duration_error;  ///< compute ops (F, B, W, BW, OPT)
  ErrorDistribution all_duration_error;      ///< every paired op with a measured duration > 0
  int matched = 0, only_predicted = 0, only_measured = 0;
  std::vector<OpPair> largest_drift;  ///< by |drift|, largest first
  std::vector<std::string> warnings;  ///< e.g. different schedule names
};

struct CompareOptions {
  int top_drift = 10;  ///< how many ops with the largest start-time drift to keep
};

/// A measured trace of p·d ranks (d data-parallel replicas, world rank k·p + r) against
/// a predicted one of p (the engines predict one replica): every replica is compared
/// with the prediction, and a warning says so. Throws tdpipe::Error when the traces
/// cannot be of the same run (rank counts differ otherwise, the measured metadata's
/// `data` disagrees, or no op pairs up).
Comparison compare(const Trace& predicted, const Trace& measured, const CompareOptions& options = {});

/// Linear-interpolated quantile (q in [0, 1]) of unsorted values; 0 for none.
double quantile(std::vector<double> values, double q);

nlohmann::json to_json(const Comparison& comparison);
/// A short human-readable report (what `tdpipe compare` prints).
std::string to_text(const Comparison& comparison);

}  // namespace tdpipe::traces
