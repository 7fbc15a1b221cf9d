// serving_report.cpp — a serving run's figures from its plan and trace (serving_report.hpp).
#include "tdpipe/traces/serving_report.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tdpipe/ir/error.hpp"

namespace tdpipe::traces {

Distribution distribution_of(std::vector<double> v) {
  Distribution d;
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  d.mean = sum / static_cast<double>(v.size());
  auto rank = [&](double q) {
    const std::size_t k = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::min(v.size() - 1, k == 0 ? 0 : k - 1)];
  };
  d.p50 = rank(0.50);
  d.p90 = rank(0.90);
  d.p99 = rank(0.99);
  d.max = v.back();
  return d;
}

ServingReport serving_report(const ir::Plan& plan, const Trace& trace) {
  if (!plan.serve) throw Error("serving report: the plan has no serving table (not a `tdpipe serve` plan)");
  const ir::ServePlan& sv = *plan.serve;
  const int P = plan.num_ranks();
  const int n = static_cast<int>(sv.batches.size());
  ServingReport rep;
  rep.planner = sv.planner;
  rep.origin = trace.origin;
  rep.stages = P;
  rep.tensor = plan.scenario.parallel.tensor;
  rep.requests = static_cast<int>(sv.requests.size());
  for (const auto& q : sv.requests) {
    rep.prompt_tokens += q.prompt;
    rep.output_tokens += q.output;
  }
  rep.batches = n;

  // Each stage's serving ops in time order; the last stage's ends time the tokens.
  std::vector<std::vector<const TraceEvent*>> ops(static_cast<std::size_t>(P));
  std::int64_t makespan = 0, origin = std::numeric_limits<std::int64_t>::max();
  for (const TraceEvent& e : trace.events) {
    makespan = std::max(makespan, e.end_ns());
    origin = std::min(origin, e.start_ns);
    if (!e.kind || !ir::is_serving(*e.kind) || e.rank < 0 || e.rank >= P) continue;
    if (e.mb < 0 || e.mb >= n)
      throw Error(fmt::format("serving report: trace event {} on rank {} names batch {}; the plan has {}", e.name,
                              e.rank, e.mb, n));
    ops[static_cast<std::size_t>(e.rank)].push_back(&e);
  }
  if (origin == std::numeric_limits<std::int64_t>::max()) origin = 0;
  std::vector<std::int64_t> end_of(static_cast<std::size_t>(n), -1);
  for (const TraceEvent* e : ops[static_cast<std::size_t>(P - 1)]) end_of[static_cast<std::size_t>(e->mb)] = e->end_ns();
  for (int j = 0; j < n; ++j)
    if (end_of[static_cast<std::size_t>(j)] < 0)
      throw Error(fmt::format("serving report: the trace has no PREFILL/DECODE of batch {} on the last stage "
                              "(rank {}); is it a trace of this plan?",
                              j, P - 1));
  rep.makespan_seconds = static_cast<double>(makespan - origin) * 1e-9;

  // Tokens: each item produces one; the first and last of each request time it.
  std::vector<double> first(sv.requests.size(), -1), last(sv.requests.size(), -1);
  std::vector<char> seen(sv.requests.size(), 0);
  int phases = 0, prev_phase = -1;
  double decode_sum = 0;
  int decode_count = 0;
  for (int j = 0; j < n; ++j) {
    const ir::ServeBatch& b = sv.batches[static_cast<std::size_t>(j)];
    const double t = static_cast<double>(end_of[static_cast<std::size_t>(j)] - origin) * 1e-9;
    if (b.has_prefill()) ++rep.prefill_batches;
    else {
      ++rep.decode_batches;
      decode_sum += static_cast<double>(b.items.size());
      ++decode_count;
    }
    if (b.phase != prev_phase) ++phases;
    prev_phase = b.phase;
    for (const ir::ServeItem& i : b.items) {
      const std::size_t r = static_cast<std::size_t>(i.request);
      if (i.position == 0 && seen[r]) ++rep.recomputed;
      seen[r] = 1;
      const int produced = i.position + i.tokens - sv.requests[r].prompt;
      if (produced == 0) first[r] = t;
      last[r] = t;
    }
  }
  rep.phases = phases;
  rep.mean_decode_batch = decode_count ? decode_sum / decode_count : 0;
  std::vector<double> ttft, tpot;
  for (std::size_t r = 0; r < sv.requests.size(); ++r) {
    ttft.push_back(first[r]);
    if (sv.requests[r].output > 1) tpot.push_back((last[r] - first[r]) / (sv.requests[r].output - 1));
  }
  rep.ttft = distribution_of(std::move(ttft));
  rep.tpot = distribution_of(std::move(tpot));
  if (rep.makespan_seconds > 0) {
    rep.output_tokens_per_second = static_cast<double>(rep.output_tokens) / rep.makespan_seconds;
    rep.total_tokens_per_second = static_cast<double>(rep.output_tokens + rep.prompt_tokens) / rep.makespan_seconds;
    rep.requests_per_second = rep.requests / rep.makespan_seconds;
  }

  for (int r = 0; r < P; ++r) {
    auto& list = ops[static_cast<std::size_t>(r)];
    std::sort(list.begin(), list.end(), [](const TraceEvent* a, const TraceEvent* b) { return a->start_ns < b->start_ns; });
    StageTime st;
    if (r < static_cast<int>(sv.kv_capacity_bytes.size())) st.kv_capacity_bytes = sv.kv_capacity_bytes[static_cast<std::size_t>(r)];
    std::int64_t cursor = origin;
    double kv_area = 0, kv_now = 0;
    int phase = -1;
    for (const TraceEvent* e : list) {
      const double gap = static_cast<double>(std::max<std::int64_t>(0, e->start_ns - cursor)) * 1e-9;
      const int ph = sv.batches[static_cast<std::size_t>(e->mb)].phase;
      if (phase < 0) st.fill_drain_seconds += gap;
      else if (ph != phase) st.phase_switch_seconds += gap;
      else st.imbalance_seconds += gap;
      kv_area += kv_now * static_cast<double>(std::max<std::int64_t>(0, e->end_ns() - std::max(cursor, origin))) * 1e-9;
      st.busy_seconds += static_cast<double>(e->dur_ns) * 1e-9;
      cursor = std::max(cursor, e->end_ns());
      kv_now = static_cast<double>(e->bytes);
      st.peak_kv_bytes = std::max(st.peak_kv_bytes, kv_now);
      phase = ph;
    }
    st.fill_drain_seconds += static_cast<double>(std::max<std::int64_t>(0, makespan - cursor)) * 1e-9;
    kv_area += kv_now * static_cast<double>(std::max<std::int64_t>(0, makespan - cursor)) * 1e-9;
    st.mean_kv_bytes = rep.makespan_seconds > 0 ? kv_area / rep.makespan_seconds : 0;
    rep.stage.push_back(st);
  }
  return rep;
}

