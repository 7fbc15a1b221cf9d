// consumer — plans and predicts an installed scenario through find_package(tdpipe).
#include <cstdio>

#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/traces/metrics.hpp"

int main() {
  const auto sc = tdpipe::ir::load_scenario(SCENARIO_DIR "/gpt3-175b-a100-8x8.yaml");
  const auto built = tdpipe::planner::build_plan(sc, "1f1b");
  const auto trace = tdpipe::planner::evaluate(built.lowered);
  std::printf("%s 1f1b %.9f\n", sc.name.c_str(), double(tdpipe::traces::compute_metrics(trace).iteration_ns) * 1e-9);
  return 0;
}
