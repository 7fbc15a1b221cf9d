// test_balance.cpp — the load balancer: assignments against brute force, the EWMA's
// closed form, slowdowns read from a trace, and re-partitioning that evens the stages.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/balance.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/cost_model.hpp"
#include "tdpipe/planner/evaluator.hpp"

#include "planner_test_util.hpp"

using namespace tdpipe;
using planner::test::scenario_path;

namespace {

double total(const std::vector<std::vector<double>>& c, const std::vector<int>& a) {
  double s = 0;
  for (std::size_t r = 0; r < a.size(); ++r) s += c[r][static_cast<std::size_t>(a[r])];
  return s;
}
double largest(const std::vector<std::vector<double>>& c, const std::vector<int>& a) {
  double s = 0;
  for (std::size_t r = 0; r < a.size(); ++r) s = std::max(s, c[r][static_cast<std::size_t>(a[r])]);
  return s;
}
bool is_permutation_of_n(std::vector<int> a) {
  std::sort(a.begin(), a.end());
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != static_cast<int>(i)) return false;
  return true;
}

}  // namespace

TEST_CASE("Hungarian and bottleneck assignments are optimal against brute force up to 6 stages", "[planner][balance]") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 120; ++trial) {
    const int n = 1 + trial % 6;
    std::vector<std::vector<double>> c(n, std::vector<double>(n));
    for (auto& row : c)
      for (double& x : row) x = trial % 3 == 0 ? double(rng() % 4) : std::uniform_real_distribution<double>(0, 10)(rng);
    std::vector<int> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    double best_sum = std::numeric_limits<double>::infinity(), best_max = best_sum, best_sum_at_max = best_sum;
    do {
      best_sum = std::min(best_sum, total(c, perm));
      best_max = std::min(best_max, largest(c, perm));
    } while (std::next_permutation(perm.begin(), perm.end()));
    std::iota(perm.begin(), perm.end(), 0);
    do {
      if (largest(c, perm) == best_max) best_sum_at_max = std::min(best_sum_at_max, total(c, perm));
    } while (std::next_permutation(perm.begin(), perm.end()));
    INFO("trial " << trial << " n " << n);
    const auto h = planner::min_sum_assignment(c);
    REQUIRE(is_permutation_of_n(h));
    CHECK(total(c, h) == Approx(best_sum).epsilon(1e-12));
    const auto b = planner::bottleneck_assignment(c);
    REQUIRE(is_permutation_of_n(b));
    CHECK(largest(c, b) == best_max);
    CHECK(total(c, b) == Approx(best_sum_at_max).epsilon(1e-12));
  }
  CHECK(planner::min_sum_assignment({}).empty());
  CHECK_THROWS_WITH(planner::min_sum_assignment({{1, 2}, {3}}), Catch::Contains("square"));
  CHECK_THROWS_WITH(planner::bottleneck_assignment({{1, std::numeric_limits<double>::infinity()}, {1, 1}}),
                    Catch::Contains("finite"));
}

TEST_CASE("EWMA: x = alpha*sample + (1-alpha)*x from the first sample", "[planner][balance]") {
  planner::Ewma e(0.25);
  e.add({4, 8});
  CHECK(e.value() == std::vector<double>{4, 8});
  e.add({8, 0});
  CHECK(e.value()[0] == Approx(5));
  CHECK(e.value()[1] == Approx(6));
  e.add({8, 0});
  CHECK(e.value()[0] == Approx(5.75));
  CHECK(e.samples() == 3);
  CHECK_THROWS_WITH(e.add({1}), Catch::Contains("a sample of 1 values after samples of 2"));
  CHECK_THROWS_WITH(planner::Ewma(0), Catch::Contains("expected 0 < alpha"));
  CHECK_THROWS_WITH(planner::Ewma(1.5), Catch::Contains("expected 0 < alpha"));
  planner::Ewma r(0.5);
  r.add({1, 2, 3});
  r.reorder({2, 0, 1});
  CHECK(r.value() == std::vector<double>{3, 1, 2});
}

