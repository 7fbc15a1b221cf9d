// test_partition.cpp — uneven stage partitions (parallel.layers_per_stage: list | auto)
// and TeraPipe's slice cuts (slices: auto): the dynamic programmes against brute-force
// oracles, and the plans, costs and memory that follow them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/cost_model.hpp"

#include "planner_test_util.hpp"

using namespace tdpipe;
using planner::test::scenario_path;

namespace {

/// Every composition of `total` into `parts` parts ≥ 1, in lexicographic order.
void compositions(int total, int parts, std::vector<int>& prefix, const std::function<void(const std::vector<int>&)>& f) {
  if (parts == 1) {
    prefix.push_back(total);
    f(prefix);
    prefix.pop_back();
    return;
  }
  for (int n = 1; n <= total - (parts - 1); ++n) {
    prefix.push_back(n);
    compositions(total - n, parts - 1, prefix, f);
    prefix.pop_back();
  }
}

/// Seconds of one F+B+W per virtual stage of a built plan (micro-batch 0, all slices).
std::vector<double> stage_seconds(const ir::Plan& plan) {
  std::vector<double> out(static_cast<std::size_t>(plan.virtual_stages()), 0.0);
  for (int r = 0; r < plan.num_ranks(); ++r)
    for (const ir::Op& op : plan.ranks[r])
      if (ir::is_compute(op.kind) && op.kind != ir::OpKind::OPT && op.mb == 0)
        out[static_cast<std::size_t>(plan.stage_of[r][op.chunk])] += op.est_seconds;
  return out;
}

}  // namespace

TEST_CASE("partition_by is the exact min-max partition - then the most even - then earlier stages lighter", "[planner][partition]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> per(0.5, 2.0), fix(0.0, 3.0);
  for (int trial = 0; trial < 40; ++trial) {
    const int V = 1 + trial % 5, L = V + static_cast<int>(rng() % 9);
    std::vector<double> per_layer(V), fixed(V);
    for (int k = 0; k < V; ++k) {
      // Integer costs on some trials, so ties happen and the tie rule is exercised.
      per_layer[k] = trial % 2 ? std::round(per(rng)) : per(rng);
      fixed[k] = trial % 2 ? std::round(fix(rng)) : fix(rng);
    }
    auto bottleneck = [&](const std::vector<int>& parts) {
      double worst = 0;
      for (int k = 0; k < V; ++k) worst = std::max(worst, parts[k] * per_layer[k] + fixed[k]);
      return worst;
    };
    auto squares = [&](const std::vector<int>& parts) {
      double h = 0;
      for (int k = 0; k < V; ++k) h += (parts[k] * per_layer[k] + fixed[k]) * (parts[k] * per_layer[k] + fixed[k]);
      return h;
    };
    // Values equal up to rounding are ties (relative 1e-9 here, far above rounding and far
    // below any real difference of these costs).
    auto same = [](double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b)); };
    double best = std::numeric_limits<double>::infinity();
    std::vector<int> prefix;
    compositions(L, V, prefix, [&](const std::vector<int>& c) { best = std::min(best, bottleneck(c)); });
    double least = std::numeric_limits<double>::infinity();
    compositions(L, V, prefix, [&](const std::vector<int>& c) {
      if (same(bottleneck(c), best)) least = std::min(least, squares(c));
    });
    std::vector<int> first_best;  // compositions come in lexicographic order
    compositions(L, V, prefix, [&](const std::vector<int>& c) {
      if (first_best.empty() && same(bottleneck(c), best) && same(squares(c), least)) first_best = c;
    });
    const std::vector<int> got = planner::partition_by(L, per_layer, fixed);
    INFO("trial " << trial << " L " << L << " V " << V);
    REQUIRE(static_cast<int>(got.size()) == V);
    CHECK(std::accumulate(got.begin(), got.end(), 0) == L);
    CHECK(same(bottleneck(got), best));
    // Then the most even, then the lexicographically first (earlier stages lighter).
    CHECK(got == first_best);
  }
  // Closed forms: equal stages split evenly; a head worth 1.5 layers on the last stage of
  // 32 layers over 4 stages: bottleneck 9 (the last stage at most 7), and of the
  // partitions reaching it 8, 8, 9, 7 is the most even and first.
  CHECK(planner::partition_by(12, {1, 1, 1}, {0, 0, 0}) == std::vector<int>{4, 4, 4});
  // Uniform non-integer costs, layers not dividing: the extra layers go last, whatever
  // order the squares were summed in (0.1 and 0.0029 are not exact in binary).
  for (double c : {0.1, 0.0029, 0.3}) {
    INFO("per-layer cost " << c);
    CHECK(planner::partition_by(97, std::vector<double>(8, c), std::vector<double>(8, 0.0)) ==
          std::vector<int>{12, 12, 12, 12, 12, 12, 12, 13});
    CHECK(planner::partition_by(13, std::vector<double>(3, c), std::vector<double>(3, 0.0)) ==
          std::vector<int>{4, 4, 5});
    CHECK(planner::partition_by(30, std::vector<double>(8, c), std::vector<double>(8, 0.0)) ==
          std::vector<int>{3, 3, 4, 4, 4, 4, 4, 4});
  }
  CHECK_THROWS_WITH(planner::partition_by(100000, std::vector<double>(1000, 1.0), std::vector<double>(1000, 0.0)),
                    Catch::Contains("give parallel.layers_per_stage as a list"));
  CHECK_THROWS_WITH(planner::partition_by(4, {1, std::nan("")}, {0, 0}), Catch::Contains("expected finite costs"));
  CHECK(planner::partition_by(32, {1, 1, 1, 1}, {0, 0, 0, 1.5}) == std::vector<int>{8, 8, 9, 7});
  CHECK_THROWS_WITH(planner::partition_by(2, {1, 1, 1}, {0, 0, 0}), Catch::Contains("at least one layer per stage"));
}

