// compare.cpp — pairs the ops of a predicted and a measured trace and measures the gap.
#include "tdpipe/traces/compare.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/traces/metrics.hpp"
#include "tdpipe/traces/pairing.hpp"

namespace tdpipe::traces {
namespace {

std::int64_t first_start(const Trace& t) {
  std::int64_t first = std::numeric_limits<std::int64_t>::max();
  for (const auto& e : t.events) first = std::min(first, e.start_ns);
  return t.events.empty() ? 0 : first;
}

ErrorDistribution distribution(const std::vector<double>& errors) {
  ErrorDistribution d;
  d.count = int(errors.size());
  if (errors.empty()) return d;
  d.median = quantile(errors, 0.5);
  d.p90 = quantile(errors, 0.9);
  d.max = *std::max_element(errors.begin(), errors.end());
  return d;
}

nlohmann::json to_json(const ErrorDistribution& d) {
  return {{"count", d.count}, {"median", d.median}, {"p90", d.p90}, {"max", d.max}};
}

}  // namespace

double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double pos = std::clamp(q, 0.0, 1.0) * double(values.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (pos - double(lo)) * (values[hi] - values[lo]);
}

namespace {
// A prediction of one replica's p pipeline ranks, as each of the measured run's d
// replicas: rank r of replica k is measured rank k·p + r (the executors' world order).
Trace replicated(const Trace& t, int d) {
  Trace out = t;
  out.ranks = t.ranks * d;
  out.events.reserve(t.events.size() * static_cast<std::size_t>(d));
  for (int k = 1; k < d; ++k)
    for (const TraceEvent& e : t.events) {
      TraceEvent& c = out.events.emplace_back(e);
      c.rank += k * t.ranks;
      if (c.peer >= 0) c.peer += k * t.ranks;
    }
  return out;
}
}  // namespace

Comparison compare(const Trace& predicted_in, const Trace& measured, const CompareOptions& options) {
  // Data parallelism: the engines predict one replica (the replicas are alike); the
  // executors measure every one. Measured p·d ranks against predicted p: each replica
  // is compared with the prediction.
  int replicas = 1;
  if (predicted_in.ranks > 0 && measured.ranks > predicted_in.ranks && measured.ranks % predicted_in.ranks == 0) {
    replicas = measured.ranks / predicted_in.ranks;
    const auto it = measured.metadata.find("data");
    if (it != measured.metadata.end() && it->second != std::to_string(replicas))
      throw Error(fmt::format("compare: the measured trace has {} ranks, {} data-parallel replicas by its metadata, "
                              "but the predicted one {} ranks: they are not of the same plan",
                              measured.ranks, it->second, predicted_in.ranks));
  }
  const Trace expanded = replicas > 1 ? replicated(predicted_in, replicas) : Trace();
  const Trace& predicted = replicas > 1 ? expanded : predicted_in;
  const Metrics pm = compute_metrics(predicted), mm = compute_metrics(measured);
  if (pm.ranks.size() != mm.ranks.size())
    throw Error(fmt::format("compare: the predicted trace has {} ranks and the measured one {}: "
                            "they are not of the same plan", pm.ranks.size(), mm.ranks.size()));
  Comparison c;
  if (replicas > 1)
    c.warnings.push_back(fmt::format("the prediction's {} pipeline ranks stand for each of the {} measured "
                                     "data-parallel replicas (ranks r, r + {}, …)",
                                     predicted_in.ranks, replicas, predicted_in.ranks));
  c.predicted_origin = predicted.origin;
  c.measured_origin = measured.origin;
  c.schedule = !measured.schedule.empty() ? measured.schedule : predicted.schedule;
  c.scenario = !measured.scenario.empty() ? measured.scenario : predicted.scenario;
  if (!predicted.schedule.empty() && !measured.schedule.empty() && predicted.schedule != measured.schedule)
    c.warnings.push_back(fmt::format("schedules differ: predicted {}, measured {}", predicted.schedule,
                                     measured.schedule));
  if (!predicted.scenario.empty() && !measured.scenario.empty() && predicted.scenario != measured.scenario)
    c.warnings.push_back(fmt::format("scenarios differ: predicted {}, measured {}", predicted.scenario,
                                     measured.scenario));

  c.predicted_iteration_ns = pm.iteration_ns;
  c.measured_iteration_ns = mm.iteration_ns;
  c.iteration_error = mm.iteration_ns > 0
      ? double(pm.iteration_ns - mm.iteration_ns) / double(mm.iteration_ns) : 0;
  c.predicted_bubble = pm.bubble_fraction;
  c.measured_bubble = mm.bubble_fraction;
  c.bubble_error_pp = 100 * (pm.bubble_fraction - mm.bubble_fraction);
  for (std::size_t r = 0; r < pm.ranks.size(); ++r) {
    RankComparison rc;
    rc.rank = int(r);
    rc.predicted_idle = pm.ranks[r].idle_fraction;
    rc.measured_idle = mm.ranks[r].idle_fraction;
    rc.bubble_error_pp = 100 * (rc.predicted_idle - rc.measured_idle);
    c.ranks.push_back(rc);
  }

  const OpPairing pairing = pair_ops(predicted, measured);
  const std::int64_t p0 = first_start(predicted), m0 = first_start(measured);
  std::vector<OpPair> pairs;
  std::vector<double> compute_err, all_err;
  for (std::size_t i = 0; i < predicted.events.size(); ++i) {
    const int j = pairing.pred_to_meas[i];
    if (j < 0) continue;
    const TraceEvent* pe = &predicted.events[i];
    const TraceEvent* me = &measured.events[static_cast<std::size_t>(j)];
    pairs.push_back(OpPair{pe->rank, pe->name, pe->start_ns - p0, me->start_ns - m0, pe->dur_ns, me->dur_ns});
    if (me->dur_ns > 0) {
      const double err = std::abs(double(pe->dur_ns - me->dur_ns)) / double(me->dur_ns);
      all_err.push_back(err);
      const auto kind = me->kind ? me->kind : pe->kind;
      if (kind && ir::is_compute(*kind)) compute_err.push_back(err);
    }
  }
  c.matched = pairing.pairs;
  c.only_predicted = static_cast<int>(predicted.events.size()) - c.matched;
  c.only_measured = static_cast<int>(measured.events.size()) - c.matched;
  if (c.matched == 0 && (!predicted.events.empty() || !measured.events.empty()))
    throw Error(fmt::format("compare: no op of the predicted trace ({} events) has a namesake on the same "
                            "rank in the measured trace ({} events): they are not of the same plan",
                            predicted.events.size(), measured.events.size()));
  c.compute_duration_error = distribution(compute_err);
  c.all_duration_error = distribution(all_err);

  std::stable_sort(pairs.begin(), pairs.end(), [](const OpPair& a, const OpPair& b) {
    return std::llabs(a.drift_ns()) > std::llabs(b.drift_ns());
  });
  if (int(pairs.size()) > options.top_drift) pairs.resize(std::max(0, options.top_drift));
  c.largest_drift = std::move(pairs);
  return c;
}

nlohmann::json to_json(const Comparison& c) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : c.ranks)
    ranks.push_back({{"rank", r.rank}, {"predicted_idle", r.predicted_idle},
                     {"measured_idle", r.measured_idle}, {"bubble_error_pp", r.bubble_error_pp}});
  nlohmann::json drift = nlohmann::json::array();
  for (const auto& p : c.largest_drift)
    drift.push_back({{"rank", p.rank}, {"name", p.name},
                     {"predicted_start", double(p.predicted_start_ns) * 1e-9},
                     {"measured_start", double(p.measured_start_ns) * 1e-9},
                     {"drift", double(p.drift_ns()) * 1e-9},
                     {"predicted_duration", double(p.predicted_dur_ns) * 1e-9},
                     {"measured_duration", double(p.measured_dur_ns) * 1e-9}});
  return {{"predicted_origin", c.predicted_origin},
          {"measured_origin", c.measured_origin},
          {"schedule", c.schedule},
          {"scenario", c.scenario},
          {"predicted_iteration_time", double(c.predicted_iteration_ns) * 1e-9},
          {"measured_iteration_time", double(c.measured_iteration_ns) * 1e-9},
          {"iteration_error", c.iteration_error},
          {"predicted_bubble_fraction", c.predicted_bubble},
          {"measured_bubble_fraction", c.measured_bubble},
          {"bubble_error_pp", c.bubble_error_pp},
          {"ranks", std::move(ranks)},
          {"compute_duration_error", to_json(c.compute_duration_error)},
          {"duration_error", to_json(c.all_duration_error)},
          {"matched_ops", c.matched},
          {"only_predicted", c.only_predicted},
          {"only_measured", c.only_measured},
          {"largest_drift", std::move(drift)},
          {"warnings", c.warnings}};
}

