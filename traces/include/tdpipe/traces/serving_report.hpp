// serving_report.hpp — what a serving run achieved, from its plan and any trace of it
// (analytic, SimGrid or measured): throughput, latency distributions, the bubbles of
// each stage by cause, and KV-cache use.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::traces {

/// Mean and percentiles of a set of seconds (nearest rank).
struct Distribution {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
Distribution distribution_of(std::vector<double> values);

/// One stage's time, split: busy (its PREFILL/DECODE ops) and idle by cause —
///  - fill_drain: before its first op and after its last (the pipeline filling and draining);
///  - phase_switch: gaps before an op whose batch belongs to another phase window than the
///    stage's previous op (TD-Pipe's prefill ↔ decode switches);
///  - imbalance: every other gap (a batch waited for a slower stage or for its tokens).
struct StageTime {
  double busy_seconds = 0, fill_drain_seconds = 0, phase_switch_seconds = 0, imbalance_seconds = 0;
  double peak_kv_bytes = 0;     ///< most KV-cache bytes the stage held (its ops' `bytes`)
  double mean_kv_bytes = 0;     ///< time-weighted over the run
  double kv_capacity_bytes = 0; ///< the plan's capacity for the stage
};

struct ServingReport {
  std::string planner;
  std::string origin;  ///< the trace's origin (analytic, simgrid, cpu, …)
  int stages = 0, tensor = 1;
  int requests = 0;
  long long prompt_tokens = 0, output_tokens = 0;
  int batches = 0, prefill_batches = 0, decode_batches = 0;
  int phases = 0;         ///< phase windows (tdpipe); 1 for pp and tp
  int recomputed = 0;     ///< prefills of preempted requests (pp, tp)
  double makespan_seconds = 0;
  double output_tokens_per_second = 0;
  double total_tokens_per_second = 0;  ///< prompt + output tokens
  double requests_per_second = 0;
  Distribution ttft;   ///< time to first token (all requests arrive at 0)
  Distribution tpot;   ///< time per output token after the first, per request with ≥ 2
  std::vector<StageTime> stage;
  double mean_decode_batch = 0;  ///< requests per decode-only batch, on average
};

/// The report of serving plan `plan` as `trace` timed it. Throws tdpipe::Error when the
/// plan has no serving table or the trace lacks a PREFILL/DECODE op of the last stage.
ServingReport serving_report(const ir::Plan& plan, const Trace& trace);

nlohmann::json to_json(const ServingReport& report);

}  // namespace tdpipe::traces
