// schedule_report.hpp — what a timeline means for its plan, computed once for every
// engine and executor (analytic, SimGrid, measured): iteration time, bubble, tokens/s,
// MFU (planner::mfu: Megatron's model FLOPs), peak memory per GPU and whether it fits.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tdpipe/ir/scenario.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::report {

struct ScheduleReport {
  std::string schedule;
  int chunks = 1;
  int slices = 1;
  std::string engine;  ///< analytic | simgrid
  double iteration_seconds = 0;
  double bubble_fraction = 0;
  std::vector<double> idle_fraction_per_rank;
  double tokens_per_second = 0;  ///< 0 for synthetic scenarios
  double mfu = 0;                ///< model FLOPs utilisation; 0 for synthetic scenarios
  std::vector<double> peak_memory_bytes_per_rank;
  std::vector<int> peak_inflight_per_rank;
  bool fits = true;
  std::string fit_message;  ///< "does not fit: needs X GiB of Y GiB on rank r" when it does not
};

/// The report of one schedule from its plan and predicted (or measured) trace.
ScheduleReport make_report(const planner::BuiltPlan& plan, const traces::Trace& trace, const std::string& engine);

nlohmann::json to_json(const ScheduleReport& report);

}  // namespace tdpipe::report
