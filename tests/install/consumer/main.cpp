// consumer — plans and predicts an installed scenario through find_package(tdpipe).
#include <cstdio>

#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/traces/metrics.hpp"
#ifdef HAVE_SIM
#include "tdpipe/sim/simulate.hpp"
#endif

int main() {
  const auto sc = tdpipe::ir::load_scenario(SCENARIO_DIR "/gpt3-175b-a100-8x8.yaml");
  const auto built = tdpipe::planner::build_plan(sc, "1f1b");
  const auto trace = tdpipe::planner::evaluate(built.lowered);
  std::printf("%s 1f1b %.9f\n", sc.name.c_str(), double(tdpipe::traces::compute_metrics(trace).iteration_ns) * 1e-9);
  // The executor's and the simulator's libraries link too.
  std::printf("rank groups %zu\n", tdpipe::exec::cpu::rank_groups(4, 2).size());
#ifdef HAVE_SIM
  const auto sim = tdpipe::sim::simulate(built.lowered, {});
  std::printf("simgrid %.9f\n", double(tdpipe::traces::compute_metrics(sim.trace).iteration_ns) * 1e-9);
#endif
  return 0;
}
