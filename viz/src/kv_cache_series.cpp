// kv_cache_series.cpp — KV-cache step functions of serving traces and their decimation
// (kv_cache_series.hpp).
#include "tdpipe/viz/kv_cache_series.hpp"

#include <algorithm>
#include <map>

#include "tdpipe/ir/op.hpp"

namespace tdpipe::viz {
namespace {

bool is_serving_event(const traces::TraceEvent& e) { return e.kind && ir::is_serving(*e.kind); }

// Appends a step, keeping the steps' invariants: a second step at one time replaces
// the first, and a step to the value already held is no step.
void push_step(std::vector<KvStep>& steps, KvStep s) {
  if (!steps.empty() && steps.back().t_ns == s.t_ns) steps.pop_back();
  if (!steps.empty() && steps.back().bytes == s.bytes) return;
  steps.push_back(s);
}

}  // namespace

bool has_serving_ops(const traces::Trace& trace) {
  return std::any_of(trace.events.begin(), trace.events.end(), is_serving_event);
}

std::vector<KvSeries> kv_cache_series(const traces::Trace& trace) {
  // Per rank, the serving events' (end, order in the trace, bytes): by end, and among
  // ops ending together, the later one in the trace holds last.
  struct End {
    std::int64_t t_ns;
    std::size_t order;
    std::int64_t bytes;
  };
  std::map<int, std::vector<End>> by_rank;
  std::int64_t trace_end = 0;
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const auto& e = trace.events[i];
    trace_end = std::max(trace_end, e.end_ns());
    if (is_serving_event(e)) by_rank[e.rank].push_back({e.end_ns(), i, e.bytes});
  }
  std::vector<KvSeries> out;
  for (auto& [rank, ends] : by_rank) {
    std::sort(ends.begin(), ends.end(),
              [](const End& a, const End& b) { return a.t_ns != b.t_ns ? a.t_ns < b.t_ns : a.order < b.order; });
    KvSeries s;
    s.rank = rank;
    s.end_ns = trace_end;
    s.steps.reserve(ends.size() + 1);
    s.steps.push_back({std::min<std::int64_t>(0, ends.front().t_ns), 0});
    for (const End& e : ends) push_step(s.steps, {e.t_ns, e.bytes});
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<KvStep> decimate_kv_steps(const std::vector<KvStep>& steps, int max_steps) {
  max_steps = std::max(4, max_steps);
  if (static_cast<int>(steps.size()) <= max_steps) return steps;
  const int buckets = max_steps / 4;
  const std::int64_t t0 = steps.front().t_ns;
  const double width = static_cast<double>(steps.back().t_ns - t0) / buckets;
  auto bucket_of = [&](std::int64_t t) {
    if (width <= 0) return 0;
    return std::min(buckets - 1, static_cast<int>(static_cast<double>(t - t0) / width));
  };
  std::vector<KvStep> out;
  out.reserve(static_cast<std::size_t>(max_steps));
  std::size_t i = 0;
  while (i < steps.size()) {
    // One bucket: steps[i, j).
    const int b = bucket_of(steps[i].t_ns);
    std::size_t j = i, lo = i, hi = i;
    for (; j < steps.size() && bucket_of(steps[j].t_ns) == b; ++j) {
      if (steps[j].bytes < steps[lo].bytes) lo = j;
      if (steps[j].bytes > steps[hi].bytes) hi = j;
    }
    std::size_t keep[] = {i, lo, hi, j - 1};
    std::sort(std::begin(keep), std::end(keep));
    for (std::size_t k = 0; k < 4; ++k) {
      if (k > 0 && keep[k] == keep[k - 1]) continue;
      // (a kept step to the value the previous kept one holds changes nothing drawn)
      if (!out.empty() && out.back().bytes == steps[keep[k]].bytes) continue;
      out.push_back(steps[keep[k]]);
    }
    i = j;
  }
  return out;
}

}  // namespace tdpipe::viz
