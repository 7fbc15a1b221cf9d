// timeline.cpp — measured GPU intervals → traces::Trace (origin "cuda").
#include "tdpipe/exec/cuda/timeline.hpp"

#include <algorithm>
#include <cmath>

#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec::cuda {

namespace {

std::string ids(const ir::Op& op, ir::OpKind kind) {
  std::string s(ir::to_string(kind));
  s += std::to_string(op.mb);
  if (op.chunk != 0) s += ".c" + std::to_string(op.chunk);
  if (op.slice != 0) s += ":s" + std::to_string(op.slice);
  return s;
}

std::int64_t to_ns(double ms) { return std::llround(ms * 1e6); }

}  // namespace

// The plan text form's spelling (plan_io.hpp), kept here so a trace names ops
// exactly as `tdpipe plan` prints them without pulling the text parser in.
std::string trace_name(const ir::Op& op) {
  using ir::OpKind;
  switch (op.kind) {
    case OpKind::SEND: return "SEND(" + ids(op, op.payload) + ">r" + std::to_string(op.peer) + ")";
    case OpKind::RECV: return "RECV(" + ids(op, op.payload) + "<r" + std::to_string(op.peer) + ")";
    case OpKind::ALLREDUCE:
    case OpKind::REDUCE_SCATTER:
    case OpKind::ALL_GATHER:
      return std::string(ir::to_string(op.kind)) + "(b" + std::to_string(op.tag) + ")";
    case OpKind::OPT: return "OPT";
    default: return op.mb < 0 ? std::string(ir::to_string(op.kind)) : ids(op, op.kind);
  }
}

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
    traces::TraceEvent e;
    e.rank = m.rank;
    e.stream = static_cast<int>(m.op.stream);
    e.name = trace_name(m.op);
    e.kind = m.op.kind;
    e.mb = m.op.mb;
    e.chunk = m.op.chunk;
    e.slice = m.op.slice;
    e.peer = m.op.peer;
    e.bytes = m.op.bytes;
    e.start_ns = to_ns(m.start_ms);
    e.dur_ns = std::max<std::int64_t>(0, to_ns(m.end_ms) - e.start_ns);
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
