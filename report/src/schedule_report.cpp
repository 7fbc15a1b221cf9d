// schedule_report.cpp — per-schedule figures from a plan and its timeline (any engine or run).
#include "tdpipe/report/schedule_report.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tdpipe/planner/cost_model.hpp"
#include "tdpipe/traces/metrics.hpp"

namespace tdpipe::report {

ScheduleReport make_report(const planner::BuiltPlan& built, const traces::Trace& trace,
                           const std::string& engine) {
  const ir::Plan& plan = built.lowered;
  const ir::Scenario& sc = plan.scenario;
  ScheduleReport r;
  r.schedule = plan.schedule;
  r.chunks = plan.chunks;
  r.slices = plan.slices;
  r.engine = engine;
  const traces::Metrics metrics = traces::compute_metrics(trace);
  r.iteration_seconds = double(metrics.iteration_ns) * 1e-9;
  r.bubble_fraction = metrics.bubble_fraction;
  for (const auto& rm : metrics.ranks) r.idle_fraction_per_rank.push_back(rm.idle_fraction);
  for (const auto& rm : built.report.ranks) r.peak_inflight_per_rank.push_back(rm.peak_inflight);

  if (sc.synthetic) {
    for (const auto& rm : built.report.ranks)
      r.peak_memory_bytes_per_rank.push_back(rm.peak_activation_bytes);
    return r;
  }
  r.tokens_per_second = planner::tokens_per_second(sc, r.iteration_seconds);
  r.mfu = planner::mfu(sc, r.iteration_seconds);
  const auto memory = planner::memory_per_rank(plan, sc);
  for (const auto& m : memory) r.peak_memory_bytes_per_rank.push_back(m.total_bytes());
  if (auto verdict = planner::check_fits(memory, sc)) {
    r.fits = false;
    r.fit_message = *verdict;
  }
  return r;
}

nlohmann::json to_json(const ScheduleReport& r) {
  nlohmann::json j;
  j["schedule"] = r.schedule;
  j["engine"] = r.engine;
  j["chunks"] = r.chunks;
  j["slices"] = r.slices;
  j["iteration_time"] = r.iteration_seconds;
  j["bubble_fraction"] = r.bubble_fraction;
  j["idle_fraction_per_rank"] = r.idle_fraction_per_rank;
  j["tokens_per_second"] = r.tokens_per_second;
  j["mfu"] = r.mfu;
  j["peak_memory_bytes_per_rank"] = r.peak_memory_bytes_per_rank;
  j["peak_inflight_per_rank"] = r.peak_inflight_per_rank;
  j["fits"] = r.fits;
  if (!r.fits) j["fit_message"] = r.fit_message;
  return j;
}

}  // namespace tdpipe::report