nlohmann::json to_json(const ServingReport& r) {
  auto dist = [](const Distribution& d) {
    return nlohmann::json{{"mean", d.mean}, {"p50", d.p50}, {"p90", d.p90}, {"p99", d.p99}, {"max", d.max}};
  };
  nlohmann::json stages = nlohmann::json::array();
  for (const StageTime& s : r.stage)
    stages.push_back({{"busy_seconds", s.busy_seconds},
                      {"fill_drain_seconds", s.fill_drain_seconds},
                      {"phase_switch_seconds", s.phase_switch_seconds},
                      {"imbalance_seconds", s.imbalance_seconds},
                      {"peak_kv_bytes", s.peak_kv_bytes},
                      {"mean_kv_bytes", s.mean_kv_bytes},
                      {"kv_capacity_bytes", s.kv_capacity_bytes}});
  return {{"planner", r.planner},
          {"origin", r.origin},
          {"stages", r.stages},
          {"tensor", r.tensor},
          {"requests", r.requests},
          {"prompt_tokens", r.prompt_tokens},
          {"output_tokens", r.output_tokens},
          {"batches", r.batches},
          {"prefill_batches", r.prefill_batches},
          {"decode_batches", r.decode_batches},
          {"phases", r.phases},
          {"recomputed_prefills", r.recomputed},
          {"mean_decode_batch", r.mean_decode_batch},
          {"makespan_seconds", r.makespan_seconds},
          {"output_tokens_per_second", r.output_tokens_per_second},
          {"total_tokens_per_second", r.total_tokens_per_second},
          {"requests_per_second", r.requests_per_second},
          {"ttft_seconds", dist(r.ttft)},
          {"tpot_seconds", dist(r.tpot)},
          {"stage", std::move(stages)}};
}

}  // namespace tdpipe::traces