TEST_CASE("layers_per_stage auto balances the cost model's stages - given lists are honoured", "[planner][partition]") {
  // A 1.3B-class GPT (hidden 2048, vocab 51200: the LM head costs about two layers) cut
  // into 8 stages of 4 layers on a DGX A100 node.
  const auto gpt = [] {
    ir::Scenario s = ir::load_scenario(scenario_path("gpt3-175b-a100-8x8.yaml"));
    s.model.layers = 32;
    s.model.hidden = 2048;
    s.model.heads = 16;
    s.model.ffn = 8192;
    s.parallel.tensor = 1;
    s.parallel.sequence_parallel = false;
    s.cluster.groups[0].nodes = 1;
    s.parallel.global_batch = 16;
    return s;
  };
  ir::Scenario sc = gpt();
  const int L = sc.model.layers, p = sc.parallel.pipeline;
  REQUIRE(p == 8);
  SECTION("auto: the LM head's stage gets fewer layers, and no stage costs more than an even split's worst") {
    const auto even = planner::build_plan(sc, "1f1b");
    sc.parallel.layers_per_stage_auto = true;
    const auto balanced = planner::build_plan(sc, "1f1b");
    const std::vector<int>& parts = balanced.lowered.stage_layers;
    REQUIRE(static_cast<int>(parts.size()) == p);
    CHECK(std::accumulate(parts.begin(), parts.end(), 0) == L);
    CHECK(parts.back() < L / p);
    const auto t_even = stage_seconds(even.lowered), t_bal = stage_seconds(balanced.lowered);
    CHECK(*std::max_element(t_bal.begin(), t_bal.end()) < *std::max_element(t_even.begin(), t_even.end()));
    // And it is the min-max: moving one layer between neighbours never lowers the worst stage.
    ir::Scenario moved = sc;
    moved.parallel.layers_per_stage_auto = false;
    for (int k = 0; k + 1 < p; ++k)
      for (int dir : {-1, 1}) {
        std::vector<int> q = parts;
        q[k] += dir;
        q[k + 1] -= dir;
        if (q[k] < 1 || q[k + 1] < 1) continue;
        moved.parallel.layers_per_stage = q;
        const auto t = stage_seconds(planner::build_plan(moved, "1f1b").lowered);
        CHECK(*std::max_element(t.begin(), t.end()) >= *std::max_element(t_bal.begin(), t_bal.end()) - 1e-15);
      }
  }
  SECTION("a given list: costs, gradient buckets and memory follow it") {
    std::vector<int> parts(static_cast<std::size_t>(p), L / p);
    parts[0] -= 1;
    parts[1] += 1;
    sc.parallel.layers_per_stage = parts;
    const auto built = planner::build_plan(sc, "1f1b");
    CHECK(built.lowered.stage_layers == parts);
    const auto t = stage_seconds(built.lowered);
    // Middle stages 1 and 2 differ by exactly one layer's F+B+W.
    const ir::Plan even_plan = planner::build_plan(gpt(), "1f1b").lowered;
    const auto even = stage_seconds(even_plan);
    const double one_layer = t[1] - even[1];
    CHECK(one_layer > 0);
    CHECK(t[0] == Approx(even[0] - one_layer).epsilon(1e-9));
    const auto mem = planner::memory_per_rank(built.lowered, sc);
    const auto mem_even = planner::memory_per_rank(even_plan, sc);
    CHECK(mem[1].weights_bytes > mem_even[1].weights_bytes);
    CHECK(mem[0].weights_bytes < mem_even[0].weights_bytes);
    CHECK(mem[2].weights_bytes == Approx(mem_even[2].weights_bytes));
    CHECK(mem[1].activation_bytes == Approx(mem_even[1].activation_bytes * (L / p + 1) / (L / p)).epsilon(1e-9));
  }
  SECTION("a list for p stages cannot run a two-chunk schedule") {
    sc.parallel.layers_per_stage = std::vector<int>(static_cast<std::size_t>(p), L / p);
    CHECK_THROWS_WITH(planner::build_plan(sc, "zb-v"),
                      Catch::Contains("parallel.layers_per_stage lists") && Catch::Contains("give " + std::to_string(2 * p)));
    sc.parallel.layers_per_stage_auto = true;
    sc.parallel.layers_per_stage.clear();
    CHECK(planner::build_plan(sc, "zb-v").lowered.stage_layers.size() == static_cast<std::size_t>(2 * p));
  }
}