TEST_CASE("measured slowdown: 1 for the engine's own trace - the factor a slow rank ran at", "[planner][balance]") {
  const ir::Scenario sc = ir::load_scenario(scenario_path("llama2-70b-a100-4x8.yaml"));
  const auto built = planner::build_plan(sc, "1f1b");
  traces::Trace trace = planner::evaluate(built.lowered);
  for (double s : planner::measured_slowdown(sc, built.lowered, trace).device) CHECK(s == Approx(1).epsilon(1e-6));
  for (auto& e : trace.events)
    if (e.rank == 2 && e.kind && ir::is_compute(*e.kind)) e.dur_ns = 3 * e.dur_ns;
  const auto slow = planner::measured_slowdown(sc, built.lowered, trace).device;
  CHECK(slow[2] == Approx(3).epsilon(1e-6));
  CHECK(slow[1] == Approx(1).epsilon(1e-6));
  // A trace that says it ran another partition is refused.
  traces::Trace other_cut = planner::evaluate(built.lowered);
  other_cut.metadata["stage_layers"] = "30,10,20,20";
  CHECK_THROWS_WITH(planner::measured_slowdown(sc, built.lowered, other_cut),
                    Catch::Contains("measured with stage_layers [30,10,20,20], the plan has [20,20,20,20]"));
  // A trace of another schedule does not describe this plan.
  const auto other = planner::build_plan(sc, "zb-h1");
  CHECK_THROWS_WITH(planner::measured_slowdown(sc, built.lowered, planner::evaluate(other.lowered)),
                    Catch::Contains("is not an op of the plan"));
}

TEST_CASE("measured slowdown with the layers' part: device factors move with speed - ends factors do not", "[planner][balance]") {
  const ir::Scenario sc = ir::load_scenario(scenario_path("tiny-gpt-cpu.yaml"));
  const auto built = planner::build_plan(sc, "1f1b");
  const traces::Trace engine = planner::evaluate(built.lowered);
  auto with_layers = [&](double layers_part, int rank, double speed_factor, double ends_factor) {
    traces::Trace t = engine;
    for (auto& e : t.events) {
      if (!e.kind || !ir::is_chunk_work(*e.kind)) continue;
      double layers = layers_part * static_cast<double>(e.dur_ns), rest = static_cast<double>(e.dur_ns) - layers;
      if (e.rank == rank) layers *= speed_factor, rest *= speed_factor * ends_factor;
      e.layers_ns = std::llround(layers);
      e.dur_ns = std::llround(layers + rest);
    }
    return planner::measured_slowdown(sc, built.lowered, t);
  };
  const planner::Slowdown base = with_layers(0.8, -1, 1, 1);
  // A device three times slower: its device factor triples, every ends factor stays.
  const planner::Slowdown slow = with_layers(0.8, 1, 3, 1);
  CHECK(slow.device[1] == Approx(3 * base.device[1]).epsilon(1e-6));
  CHECK(slow.device[0] == Approx(base.device[0]).epsilon(1e-6));
  for (int k = 0; k < 2; ++k) CHECK(slow.ends[k] == Approx(base.ends[k]).epsilon(1e-6));
  // The head (stage 1's ends) twice as long as before: only its ends factor doubles.
  const planner::Slowdown head = with_layers(0.8, 1, 1, 2);
  CHECK(head.device[1] == Approx(base.device[1]).epsilon(1e-6));
  CHECK(head.ends[1] == Approx(2 * base.ends[1]).epsilon(1e-6));
  CHECK(head.ends[0] == Approx(base.ends[0]).epsilon(1e-6));
  // The engine's own trace cut by the cost model's own layer share of each op: every
  // factor is 1 (units, micro-batch count and the share all agree).
  {
    traces::Trace t = engine;
    for (auto& e : t.events) {
      if (!e.kind || !ir::is_chunk_work(*e.kind)) continue;
      const ir::GpuSpec gpu = planner::gpu_of_rank(sc, e.rank);
      const int n = built.lowered.stage_layers[static_cast<std::size_t>(e.rank)];
      double all = 0, none = 0;
      for (ir::OpKind kind : *e.kind == ir::OpKind::BW ? std::vector<ir::OpKind>{ir::OpKind::B, ir::OpKind::W}
                                                         : std::vector<ir::OpKind>{*e.kind}) {
        all += planner::chunk_cost(sc, gpu, kind, e.rank, 2, n, sc.model.seq, 0).seconds;
        none += planner::chunk_cost(sc, gpu, kind, e.rank, 2, 0, sc.model.seq, 0).seconds;
      }
      e.layers_ns = std::llround(static_cast<double>(e.dur_ns) * (all - none) / all);
    }
    const planner::Slowdown own = planner::measured_slowdown(sc, built.lowered, t);
    for (int k = 0; k < 2; ++k) {
      INFO("stage " << k);
      CHECK(own.device[k] == Approx(1).epsilon(1e-3));
      CHECK(own.ends[k] == Approx(1).epsilon(1e-3));
    }
  }
  // Without the layers' part (other engines' traces): the whole ratio, ends as modelled.
  const planner::Slowdown whole = planner::measured_slowdown(sc, built.lowered, engine);
  for (int k = 0; k < 2; ++k) CHECK((whole.device[k] == Approx(1).epsilon(1e-6) && whole.ends[k] == 1));
}

