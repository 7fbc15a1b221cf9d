// timeline.hpp — measured GPU intervals → traces::Trace. The CUDA backend records
// an event before and after every op on the op's stream; all are read relative to
// one origin event recorded after a barrier, so every rank's times share a zero.
// This half is plain C++ (no CUDA) and unit-tested on CPU.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tdpipe/ir/op.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::exec::cuda {

/// One op's measured interval: milliseconds since the origin event, as
/// cudaEventElapsedTime reports them (about 0.5 µs resolution).
struct TimedOp {
  int rank = 0;
  ir::Op op;
  double start_ms = 0;
  double end_ms = 0;
};

struct TimelineInfo {
  std::string schedule;
  std::string scenario;
  int ranks = 0;
  std::map<std::string, std::string> metadata;  ///< device name, transport, … (added to the trace)
};

/// Builds the "cuda" trace: one event per op named like the plan's text form,
/// integer ns, sorted by (rank, stream, start). Throws tdpipe::Error naming the op
/// for an interval that ends before it starts or starts before the origin
/// (that means an event was recorded on the wrong stream or before the barrier).
traces::Trace build_trace(const std::vector<TimedOp>& ops, const TimelineInfo& info);

/// The trace event name of an op: "F3.c1:s2", "SEND(F3>r1)", "ALLREDUCE(b0)", "OPT".
std::string trace_name(const ir::Op& op);

}  // namespace tdpipe::exec::cuda
