// test_schedule_auto.cpp — the memory-bounded `auto` scheduler: against the zero-bubble
// templates on the paper's op times, optimal where a lower bound proves it, 1F1B with W
// fused, slices, determinism, and its memory budget checked by the validator.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/replay.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/planner/generators.hpp"

using namespace tdpipe;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

const std::filesystem::path kScenarioDir = std::filesystem::path(TDPIPE_SOURCE_DIR) / "scenarios";

ir::Scenario with_budget(ir::Scenario sc, const std::string& budget) {
  sc.parallel.memory_budget = budget;
  return sc;
}

/// Iteration time (ns) of the analytic engine on the built plan.
std::int64_t iteration_ns(const ir::Scenario& sc, const std::string& schedule, int slices = 0) {
  const planner::BuiltPlan built = planner::build_plan(sc, schedule, slices);
  return ir::replay(built.lowered, planner::analytic_durations(built.lowered)).makespan_ns;
}

ir::Scenario uniform(int p, int m, int S = 1) {
  return ir::parse_scenario("synthetic: {stages: " + std::to_string(p) + ", microbatches: " + std::to_string(m) +
                                ", slices: " + std::to_string(S) + ", time: {F: 1000, B: 1000, W: 1000}}\n",
                            "uniform.yaml");
}

/// Unit F, B, W; an F holds one unit until its B; `budget` units per rank; no latency.
planner::AutoCosts unit_costs(int p, int budget) {
  planner::AutoCosts c;
  const std::vector<std::vector<double>> one(p, std::vector<double>(1, 1.0));
  c.f_seconds = c.b_seconds = c.w_seconds = c.f_bytes = one;
  c.b_bytes = std::vector<std::vector<double>>(p, std::vector<double>(1, -1.0));
  c.w_bytes = std::vector<std::vector<double>>(p, std::vector<double>(1, 0.0));
  c.p2p_seconds.assign(p - 1, 0.0);
  c.budget_bytes.assign(p, budget);
  return c;
}

/// The exact optimum for unit ops: breadth-first over time steps of every choice each
/// rank can make (idle, or any ready F, B or W — micro-batches are alike, so F's, B's
/// and W's in order lose nothing); a state is how many F, B, W each rank has done.
std::int64_t optimal_makespan(int p, int m, int budget) {
  auto get = [](std::uint64_t s, int i) { return static_cast<int>((s >> (3 * i)) & 7); };
  auto bump = [](std::uint64_t s, int i) { return s + (std::uint64_t{1} << (3 * i)); };
  std::uint64_t done = 0;
  for (int i = 0; i < 3 * p; ++i) done |= std::uint64_t(m) << (3 * i);
  std::unordered_set<std::uint64_t> layer = {0};
  for (std::int64_t t = 0;; ++t) {
    if (layer.count(done)) return t;
    std::unordered_set<std::uint64_t> next;
    for (std::uint64_t s : layer) {
      std::vector<std::uint64_t> states = {s};
      for (int r = 0; r < p; ++r) {
        const int f = get(s, 3 * r), b = get(s, 3 * r + 1), w = get(s, 3 * r + 2);
        std::vector<int> moves;  // field index to bump; -1: idle
        // Idling while a W is ready never helps: the W has no successor, so running it
        // now and idling at its later slot instead leaves every other op where it was.
        if (w < b) moves.push_back(3 * r + 2); else moves.push_back(-1);
        if (f < m && (r == 0 || get(s, 3 * (r - 1)) > f) && f - b < budget) moves.push_back(3 * r);
        if (b < f && (r == p - 1 || get(s, 3 * (r + 1) + 1) > b)) moves.push_back(3 * r + 1);
        std::vector<std::uint64_t> grown;
        for (std::uint64_t x : states)
          for (int mv : moves) grown.push_back(mv < 0 ? x : bump(x, mv));
        states = std::move(grown);
      }
      next.insert(states.begin(), states.end());
    }
    layer = std::move(next);
  }
}

}  // namespace

