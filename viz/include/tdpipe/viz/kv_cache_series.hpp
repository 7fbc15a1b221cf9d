// kv_cache_series.hpp — the KV-cache chart's data, without any drawing: each rank's
// KV-cache bytes over time as a step function, read from a serving trace's PREFILL and
// DECODE events (each one's `bytes`: what the rank holds once the op is done), and its
// decimation for drawing large traces.
#pragma once

#include <cstdint>
#include <vector>

#include "tdpipe/traces/trace.hpp"

namespace tdpipe::viz {

/// From `t_ns` on (until the next step), the rank holds `bytes` of KV cache.
struct KvStep {
  std::int64_t t_ns = 0;
  std::int64_t bytes = 0;
  friend bool operator==(const KvStep&, const KvStep&) = default;
};

/// One rank's KV cache over time.
struct KvSeries {
  int rank = 0;
  /// Change points, time ascending, no two alike in time or (consecutive) in bytes; the
  /// first is {0, 0} (nothing cached before the trace's first op) unless an op ends at 0.
  std::vector<KvStep> steps;
  /// Where the last value stops being drawn: the trace's end (its last event's end).
  std::int64_t end_ns = 0;
};

/// True when the trace has a PREFILL or DECODE event (a serving trace).
bool has_serving_ops(const traces::Trace& trace);

/// Each rank's KV cache over time (ranks with serving ops only, rank ascending): a step at
/// each PREFILL/DECODE end to that op's `bytes` — the value is absolute, so only change
/// points are kept (an op that leaves the cache as it was adds no step). Times as in the
/// trace (the viewer's model has shifted them to start at 0).
std::vector<KvSeries> kv_cache_series(const traces::Trace& trace);

/// At most `max_steps` (≥ 4) of `steps`, chosen so that extremes survive: the span of
/// the steps is cut into max_steps / 4 buckets of equal time, and each bucket keeps
/// its first, lowest, highest and last step (the M4 rule of line-chart aggregation, on
/// change points). What is kept is a subset of the true steps, so the peak appears with
/// its exact value and time; in between, a dip or rise shorter than a bucket that is not
/// an extreme of it is dropped. Fewer steps than the cap come back unchanged.
std::vector<KvStep> decimate_kv_steps(const std::vector<KvStep>& steps, int max_steps);

}  // namespace tdpipe::viz
