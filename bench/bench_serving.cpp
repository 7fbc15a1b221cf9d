// bench_serving.cpp — time to plan and predict a serving workload: for each shipped
// serving scenario (5,000 ShareGPT-like requests) and each planner (pp, tp, tdpipe), the
// wall time of generating the requests, planning (scheduler + ops), validating (with the
// deadlock replay), predicting with the analytic engine and computing the report — with
// the plan's batches and ops and the predicted output throughput beside it. The goal is
// ≤ 1 s for planning + the analytic engine. Prints figures; never pass/fail.
//
//   bench_serving [--requests N] [--repeat K] [SCENARIO.yaml …]
//       defaults: 5000 requests, best of 3, the four serve-*-4.yaml scenarios
#include "bench_help.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/ir/validate.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/planner/serving.hpp"
#include "tdpipe/traces/serving_report.hpp"

using namespace tdpipe;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

int main(int argc, char** argv) {
  if (bench::help_requested(argc, argv)) return 0;
  int requests = 5000, repeat = 3;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--requests") && i + 1 < argc) requests = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = std::max(1, std::atoi(argv[++i]));
    else files.emplace_back(argv[i]);
  }
  if (files.empty())
    for (const char* name : {"serve-llama2-13b-l20-pcie-4", "serve-llama2-13b-a100-nvlink-4",
                             "serve-qwen2.5-32b-l20-pcie-4", "serve-qwen2.5-32b-a100-nvlink-4"})
      files.push_back(std::string(TDPIPE_SOURCE_DIR) + "/scenarios/" + name + ".yaml");
  std::printf("%-32s %-7s %8s %8s %9s %9s %9s %9s %9s %11s %10s\n", "scenario", "planner", "batches", "ops",
              "requests", "plan", "validate", "analytic", "report", "plan+pred", "out tok/s");
  for (const auto& file : files) {
    ir::Scenario sc = ir::load_scenario(file);
    sc.serving->requests = requests;
    for (const std::string planner : {"pp", "tp", "tdpipe"}) {
      double best[5] = {1e30, 1e30, 1e30, 1e30, 1e30};
      std::size_t batches = 0, ops = 0;
      double tokens_per_second = 0;
      for (int k = 0; k < repeat; ++k) {
        auto t = Clock::now();
        const auto reqs = ir::serving_requests(*sc.serving);
        best[0] = std::min(best[0], seconds_since(t));
        t = Clock::now();
        const ir::Plan plan = planner::plan_serving(sc, planner, reqs);
        best[1] = std::min(best[1], seconds_since(t));
        t = Clock::now();
        ir::validate(plan);
        best[2] = std::min(best[2], seconds_since(t));
        t = Clock::now();
        const traces::Trace trace = planner::evaluate(plan);
        best[3] = std::min(best[3], seconds_since(t));
        t = Clock::now();
        const auto report = traces::serving_report(plan, trace);
        best[4] = std::min(best[4], seconds_since(t));
        batches = plan.serve->batches.size();
        ops = 0;
        for (const auto& r : plan.ranks) ops += r.size();
        tokens_per_second = report.output_tokens_per_second;
      }
      const std::string name = sc.name.size() > 32 ? sc.name.substr(0, 32) : sc.name;
      std::printf("%-32s %-7s %8zu %8zu %8.3fs %8.3fs %8.3fs %8.3fs %8.3fs %10.3fs %10.0f\n", name.c_str(),
                  planner.c_str(), batches, ops, best[0], best[1], best[2], best[3], best[4],
                  best[0] + best[1] + best[3] + best[4], tokens_per_second);
    }
  }
  return 0;
}
