// test_sim_network.cpp — communication on modelled links: an isolated transfer costs
// latency + size/bandwidth, flows share a NIC, an isolated ring all-reduce follows
// 2(n−1)/n·S/B + 2(n−1)·α, and the reductions agree with the plain model.
#include <catch2/catch.hpp>

#include <cmath>

#include "sim_test_util.hpp"
#include "tdpipe/sim/platform.hpp"
#include "tdpipe/sim/simulate.hpp"

using namespace tdpipe;
using namespace tdpipe::sim::testing;

namespace {
double seconds(const traces::TraceEvent& e) { return static_cast<double>(e.dur_ns) * 1e-9; }
}  // namespace

TEST_CASE("an isolated inter-node transfer takes latency + size / NIC bandwidth", "[sim][network]") {
  // t = 8: each pipeline rank is one DGX node, the transfer leaves through one HDR NIC.
  auto sc = a100_cluster(2, 8, 2, 1);
  auto plan = empty_plan(sc, 2, 1);
  const std::int64_t bytes = 64 << 20;
  plan.ranks[0].push_back(send_op(1, bytes));
  plan.ranks[1].push_back(recv_op(0, bytes));
  const auto res = sim::simulate(plan);
  const double expected = 14e-6 + bytes / 25e9;
  CHECK(seconds(event(res.trace, 0, "SEND(F0>r1)")) == Approx(expected).epsilon(1e-6));
  CHECK(seconds(event(res.trace, 1, "RECV(F0<r0)")) == Approx(expected).epsilon(1e-6));
  REQUIRE(res.transfer_ns.size() == 2);
  CHECK(res.transfer_ns[0] == event(res.trace, 0, "SEND(F0>r1)").dur_ns);
  CHECK(res.exposed_transfer_ns[1] == res.transfer_ns[1]);  // no compute to hide under
  // The NIC link ran at full speed while the flow was alone on it.
  REQUIRE(!res.links.empty());
  CHECK(res.links.front().peak_utilisation == Approx(1.0).epsilon(1e-6));
}

TEST_CASE("an isolated intra-node transfer crosses NVSwitch at NVLink bandwidth", "[sim][network]") {
  auto sc = a100_cluster(1, 1, 2, 1);
  auto plan = empty_plan(sc, 2, 1);
  const std::int64_t bytes = 256 << 20;
  plan.ranks[0].push_back(send_op(1, bytes));
  plan.ranks[1].push_back(recv_op(0, bytes));
  const auto res = sim::simulate(plan);
  CHECK(seconds(event(res.trace, 0, "SEND(F0>r1)")) == Approx(3.4e-6 + bytes / 300e9).epsilon(1e-6));
}

TEST_CASE("route_between: hops and latency per fabric level", "[sim][network]") {
  sim::PlatformSpec s = sim::platform_preset("dgx-a100-hdr", 64);
  s.nodes_per_leaf = 16;
  s.fat_tree_levels = 2;
  const auto intra = sim::route_between(s, 0, 7);
  CHECK(!intra.inter_node);
  CHECK(intra.latency_seconds == Approx(3.4e-6));
  const auto leaf = sim::route_between(s, 0, 8);  // node 0 → node 1, same leaf
  CHECK(leaf.hops == 2);
  CHECK(leaf.latency_seconds == Approx(14e-6));
  const auto spine = sim::route_between(s, 0, 16 * 8);  // node 0 → node 16, next leaf
  CHECK(spine.hops == 4);
  CHECK(spine.latency_seconds == Approx(14e-6 + 2 * s.ib_switch_hop_latency_seconds));
  s.oversubscription = 2;
  // 16 nodes × 8 NICs × 25 GB/s / 2 under one leaf: still above one NIC.
  CHECK(sim::route_between(s, 0, 16 * 8).bottleneck_bytes_per_second == Approx(25e9));
}

TEST_CASE("two flows leaving one NIC share its bandwidth", "[sim][network]") {
  auto sc = a100_cluster(3, 8, 3, 1);
  auto plan = empty_plan(sc, 3, 1);
  const std::int64_t bytes = 50'000'000;
  plan.ranks[0].push_back(send_op(1, bytes, 0, 0));
  plan.ranks[0].push_back(send_op(2, bytes, 0, 0));  // same batch: posted together
  plan.ranks[1].push_back(recv_op(0, bytes));
  plan.ranks[2].push_back(recv_op(0, bytes));
  const auto res = sim::simulate(plan);
  CHECK(seconds(event(res.trace, 0, "SEND(F0>r1)")) == Approx(14e-6 + 2 * bytes / 25e9).epsilon(1e-6));
  CHECK(seconds(event(res.trace, 0, "SEND(F0>r2)")) == Approx(14e-6 + 2 * bytes / 25e9).epsilon(1e-6));
}

