// test_capacity_fit.cpp — fitting how much of a shared device the ranks get
// (exec::cpu::fit_shared_capacity) from traces made by the shared-device prediction
// itself, whose capacity is known.
#include <catch2/catch.hpp>

#include "exec_test_util.hpp"
#include "tdpipe/exec/cpu/calibrate.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/report/shared_device.hpp"
#include "tdpipe/traces/profile.hpp"

using namespace tdpipe;
using ir::OpKind;

namespace {

// tiny-gpt-cpu on p stages with uniform work per op kind, links ~free, predicted on a
// device of `capacity` shared by every rank.
traces::Trace shared_prediction(const ir::Plan& lowered, double capacity) {
  ir::Plan plan = lowered;
  traces::Profile prof;
  prof.scenario = plan.scenario.name;
  prof.stages = plan.stages;
  prof.ops = {{OpKind::F, -1, -1, 1, 1e-3, 5},
              {OpKind::B, -1, -1, 1, 1.5e-3, 5},
              {OpKind::W, -1, -1, 1, 0.5e-3, 5},
              {OpKind::OPT, -1, -1, 1, 0.25e-3, 5}};
  prof.p2p = {1e-12, 1e18};
  prof.platform.shared_capacity = capacity;
  traces::apply_profile(prof, plan);
  return report::predict_shared(plan, [](const ir::Plan& p) { return planner::evaluate(p); });
}

}  // namespace

TEST_CASE("the shared capacity is recovered from traces of a known one", "[exec][calibrate][sharing]") {
  for (const char* schedule : {"gpipe", "1f1b", "zb-h1"}) {
    const ir::Plan plan = planner::build_plan(exec::test::small_scenario(4, 1, 8, 2), schedule, 1).lowered;
    for (double capacity : {1.0, 1.5, 2.0, 3.0}) {
      CAPTURE(schedule, capacity);
      const traces::Trace t = shared_prediction(plan, capacity);
      const exec::cpu::CapacityFit fit = exec::cpu::fit_shared_capacity(plan, {t}, 4, 1.0);
      CHECK(fit.informative);
      CHECK(fit.capacity == Approx(capacity).margin(0.051));
      CHECK(fit.spread <= fit.spread_at_fallback);
    }
  }
}

TEST_CASE("without overlapping ops the capacity cannot be told: the fallback stays", "[exec][calibrate][sharing]") {
  // One stage: one op at a time, every capacity explains the trace alike.
  const ir::Plan plan = planner::build_plan(exec::test::small_scenario(1, 1, 4, 2), "1f1b", 1).lowered;
  const traces::Trace t = shared_prediction(plan, 1.0);
  const exec::cpu::CapacityFit fit = exec::cpu::fit_shared_capacity(plan, {t}, 4, 2.0);
  CHECK_FALSE(fit.informative);
  CHECK(fit.capacity == 2.0);
}
