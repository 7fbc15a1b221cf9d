// trace.cpp — building trace events from plan ops.
#include "tdpipe/traces/trace.hpp"

#include "tdpipe/ir/plan_io.hpp"

namespace tdpipe::traces {

TraceEvent event_of(const ir::Op& op, int rank, std::int64_t start_ns, std::int64_t end_ns) {
  TraceEvent e;
  fill_event(e, op, rank, start_ns, end_ns);
  return e;
}

void fill_event(TraceEvent& e, const ir::Op& op, int rank, std::int64_t start_ns, std::int64_t end_ns) {
  e.rank = rank;
  e.stream = static_cast<int>(op.stream);
  char name[ir::kOpTextMax];
  e.name.assign(name, ir::op_to_chars(op, name, sizeof name));
  e.kind = op.kind;
  e.mb = op.mb;
  e.chunk = op.chunk;
  e.slice = op.slice;
  e.peer = op.peer;
  e.bytes = op.bytes;
  e.start_ns = start_ns;
  e.dur_ns = end_ns - start_ns;
}

}  // namespace tdpipe::traces