TEST_CASE("an isolated ring all-reduce matches 2(n-1)/n S/B + 2(n-1) alpha", "[sim][network][collective]") {
  const int d = 8;  // 8 replicas, one node each (t = 8): a ring of NICs under one switch
  auto sc = a100_cluster(d, 8, 1, d);
  auto plan = empty_plan(sc, 1, d);
  const double bytes = 400e6;
  plan.ranks[0].push_back(allreduce_op(static_cast<std::int64_t>(bytes)));
  const double expected = sim::ring_allreduce_seconds(bytes, d, 14e-6, 25e9);
  CHECK(expected == Approx(2.0 * 7 / 8 * bytes / 25e9 + 14 * 14e-6));

  sim::SimOptions opt;
  opt.collective = sim::CollectiveAlgorithm::Ring;
  SECTION("reduced, ring steps collapsed into one flow") {
    const auto res = sim::simulate(plan, opt);
    CHECK(seconds(event(res.trace, 0, "ALLREDUCE(b0)")) == Approx(expected).epsilon(0.01));
    CHECK(res.collective == "ring");
    CHECK(res.flows == 1);
  }
  SECTION("reduced, one flow per ring step") {
    opt.collapse_ring_steps = false;
    const auto res = sim::simulate(plan, opt);
    CHECK(seconds(event(res.trace, 0, "ALLREDUCE(b0)")) == Approx(expected).epsilon(0.01));
    CHECK(res.flows == 2 * (d - 1));
  }
  SECTION("plain: every GPU of every replica runs the ring") {
    opt.fidelity = sim::Fidelity::Plain;
    const auto res = sim::simulate(plan, opt);
    CHECK(seconds(event(res.trace, 0, "ALLREDUCE(b0)")) == Approx(expected).epsilon(0.01));
    CHECK(res.simulated_gpus == 8 * d);
    CHECK(res.flows == 8 * d * 2 * (d - 1));
  }
}

TEST_CASE("Auto picks the tree for a small all-reduce over many nodes, as NCCL does", "[sim][collective]") {
  const int d = 64;
  auto sc = a100_cluster(d, 8, 1, d);
  auto plan = empty_plan(sc, 1, d);
  plan.ranks[0].push_back(allreduce_op(1 << 20));
  const auto res = sim::simulate(plan);
  CHECK(res.collective == "tree");
  // 64 nodes exceed one leaf of 16: ring neighbours cross the spine (α = 14 µs + 2 hops).
  const double alpha = 14e-6 + 2 * 0.5e-6;
  CHECK(seconds(event(res.trace, 0, "ALLREDUCE(b0)")) ==
        Approx(sim::tree_allreduce_seconds(1 << 20, d, alpha, 25e9)).epsilon(0.01));
  auto big = plan;
  big.ranks[0][0].bytes = 2'000'000'000;
  CHECK(sim::simulate(big).collective == "ring");
}

TEST_CASE("an all-reduce contends with pipeline traffic on the NIC", "[sim][network][collective]") {
  // p = 2 pipeline ranks (one node each), d = 2 replicas: rank 0's all-reduce and its
  // activation SEND leave through the same NIC.
  auto sc = a100_cluster(4, 8, 2, 2);
  auto plan = empty_plan(sc, 2, 2);
  const std::int64_t bytes = 100'000'000;
  plan.ranks[0].push_back(allreduce_op(bytes));  // n = 2: 2(n-1)/n · S = S on the wire
  plan.ranks[0].push_back(send_op(1, bytes));
  plan.ranks[1].push_back(recv_op(0, bytes));
  sim::SimOptions opt;
  opt.collective = sim::CollectiveAlgorithm::Ring;
  for (auto fidelity : {sim::Fidelity::Reduced, sim::Fidelity::Plain}) {
    opt.fidelity = fidelity;
    const auto res = sim::simulate(plan, opt);
    // Both flows move 100 MB over one 25 GB/s NIC at the same time: 8 ms, not 4 ms.
    CHECK(seconds(event(res.trace, 0, "SEND(F0>r1)")) == Approx(14e-6 + 2 * bytes / 25e9).epsilon(0.01));
    CHECK(seconds(event(res.trace, 0, "ALLREDUCE(b0)")) == Approx(2 * 14e-6 + 2 * bytes / 25e9).epsilon(0.01));
  }
}
