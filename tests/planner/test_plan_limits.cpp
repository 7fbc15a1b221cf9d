// test_plan_limits.cpp — plans too large to hold are refused before they are built,
// with the estimate and the limit; the estimate bounds every schedule's real size.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <string>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/generators.hpp"

using namespace tdpipe;
using Catch::Matchers::Contains;

namespace {

const std::filesystem::path kScenarioDir = std::filesystem::path(TDPIPE_SOURCE_DIR) / "scenarios";

ir::Scenario synthetic(int p, int m) {
  return ir::parse_scenario("synthetic: {stages: " + std::to_string(p) + ", microbatches: " + std::to_string(m) +
                                ", time: {F: 1, B: 1, W: 1}}\n",
                            "limits.yaml");
}

std::int64_t op_count(const ir::Plan& plan) {
  std::int64_t n = 0;
  for (const auto& ops : plan.ranks) n += static_cast<std::int64_t>(ops.size());
  return n;
}

}  // namespace

TEST_CASE("estimate_ops bounds the lowered plan of every schedule", "[planner][limits]") {
  for (const char* file : {"synthetic-uniform-p4-m8.yaml", "tiny-gpt-cpu.yaml", "gpt3-175b-a100-8x8.yaml",
                           "mixed-a100-h100.yaml", "offload:llama2-70b-a100-4x8.yaml", "offload:tiny-gpt-cpu.yaml"}) {
    // "offload:": the same scenario with parameter offload (a LOAD per layer and F or B).
    std::string name = file;
    const bool offload = name.rfind("offload:", 0) == 0;
    if (offload) name = name.substr(8);
    ir::Scenario sc = ir::load_scenario((kScenarioDir / name).string());
    if (offload) sc.parallel.param_offload = "layers";
    if (offload && sc.model.layers > 8) sc.parallel.global_batch = 16;  // a short plan
    for (const auto& schedule : planner::schedule_names())
      for (int slices : {0, 3}) {
        if (slices && schedule != "tdpipe") continue;
        INFO(file << " " << schedule << " S=" << slices);
        const planner::BuiltPlan built = planner::build_plan(sc, schedule, slices);
        const std::int64_t real = op_count(built.lowered);
        const std::int64_t bound = planner::estimate_ops(sc, schedule, slices);
        CHECK(real <= bound);
        CHECK(bound <= 3 * real + 64 * built.lowered.stages);  // a bound, not a wild guess
      }
  }
}

TEST_CASE("absurd plans are refused up front with the figures, and --max-ops raises the limit",
          "[planner][limits]") {
  const auto t0 = std::chrono::steady_clock::now();
  // m = 1e6 (the 607 MB of plan text) and p = m = 1e4: refused without allocating.
  CHECK_THROWS_WITH(planner::build_plan(synthetic(8, 1000000), "1f1b"),
                    Contains("the 1f1b plan would have up to 56000512 ops (p = 8 stages x m = 1000000 micro-batches "
                             "x v = 1 chunks x S = 1 slices x 7)") &&
                        Contains("the limit is 10000000 ops (--max-ops N raises it)"));
  CHECK_THROWS_WITH(planner::build_plan(synthetic(10000, 10000), "zb-h1"), Contains("up to 700640000 ops"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));  // refused, not attempted

  // The same limit lowered: a plan just over it is refused, a raised limit lets it through.
  const ir::Scenario small = synthetic(4, 8);
  const std::int64_t need = planner::estimate_ops(small, "1f1b");
  CHECK_THROWS_WITH(planner::build_plan(small, "1f1b", 0, need - 1), Contains("--max-ops"));
  CHECK_NOTHROW(planner::build_plan(small, "1f1b", 0, need));
}
