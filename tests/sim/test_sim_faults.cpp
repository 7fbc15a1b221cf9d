// test_sim_faults.cpp — faults in the simulator: specs and their errors, a straggler
// equals the plan with its ranks' compute stretched, a degraded NIC follows the α-β
// closed forms at its reduced bandwidth, the reduced engine (one healthy replica for
// all, the touched ones exact) agrees with the plain one, and checkpoint-restart
// accounting follows its closed form.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "sim_test_util.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/replay.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/sim/faults.hpp"
#include "tdpipe/sim/simulate.hpp"

using namespace tdpipe;
using namespace tdpipe::sim::testing;
using Catch::Matchers::Contains;

namespace {

double seconds(const traces::TraceEvent& e) { return static_cast<double>(e.dur_ns) * 1e-9; }

std::vector<sim::SimFault> faults(std::initializer_list<const char*> specs) {
  std::vector<sim::SimFault> out;
  for (const char* s : specs) out.push_back(sim::parse_sim_fault(s));
  return out;
}


/// One GPU and one NIC per node: DP replicas and pipeline stages talk over IB.
ir::Scenario one_gpu_nodes(int nodes, int pipeline, int data) {
  auto sc = a100_cluster(nodes, 1, pipeline, data);
  sc.cluster.gpus_per_node = 1;
  sc.cluster.nics_per_node = 1;
  return sc;
}

}  // namespace

