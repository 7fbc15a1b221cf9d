// trace.cpp — building trace events from plan ops.
#include "tdpipe/traces/trace.hpp"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

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

std::vector<int> stream_lanes(const Trace& trace) {
  std::vector<std::size_t> order(trace.events.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto& x = trace.events[a];
    const auto& y = trace.events[b];
    return std::tie(x.rank, x.stream, x.start_ns) < std::tie(y.rank, y.stream, y.start_ns);
  });
  std::vector<int> lane(trace.events.size(), 0);
  std::map<std::pair<int, int>, std::vector<std::int64_t>> ends;  // (rank, stream) → each lane's end
  for (std::size_t i : order) {
    const auto& e = trace.events[i];
    auto& lanes = ends[{e.rank, e.stream}];
    std::size_t k = 0;
    while (k < lanes.size() && lanes[k] > e.start_ns) ++k;
    if (k == lanes.size()) lanes.push_back(0);
    lanes[k] = e.start_ns + e.dur_ns;
    lane[i] = static_cast<int>(k);
  }
  return lane;
}

}  // namespace tdpipe::traces