TEST_CASE("auto beats ZB-H1 at 1F1B's budget and ZB-H2 at twice it on the paper's op times", "[planner][auto]") {
  const ir::Scenario zb = ir::load_scenario((kScenarioDir / "synthetic-zb-p8-m24.yaml").string());
  const std::int64_t h1 = iteration_ns(zb, "zb-h1"), h2 = iteration_ns(zb, "zb-h2");
  const std::int64_t auto1 = iteration_ns(with_budget(zb, "1f1b"), "auto");
  const std::int64_t auto2 = iteration_ns(with_budget(zb, "2x1f1b"), "auto");
  INFO("zb-h1 " << h1 << " ns, auto:1f1b " << auto1 << " ns, zb-h2 " << h2 << " ns, auto:2x1f1b " << auto2);
  CHECK(auto1 <= h1);
  CHECK(auto2 <= h2);
  CHECK(auto2 <= auto1);  // more memory never hurts
  CHECK(auto1 < iteration_ns(zb, "1f1b"));
}

TEST_CASE("auto is optimal with uniform costs and no latency (exact search oracle)", "[planner][auto]") {
  // Budgets in micro-batches held from F to B: 1, 2, p (1F1B's) and 2p.
  for (int p = 1; p <= 4; ++p)
    for (int m = 1; m <= 6; ++m)
      for (int budget : {1, 2, p, 2 * p}) {
        planner::ScheduleParams params;
        params.stages = p;
        params.microbatches = m;
        params.auto_costs = unit_costs(p, budget);
        const ir::Plan plan = planner::make_schedule("auto", params);
        auto unit = [](const ir::Op& op, int) -> std::int64_t { return ir::is_compute(op.kind) ? 1 : 0; };
        INFO("p=" << p << " m=" << m << " budget " << budget);
        CHECK(ir::replay(plan, unit).makespan_ns == optimal_makespan(p, m, budget));
      }
}

TEST_CASE("auto with W fused and a budget of p micro-batches idles what 1F1B idles", "[planner][auto]") {
  for (int p : {2, 3, 4, 6})
    for (int m : {1, 4, 8, 13}) {
      planner::ScheduleParams params;
      params.stages = p;
      params.microbatches = m;
      params.auto_costs.split_backward = false;  // unit costs: F = 1, BW = B + W = 2
      const ir::Plan plan = planner::make_schedule("auto", params);
      for (const auto& ops : plan.ranks)
        REQUIRE(std::none_of(ops.begin(), ops.end(), [](const ir::Op& o) { return o.kind == ir::OpKind::W; }));
      auto unit = [](const ir::Op& op, int) -> std::int64_t {
        return op.kind == ir::OpKind::F ? 1 : op.kind == ir::OpKind::BW ? 2 : 0;
      };
      const auto result = ir::replay(plan, unit);
      INFO("p=" << p << " m=" << m);
      // 1F1B: every rank busy 3m, idle (p−1)(F+BW) = 3(p−1).
      CHECK(result.makespan_ns == 3 * m + 3 * (p - 1));
    }
}

TEST_CASE("auto schedules temporal slices and slicing shrinks the bubble",
          "[planner][auto][slices]") {
  const ir::Scenario sc = uniform(4, 8);
  const std::int64_t s1 = iteration_ns(sc, "auto", 1);
  const std::int64_t s4 = iteration_ns(sc, "auto", 4);
  CHECK(s4 < s1);
  const planner::BuiltPlan built = planner::build_plan(sc, "auto", 4);
  CHECK(built.lowered.slices == 4);
  // Backward of a micro-batch's slices in reverse order on every rank.
  for (const auto& ops : built.compute_only.ranks) {
    std::vector<int> last_b_slice(8, 4);
    for (const ir::Op& o : ops)
      if (o.kind == ir::OpKind::B) {
        CHECK(o.slice == last_b_slice[o.mb] - 1);
        last_b_slice[o.mb] = o.slice;
      }
  }
}

