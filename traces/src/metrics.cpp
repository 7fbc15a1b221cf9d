// metrics.cpp — union-of-intervals arithmetic over a trace, per rank.
//
// An event is compute when its kind is (F, B, W, BW, OPT); communication when its kind
// is any other; for foreign events without a kind, names that look like NCCL or
// copy kernels (nccl, send, recv, allreduce, all_gather, reduce_scatter, memcpy) are
// communication and the rest compute. Overlapping compute intervals of one rank (two
// streams) count once; communication overlapped by compute is hidden, the rest exposed.
#include "tdpipe/traces/metrics.hpp"

#include <algorithm>
#include <cctype>
#include <limits>
#include <string>
#include <utility>

namespace tdpipe::traces {
namespace {

using Interval = TimeSpan;  // [start, end)

bool looks_like_comm(const std::string& name) {
  std::string lower(name.size(), ' ');
  std::transform(name.begin(), name.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* w : {"nccl", "send", "recv", "allreduce", "all_reduce", "allgather", "all_gather",
                        "reducescatter", "reduce_scatter", "memcpy"})
    if (lower.find(w) != std::string::npos) return true;
  return false;
}

bool is_compute_event(const TraceEvent& e) {
  if (e.kind) return ir::is_compute(*e.kind);
  return !looks_like_comm(e.name);
}

// Sorts and merges into disjoint intervals.
std::vector<Interval> merge(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const auto& iv : v) {
    if (iv.second <= iv.first) continue;
    if (!out.empty() && iv.first <= out.back().second)
      out.back().second = std::max(out.back().second, iv.second);
    else
      out.push_back(iv);
  }
  return out;
}

std::int64_t length(const std::vector<Interval>& v) {
  std::int64_t n = 0;
  for (const auto& iv : v) n += iv.second - iv.first;
  return n;
}

// Total length of the intersection of two merged interval lists.
std::int64_t overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::int64_t n = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const std::int64_t lo = std::max(a[i].first, b[j].first);
    const std::int64_t hi = std::min(a[i].second, b[j].second);
    if (hi > lo) n += hi - lo;
    (a[i].second < b[j].second ? i : j)++;
  }
  return n;
}

}  // namespace

BusyUnion busy_union(std::vector<TimeSpan> compute, std::vector<TimeSpan> comm) {
  const auto c = merge(std::move(compute));
  const auto x = merge(std::move(comm));
  BusyUnion u;
  u.compute_ns = length(c);
  u.comm_ns = length(x);
  u.hidden_comm_ns = overlap(c, x);
  return u;
}

Metrics compute_metrics(const Trace& trace) {
  Metrics m;
  int ranks = trace.ranks;
  std::int64_t first = std::numeric_limits<std::int64_t>::max(), last = std::numeric_limits<std::int64_t>::min();
  for (const auto& e : trace.events) {
    ranks = std::max(ranks, e.rank + 1);
    first = std::min(first, e.start_ns);
    last = std::max(last, e.end_ns());
  }
  m.iteration_ns = trace.events.empty() ? 0 : last - first;
  std::vector<std::vector<Interval>> compute(ranks), comm(ranks);
  std::vector<Interval> span(ranks, {std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min()});
  for (const auto& e : trace.events) {
    if (e.rank < 0) continue;
    (is_compute_event(e) ? compute : comm)[e.rank].emplace_back(e.start_ns, e.end_ns());
    span[e.rank].first = std::min(span[e.rank].first, e.start_ns);
    span[e.rank].second = std::max(span[e.rank].second, e.end_ns());
  }
  m.ranks.resize(ranks);
  double compute_sum = 0;
  for (int r = 0; r < ranks; ++r) {
    const BusyUnion u = busy_union(std::move(compute[r]), std::move(comm[r]));
    RankMetrics& rm = m.ranks[r];
    rm.compute_ns = u.compute_ns;
    rm.hidden_comm_ns = u.hidden_comm_ns;
    rm.exposed_comm_ns = u.exposed_comm_ns();
    rm.idle_ns = m.iteration_ns - rm.compute_ns - rm.exposed_comm_ns;
    rm.idle_fraction = m.iteration_ns > 0 ? double(m.iteration_ns - rm.compute_ns) / double(m.iteration_ns) : 0;
    rm.span_ns = span[r].second > span[r].first ? span[r].second - span[r].first : 0;
    compute_sum += double(rm.compute_ns);
  }
  if (m.iteration_ns > 0 && ranks > 0)
    m.bubble_fraction = 1.0 - compute_sum / ranks / double(m.iteration_ns);
  return m;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace tdpipe::traces