TEST_CASE("rebalance is the best partition by brute force - and a costly head sheds layers", "[planner][balance]") {
  // 12 layers on 4 stages: every one of the 165 partitions, each one's bottleneck read
  // from rebalance's own stage times for it (seconds_before); none beats the balancer's.
  ir::Scenario small = ir::load_scenario(scenario_path("tiny-gpt-cpu.yaml"));
  small.model.layers = 12;
  small.parallel.pipeline = 4;
  small.cluster.gpus_per_node = 4;
  for (const planner::Slowdown& s : {planner::Slowdown{{1, 1, 1, 1}, {1, 1, 1, 1}}, planner::Slowdown{{1, 2, 1, 1}, {}},
                                     planner::Slowdown{{1, 1, 1.5, 1}, {3, 1, 1, 30}}}) {
    const planner::Rebalance b = planner::rebalance(small, s);
    const double best = *std::max_element(b.seconds_after.begin(), b.seconds_after.end());
    double least = std::numeric_limits<double>::infinity();
    for (int a = 1; a <= 9; ++a)
      for (int c = 1; a + c <= 10; ++c)
        for (int d = 1; a + c + d <= 11; ++d) {
          ir::Scenario fixed = small;
          fixed.parallel.layers_per_stage = {a, c, d, 12 - a - c - d};
          const planner::Rebalance f = planner::rebalance(fixed, s);
          least = std::min(least, *std::max_element(f.seconds_before.begin(), f.seconds_before.end()));
        }
    CHECK(best == Approx(least).epsilon(1e-12));
  }
  const ir::Scenario sc = ir::load_scenario(scenario_path("llama2-70b-a100-4x8.yaml"));
  const int last_plain = planner::rebalance(sc, {{1, 1, 1, 1}, {1, 1, 1, 1}}).layers_after[3];
  const int last_costly = planner::rebalance(sc, {{1, 1, 1, 1}, {1, 1, 1, 30}}).layers_after[3];
  CHECK(last_costly < last_plain);
  CHECK_THROWS_WITH(planner::rebalance(sc, {{1, 1, 1, 1}, {1, 1}}), Catch::Contains("expected one per stage"));
  CHECK_THROWS_WITH(planner::rebalance(sc, {{1, 1, 1, 1}, {1, 1, -1, 1}}), Catch::Contains("positive finite"));
}