TEST_CASE("sim fault specs: slow, link and fail parse, and bad ones name the spec and the key", "[sim][faults]") {
  const auto slow = sim::parse_sim_fault("slow:rank=3,factor=1.5");
  CHECK(slow.kind == sim::SimFault::Kind::Slow);
  CHECK(slow.rank == 3);
  CHECK(slow.factor == 1.5);
  const auto link = sim::parse_sim_fault("link:node=2,factor=0.5,nic=1");
  CHECK(link.kind == sim::SimFault::Kind::Link);
  CHECK((link.node == 2 && link.nic == 1 && link.factor == 0.5));
  CHECK(sim::parse_sim_fault("link:node=2,factor=0.5").nic == -1);
  CHECK(sim::parse_sim_fault("fail:rank=5,at=10s").at_seconds == 10);
  CHECK(sim::parse_sim_fault("fail:rank=5,at=10").at_seconds == 10);
  CHECK(sim::parse_sim_fault("fail:rank=5,at=5min").at_seconds == 300);
  CHECK(sim::parse_sim_fault("fail:rank=5,at=2h").at_seconds == 7200);
  CHECK(sim::parse_sim_fault("fail:rank=5,at=250ms").at_seconds == Approx(0.25));

  auto error = [](const char* spec) {
    try {
      sim::parse_sim_fault(spec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(error("stall:rank=1"), Contains("unknown fault kind \"stall\"") && Contains("slow:rank=G"));
  CHECK_THAT(error("slow:rank=1"), Contains("slow needs factor="));
  CHECK_THAT(error("slow:rank=1,factor=1"), Contains("factor=1 is not a number in (1, 100]"));
  CHECK_THAT(error("slow:rank=1,factor=0.5"), Contains("how many times slower"));
  CHECK_THAT(error("link:node=1,factor=1.5"), Contains("factor=1.5 is not a number in (0, 1]"));
  CHECK_THAT(error("link:node=1,factor=0"), Contains("the share of the bandwidth left"));
  CHECK_THAT(error("link:node=1,factor=0.5,rank=2"), Contains("link takes no key \"rank\""));
  CHECK_THAT(error("fail:rank=1,at=-3s"), Contains("at=-3s is not a time"));
  CHECK_THAT(error("fail:rank=1,at=10 parsecs"), Contains("is not a time"));
  CHECK_THAT(error("fail:rank=1,rank=2,at=1"), Contains("key \"rank\" given twice"));
  CHECK_THAT(error("slow:rank=x,factor=2"), Contains("rank=x is not an integer"));
  CHECK_THAT(error("slow:rank"), Contains("\"rank\" is not key=value"));
  CHECK_THAT(error("slow:rank=3,factor=1.5,"), Contains("ends with a comma"));

  // Against the layout: t = 8, p = 8, d = 2 on 16 nodes (128 GPUs, 8 NICs a node).
  const ir::Placement place{8, 8, 2};
  const sim::PlatformSpec spec = sim::platform_preset("dgx-a100-hdr", 16);
  auto check_error = [&](const char* s) {
    try {
      sim::check_sim_faults(faults({s}), place, spec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(check_error("slow:rank=127,factor=2") == "no error");
  CHECK_THAT(check_error("slow:rank=128,factor=2"), Contains("rank 128 is not a GPU of the plan") && Contains("0 to 127"));
  CHECK_THAT(check_error("fail:rank=200,at=1"), Contains("rank 200 is not a GPU"));
  CHECK_THAT(check_error("link:node=16,factor=0.5"), Contains("node 16 holds no GPU of the plan") && Contains("0 to 15"));
  CHECK_THAT(check_error("link:node=1,factor=0.5,nic=8"), Contains("nic 8 does not exist") && Contains("0 to 7"));
  const sim::PlatformSpec one = sim::platform_preset("dgx-a100-hdr", 1);
  CHECK_THROWS_WITH(sim::check_sim_faults(faults({"link:node=0,factor=0.5"}), ir::Placement{8, 1, 1}, one),
                    Contains("the cluster is one node"));

  // What each touches, said in the layout's terms.
  CHECK(sim::affected_replicas(faults({"slow:rank=70,factor=2"}), place, spec) == std::vector<int>{1});
  CHECK(sim::affected_replicas(faults({"link:node=3,factor=0.5", "slow:rank=1,factor=2"}), place, spec) ==
        std::vector<int>{0});
  CHECK(sim::affected_replicas(faults({"fail:rank=70,at=1"}), place, spec).empty());
  CHECK_THAT(sim::describe_sim_fault(slow, place, spec),
             Contains("GPU 3 = replica 0, stage 0, TP rank 3") && Contains("GPUs 0–7") && Contains("1.5× slower"));
  CHECK_THAT(sim::describe_sim_fault(sim::parse_sim_fault("link:node=9,factor=0.5"), place, spec),
             Contains("GPUs 72–79: (replica 1, stage 1)") && Contains("12.5 GB/s"));
}

TEST_CASE("a straggler: the prediction equals the plan with its rank's compute F× longer, op by op",
          "[sim][faults]") {
  ir::Scenario sc;
  sc.name = "synthetic-slow";
  ir::Synthetic s;
  s.stages = 4;
  s.microbatches = 8;
  s.f_seconds = 1e-3;
  s.b_seconds = 2e-3;
  s.w_seconds = 1.5e-3;
  s.p2p_latency_seconds = 10e-6;
  sc.synthetic = s;
  for (const char* schedule : {"gpipe", "1f1b", "zb-h1"}) {
    SECTION(schedule) {
      const auto built = planner::build_plan(sc, schedule);
      sim::SimOptions opt;
      opt.faults = faults({"slow:rank=2,factor=2"});
      const auto slow = sim::simulate(built.lowered, opt);
      ir::Plan stretched = built.lowered;
      for (auto& op : stretched.ranks[2])
        if (ir::is_compute(op.kind)) op.est_seconds *= 2;
      const auto expected = sim::simulate(stretched);
      const auto healthy = sim::simulate(built.lowered);
      REQUIRE(slow.trace.events.size() == expected.trace.events.size());
      for (std::size_t i = 0; i < slow.trace.events.size(); ++i) {
        INFO(slow.trace.events[i].name << " on rank " << slow.trace.events[i].rank);
        CHECK(slow.trace.events[i].start_ns == expected.trace.events[i].start_ns);
        CHECK(slow.trace.events[i].dur_ns == expected.trace.events[i].dur_ns);
      }
      CHECK(slow.metrics.iteration_ns > healthy.metrics.iteration_ns);
      CHECK(slow.trace.metadata.at("faults") == "slow:rank=2,factor=2");
    }
  }
}

TEST_CASE("a straggler in one of d replicas: reduced (one healthy replica for all, the slow one exact) agrees "
          "with plain",
          "[sim][faults][dp]") {
  const auto built = planner::build_plan(gpt3_dp(4), "1f1b");
  sim::SimOptions opt;
  const auto healthy = sim::simulate(built.lowered, opt);
  // GPU 130 = replica 2, stage 0, TP rank 2: its TP group computes 1.3× slower.
  opt.faults = faults({"slow:rank=130,factor=1.3"});
  const auto reduced = sim::simulate(built.lowered, opt);
  CHECK(reduced.trace_replica == 2);
  CHECK(reduced.simulated_replicas == std::vector<int>{0, 2});
  CHECK(reduced.actors == 2 * healthy.actors);
  opt.fidelity = sim::Fidelity::Plain;
  const auto plain = sim::simulate(built.lowered, opt);
  CHECK(plain.trace_replica == 2);
  CHECK(reduced.iteration_seconds == Approx(plain.iteration_seconds).epsilon(0.01));
  // Stage 0 is the straggler; the whole iteration waits for it (its replica through the
  // pipeline, the others through the DP all-reduce). Its compute is 1.3× longer.
  // The healthy replicas wait for it in every DP all-reduce, so the iteration is what
  // it would be with every replica's stage 0 that slow.
  ir::Plan stretched = built.lowered;
  for (auto& op : stretched.ranks[0])
    if (ir::is_compute(op.kind)) op.est_seconds *= 1.3;
  sim::SimOptions plain_opt;
  const auto everywhere = sim::simulate(stretched, plain_opt);
  CHECK(reduced.iteration_seconds == Approx(everywhere.iteration_seconds).epsilon(1e-6));
  CHECK(reduced.iteration_seconds > healthy.iteration_seconds + 0.3);
  CHECK(reduced.metrics.ranks[0].compute_ns == Approx(1.3 * healthy.metrics.ranks[0].compute_ns).epsilon(1e-6));
  CHECK(reduced.metrics.ranks[1].compute_ns == healthy.metrics.ranks[1].compute_ns);

  SECTION("a straggler in replica 0: replica 1 stands for the healthy ones") {
    opt.fidelity = sim::Fidelity::Reduced;
    opt.faults = faults({"slow:rank=8,factor=1.3"});  // replica 0, stage 1
    const auto r0 = sim::simulate(built.lowered, opt);
    CHECK(r0.simulated_replicas == std::vector<int>{0, 1});
    CHECK(r0.trace_replica == 0);
    opt.fidelity = sim::Fidelity::Plain;
    CHECK(r0.iteration_seconds == Approx(sim::simulate(built.lowered, opt).iteration_seconds).epsilon(0.01));
  }
}

TEST_CASE("the iteration is the slowest pipeline's: a milder second fault never makes it shorter",
          "[sim][faults][dp]") {
  const auto built = planner::build_plan(gpt3_dp(2), "1f1b");
  sim::SimOptions opt;
  opt.faults = faults({"slow:rank=64,factor=1.5"});  // replica 1, stage 0
  const auto one = sim::simulate(built.lowered, opt);
  CHECK(one.trace_replica == 1);
  for (const char* milder : {"slow:rank=0,factor=1.01", "link:node=7,factor=0.99"}) {
    INFO(milder);
    opt.faults = faults({"slow:rank=64,factor=1.5", milder});
    const auto two = sim::simulate(built.lowered, opt);
    CHECK(two.trace_replica == 1);  // the 1.5× replica still ends last
    CHECK(two.iteration_seconds >= one.iteration_seconds);
  }
}

TEST_CASE("one slow NIC of a TP group, distributed optimizer: plain reports the late TP rank, as reduced does",
          "[sim][faults][dp]") {
  auto sc = gpt3_dp(2);
  sc.parallel.distributed_optimizer = true;
  const auto built = planner::build_plan(sc, "1f1b");
  sim::SimOptions opt;
  opt.faults = faults({"link:node=7,factor=0.1,nic=5"});  // replica 0, stage 7, TP rank 5
  const auto reduced = sim::simulate(built.lowered, opt);
  opt.fidelity = sim::Fidelity::Plain;
  const auto plain = sim::simulate(built.lowered, opt);
  CHECK(plain.trace_replica == 0);
  CHECK(plain.trace_tp == 5);  // its all-gather after OPT ends last
  CHECK(reduced.iteration_seconds == Approx(plain.iteration_seconds).epsilon(0.01));
  opt.faults = faults({"link:node=7,factor=0.1"});  // the whole node: the same iteration
  CHECK(sim::simulate(built.lowered, opt).iteration_seconds == Approx(plain.iteration_seconds).epsilon(0.01));
}

TEST_CASE("a degraded NIC: an isolated ring all-reduce and a p2p transfer at its reduced bandwidth",
          "[sim][faults][network]") {
  const double bytes = 400e6, alpha = 14e-6, bw = 25e9;
  sim::SimOptions opt;
  opt.collective = sim::CollectiveAlgorithm::Ring;
  opt.faults = faults({"link:node=1,factor=0.5"});
  SECTION("all-reduce over d = 4 replicas, one node each: the ring runs at the slow NIC's pace") {
    const int d = 4;
    auto sc = one_gpu_nodes(d, 1, d);
    auto plan = empty_plan(sc, 1, d);
    plan.ranks[0].push_back(allreduce_op(static_cast<std::int64_t>(bytes)));
    const double expected = sim::ring_allreduce_seconds(bytes, d, alpha, 0.5 * bw);
    for (auto fidelity : {sim::Fidelity::Reduced, sim::Fidelity::Plain}) {
      opt.fidelity = fidelity;
      const auto res = sim::simulate(plan, opt);
      // The trace shows the replica on node 1; replica 0 (healthy) ends with it.
      CHECK(res.trace_replica == 1);
      CHECK(seconds(event(res.trace, 0, "ALLREDUCE(b0)")) == Approx(expected).epsilon(0.01));
      CHECK(res.iteration_seconds == Approx(expected).epsilon(0.01));
    }
    opt.faults.clear();
    opt.fidelity = sim::Fidelity::Reduced;
    CHECK(sim::simulate(plan, opt).iteration_seconds ==
          Approx(sim::ring_allreduce_seconds(bytes, d, alpha, bw)).epsilon(0.01));
  }
  SECTION("a SEND into the degraded node") {
    auto sc = one_gpu_nodes(2, 2, 1);
    auto plan = empty_plan(sc, 2, 1);
    plan.ranks[0].push_back(send_op(1, static_cast<std::int64_t>(bytes)));
    plan.ranks[1].push_back(recv_op(0, static_cast<std::int64_t>(bytes)));
    const auto res = sim::simulate(plan, opt);
    CHECK(seconds(event(res.trace, 0, "SEND(F0>r1)")) == Approx(alpha + bytes / (0.5 * bw)).epsilon(1e-6));
  }
  SECTION("one NIC of a DGX node: its TP group's transfers end with it") {
    auto sc = a100_cluster(2, 8, 2, 1);  // t = 8: a stage per node, each TP GPU on its NIC
    auto plan = empty_plan(sc, 2, 1);
    plan.ranks[0].push_back(send_op(1, static_cast<std::int64_t>(bytes)));
    plan.ranks[1].push_back(recv_op(0, static_cast<std::int64_t>(bytes)));
    // The forward that needs it: every TP rank's part (the layer's TP all-reduce).
    ir::Op f = compute_op(ir::OpKind::F, 0, 1e-3);
    f.deps.push_back({1, 0});
    plan.ranks[1].push_back(f);
    opt.faults = faults({"link:node=0,factor=0.25,nic=5"});
    for (auto fidelity : {sim::Fidelity::Reduced, sim::Fidelity::Plain}) {
      opt.fidelity = fidelity;
      const auto res = sim::simulate(plan, opt);
      CHECK(std::abs(event(res.trace, 1, "F0").start_ns - std::llround((alpha + bytes / (0.25 * bw)) * 1e9)) <= 2);
      CHECK(res.iteration_seconds == Approx(alpha + bytes / (0.25 * bw) + 1e-3).epsilon(1e-6));
    }
  }
}

TEST_CASE("failures: work since the last complete checkpoint is lost, then detection and restart",
          "[sim][faults][failure]") {
  // T = 2 s, a checkpoint after every 3rd iteration taking 0.5 s: iteration i done by
  // e(i) = 2i + 0.5·⌊i/3⌋ (e(3) = 6.5, e(4) = 8.5, e(5) = 10.5, e(6) = 13).
  sim::FailureOptions o;
  o.checkpoint_every = 3;
  o.checkpoint_seconds = 0.5;
  o.detect_seconds = 1;
  o.restart_seconds = 10;
  SECTION("one failure in iteration 5") {
    const auto t = sim::failure_timeline(2, faults({"fail:rank=0,at=10s"}), o);
    REQUIRE(t.events.size() == 1);
    const auto& e = t.events[0];
    CHECK(e.fired);
    CHECK(e.iteration == 5);
    CHECK(e.restart_from == 3);
    CHECK(e.lost_seconds == Approx(10 - 6.5));
    CHECK(e.resume_at_seconds == Approx(21));
    CHECK(t.steps == 5);  // up to the interrupted iteration, redone
    CHECK(t.no_failure_seconds == Approx(10.5));
    CHECK(t.total_seconds == Approx(21 + (10.5 - 6.5)));
    CHECK(t.lost_seconds == Approx(3.5 + 1 + 10));
    CHECK(t.mean_iteration_seconds == Approx(25.0 / 5));
    CHECK(t.goodput == Approx(10.0 / 25));
    CHECK(t.checkpoints == 1);
  }
  SECTION("during a checkpoint write: that checkpoint is not complete") {
    const auto t = sim::failure_timeline(2, faults({"fail:rank=0,at=6.2"}), o);
    CHECK(t.events[0].iteration == 3);
    CHECK(t.events[0].restart_from == 0);
    CHECK(t.events[0].lost_seconds == Approx(6.2));
    // On the dot of a checkpoint's end it is complete.
    const auto u = sim::failure_timeline(2, faults({"fail:rank=0,at=6.5"}), o);
    CHECK(u.events[0].restart_from == 3);
    CHECK(u.events[0].lost_seconds == Approx(0));
    CHECK(u.events[0].iteration == 4);
  }
  SECTION("a second failure during the restart starts it over; one after the run never happens") {
    o.steps = 6;
    const auto t = sim::failure_timeline(2, faults({"fail:rank=3,at=40s", "fail:rank=0,at=10s", "fail:rank=1,at=15s"}), o);
    REQUIRE(t.events.size() == 3);
    CHECK(t.events[0].at_seconds == 10);  // in time order
    CHECK(t.events[1].fired);
    CHECK(t.events[1].restart_from == 3);
    CHECK(t.events[1].lost_seconds == 0);
    CHECK(t.events[1].resume_at_seconds == Approx(26));
    // Resumed at 26 s from iteration 3: done at 26 + e(6) − e(3) = 32.5 s < 40 s.
    CHECK(!t.events[2].fired);
    CHECK(t.total_seconds == Approx(26 + 13 - 6.5));
    CHECK(t.no_failure_seconds == Approx(13));
    CHECK(t.checkpoints == 2);
  }
  SECTION("bad options are named") {
    o.checkpoint_every = 0;
    CHECK_THROWS_WITH(sim::failure_timeline(2, faults({"fail:rank=0,at=1"}), o), Contains("--checkpoint-every"));
    o.checkpoint_every = 1;
    o.restart_seconds = -1;
    CHECK_THROWS_WITH(sim::failure_timeline(2, faults({"fail:rank=0,at=1"}), o), Contains("--restart-seconds"));
  }
}