std::string to_text(const Comparison& c) {
  std::string out;
  auto line = [&](fmt::string_view format, const auto&... args) {
    out += fmt::vformat(format, fmt::make_format_args(args...));
    out += '\n';
  };
  line("predicted ({}) vs measured ({}){}{}", c.predicted_origin, c.measured_origin,
       c.schedule.empty() ? "" : ", schedule " + c.schedule, c.scenario.empty() ? "" : ", scenario " + c.scenario);
  for (const auto& w : c.warnings) line("warning: {}", w);
  line("iteration time   {:10.6f} s vs {:10.6f} s   error {:+.2f} %", c.predicted_iteration_ns * 1e-9,
       c.measured_iteration_ns * 1e-9, 100 * c.iteration_error);
  line("bubble           {:9.2f} %  vs {:9.2f} %    error {:+.2f} pp", 100 * c.predicted_bubble,
       100 * c.measured_bubble, c.bubble_error_pp);
  for (const auto& r : c.ranks)
    line("  rank {:3}  idle {:6.2f} % vs {:6.2f} %   error {:+.2f} pp", r.rank, 100 * r.predicted_idle,
         100 * r.measured_idle, r.bubble_error_pp);
  line("op durations (compute, {} ops): |error| median {:.2f} %, p90 {:.2f} %, max {:.2f} %",
       c.compute_duration_error.count, 100 * c.compute_duration_error.median,
       100 * c.compute_duration_error.p90, 100 * c.compute_duration_error.max);
  line("op durations (all, {} ops):     |error| median {:.2f} %, p90 {:.2f} %", c.all_duration_error.count,
       100 * c.all_duration_error.median, 100 * c.all_duration_error.p90);
  line("ops matched {}, only predicted {}, only measured {}", c.matched, c.only_predicted, c.only_measured);
  if (!c.largest_drift.empty()) {
    line("largest start-time drift (measured − predicted):");
    for (const auto& p : c.largest_drift)
      line("  rank {:3}  {:<24} {:+.6f} s", p.rank, p.name, p.drift_ns() * 1e-9);
  }
  return out;
}

}  // namespace tdpipe::traces