TEST_CASE("rebalance moves layers off a slow rank until its stages are within 15 percent", "[planner][balance]") {
  const ir::Scenario sc = ir::load_scenario(scenario_path("llama2-70b-a100-4x8.yaml"));
  // Rank 1 runs at half speed (a straggler node): the even split is 2x unbalanced.
  const planner::Rebalance b = planner::rebalance(sc, {{1, 2, 1, 1}, {}});
  CHECK(b.layers_before == std::vector<int>{20, 20, 20, 20});
  CHECK(b.spread_before > 0.9);
  CHECK(std::accumulate(b.layers_after.begin(), b.layers_after.end(), 0) == 80);
  CHECK(b.layers_after[1] < 15);
  CHECK(b.spread_after <= 0.15);
  CHECK(*std::max_element(b.seconds_after.begin(), b.seconds_after.end()) <
        0.7 * *std::max_element(b.seconds_before.begin(), b.seconds_before.end()));
  CHECK(b.scenario.parallel.layers_per_stage == b.layers_after);
  // Uniform GPUs: no reason to move a stage to another slot.
  CHECK(b.device_of_stage == std::vector<int>{0, 1, 2, 3});
  // The balanced scenario plans, and its modelled stage times follow the new layers.
  const auto built = planner::build_plan(b.scenario, "1f1b");
  CHECK(built.lowered.stage_layers == b.layers_after);
}

TEST_CASE("rebalance on the mixed A100 and H100 cluster - H100 stages take more layers", "[planner][balance]") {
  const ir::Scenario sc = ir::load_scenario(scenario_path("mixed-a100-h100.yaml"));
  const planner::Rebalance b = planner::rebalance(sc, {{1, 1, 1, 1}, {}});
  CHECK(b.layers_before == std::vector<int>{20, 20, 20, 20});
  CHECK(b.layers_after[2] + b.layers_after[3] > b.layers_after[0] + b.layers_after[1]);
  CHECK(b.spread_after < b.spread_before);
  CHECK(b.spread_after <= 0.15);
  CHECK(std::accumulate(b.layers_after.begin(), b.layers_after.end(), 0) == 80);
  CHECK(b.scenario.cluster.groups.size() == 2);
  // A slow A100-class H100 node: whatever order the stages end in, each runs on the GPU
  // (and the device) its time was computed for.
  for (const std::vector<double>& slow : {std::vector<double>{1, 1, 2, 1}, {1, 1, 1, 3}, {2, 1, 1, 1}}) {
    const planner::Rebalance m = planner::rebalance(sc, {slow, {}});
    INFO("slowdown " << slow[0] << " " << slow[1] << " " << slow[2] << " " << slow[3]);
    for (int k = 0; k < 4; ++k)
      CHECK(planner::gpu_of_rank(m.scenario, k).name == planner::gpu_of_rank(sc, m.device_of_stage[k]).name);
    for (int k = 1; k < 4; ++k)  // slots keep their order inside a group
      if (planner::gpu_of_rank(sc, m.device_of_stage[k]).name == planner::gpu_of_rank(sc, m.device_of_stage[k - 1]).name)
        CHECK(m.device_of_stage[k] == m.device_of_stage[k - 1] + 1);
    CHECK(m.spread_after < m.spread_before);
  }
  // One group of identical nodes: no order of slots can be written in the scenario.
  const ir::Scenario uniform = ir::load_scenario(scenario_path("llama2-70b-a100-4x8.yaml"));
  for (const std::vector<double>& slow : {std::vector<double>{1, 1, 1, 2}, {3, 1, 1, 1}})
    CHECK(planner::rebalance(uniform, {slow, {}}).device_of_stage == std::vector<int>{0, 1, 2, 3});
  CHECK_THROWS_WITH(planner::rebalance(sc, {{1, 1, 1}, {}}), Catch::Contains("expected one per rank"));
  CHECK_THROWS_WITH(planner::rebalance(sc, {{1, 1, 0, 1}, {}}), Catch::Contains("positive finite"));
}
