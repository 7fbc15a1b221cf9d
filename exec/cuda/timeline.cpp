// timeline.cpp — measured GPU intervals → traces::Trace (origin "cuda").
#include "tdpipe/exec/cuda/timeline.hpp"

#include <algorithm>
#include <cmath>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/plan_io.hpp"

namespace tdpipe::exec::cuda {

namespace {

std::int64_t to_ns(double ms) { return std::llround(ms * 1e6); }

}  // namespace

// Exactly the interpreter's event names (traces::event_of → ir::op_to_text), so a
// measured CUDA trace pairs op for op with simulated and CPU traces in `tdpipe
// compare` — including collectives of chunk c ("ALLREDUCE(b0.c1)") and ops on a
// non-default stream ("…@p2p"), which a separate spelling got wrong before.
std::string trace_name(const ir::Op& op) { return ir::op_to_text(op); }

traces::Trace build_trace(const std::vector<TimedOp>& ops, const TimelineInfo& info) {
  traces::Trace t;
  t.origin = "cuda";
  t.schedule = info.schedule;
  t.scenario = info.scenario;
  t.ranks = info.ranks;
  t.metadata = info.metadata;
  t.events.reserve(ops.size());
  for (const TimedOp& m : ops) {
    if (m.rank < 0 || (info.ranks > 0 && m.rank >= info.ranks))
      throw Error("cuda timeline: op " + trace_name(m.op) + " on rank " + std::to_string(m.rank) +
                  " but the trace has " + std::to_string(info.ranks) + " ranks");
    if (m.start_ms < 0)
      throw Error("cuda timeline: rank " + std::to_string(m.rank) + " op " + trace_name(m.op) +
                  " starts " + std::to_string(-m.start_ms) +
                  " ms before the origin event (recorded before the barrier?)");
    if (m.end_ms < m.start_ms)
      throw Error("cuda timeline: rank " + std::to_string(m.rank) + " op " + trace_name(m.op) +
                  " ends before it starts (" + std::to_string(m.start_ms) + " ms → " +
                  std::to_string(m.end_ms) + " ms): its events are on different streams");
    const std::int64_t start = to_ns(m.start_ms);
    traces::TraceEvent e = traces::event_of(m.op, m.rank, start, std::max(start, to_ns(m.end_ms)));
    t.events.push_back(std::move(e));
  }
  std::stable_sort(t.events.begin(), t.events.end(), [](const auto& a, const auto& b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    if (a.stream != b.stream) return a.stream < b.stream;
    return a.start_ns < b.start_ns;
  });
  return t;
}

}  // namespace tdpipe::exec::cuda
