// test_sim_behaviour.cpp — DP overlap switch, reductions vs the plain model, metrics,
// progress, and bad inputs rejected with a clear message.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim_test_util.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/cost_model.hpp"
#include "tdpipe/report/schedule_report.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/sim/platform.hpp"
#include "tdpipe/sim/simulate.hpp"
#include "tdpipe/traces/profile.hpp"

using namespace tdpipe;
using namespace tdpipe::sim::testing;
using Catch::Matchers::Contains;

namespace {


std::int64_t total_ns(const traces::Trace& t, ir::OpKind kind) {
  std::int64_t n = 0;
  for (const auto& e : t.events)
    if (e.kind == kind) n += e.dur_ns;
  return n;
}

}  // namespace

TEST_CASE("bucketed DP all-reduce overlaps backward - the switch turns overlap off", "[sim][dp]") {
  // Lowering fires a chunk's buckets after its last backward op: with two chunks per
  // rank, chunk 1's reduction runs under chunk 0's remaining backward.
  const auto built = planner::build_plan(gpt3_dp(4), "interleaved");
  sim::SimOptions opt;
  const auto overlapped = sim::simulate(built.lowered, opt);
  opt.overlap_dp = false;
  const auto serial = sim::simulate(built.lowered, opt);
  REQUIRE(total_ns(overlapped.trace, ir::OpKind::ALLREDUCE) > 0);
  CHECK(overlapped.metrics.iteration_ns < serial.metrics.iteration_ns);
  // Buckets reduce while later backward ops compute: part of the reduction is hidden.
  std::int64_t hidden = 0;
  for (const auto& r : overlapped.metrics.ranks) hidden += r.hidden_comm_ns;
  CHECK(hidden > 0);
  // Without overlap every all-reduce starts after the rank's last backward op.
  for (const auto& e : serial.trace.events) {
    if (e.kind != ir::OpKind::ALLREDUCE) continue;
    std::int64_t last_bwd = 0;
    for (const auto& c : serial.trace.events)
      if (c.rank == e.rank && (c.kind == ir::OpKind::BW || c.kind == ir::OpKind::B || c.kind == ir::OpKind::W))
        last_bwd = std::max(last_bwd, c.end_ns());
    CHECK(e.start_ns >= last_bwd);
  }
  // Each bucket but a chunk's last may start part-way through the chunk's own last
  // backward (Op::ready_after): in both engines it starts inside that op, no earlier than
  // the share of it the plan names; with the switch off, after the rank's last backward.
  for (const bool simgrid : {false, true}) {
    INFO((simgrid ? "simgrid" : "analytic"));
    const traces::Trace t = simgrid ? overlapped.trace : planner::evaluate(built.lowered);
    std::map<std::pair<int, std::string>, const traces::TraceEvent*> by_name;
    for (const auto& e : t.events) by_name[{e.rank, e.name}] = &e;
    int early = 0;
    for (int r = 0; r < built.lowered.num_ranks(); ++r)
      for (const ir::Op& op : built.lowered.ranks[static_cast<std::size_t>(r)]) {
        if (op.kind != ir::OpKind::ALLREDUCE || op.ready_after >= 1.0f) continue;
        const ir::Op& trigger = built.lowered.ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(op.deps[0].index)];
        const auto* a = by_name.at({r, ir::op_to_text(op)});
        const auto* b = by_name.at({r, ir::op_to_text(trigger)});
        INFO(ir::op_to_text(op) << " on rank " << r << " after " << ir::op_to_text(trigger));
        CHECK(a->start_ns >= b->start_ns + std::llround(op.ready_after * double(b->dur_ns)) - 1000);
        early += a->start_ns < b->end_ns();
      }
    CHECK(early > 0);
  }
}

