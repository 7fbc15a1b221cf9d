// trace.hpp — a timeline: per rank and stream, op intervals. Predicted (analytic,
// simgrid) and measured (cpu, cuda) timelines share this one type.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tdpipe/ir/op.hpp"

namespace tdpipe::traces {

/// One op's interval. Times in integer nanoseconds from the trace origin, so
/// closed-form checks are exact.
struct TraceEvent {
  int rank = 0;
  int stream = 0;      ///< ir::Stream as int for tdpipe traces; any tid for foreign traces
  std::string name;    ///< e.g. "F3.c1:s0" (tdpipe), or the foreign event's name
  std::optional<ir::OpKind> kind;  ///< unset for foreign events tdpipe does not know
  int mb = -1, chunk = 0, slice = 0;
  int peer = -1;
  std::int64_t bytes = 0;
  std::int64_t start_ns = 0;
  std::int64_t dur_ns = 0;
  /// Of dur_ns, the time spent in the model's decoder layers (the rest: embedding, head,
  /// loss) where the executor measured it (the CPU backend's F/B/W/BW); −1 unknown.
  std::int64_t layers_ns = -1;

  std::int64_t end_ns() const { return start_ns + dur_ns; }
  friend bool operator==(const TraceEvent&, const TraceEvent&) = default;
};

/// The event of plan op `op` on `rank` from `start_ns` to `end_ns`, named by its text
/// form (ir::op_to_text) so predicted and measured traces pair op for op.
TraceEvent event_of(const ir::Op& op, int rank, std::int64_t start_ns, std::int64_t end_ns);
/// event_of into an existing event (e.g. one emplaced at the end of Trace::events):
/// no temporary, and the name formatted without a heap string (one allocation only
/// for a name longer than std::string's inline buffer).
void fill_event(TraceEvent& event, const ir::Op& op, int rank, std::int64_t start_ns, std::int64_t end_ns);

struct Trace {
  std::string origin;    ///< "analytic", "simgrid", "cpu", "cuda", or "chrome" for foreign traces
  std::string schedule;  ///< schedule name, if known
  std::string scenario;  ///< scenario name, if known
  int ranks = 0;
  std::vector<TraceEvent> events;
  std::map<std::string, std::string> metadata;  ///< free-form run metadata

  friend bool operator==(const Trace&, const Trace&) = default;
};

/// Each event's lane within its (rank, stream): the first lane whose last event ended by
/// the event's start (events taken by start), so that the events of one lane never
/// overlap — a p2p batch's SENDs and RECVs start together and end apart. Writers give
/// each lane a track (Chrome) or a stream (Kineto) of its own.
std::vector<int> stream_lanes(const Trace& trace);

}  // namespace tdpipe::traces
