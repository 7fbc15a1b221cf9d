// timeline_model.hpp — what the Gantt timeline shows, without any drawing: N traces
// (indexed 0..N−1 in the order given, N ≤ kMaxTraces) shifted to start at 0, their
// names, their lanes (rank × stream × trace: under each rank and stream one lane per
// trace in trace order, so with two traces the predicted lane sits directly above the
// measured one), op pairing between traces and hit testing.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tdpipe/traces/trace.hpp"
#include "tdpipe/traces/pairing.hpp"
#include "tdpipe/viz/trace_names.hpp"

namespace tdpipe::viz {

/// Which op: the trace (0..N−1) and the index into that trace's events.
struct OpId {
  int trace = 0;
  int index = -1;
  friend bool operator==(const OpId&, const OpId&) = default;
};

/// One row of the timeline: the events of one rank and stream of one trace.
struct Lane {
  int trace = 0;
  int rank = 0;
  int stream = 0;
  bool compute = true;      ///< idle time in this lane is a bubble (shaded)
  std::vector<int> events;  ///< indices into the trace's events, sorted by start
  std::int64_t max_dur_ns = 0;
  int y = 0;       ///< top, in timeline pixels
  int height = 0;  ///< in timeline pixels
  std::string label;  ///< "r0 compute · pred": rank, stream and the trace's short name
};

/// Pixel sizes of the lane layout.
inline constexpr int kComputeLaneHeight = 24;
inline constexpr int kCommLaneHeight = 14;
inline constexpr int kLaneGap = 2;    ///< between the lanes of one rank
inline constexpr int kRankGap = 10;   ///< between ranks
inline constexpr int kCompactLaneHeight = 14;  ///< compute lanes only
inline constexpr int kCompactRankGap = 3;      ///< compute lanes only

class TimelineModel {
 public:
  /// Replaces the traces (at most kMaxTraces; more throws tdpipe::Error). Each trace is
  /// shifted so that its earliest event starts at 0. `names` (one per trace) default to
  /// default_trace_names().
  void set_traces(std::vector<traces::Trace> traces, std::optional<TraceNames> names = std::nullopt);

  /// Number of traces (0..kMaxTraces).
  int count() const { return static_cast<int>(traces_.size()); }
  bool has(int trace) const { return trace >= 0 && trace < count(); }
  bool empty() const { return traces_.empty(); }
  /// Only the compute lanes of tdpipe traces (one shorter lane per rank and trace; a foreign
  /// trace keeps its lanes): ~30 ranks of one trace at once in a 1600 × 900 window; the p2p,
  /// dp and copy lanes' ops are then not drawn or hit.
  void set_compute_lanes_only(bool on);
  bool compute_lanes_only() const { return compute_only_; }
  const traces::Trace& trace(int t) const { return traces_[index(t)]; }
  const traces::TraceEvent& event(OpId id) const {
    return trace(id.trace).events[static_cast<std::size_t>(id.index)];
  }
  /// How much the trace was shifted left to start at 0 (ns); 0 when absent.
  std::int64_t shift_ns(int t) const { return has(t) ? shift_[index(t)] : 0; }
  /// The trace's iteration end (last event end after the shift); 0 when absent.
  std::int64_t end_ns(int t) const { return has(t) ? end_[index(t)] : 0; }
  /// The longest iteration end: the width of the time axis.
  std::int64_t span_ns() const;

  /// The traces' names (lane labels, legends, charts, table, tooltips).
  const TraceNames& names() const { return names_; }
  const std::string& name(int t) const { return names_.name[index(t)]; }

  const std::vector<Lane>& lanes() const { return lanes_; }
  int total_height() const { return total_height_; }
  /// Number of ranks shown (max over the traces).
  int ranks() const { return ranks_; }

  /// The ops of traces `a` and `b` paired (traces::pair_ops(trace(a), trace(b)):
  /// pred_to_meas maps a's events to b's), computed on first use and kept.
  const traces::OpPairing& pairing(int a, int b) const;
  /// pairing(0, 1) with two traces or more (the duration scatter's pairs); else empty.
  const traces::OpPairing& pairing() const;
  /// The same op in trace `other`, when it was matched.
  std::optional<OpId> twin(OpId id, int other) const;
  /// The same op in every other trace that has it, in trace order.
  std::vector<OpId> twins(OpId id) const;
  /// Lane index holding this op.
  int lane_of(OpId id) const;

  /// Lane at timeline y (pixels), or -1 between lanes.
  int lane_at_y(double y) const;
  /// The op of `lane` covering time t; with several, the shortest (innermost).
  /// `slack_ns` widens ops so sub-pixel ops can still be hit.
  std::optional<OpId> op_at(int lane, std::int64_t t_ns, std::int64_t slack_ns = 0) const;
  /// The idle gap [start, end) of a compute lane around t, if t is in one.
  std::optional<std::pair<std::int64_t, std::int64_t>> gap_at(int lane,
                                                              std::int64_t t_ns) const;

 private:
  static std::size_t index(int t) { return static_cast<std::size_t>(t); }
  void build_lanes();

  std::vector<traces::Trace> traces_;
  TraceNames names_;
  std::vector<std::int64_t> shift_, end_;
  std::vector<std::vector<int>> lane_of_event_;
  std::vector<Lane> lanes_;
  bool compute_only_ = false;
  mutable std::map<std::pair<int, int>, traces::OpPairing> pairings_;
  int total_height_ = 0;
  int ranks_ = 0;
};

/// Short text for a stream id: "compute", "p2p", "dp" for tdpipe traces, "tid N" else.
std::string stream_name(int stream, bool tdpipe_trace);
/// True when some event of the trace carries a tdpipe op kind.
bool is_tdpipe_trace(const traces::Trace& trace);

}  // namespace tdpipe::viz