TEST_CASE("distributed optimizer: reduce-scatter + all-gather move the all-reduce's ring volume - the optimizer "
          "state and step shrink d-fold",
          "[sim][dp][zero1]") {
  ir::Scenario sc = gpt3_dp(4);
  const auto plain = planner::build_plan(sc, "1f1b");
  sc.parallel.distributed_optimizer = true;
  const auto sharded = planner::build_plan(sc, "1f1b");
  // ZeRO-1: Adam's 12 bytes per parameter over d = 4 replicas; weights and gradients stay.
  const auto mem_plain = planner::memory_per_rank(plain.lowered, gpt3_dp(4));
  const auto mem_sharded = planner::memory_per_rank(sharded.lowered, sc);
  REQUIRE(mem_sharded.size() == mem_plain.size());
  for (std::size_t r = 0; r < mem_plain.size(); ++r) {
    CHECK(mem_sharded[r].optimizer_bytes == Approx(mem_plain[r].optimizer_bytes / 4));
    CHECK(mem_sharded[r].grads_bytes == mem_plain[r].grads_bytes);
  }
  const ir::Op& opt_plain = plain.lowered.ranks[0].back();
  const auto opt_at = [](const ir::Plan& p) {
    for (const ir::Op& op : p.ranks[0])
      if (op.kind == ir::OpKind::OPT) return op.est_seconds;
    return -1.0;
  };
  REQUIRE(opt_plain.kind == ir::OpKind::OPT);
  CHECK(opt_at(sharded.lowered) == Approx(opt_plain.est_seconds / 4));
  for (const bool simgrid : {false, true}) {
    INFO((simgrid ? "simgrid" : "analytic"));
    traces::Trace a, b;
    if (simgrid) {
      a = sim::simulate(plain.lowered, {}).trace;
      b = sim::simulate(sharded.lowered, {}).trace;
    } else {
      a = planner::evaluate(plain.lowered);
      b = planner::evaluate(sharded.lowered);
    }
    const std::int64_t ar = total_ns(a, ir::OpKind::ALLREDUCE);
    const std::int64_t rs = total_ns(b, ir::OpKind::REDUCE_SCATTER), ag = total_ns(b, ir::OpKind::ALL_GATHER);
    REQUIRE(ar > 0);
    CHECK(total_ns(b, ir::OpKind::ALLREDUCE) == 0);
    // Ring: all-reduce = 2(d − 1) steps of S/d; reduce-scatter and all-gather d − 1 each.
    CHECK(double(rs) == Approx(double(ag)).epsilon(0.02));
    CHECK(double(rs + ag) == Approx(double(ar)).epsilon(0.02));
    // The all-gather follows OPT: every one starts after its rank's OPT ended.
    for (const auto& e : b.events) {
      if (e.kind != ir::OpKind::ALL_GATHER) continue;
      for (const auto& o : b.events)
        if (o.rank == e.rank && o.kind == ir::OpKind::OPT) CHECK(e.start_ns >= o.end_ns());
    }
  }
}

TEST_CASE("reduced and plain fidelity agree within 1% on a small DP pipeline", "[sim][fidelity]") {
  const auto built = planner::build_plan(gpt3_dp(2), "1f1b");
  sim::SimOptions opt;
  opt.collective = sim::CollectiveAlgorithm::Ring;
  const auto reduced = sim::simulate(built.lowered, opt);
  opt.fidelity = sim::Fidelity::Plain;
  const auto plain = sim::simulate(built.lowered, opt);
  CHECK(plain.simulated_gpus == 8 * 8 * 2);
  CHECK(reduced.actors < plain.actors);
  CHECK(std::abs(double(reduced.metrics.iteration_ns) / double(plain.metrics.iteration_ns) - 1) < 0.01);
}

TEST_CASE("metrics: tokens/s, MFU (one definition, downstream) and activation memory", "[sim][metrics]") {
  auto sc = ir::load_scenario(std::string(TDPIPE_SOURCE_DIR) + "/scenarios/gpt3-175b-a100-8x8.yaml");
  const auto built = planner::build_plan(sc, "1f1b");
  std::vector<double> fractions;
  sim::SimOptions opt;
  opt.progress = [&](double f) { fractions.push_back(f); };
  const auto res = sim::simulate(built.lowered, opt);
  const double tokens = 64.0 * 2048;
  const report::ScheduleReport rep = report::make_report(built, res.trace, "simgrid");
  CHECK(rep.iteration_seconds == Approx(res.iteration_seconds).epsilon(1e-12));
  CHECK(rep.tokens_per_second == Approx(tokens / res.iteration_seconds));
  CHECK(rep.mfu > 0.1);
  CHECK(rep.mfu < 0.8);
  // Megatron's model FLOPs (Narayanan et al. 2021, eq. 3), which the generalised count
  // equals for ffn = 4h: 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)).
  const double B = 64, s = 2048, l = sc.model.layers, h = sc.model.hidden, V = sc.model.vocab;
  REQUIRE(sc.model.ffn == 4 * sc.model.hidden);
  CHECK(planner::model_flops_per_iteration(sc) == Approx(72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))));
  CHECK(rep.mfu == Approx(planner::model_flops_per_iteration(sc) / (res.iteration_seconds * 64 * sc.cluster.groups.at(0).gpu.peak_flops)));
  REQUIRE(res.peak_activation_bytes.size() == 8);
  // 1F1B: rank 0 keeps p = 8 micro-batches in flight, the last rank one.
  CHECK(res.peak_activation_bytes.front() > 4 * res.peak_activation_bytes.back());
  REQUIRE(!fractions.empty());
  CHECK(fractions.back() == Approx(1.0));
  CHECK(std::is_sorted(fractions.begin(), fractions.end()));
}

