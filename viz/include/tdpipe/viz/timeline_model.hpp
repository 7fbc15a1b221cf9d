// timeline_model.hpp — what the Gantt timeline shows, without any drawing: one or
// two traces shifted to start at 0, their lanes (rank × stream, predicted lane
// directly above the measured lane), op pairing and hit testing.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tdpipe/traces/trace.hpp"
#include "tdpipe/traces/pairing.hpp"

namespace tdpipe::viz {

enum class Side : int { Predicted = 0, Measured = 1 };

/// Which op: side and index into that side's trace events.
struct OpId {
  Side side = Side::Predicted;
  int index = -1;
  friend bool operator==(const OpId&, const OpId&) = default;
};

/// One row of the timeline: the events of one rank and stream of one trace.
struct Lane {
  Side side = Side::Predicted;
  int rank = 0;
  int stream = 0;
  bool compute = true;      ///< idle time in this lane is a bubble (shaded)
  std::vector<int> events;  ///< indices into the side's events, sorted by start
  std::int64_t max_dur_ns = 0;
  int y = 0;       ///< top, in timeline pixels
  int height = 0;  ///< in timeline pixels
  std::string label;
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
  /// Replaces the traces (either may be absent). Each trace is shifted so that
  /// its earliest event starts at 0.
  void set_traces(std::optional<traces::Trace> predicted,
                  std::optional<traces::Trace> measured);

  bool has(Side side) const { return traces_[index(side)].has_value(); }
  /// Only the compute lanes of tdpipe traces (one shorter lane per rank and side; a foreign
  /// trace keeps its lanes): ~30 ranks of one trace at once in a 1600 × 900 window; the p2p,
  /// dp and copy lanes' ops are then not drawn or hit.
  void set_compute_lanes_only(bool on);
  bool compute_lanes_only() const { return compute_only_; }
  bool empty() const { return !has(Side::Predicted) && !has(Side::Measured); }
  const traces::Trace& trace(Side side) const { return *traces_[index(side)]; }
  const traces::TraceEvent& event(OpId id) const {
    return trace(id.side).events[static_cast<std::size_t>(id.index)];
  }
  /// How much the side's trace was shifted left to start at 0 (ns).
  std::int64_t shift_ns(Side side) const { return shift_[index(side)]; }
  /// The side's iteration end (last event end after the shift); 0 when absent.
  std::int64_t end_ns(Side side) const { return end_[index(side)]; }
  /// The longer of the two iteration ends: the width of the time axis.
  std::int64_t span_ns() const;

  const std::vector<Lane>& lanes() const { return lanes_; }
  int total_height() const { return total_height_; }
  /// Number of ranks shown (max over both traces).
  int ranks() const { return ranks_; }

  const traces::OpPairing& pairing() const { return pairing_; }
  /// The same op in the other trace, when both are open and it was matched.
  std::optional<OpId> twin(OpId id) const;
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
  static std::size_t index(Side s) { return static_cast<std::size_t>(s); }
  void build_lanes();

  std::array<std::optional<traces::Trace>, 2> traces_;
  std::array<std::int64_t, 2> shift_{0, 0};
  std::array<std::int64_t, 2> end_{0, 0};
  std::array<std::vector<int>, 2> lane_of_event_;
  std::vector<Lane> lanes_;
  bool compute_only_ = false;
  traces::OpPairing pairing_;
  int total_height_ = 0;
  int ranks_ = 0;
};

/// Short text for a stream id: "compute", "p2p", "dp" for tdpipe traces, "tid N" else.
std::string stream_name(int stream, bool tdpipe_trace);
/// True when some event of the trace carries a tdpipe op kind.
bool is_tdpipe_trace(const traces::Trace& trace);

}  // namespace tdpipe::viz