TEST_CASE("auto partition gives the faster GPUs of a mixed cluster more layers", "[planner][partition]") {
  ir::Scenario sc = ir::load_scenario(scenario_path("mixed-a100-h100.yaml"));
  sc.parallel.layers_per_stage_auto = true;
  const auto built = planner::build_plan(sc, "1f1b");
  const std::vector<int>& parts = built.lowered.stage_layers;
  REQUIRE(parts.size() == 4);
  // Stages 0–1 on A100s, 2–3 on H100s (≈3× the peak): the H100 stages hold more.
  CHECK(parts[2] > parts[1]);
  CHECK(parts[2] + parts[3] > parts[0] + parts[1]);
  const auto t = stage_seconds(built.lowered);
  const auto even_t = stage_seconds(planner::build_plan(ir::load_scenario(scenario_path("mixed-a100-h100.yaml")),
                                                        "1f1b").lowered);
  CHECK(*std::max_element(t.begin(), t.end()) < 0.8 * *std::max_element(even_t.begin(), even_t.end()));
}

TEST_CASE("TeraPipe's slice DP finds the optimum of the grid - more slices as the pipeline deepens", "[planner][slices]") {
  // compute(len, prefix): a fixed per-slice overhead, linear work and a causal-attention
  // term growing with the prefix; transfer: latency + bytes.
  const double overhead = 0.05;
  auto compute = [&](double len, double prefix) { return overhead + len * (1.0 + 0.02 * (prefix + len / 2)); };
  auto transfer = [](double len) { return 0.01 + 0.001 * len; };
  const int seq = 12;
  for (int p : {1, 2, 4, 8})
    for (int m : {1, 3, 16}) {
      double best = std::numeric_limits<double>::infinity();
      std::vector<int> prefix;
      for (int S = 1; S <= seq; ++S)
        compositions(seq, S, prefix, [&](const std::vector<int>& c) {
          double sum = 0, worst = 0, at = 0;
          for (int len : c) {
            sum += compute(len, at);
            worst = std::max(worst, compute(len, at) + transfer(len));
            at += len;
          }
          best = std::min(best, m * sum + (p - 1) * worst);
        });
      const std::vector<int> got = planner::solve_slices_terapipe(seq, p, m, 64, compute, transfer);
      double sum = 0, worst = 0, at = 0;
      for (int len : got) {
        CHECK(len >= 1);
        sum += compute(len, at);
        worst = std::max(worst, compute(len, at) + transfer(len));
        at += len;
      }
      INFO("p " << p << " m " << m << " S " << got.size());
      CHECK(at == seq);
      CHECK(m * sum + (p - 1) * worst == Approx(best).epsilon(1e-12));
      if (p == 1) CHECK(got.size() == 1);  // no fill to hide: every cut only adds overhead
    }
  // A coarse grid (seq 40 on 8 units, cut points at ⌊40u/8⌋): the optimum over every
  // composition of the 8 units.
  for (int p : {2, 8})
    for (int m : {1, 4}) {
      const int G = 8, long_seq = 40;
      double best = std::numeric_limits<double>::infinity();
      std::vector<int> prefix;
      for (int S = 1; S <= G; ++S)
        compositions(G, S, prefix, [&](const std::vector<int>& units) {
          double sum = 0, worst = 0;
          int u = 0;
          for (int n : units) {
            const double a = long_seq * u / G, b = long_seq * (u + n) / G;
            sum += compute(b - a, a);
            worst = std::max(worst, compute(b - a, a) + transfer(b - a));
            u += n;
          }
          best = std::min(best, m * sum + (p - 1) * worst);
        });
      const std::vector<int> got = planner::solve_slices_terapipe(long_seq, p, m, G, compute, transfer);
      double sum = 0, worst = 0, at = 0;
      for (int len : got) {
        CHECK(len % (long_seq / G) == 0);  // on the grid
        sum += compute(len, at);
        worst = std::max(worst, compute(len, at) + transfer(len));
        at += len;
      }
      INFO("coarse grid: p " << p << " m " << m);
      CHECK(at == long_seq);
      CHECK(m * sum + (p - 1) * worst == Approx(best).epsilon(1e-12));
    }
  // Deeper pipelines with few micro-batches cut finer; later slices (longer prefix) are shorter.
  const auto shallow = planner::solve_slices_terapipe(seq, 2, 16, 64, compute, transfer);
  const auto deep = planner::solve_slices_terapipe(seq, 8, 1, 64, compute, transfer);
  CHECK(deep.size() > shallow.size());
  CHECK(deep.front() >= deep.back());
  CHECK_THROWS_AS(planner::solve_slices_terapipe(0, 2, 2, 8, compute, transfer), Error);
}