TEST_CASE("a calibration profile replaces the cost model's op times", "[sim][profile]") {
  auto sc = a100_cluster(2, 8, 2, 1);
  auto plan = empty_plan(sc, 2, 1);
  plan.ranks[0].push_back(compute_op(ir::OpKind::F, 0, 1e-3));
  plan.ranks[1].push_back(compute_op(ir::OpKind::F, 0, 1e-3));
  traces::Profile prof;
  prof.scenario = "test-a100";
  prof.ops.push_back({ir::OpKind::F, 1, -1, 0, 5e-3, 3});  // stage 1 only
  const traces::ProfileApplied applied = traces::apply_profile(prof, plan, /*ops_only=*/true);
  CHECK(applied.ops_from_profile == 1);
  CHECK(applied.ops_kept == 1);
  const auto res = sim::simulate(plan);
  CHECK(event(res.trace, 0, "F0").dur_ns == 1'000'000);  // not in the profile: est_seconds
  CHECK(event(res.trace, 1, "F0").dur_ns == 5'000'000);
}

TEST_CASE("bad inputs are rejected with a message naming the problem", "[sim][errors]") {
  auto sc = a100_cluster(2, 8, 2, 1);
  SECTION("a plan that is not lowered") {
    auto plan = empty_plan(sc, 2, 1);
    plan.lowered = false;
    REQUIRE_THROWS_WITH(sim::simulate(plan), Contains("not lowered"));
  }
  SECTION("more GPUs than the cluster has") {
    auto plan = empty_plan(sc, 2, 2);  // t·p·d = 32 GPUs on 2 nodes
    REQUIRE_THROWS_WITH(sim::simulate(plan), Contains("32 GPUs") && Contains("has 16"));
  }
  SECTION("an impossible fabric") {
    auto plan = empty_plan(sc, 2, 1);
    sim::SimOptions opt;
    opt.fabric.oversubscription = 0.5;
    REQUIRE_THROWS_WITH(sim::simulate(plan, opt), Contains("impossible fabric") && Contains("oversubscription"));
    opt.fabric.oversubscription = 0;
    opt.fabric.levels = 3;
    REQUIRE_THROWS_WITH(sim::simulate(plan, opt), Contains("3-level trees are not modelled"));
    sc.cluster.nics_per_node = 3;
    REQUIRE_THROWS_WITH(sim::platform_for(sc), Contains("nics_per_node 3 must divide gpus_per_node 8"));
  }
  SECTION("a SEND without its RECV") {
    auto plan = empty_plan(sc, 2, 1);
    plan.ranks[0].push_back(send_op(1, 1000));
    REQUIRE_THROWS_WITH(sim::simulate(plan), Contains("rank 0 op 0 (SEND(F0>r1)): no matching RECV on rank 1"));
  }
  SECTION("an order that deadlocks names the blocked ops") {
    auto plan = empty_plan(sc, 2, 1);
    // Both ranks first wait to receive, then send: blocking rendezvous never completes.
    plan.ranks[0].push_back(recv_op(1, 1000));
    plan.ranks[0].push_back(send_op(1, 1000, 1));
    plan.ranks[1].push_back(recv_op(0, 1000, 1));
    plan.ranks[1].push_back(send_op(0, 1000));
    REQUIRE_THROWS_WITH(sim::simulate(plan),
                        Contains("deadlocked") && Contains("rank 0 p2p stream blocked at op 0 (RECV(F0<r1)"));
  }
  SECTION("a calibration profile measured for another scenario or depth") {
    auto plan = empty_plan(sc, 2, 1);
    traces::Profile prof;
    prof.scenario = "tiny-gpt-cpu";
    REQUIRE_THROWS_WITH(traces::apply_profile(prof, plan),
                        Contains("measured for scenario 'tiny-gpt-cpu'") && Contains("'test-a100'"));
    prof.scenario = "test-a100";
    prof.stages = 4;
    REQUIRE_THROWS_WITH(traces::apply_profile(prof, plan), Contains("p = 4") && Contains("p = 2"));
  }
  SECTION("an unknown platform preset") {
    REQUIRE_THROWS_WITH(sim::platform_preset("dgx-b300", 1), Contains("dgx-a100-hdr"));
  }
}

