// schedule_report.cpp — per-schedule figures from a plan and its timeline.
#include "tdpipe/planner/schedule_report.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tdpipe/planner/cost_model.hpp"
#include "tdpipe/traces/metrics.hpp"

namespace tdpipe::planner {

double model_flops_per_iteration(const ir::Scenario& sc) {
  if (sc.synthetic) return 0;
  const auto& m = sc.model;
  const double tokens = double(sc.parallel.global_batch) * m.seq;
  const double h = m.hidden, s = m.seq, f = m.ffn;
  // Forward per token and layer: QKV + projection 8h², MLP 4h·ffn, attention
  // scores and values 4·s·h (Megatron counts them without causal halving).
  const double layer_fwd = 8 * h * h + 4 * h * f + 4 * s * h;
  const double head_fwd = 2 * h * m.vocab;
  return 3 * tokens * (m.layers * layer_fwd + head_fwd);
}

ScheduleReport make_report(const BuiltPlan& built, const traces::Trace& trace,
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
  if (r.iteration_seconds > 0) {
    r.tokens_per_second = double(sc.parallel.global_batch) * sc.model.seq / r.iteration_seconds;
    double peak_sum = 0;
    for (const auto& g : sc.cluster.groups)
      peak_sum += g.gpu.peak_flops * g.nodes * sc.cluster.gpus_per_node;
    const int used = sc.parallel.tensor * sc.parallel.pipeline * sc.parallel.data;
    const double mean_peak = peak_sum / std::max(1, sc.cluster.gpus());
    r.mfu = model_flops_per_iteration(sc) / (r.iteration_seconds * used * mean_peak);
  }
  const auto memory = memory_per_rank(plan, sc);
  for (const auto& m : memory) r.peak_memory_bytes_per_rank.push_back(m.total_bytes());
  if (auto verdict = check_fits(memory, sc)) {
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

}  // namespace tdpipe::planner