TEST_CASE("auto is deterministic", "[planner][auto]") {
  const ir::Scenario sc = uniform(8, 24);
  CHECK(planner::build_plan(sc, "auto").compute_only == planner::build_plan(sc, "auto").compute_only);
  const ir::Scenario gpt3 = ir::load_scenario((kScenarioDir / "gpt3-175b-a100-8x8.yaml").string());
  CHECK(ir::to_text(planner::build_plan(gpt3, "auto").compute_only) ==
        ir::to_text(planner::build_plan(gpt3, "auto").compute_only));
}

TEST_CASE("auto's memory budget is honoured and reported by the validator and refused when too small", "[planner][auto]") {
  const ir::Scenario gpt3 = ir::load_scenario((kScenarioDir / "gpt3-175b-a100-8x8.yaml").string());
  for (const char* budget : {"1f1b", "2x1f1b", "max", "20"}) {
    INFO(budget);
    const planner::BuiltPlan built = planner::build_plan(with_budget(gpt3, budget), "auto");
    REQUIRE(built.report.ranks.size() == 8);
    for (const auto& r : built.report.ranks) {
      CHECK(r.budget_bytes > 0);
      CHECK(r.peak_activation_bytes <= r.budget_bytes * (1 + 1e-9));
    }
    if (std::string(budget) == "20") CHECK(built.report.ranks[0].budget_bytes == 20.0 * (1u << 30));
  }
  // The 1F1B budget is p micro-batches on every rank: rank 0 holds exactly what 1F1B holds.
  const planner::BuiltPlan one = planner::build_plan(with_budget(gpt3, "1f1b"), "auto");
  const planner::BuiltPlan ref = planner::build_plan(gpt3, "1f1b");
  CHECK(one.report.ranks[0].peak_activation_bytes <= ref.report.ranks[0].peak_activation_bytes * (1 + 1e-9));

  CHECK_THROWS_WITH(planner::build_plan(with_budget(gpt3, "0.01"), "auto"),
                    Contains("parallel.memory_budget 0.01: rank 0 may hold 0.01 GiB of activations but one "
                             "micro-batch needs"));
  // The validator refuses a plan whose peak exceeds the budget it carries.
  planner::BuiltPlan tight = planner::build_plan(with_budget(gpt3, "1f1b"), "auto");
  tight.lowered.memory_budget_bytes[3] = tight.report.ranks[3].peak_activation_bytes / 2;
  CHECK_THROWS_WITH(ir::validate(tight.lowered), StartsWith("rank 3: peak activation memory"));
  // A synthetic scenario without activation sizes has no GiB budget.
  CHECK_THROWS_WITH(planner::build_plan(with_budget(uniform(4, 8), "12"), "auto"),
                    Contains("needs activation sizes"));
}

TEST_CASE("parallel.memory_budget is read and checked and round-tripped", "[planner][auto][scenario]") {
  const std::string base =
      "model: {layers: 8, hidden: 64, heads: 4, seq: 32, vocab: 64}\n"
      "cluster: {gpu: cpu, nodes: 1, gpus_per_node: 4}\n"
      "parallel:\n"
      "  pipeline: 4\n"
      "  global_batch: 8\n";
  CHECK(ir::parse_scenario(base, "s.yaml").parallel.memory_budget == "max");
  const ir::Scenario s = ir::parse_scenario(base + "  memory_budget: 2x1f1b\n", "s.yaml");
  CHECK(s.parallel.memory_budget == "2x1f1b");
  CHECK(ir::scenario_from_json(ir::to_json(s)) == s);
  CHECK(ir::parse_scenario(base + "  memory_budget: 12.5\n", "s.yaml").parallel.memory_budget == "12.5");
  CHECK_THROWS_WITH(ir::parse_scenario(base + "  memory_budget: lots\n", "s.yaml"),
                    "s.yaml:6: parallel.memory_budget: expected 1f1b, 2x1f1b, max or a positive number of GiB, "
                    "got \"lots\"");
  CHECK_THROWS_WITH(ir::parse_scenario(base + "  memory_budget: -3\n", "s.yaml"), StartsWith("s.yaml:6:"));
}