TEST_CASE("slices auto puts TeraPipe's cuts in the plan - S follows m and p", "[planner][slices]") {
  ir::Scenario sc = ir::load_scenario(scenario_path("llama7b-128k-a100-8x8.yaml"));
  sc.parallel.slices_auto = true;
  const std::vector<int> cuts = planner::auto_slice_tokens(sc);
  REQUIRE(cuts.size() > 1);  // one 128k sequence per micro-batch, few micro-batches: slicing pays
  CHECK(std::accumulate(cuts.begin(), cuts.end(), 0) == sc.model.seq);
  CHECK(cuts.front() > cuts.back());  // attention's prefix makes later tokens dearer
  for (const char* schedule : {"tdpipe", "auto"}) {
    const auto built = planner::build_plan(sc, schedule);
    CHECK(built.lowered.slice_tokens == cuts);
    CHECK(built.lowered.slices == static_cast<int>(cuts.size()));
  }
  // --slices auto (kAutoSlices) is the same as the scenario's key; other schedules refuse it.
  sc.parallel.slices_auto = false;
  CHECK(planner::build_plan(sc, "tdpipe", planner::kAutoSlices).lowered.slice_tokens == cuts);
  CHECK_THROWS_WITH(planner::build_plan(sc, "1f1b", planner::kAutoSlices), Catch::Contains("--slices auto"));
  // With many micro-batches the fill is small beside the work: fewer (or no) cuts.
  ir::Scenario many = sc;
  many.parallel.global_batch = sc.parallel.global_batch * 64;
  CHECK(planner::auto_slice_tokens(many).size() < cuts.size());
  // A synthetic scenario has no tokens to cut.
  CHECK_THROWS_WITH(planner::auto_slice_tokens(ir::load_scenario(scenario_path("synthetic-zb-p8-m24.yaml"))),
                    Catch::Contains("synthetic"));
}
