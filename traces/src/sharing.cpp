// sharing.cpp — processor-sharing rates of a trace's compute events, and matching a
// plan's ops to a trace's events (semantics in sharing.hpp).
#include "tdpipe/traces/sharing.hpp"

#include <algorithm>
#include <utility>

#include "tdpipe/traces/pairing.hpp"

namespace tdpipe::traces {

std::vector<double> shared_rates(const Trace& trace, double capacity) {
  const auto& ev = trace.events;
  std::vector<double> rate(ev.size(), 1.0);
  if (!(capacity > 0)) return rate;
  // Sweep over the start/end points of compute events; between two points the number
  // k of running ops is constant, and each gets min(1, C/k) of that stretch.
  std::vector<std::size_t> compute;
  for (std::size_t i = 0; i < ev.size(); ++i)
    if (ev[i].kind && ir::is_compute(*ev[i].kind) && ev[i].dur_ns > 0) compute.push_back(i);
  std::vector<std::pair<std::int64_t, std::int64_t>> marks;  // (time, ±(i+1)); ends before starts at a tie
  marks.reserve(2 * compute.size());
  for (std::size_t i : compute) {
    marks.emplace_back(ev[i].start_ns, static_cast<std::int64_t>(i) + 1);
    marks.emplace_back(ev[i].end_ns(), -(static_cast<std::int64_t>(i) + 1));
  }
  std::sort(marks.begin(), marks.end());
  std::vector<double> share(ev.size(), 0.0);  // ∫ rate dt so far, ns
  std::vector<std::size_t> running;
  std::int64_t last = marks.empty() ? 0 : marks.front().first;
  for (const auto& [t, code] : marks) {
    if (t > last && !running.empty()) {
      const double r = std::min(1.0, capacity / static_cast<double>(running.size()));
      for (std::size_t i : running) share[i] += r * static_cast<double>(t - last);
    }
    last = t;
    const std::size_t i = static_cast<std::size_t>(code > 0 ? code - 1 : -code - 1);
    if (code > 0) running.push_back(i);
    else running.erase(std::find(running.begin(), running.end(), i));
  }
  for (std::size_t i : compute) rate[i] = std::clamp(share[i] / static_cast<double>(ev[i].dur_ns), 1e-9, 1.0);
  return rate;
}

std::vector<std::vector<int>> plan_event_index(const ir::Plan& plan, const Trace& trace) {
  // The plan's ops as a trace, starting in their rank's order, paired with `trace` by
  // the rule `tdpipe compare` and the viewer use (pair_ops).
  Trace ops;
  for (std::size_t r = 0; r < plan.ranks.size(); ++r)
    for (std::size_t i = 0; i < plan.ranks[r].size(); ++i) {
      const auto at = static_cast<std::int64_t>(i);
      ops.events.push_back(event_of(plan.ranks[r][i], static_cast<int>(r), at, at));
    }
  const OpPairing pairing = pair_ops(ops, trace);
  std::vector<std::vector<int>> out(plan.ranks.size());
  std::size_t k = 0;
  for (std::size_t r = 0; r < plan.ranks.size(); ++r)
    for (std::size_t i = 0; i < plan.ranks[r].size(); ++i) out[r].push_back(pairing.pred_to_meas[k++]);
  return out;
}

}  // namespace tdpipe::traces
