// test_equivalence.cpp — the executor's core promise: every schedule, on every
// (p, d) layout, trains exactly like one device (loss, gradients, weights).
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>
#include <tuple>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "exec_test_util.hpp"
#include "tdpipe/exec/cpu/backend.hpp"
#include "tdpipe/exec/cpu/corpus.hpp"
#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/exec/launch_common.hpp"
#include "tdpipe/ir/plan_io.hpp"

namespace tdpipe::exec {
namespace {

using test::max_rel_error;

struct Layout {
  int p, d, m, b;
};

}  // namespace

// Both runtimes (a thread per stream; cooperative streams on a thread per rank, or on one
// thread taking turns between every rank).
TEST_CASE("every schedule matches the single-device run for 3 Adam steps", "[exec][equivalence]") {
  struct Runtimes {
    Runtime runtime;
    bool one_thread;
    const char* name;
  };
  const std::vector<Runtimes> runtimes = {{Runtime::cooperative, false, "cooperative"},
                                          {Runtime::cooperative, true, "cooperative, one thread for all ranks"},
                                          {Runtime::threaded, false, "threaded"}};
  const std::vector<Layout> layouts = {{2, 1, 4, 1}, {4, 1, 8, 1}, {2, 2, 4, 2}};
  const std::vector<std::pair<std::string, int>> schedules = {
      {"gpipe", 1}, {"1f1b", 1}, {"interleaved", 1}, {"zb-h1", 1}, {"zb-h2", 1},
      {"zb-v", 1},  {"tdpipe", 2}, {"tdpipe", 4}};
  constexpr int kSteps = 3;
  for (const Layout& L : layouts) {
    const ir::Scenario sc = test::small_scenario(L.p, L.d, L.m, L.b);
    const cpu::RunResult ref = cpu::run_reference(sc, L.d, L.m, test::train_options(kSteps));
    REQUIRE(ref.loss_per_step.size() == kSteps);
    for (const auto& [runtime, one_thread, runtime_name] : runtimes) {
      for (const auto& [name, slices] : schedules) DYNAMIC_SECTION(
          fmt::format("{} S={} on p={} d={} m={} b={}, {} runtime", name, slices, L.p, L.d, L.m, L.b,
                      runtime_name)) {
        const auto built = planner::build_plan(sc, name, slices);
        REQUIRE(built.lowered.lowered);
        REQUIRE(built.lowered.slices == slices);
        cpu::CpuRunOptions opt;
        opt.train = test::train_options(kSteps);
        opt.runtime = runtime;
        opt.rank_threads = one_thread ? 1 : L.p * L.d;
        const cpu::RunResult got = cpu::run_cpu(built.lowered, opt);
        REQUIRE(got.loss_per_step.size() == kSteps);
        for (int s = 0; s < kSteps; ++s) {
          INFO("step " << s << " loss " << got.loss_per_step[s] << " vs " << ref.loss_per_step[s]);
          CHECK(std::abs(got.loss_per_step[s] - ref.loss_per_step[s]) <=
                1e-5 * std::abs(ref.loss_per_step[s]));
        }
        std::string worst;
        const double grad_err = max_rel_error(got.grads, ref.grads, &worst);
        INFO("worst gradient " << worst << " rel " << grad_err);
        CHECK(grad_err <= 1e-5);
        const double weight_err = max_rel_error(got.weights, ref.weights, &worst);
        INFO("worst weight " << worst << " rel " << weight_err);
        CHECK(weight_err <= 1e-5);
        // Ring all-reduce forms each sum once: replicas stay bit-identical.
        CHECK(got.replica_divergence == 0.0);
      }
    }
  }
}

TEST_CASE("uneven stage partitions and uneven slice cuts match the single-device run", "[exec][equivalence]") {
  // 7 layers do not divide over 2, 3 or 4 stages: each plan carries its stage_layers
  // (given, or by the cost model's min-max partition) and the executor builds exactly
  // those stages; hand-cut uneven slices ride in plan.slice_tokens.
  struct Case {
    int p;
    std::string schedule;
    std::vector<int> layers;  // empty: auto
    int slices;
    std::vector<int> cuts;    // empty: the planner's
  };
  const std::vector<Case> cases = {{2, "1f1b", {2, 5}, 1, {}},        {3, "zb-h1", {1, 3, 3}, 1, {}},
                                   {4, "tdpipe", {1, 2, 3, 1}, 3, {9, 2, 5}}, {2, "interleaved", {}, 1, {}},
                                   {4, "auto", {}, 2, {3, 13}},           {3, "zb-v", {}, 1, {}}};
  constexpr int kSteps = 2;
  for (const Case& c : cases) DYNAMIC_SECTION(fmt::format("{} p={} S={} first stage {}", c.schedule, c.p, c.slices,
                                                          c.layers.empty() ? -1 : c.layers[0])) {
    ir::Scenario sc = test::small_scenario(c.p, 1, 4, 1);
    sc.model.layers = 7;
    sc.parallel.layers_per_stage = c.layers;
    sc.parallel.layers_per_stage_auto = c.layers.empty();
    const cpu::RunResult ref = cpu::run_reference(sc, 1, 4, test::train_options(kSteps));
    auto built = planner::build_plan(sc, c.schedule, c.slices);
    ir::Plan plan = built.lowered;
    long long sum = 0;
    for (int n : plan.stage_layers) sum += n;
    REQUIRE(sum == 7);
    REQUIRE(static_cast<int>(plan.stage_layers.size()) == plan.virtual_stages());
    if (!c.layers.empty()) CHECK(plan.stage_layers == c.layers);
    if (!c.cuts.empty()) plan.slice_tokens = c.cuts;
    cpu::CpuRunOptions opt;
    opt.train = test::train_options(kSteps);
    const cpu::RunResult got = cpu::run_cpu(plan, opt);
    REQUIRE(got.loss_per_step.size() == kSteps);
    for (int s = 0; s < kSteps; ++s) CHECK(got.loss_per_step[s] == Approx(ref.loss_per_step[s]).epsilon(1e-9));
    std::string worst;
    const double grad_err = max_rel_error(got.grads, ref.grads, &worst);
    INFO("worst gradient " << worst << " rel " << grad_err);
    CHECK(grad_err <= 1e-9);
    CHECK(got.grads.size() == ref.grads.size());
  }
}

TEST_CASE("re-partitioning mid-training carries weights and Adam state - 2+2 steps equal 4 on one device",
          "[exec][equivalence]") {
  // What the load balancer does between segments: stop, re-cut the layers, go on.
  ir::Scenario sc = test::small_scenario(2, 1, 4, 1);
  const cpu::RunResult ref = cpu::run_reference(sc, 1, 4, test::train_options(4));
  cpu::CpuRunOptions opt;
  opt.train = test::train_options(2);
  const cpu::RunResult first = cpu::run_cpu(planner::build_plan(sc, "1f1b").lowered, opt);
  REQUIRE(first.state.steps_done == 2);
  REQUIRE(first.state.m1.size() == first.weights.size());
  sc.parallel.layers_per_stage = {5, 3};
  const ir::Plan moved = planner::build_plan(sc, "zb-h1").lowered;
  REQUIRE(moved.stage_layers == std::vector<int>{5, 3});
  opt.start = first.state;
  const cpu::RunResult second = cpu::run_cpu(moved, opt);
  REQUIRE(second.loss_per_step.size() == 2);
  for (int s = 0; s < 4; ++s) {
    const double got = s < 2 ? first.loss_per_step[s] : second.loss_per_step[s - 2];
    INFO("step " << s);
    CHECK(got == Approx(ref.loss_per_step[s]).epsilon(1e-9));
  }
  std::string worst;
  CHECK(max_rel_error(second.weights, ref.weights, &worst) <= 1e-9);
  CHECK(max_rel_error(second.grads, ref.grads, &worst) <= 1e-9);
  CHECK(second.state.steps_done == 4);
  // Without the moments (a fresh Adam) the run would differ: the carry is needed.
  cpu::TrainState no_moments = first.state;
  for (auto& [name, v] : no_moments.m1) std::fill(v.begin(), v.end(), 0.0);
  opt.start = no_moments;
  CHECK(max_rel_error(cpu::run_cpu(moved, opt).weights, ref.weights, &worst) > 1e-6);
  // A state missing a tensor is refused by name.
  cpu::TrainState broken = first.state;
  broken.m2.erase("block3.wq");
  opt.start = broken;
  CHECK_THROWS_WITH(cpu::run_cpu(moved, opt), Catch::Contains("block3.wq"));
}

TEST_CASE("ZeRO-1 (reduce-scatter - sharded Adam - all-gather) trains bit-identically to all-reduce",
          "[exec][equivalence][zero1]") {
  // The ring reduce-scatter is the all-reduce's first half and Adam is elementwise, so
  // each replica's shard, and after the all-gather every weight, equals the all-reduce
  // run's to the bit; the report's gradients and moments are assembled from the owners.
  struct Case {
    std::string schedule;
    int slices, p, d, m;
    double bucket_mb;
  };
  const std::vector<Case> cases = {{"1f1b", 1, 2, 2, 4, 40},           {"1f1b", 1, 2, 4, 4, 0.004},
                                   {"interleaved", 1, 2, 2, 4, 0.004}, {"tdpipe", 2, 2, 2, 4, 0.01},
                                   {"zb-h1", 1, 2, 3, 4, 0.004}};
  constexpr int kSteps = 3;
  for (const Case& c : cases) DYNAMIC_SECTION(fmt::format("{} S={} p={} d={} bucket {} MiB", c.schedule, c.slices,
                                                          c.p, c.d, c.bucket_mb)) {
    ir::Scenario sc = test::small_scenario(c.p, c.d, c.m, 1);
    sc.parallel.bucket_mb = c.bucket_mb;
    if (c.schedule == "interleaved") sc.parallel.chunks = 2;
    const ir::Plan plain = planner::build_plan(sc, c.schedule, c.slices).lowered;
    sc.parallel.distributed_optimizer = true;
    const ir::Plan sharded = planner::build_plan(sc, c.schedule, c.slices).lowered;
    int all_reduce = 0, scatter = 0, gather = 0;
    for (const auto& rank : sharded.ranks)
      for (const ir::Op& op : rank) {
        all_reduce += op.kind == ir::OpKind::ALLREDUCE;
        scatter += op.kind == ir::OpKind::REDUCE_SCATTER;
        gather += op.kind == ir::OpKind::ALL_GATHER;
      }
    CHECK(all_reduce == 0);
    REQUIRE(scatter >= c.p * sharded.chunks);
    CHECK(gather == scatter);
    if (c.bucket_mb < 1) CHECK(scatter > c.p * sharded.chunks);  // several buckets per chunk
    // A plan file keeps the collectives and when each bucket may start (ready_after).
    CHECK(ir::plan_from_json(ir::to_json(sharded)) == sharded);
    cpu::CpuRunOptions opt;
    opt.train = test::train_options(kSteps);
    const cpu::RunResult want = cpu::run_cpu(plain, opt);
    const cpu::RunResult got = cpu::run_cpu(sharded, opt);
    REQUIRE(got.loss_per_step.size() == kSteps);
    for (int s = 0; s < kSteps; ++s) CHECK(got.loss_per_step[s] == want.loss_per_step[s]);
    CHECK(got.weights == want.weights);
    CHECK(got.grads == want.grads);
    CHECK(got.state.m1 == want.state.m1);
    CHECK(got.state.m2 == want.state.m2);
    CHECK(got.replica_divergence == 0.0);
    // And both equal one device (the equivalence every other layout meets).
    const cpu::RunResult ref = cpu::run_reference(sc, c.d, c.m, test::train_options(kSteps));
    std::string worst;
    const double err = max_rel_error(got.weights, ref.weights, &worst);
    INFO("worst weight " << worst << " rel " << err);
    CHECK(err <= 1e-5);
  }
}

TEST_CASE("a sharded OPT steps only the replica's own segments", "[exec][zero1]") {
  // What the bit-identity above cannot see (the all-gather overwrites every other part):
  // replica 1 of 2 updates exactly owned_ranges of each chunk, nothing else.
  ir::Scenario sc = test::small_scenario(2, 2, 4, 1);
  sc.parallel.bucket_mb = 0.004;
  sc.parallel.distributed_optimizer = true;
  const ir::Plan plan = planner::build_plan(sc, "1f1b").lowered;
  const std::vector<int> buckets = sharded_buckets(plan);
  REQUIRE(buckets.size() == 2);
  const cpu::TrainOptions train = test::train_options(1);
  const cpu::Corpus corpus = cpu::Corpus::load(train.corpus_path);
  cpu::CpuCompute c(cpu::GptConfig::from_scenario(sc), plan, 0, 1, corpus, train);
  cpu::GptStage& st = c.chunk_stage(0);
  std::fill(st.grads().begin(), st.grads().end(), 0.5);
  const std::vector<double> before = st.params();
  const OptimizerShard shard{1, 2, {buckets[0]}};
  ComputeOp opt;
  opt.kind = ir::OpKind::OPT;
  opt.stage = -1;
  opt.shard = &shard;
  c.run(opt, {});
  const auto n = static_cast<std::int64_t>(before.size());
  std::vector<char> owned(before.size(), 0);
  for (const auto& [b, e] : owned_ranges(n, buckets[0], shard))
    std::fill(owned.begin() + b, owned.begin() + e, 1);
  std::int64_t moved = 0, owned_count = 0;
  for (std::size_t i = 0; i < before.size(); ++i) {
    owned_count += owned[i];
    if (st.params()[i] != before[i]) {
      ++moved;
      REQUIRE(owned[i]);
    } else {
      REQUIRE_FALSE(owned[i]);  // every owned parameter moves (g = 0.5 ≠ 0)
    }
  }
  CHECK(moved == owned_count);
  CHECK(owned_count > n / 3);
  CHECK(owned_count < 2 * n / 3);
}

TEST_CASE("the loss really moves: 3 steps change it and the weights", "[exec][equivalence]") {
  // Guards the equality test against a model that does nothing (both sides constant).
  const ir::Scenario sc = test::small_scenario(2, 1, 4, 1);
  const cpu::RunResult ref = cpu::run_reference(sc, 1, 4, test::train_options(3));
  const cpu::RunResult before = cpu::run_reference(sc, 1, 4, test::train_options(0));
  REQUIRE(ref.loss_per_step.size() == 3);
  // Initial loss of a near-uniform predictor over the 32-entry vocabulary is ≈ ln 32.
  CHECK(ref.loss_per_step[0] == Approx(std::log(32.0)).epsilon(0.05));
  std::string worst;
  CHECK(max_rel_error(ref.weights, before.weights, &worst) > 1e-3);
  double grad_norm = 0;
  for (const auto& [n, g] : ref.grads)
    for (double x : g) grad_norm += x * x;
  CHECK(grad_norm > 1e-8);
}


TEST_CASE("round_to_bf16 rounds to the nearest bfloat16, ties to even, as CUDA's __float2bfloat16", "[exec][wire]") {
  // bf16 keeps 8 significant bits: around 1 its spacing is 2^-7.
  CHECK(round_to_bf16(1.0) == 1.0);
  CHECK(round_to_bf16(1.0 + 0x1p-8) == 1.0);                       // a tie: to the even 1.0
  CHECK(round_to_bf16(1.0 + 3 * 0x1p-8) == 1.0 + 0x1p-6);          // a tie: to the even 1 + 2^-6
  CHECK(round_to_bf16(1.0 + 0x1p-8 + 0x1p-20) == 1.0 + 0x1p-7);    // above the tie: up
  CHECK(round_to_bf16(-3.0 - 0x1p-7) == -3.0);                      // below half a spacing (2^-6): down
  CHECK(round_to_bf16(0x1.fffffep127) == std::numeric_limits<double>::infinity());  // overflow
  CHECK(std::isnan(round_to_bf16(std::numeric_limits<double>::quiet_NaN())));
}

TEST_CASE("bf16 between stages: what crosses stages is rounded, so a pipeline drifts from the single-device run by "
          "bf16's rounding only, and one stage is unchanged",
          "[exec][wire]") {
  constexpr int kSteps = 3;
  const ir::Scenario sc = test::small_scenario(4, 1, 8, 1);
  const cpu::RunResult ref = cpu::run_reference(sc, 1, 8, test::train_options(kSteps));
  cpu::CpuRunOptions opt;
  opt.train = test::train_options(kSteps);
  opt.train.bf16_wire = true;
  const cpu::RunResult piped = cpu::run_cpu(planner::build_plan(sc, "1f1b", 1).lowered, opt);
  const cpu::RunResult exact =
      cpu::run_cpu(planner::build_plan(sc, "1f1b", 1).lowered, [] {
        cpu::CpuRunOptions o;
        o.train = test::train_options(kSteps);
        return o;
      }());
  REQUIRE(piped.loss_per_step.size() == kSteps);
  for (int s = 0; s < kSteps; ++s) {
    INFO("step " << s << ": bf16 between stages " << piped.loss_per_step[s] << ", exact " << exact.loss_per_step[s]
                 << ", one device " << ref.loss_per_step[s]);
    CHECK(exact.loss_per_step[s] == Approx(ref.loss_per_step[s]).epsilon(1e-12));
    CHECK(piped.loss_per_step[s] != exact.loss_per_step[s]);  // the rounding happened
    CHECK(std::abs(piped.loss_per_step[s] - ref.loss_per_step[s]) <= 1e-3 * std::abs(ref.loss_per_step[s]));
  }
  // Step 0's gradients, from identical weights: bf16's rounding alone (later steps add
  // Adam's amplification of near-zero gradients).
  cpu::CpuRunOptions first = opt;
  first.train.steps = 1;
  const cpu::RunResult g = cpu::run_cpu(planner::build_plan(sc, "1f1b", 1).lowered, first);
  std::string worst;
  const double err = max_rel_error(g.grads, cpu::run_reference(sc, 1, 8, test::train_options(1)).grads, &worst);
  INFO("worst gradient " << worst << " relative L2 error " << err);
  CHECK(err > 0);
  CHECK(err <= 1e-2);
  // One stage: nothing crosses, nothing is rounded.
  const ir::Scenario one = test::small_scenario(1, 1, 8, 1);
  const cpu::RunResult single = cpu::run_cpu(planner::build_plan(one, "1f1b", 1).lowered, opt);
  cpu::CpuRunOptions plain;
  plain.train = test::train_options(kSteps);
  CHECK(single.loss_per_step == cpu::run_cpu(planner::build_plan(one, "1f1b", 1).lowered, plain).loss_per_step);
}

}  // namespace tdpipe::exec
