// pairing.cpp — match predicted and measured events by op identity and occurrence.
#include "tdpipe/traces/pairing.hpp"

#include <algorithm>
#include <string_view>
#include <tuple>

namespace tdpipe::traces {
namespace {

// The identity of an op within its trace, and its start to order occurrences. The
// event name is the op's text form in tdpipe traces ("F3.c1:s0", "SEND(F0>r1)"), so
// pairing by (rank, name) pairs the same op of a prediction and a measurement;
// nameless events fall back to their fields.
struct Entry {
  int rank;
  std::string_view name;
  int kind, mb, chunk, slice, peer, stream;
  std::int64_t start_ns;
  int index;

  auto key() const { return std::tie(rank, name, kind, mb, chunk, slice, peer, stream); }
};

// Events sorted by key, then start (then index, so ties are stable).
std::vector<Entry> sorted_entries(const Trace& t) {
  std::vector<Entry> out;
  out.reserve(t.events.size());
  for (int i = 0; i < static_cast<int>(t.events.size()); ++i) {
    const auto& e = t.events[static_cast<std::size_t>(i)];
    if (!e.name.empty())
      out.push_back({e.rank, e.name, -1, -1, 0, 0, -1, -1, e.start_ns, i});
    else if (e.kind)
      out.push_back({e.rank, {}, static_cast<int>(*e.kind), e.mb, e.chunk, e.slice, e.peer, -1, e.start_ns, i});
    else
      out.push_back({e.rank, {}, -2, -1, 0, 0, -1, e.stream, e.start_ns, i});
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.rank, a.name, a.kind, a.mb, a.chunk, a.slice, a.peer, a.stream, a.start_ns, a.index) <
           std::tie(b.rank, b.name, b.kind, b.mb, b.chunk, b.slice, b.peer, b.stream, b.start_ns, b.index);
  });
  return out;
}

}  // namespace

OpPairing pair_ops(const Trace& predicted, const Trace& measured) {
  OpPairing p;
  p.pred_to_meas.assign(predicted.events.size(), -1);
  p.meas_to_pred.assign(measured.events.size(), -1);
  const auto a = sorted_entries(predicted);
  const auto b = sorted_entries(measured);
  // Merge join: walk both key-sorted lists; within equal keys, occurrences pair up
  // in start order.
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i].key() < b[j].key()) {
      ++i;
    } else if (b[j].key() < a[i].key()) {
      ++j;
    } else {
      p.pred_to_meas[static_cast<std::size_t>(a[i].index)] = b[j].index;
      p.meas_to_pred[static_cast<std::size_t>(b[j].index)] = a[i].index;
      ++p.pairs;
      ++i;
      ++j;
    }
  }
  return p;
}

}  // namespace tdpipe::traces
