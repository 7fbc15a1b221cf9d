// timeline_model.cpp — lanes, shifts, pairing and hit testing of the timeline.
#include "tdpipe/viz/timeline_model.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/op.hpp"

namespace tdpipe::viz {

// Streams are tdpipe's (compute, p2p, dp, copy) in tdpipe traces and in those imported
// onto a plan (Kineto, Nsight); a foreign Chrome trace's are its renumbered tids, even
// where some of its ranges are named like ops.
bool is_tdpipe_trace(const traces::Trace& trace) {
  if (trace.origin == "chrome") return false;
  return std::any_of(trace.events.begin(), trace.events.end(),
                     [](const traces::TraceEvent& e) { return e.kind.has_value(); });
}

std::string stream_name(int stream, bool tdpipe_trace) {
  if (tdpipe_trace && stream >= 0 && stream < ir::kStreamCount)
    return std::string(ir::to_string(static_cast<ir::Stream>(stream)));
  return "tid " + std::to_string(stream);
}

void TimelineModel::set_traces(std::vector<traces::Trace> traces, std::optional<TraceNames> names) {
  if (static_cast<int>(traces.size()) > kMaxTraces)
    throw Error("at most " + std::to_string(kMaxTraces) + " traces side by side, got " +
                std::to_string(traces.size()));
  if (names && names->size() != static_cast<int>(traces.size()))
    throw Error("trace names: " + std::to_string(names->size()) + " names for " +
                std::to_string(traces.size()) + " traces");
  traces_ = std::move(traces);
  const std::size_t n = traces_.size();
  shift_.assign(n, 0);
  end_.assign(n, 0);
  for (std::size_t s = 0; s < n; ++s) {
    auto& events = traces_[s].events;
    if (events.empty()) continue;
    std::int64_t first = std::numeric_limits<std::int64_t>::max();
    for (const auto& e : events) first = std::min(first, e.start_ns);
    std::int64_t last = 0;
    for (auto& e : events) {
      e.start_ns -= first;
      last = std::max(last, e.end_ns());
    }
    shift_[s] = first;
    end_[s] = last;
  }
  if (names) {
    names_ = std::move(*names);
  } else {
    std::vector<const traces::Trace*> ptrs;
    for (const auto& t : traces_) ptrs.push_back(&t);
    names_ = default_trace_names(ptrs);
  }
  pairings_.clear();
  if (n == 2) (void)pairing(0, 1);  // the scatter and the twins need it at once
  build_lanes();
}

std::int64_t TimelineModel::span_ns() const {
  std::int64_t span = 0;
  for (const auto e : end_) span = std::max(span, e);
  return span;
}

void TimelineModel::set_compute_lanes_only(bool on) {
  if (on == compute_only_) return;
  compute_only_ = on;
  build_lanes();
}

void TimelineModel::build_lanes() {
  lanes_.clear();
  total_height_ = 0;
  ranks_ = 0;
  const std::size_t n = traces_.size();
  lane_of_event_.assign(n, {});
  for (std::size_t s = 0; s < n; ++s) lane_of_event_[s].assign(traces_[s].events.size(), -1);

  // Lanes are keyed by (rank, stream); every trace shares the key set so that the
  // traces' lanes of one rank and stream sit together, in trace order.
  std::set<std::pair<int, int>> keys;
  std::vector<bool> tdpipe_trace(n, false);  // streams are tdpipe's in this trace
  for (std::size_t s = 0; s < n; ++s) {
    tdpipe_trace[s] = is_tdpipe_trace(traces_[s]);
    for (const auto& e : traces_[s].events) keys.insert({e.rank, e.stream});
    ranks_ = std::max(ranks_, traces_[s].ranks);
  }
  // Bucket every event into its lane in one pass.
  std::map<std::pair<int, int>, int> key_index;
  for (const auto& k : keys) key_index.emplace(k, static_cast<int>(key_index.size()));
  std::vector<std::vector<std::vector<int>>> buckets(n);
  for (std::size_t s = 0; s < n; ++s) {
    buckets[s].resize(keys.size());
    const auto& events = traces_[s].events;
    for (int i = 0; i < static_cast<int>(events.size()); ++i) {
      const auto& e = events[static_cast<std::size_t>(i)];
      buckets[s][static_cast<std::size_t>(key_index.at({e.rank, e.stream}))].push_back(i);
    }
  }

  // Compute lanes only: each tdpipe trace keeps its compute lanes, shorter and closer (17 px
  // a rank: ~30 ranks of one trace in a 1600 × 900 window); a foreign trace keeps its lanes.
  const int compute_height = compute_only_ ? kCompactLaneHeight : kComputeLaneHeight;
  const int rank_gap = compute_only_ ? kCompactRankGap : kRankGap;
  int y = 0;
  int prev_rank = std::numeric_limits<int>::min();
  for (const auto& [key, k] : key_index) {
    const auto [rank, stream] = key;
    ranks_ = std::max(ranks_, rank + 1);
    // (compact mode also drops a trace's empty lanes: a foreign trace beside a tdpipe one
    // shares no streams with it)
    auto shown = [&](std::size_t s) {
      if (!compute_only_) return true;
      if (buckets[s][static_cast<std::size_t>(k)].empty()) return false;
      return !(tdpipe_trace[s] && stream != static_cast<int>(ir::Stream::Compute));
    };
    bool any = false;
    for (std::size_t s = 0; s < n; ++s) any = any || shown(s);
    if (!any) continue;
    if (rank != prev_rank && prev_rank != std::numeric_limits<int>::min()) y += rank_gap;
    prev_rank = rank;
    for (std::size_t s = 0; s < n; ++s) {
      if (!shown(s)) continue;
      const bool tdpipe = tdpipe_trace[s];
      const std::string& who = names_.short_name[s];
      Lane lane;
      lane.trace = static_cast<int>(s);
      lane.rank = rank;
      lane.stream = stream;
      const auto& events = traces_[s].events;
      lane.events = std::move(buckets[s][static_cast<std::size_t>(k)]);
      bool any_kind = false, any_compute = false;
      for (int i : lane.events) {
        const auto& e = events[static_cast<std::size_t>(i)];
        lane.max_dur_ns = std::max(lane.max_dur_ns, e.dur_ns);
        if (e.kind) {
          any_kind = true;
          any_compute = any_compute || ir::is_compute(*e.kind);
        }
      }
      std::stable_sort(lane.events.begin(), lane.events.end(), [&](int a, int b) {
        return events[static_cast<std::size_t>(a)].start_ns <
               events[static_cast<std::size_t>(b)].start_ns;
      });
      // A tdpipe lane is a compute lane when it runs compute ops; a foreign lane
      // (no kinds) has unknown purpose, so its idle time counts as bubble.
      lane.compute = any_kind ? any_compute
                              : (tdpipe ? stream == static_cast<int>(ir::Stream::Compute)
                                        : true);
      lane.height = lane.compute ? compute_height : kCommLaneHeight;
      lane.y = y;
      y += lane.height + kLaneGap;
      lane.label = "r" + std::to_string(rank) + " " + stream_name(stream, tdpipe) + " · " + who;
      if (!tdpipe) {  // a foreign trace's own names for its process and thread, where it gave them
        const auto& meta = traces_[s].metadata;
        auto find = [&](const std::string& key) {
          const auto it = meta.find(key);
          return it == meta.end() ? std::string() : it->second;
        };
        const std::string pid = find("chrome.pid." + std::to_string(rank));
        std::string process = find("chrome.process_name." + std::to_string(rank));
        if (process.empty() && !pid.empty()) process = "pid " + pid;
        std::string thread = find("chrome.thread_name." + std::to_string(rank) + "." + std::to_string(stream));
        if (thread.empty() && !find("chrome.tid." + std::to_string(stream)).empty())
          thread = "tid " + find("chrome.tid." + std::to_string(stream));
        if (!process.empty() || !thread.empty())
          lane.label = (process.empty() ? "r" + std::to_string(rank) : process) + " · " +
                       (thread.empty() ? stream_name(stream, false) : thread) + " · " + who;
      }
      const int lane_index = static_cast<int>(lanes_.size());
      for (int i : lane.events) lane_of_event_[s][static_cast<std::size_t>(i)] = lane_index;
      lanes_.push_back(std::move(lane));
    }
  }
  total_height_ = y;
}

const traces::OpPairing& TimelineModel::pairing(int a, int b) const {
  static const traces::OpPairing none;
  if (!has(a) || !has(b) || a == b) return none;
  auto it = pairings_.find({a, b});
  if (it == pairings_.end())
    it = pairings_.emplace(std::pair{a, b}, traces::pair_ops(trace(a), trace(b))).first;
  return it->second;
}

const traces::OpPairing& TimelineModel::pairing() const { return pairing(0, 1); }

std::optional<OpId> TimelineModel::twin(OpId id, int other) const {
  if (!has(id.trace) || !has(other) || other == id.trace || id.index < 0) return std::nullopt;
  // One pairing per pair of traces, kept as (lower, higher): pair_ops is symmetric.
  const bool forward = id.trace < other;
  const auto& p = forward ? pairing(id.trace, other) : pairing(other, id.trace);
  const auto& map = forward ? p.pred_to_meas : p.meas_to_pred;
  if (id.index >= static_cast<int>(map.size())) return std::nullopt;
  const int j = map[static_cast<std::size_t>(id.index)];
  if (j < 0) return std::nullopt;
  return OpId{other, j};
}

std::vector<OpId> TimelineModel::twins(OpId id) const {
  std::vector<OpId> out;
  for (int t = 0; t < count(); ++t)
    if (const auto tw = twin(id, t)) out.push_back(*tw);
  return out;
}

int TimelineModel::lane_of(OpId id) const {
  if (!has(id.trace)) return -1;
  const auto& v = lane_of_event_[index(id.trace)];
  if (id.index < 0 || id.index >= static_cast<int>(v.size())) return -1;
  return v[static_cast<std::size_t>(id.index)];
}

int TimelineModel::lane_at_y(double y) const {
  // Lanes are sorted by y; binary search the last lane starting at or above y.
  auto it = std::upper_bound(lanes_.begin(), lanes_.end(), y,
                             [](double v, const Lane& l) { return v < l.y; });
  if (it == lanes_.begin()) return -1;
  --it;
  if (y >= it->y + it->height) return -1;
  return static_cast<int>(it - lanes_.begin());
}

std::optional<OpId> TimelineModel::op_at(int lane_index, std::int64_t t,
                                         std::int64_t slack) const {
  if (lane_index < 0 || lane_index >= static_cast<int>(lanes_.size())) return std::nullopt;
  const Lane& lane = lanes_[static_cast<std::size_t>(lane_index)];
  const auto& events = trace(lane.trace).events;
  // Events are sorted by start; none starting before t - max_dur - slack can cover t.
  const std::int64_t lo = t - lane.max_dur_ns - slack;
  auto it = std::lower_bound(lane.events.begin(), lane.events.end(), lo, [&](int i, std::int64_t v) {
    return events[static_cast<std::size_t>(i)].start_ns < v;
  });
  std::optional<OpId> best;
  std::int64_t best_dur = std::numeric_limits<std::int64_t>::max();
  std::int64_t best_dist = std::numeric_limits<std::int64_t>::max();
  for (; it != lane.events.end(); ++it) {
    const auto& e = events[static_cast<std::size_t>(*it)];
    if (e.start_ns > t + slack) break;
    if (e.end_ns() + slack < t) continue;
    // Prefer an op truly covering t, then the nearest, then the shortest.
    const std::int64_t dist = t < e.start_ns ? e.start_ns - t : (t > e.end_ns() ? t - e.end_ns() : 0);
    if (dist < best_dist || (dist == best_dist && e.dur_ns < best_dur)) {
      best = OpId{lane.trace, *it};
      best_dist = dist;
      best_dur = e.dur_ns;
    }
  }
  return best;
}

std::optional<std::pair<std::int64_t, std::int64_t>> TimelineModel::gap_at(
    int lane_index, std::int64_t t) const {
  if (lane_index < 0 || lane_index >= static_cast<int>(lanes_.size())) return std::nullopt;
  const Lane& lane = lanes_[static_cast<std::size_t>(lane_index)];
  const std::int64_t end = end_ns(lane.trace);
  if (!lane.compute || t < 0 || t >= end) return std::nullopt;
  const auto& events = trace(lane.trace).events;
  std::int64_t gap_start = 0, gap_end = end;
  for (int i : lane.events) {
    const auto& e = events[static_cast<std::size_t>(i)];
    if (e.end_ns() <= t) {
      gap_start = std::max(gap_start, e.end_ns());
    } else if (e.start_ns <= t) {
      return std::nullopt;  // busy at t
    } else {
      gap_end = e.start_ns;
      break;
    }
  }
  if (gap_end <= gap_start) return std::nullopt;
  return std::make_pair(gap_start, gap_end);
}

}  // namespace tdpipe::viz