TEST_CASE("1-bit Adam: each bucket's compressed all-reduce carries the packed momentum, priced as its kernels plus "
          "an all-to-all and a ring all-gather of those bytes in both engines",
          "[sim][dp][onebit]") {
  ir::Scenario sc = gpt3_dp(4);
  const auto plain = planner::build_plan(sc, "1f1b");
  sc.parallel.optimizer = "onebit-adam";
  const auto onebit = planner::build_plan(sc, "1f1b");
  // The same buckets, each now a COMPRESSED_ALLREDUCE of one sign bit per bf16 gradient
  // (elements = bytes / 2) plus a 4-byte scale per member: 1/16 of the bytes and a little.
  std::vector<std::int64_t> grads, packed;
  for (const ir::Op& op : plain.lowered.ranks[0])
    if (op.kind == ir::OpKind::ALLREDUCE) grads.push_back(op.bytes);
  for (const ir::Op& op : onebit.lowered.ranks[0]) {
    CHECK(op.kind != ir::OpKind::ALLREDUCE);
    if (op.kind != ir::OpKind::COMPRESSED_ALLREDUCE) continue;
    packed.push_back(op.bytes);
    CHECK(op.stream == ir::Stream::DP);
    CHECK(op.est_seconds > 0);  // the compression kernels
  }
  REQUIRE(grads.size() == packed.size());
  REQUIRE(!grads.empty());
  for (std::size_t k = 0; k < grads.size(); ++k) {
    const std::int64_t elements = grads[k] / 2, longest = (elements + 3) / 4;
    CHECK(packed[k] == 4 * (4 + (longest + 7) / 8));
  }
  // The error-feedback buffers: fp32 worker error over every parameter, the server's over
  // its 1/d segment: 4 + 4/4 bytes per parameter more optimizer state.
  const auto mem_plain = planner::memory_per_rank(plain.lowered, gpt3_dp(4));
  const auto mem_onebit = planner::memory_per_rank(onebit.lowered, sc);
  for (std::size_t r = 0; r < mem_plain.size(); ++r) {
    const double params = mem_plain[r].weights_bytes / 2;
    CHECK(mem_onebit[r].optimizer_bytes == Approx(mem_plain[r].optimizer_bytes + 5 * params));
  }
  const traces::Trace analytic = planner::evaluate(onebit.lowered);
  std::map<std::pair<int, std::string>, std::int64_t> dur;
  for (const auto& e : analytic.events) dur[{e.rank, e.name}] = e.dur_ns;
  for (int r = 0; r < onebit.lowered.num_ranks(); ++r)
    for (const ir::Op& op : onebit.lowered.ranks[static_cast<std::size_t>(r)]) {
      if (op.kind != ir::OpKind::COMPRESSED_ALLREDUCE) continue;
      const double want = planner::compressed_allreduce_seconds(onebit.lowered, r, op.bytes) + op.est_seconds;
      CHECK(double(dur.at({r, ir::op_to_text(op)})) == Approx(want * 1e9).margin(2));
    }
  const auto sim_plain = sim::simulate(plain.lowered, {});
  const auto sim_onebit = sim::simulate(onebit.lowered, {});
  const std::int64_t sim_c = total_ns(sim_onebit.trace, ir::OpKind::COMPRESSED_ALLREDUCE);
  const std::int64_t ana_c = total_ns(analytic, ir::OpKind::COMPRESSED_ALLREDUCE);
  REQUIRE(sim_c > 0);
  CHECK(double(sim_c) == Approx(double(ana_c)).epsilon(0.05));
  // Less on the wire: the exchange (the op less its kernels) takes a fraction of the
  // all-reduce's time — 1/16 of the bytes, d instead of 2(d − 1) latencies — and the
  // iteration is no longer.
  double kernels_ns = 0;
  for (const auto& rank : onebit.lowered.ranks)
    for (const ir::Op& op : rank)
      if (op.kind == ir::OpKind::COMPRESSED_ALLREDUCE) kernels_ns += op.est_seconds * 1e9;
  CHECK(double(sim_c) - kernels_ns < double(total_ns(sim_plain.trace, ir::OpKind::ALLREDUCE)) / 8);
  CHECK(sim_onebit.metrics.iteration_ns <= sim_plain.metrics.iteration_ns);
  // A plan file keeps the compressed collectives.
  CHECK(ir::plan_from_json(ir::to_json(onebit.lowered)) == onebit.lowered);
}
