// test_metrics.cpp — metrics of hand-made traces with known idle and exposed comm.
#include <catch2/catch.hpp>

#include "tdpipe/traces/metrics.hpp"
#include "tdpipe/traces/sharing.hpp"

#include <string>
#include <vector>

using namespace tdpipe;
using namespace tdpipe::traces;

namespace {

TraceEvent ev(int rank, ir::Stream stream, ir::OpKind kind, std::int64_t start, std::int64_t end) {
  TraceEvent e;
  e.rank = rank;
  e.stream = static_cast<int>(stream);
  e.kind = kind;
  e.name = std::string(ir::to_string(kind));
  e.start_ns = start;
  e.dur_ns = end - start;
  return e;
}

}  // namespace

TEST_CASE("Metrics of a two-rank trace with hidden and exposed communication", "[traces][metrics]") {
  using ir::OpKind;
  using ir::Stream;
  Trace t;
  t.ranks = 2;
  // Rank 0: compute [0,10) and [20,30); a send [5,25) → hidden 10 ([5,10) + [20,25)), exposed 10.
  t.events.push_back(ev(0, Stream::Compute, OpKind::F, 0, 10));
  t.events.push_back(ev(0, Stream::Compute, OpKind::BW, 20, 30));
  t.events.push_back(ev(0, Stream::P2P, OpKind::SEND, 5, 25));
  // Rank 1: compute [10,40) and an overlapping OPT on another stream [35,45) → union 35;
  // a DP all-reduce [40,50) → exposed [45,50) = 5, hidden [40,45) = 5.
  t.events.push_back(ev(1, Stream::Compute, OpKind::F, 10, 40));
  t.events.push_back(ev(1, Stream::DP, OpKind::OPT, 35, 45));
  t.events.push_back(ev(1, Stream::DP, OpKind::ALLREDUCE, 40, 50));

  const Metrics m = compute_metrics(t);
  REQUIRE(m.iteration_ns == 50);
  REQUIRE(m.ranks.size() == 2);
  CHECK(m.ranks[0].compute_ns == 20);
  CHECK(m.ranks[0].hidden_comm_ns == 10);
  CHECK(m.ranks[0].exposed_comm_ns == 10);
  CHECK(m.ranks[0].idle_ns == 20);
  CHECK(m.ranks[0].idle_fraction == Approx(0.6));
  CHECK(m.ranks[1].compute_ns == 35);
  CHECK(m.ranks[1].hidden_comm_ns == 5);
  CHECK(m.ranks[1].exposed_comm_ns == 5);
  CHECK(m.ranks[1].idle_ns == 10);
  CHECK(m.ranks[1].idle_fraction == Approx(0.3));
  CHECK(m.bubble_fraction == Approx(1 - (20 + 35) / 2.0 / 50));
}

TEST_CASE("1F1B closed form: (p−1)(F+B+W) idle per rank", "[traces][metrics]") {
  // p = 2, m = 2, F = 2, BW = 3 (hand-made 1F1B timeline without communication):
  // rank0: F0 [0,2) F1 [2,4) BW0 [7,10) BW1 [12,15); rank1: F0 [2,4) BW0 [4,7) F1 [7,9) BW1 [9,12).
  using ir::OpKind;
  using ir::Stream;
  Trace t;
  t.ranks = 2;
  t.events = {ev(0, Stream::Compute, OpKind::F, 0, 2), ev(0, Stream::Compute, OpKind::F, 2, 4),
              ev(1, Stream::Compute, OpKind::F, 2, 4), ev(1, Stream::Compute, OpKind::BW, 4, 7),
              ev(0, Stream::Compute, OpKind::BW, 7, 10), ev(1, Stream::Compute, OpKind::F, 7, 9),
              ev(1, Stream::Compute, OpKind::BW, 9, 12), ev(0, Stream::Compute, OpKind::BW, 12, 15)};
  const Metrics m = compute_metrics(t);
  REQUIRE(m.iteration_ns == 15);
  // Every rank computes m·(F+BW) = 10 and idles (p−1)(F+BW) = 5.
  CHECK(m.ranks[0].idle_ns == 5);
  CHECK(m.ranks[1].idle_ns == 5);
  CHECK(m.bubble_fraction == Approx(5.0 / 15));
}

TEST_CASE("Foreign events without a kind are classified by name", "[traces][metrics]") {
  Trace t;
  TraceEvent gemm;
  gemm.name = "ampere_fp16_gemm";
  gemm.dur_ns = 100;
  TraceEvent nccl;
  nccl.name = "ncclDevKernel_AllReduce_Sum_f16_RING_LL";
  nccl.start_ns = 50;
  nccl.dur_ns = 100;
  nccl.stream = 1;
  t.events = {gemm, nccl};
  const Metrics m = compute_metrics(t);
  REQUIRE(m.ranks.size() == 1);
  CHECK(m.ranks[0].compute_ns == 100);
  CHECK(m.ranks[0].hidden_comm_ns == 50);
  CHECK(m.ranks[0].exposed_comm_ns == 50);
  CHECK(m.ranks[0].idle_ns == 0);
}

TEST_CASE("An empty trace has zero metrics", "[traces][metrics]") {
  Trace t;
  t.ranks = 3;
  const Metrics m = compute_metrics(t);
  CHECK(m.iteration_ns == 0);
  CHECK(m.ranks.size() == 3);
  CHECK(m.bubble_fraction == 0);
}

TEST_CASE("processor sharing: each compute op's average rate on a shared device", "[traces][sharing]") {
  auto ev = [](int rank, ir::OpKind kind, std::int64_t start, std::int64_t dur) {
    TraceEvent e;
    e.rank = rank;
    e.kind = kind;
    e.name = std::string(ir::to_string(kind)) + "0";
    e.mb = 0;
    e.start_ns = start;
    e.dur_ns = dur;
    return e;
  };
  Trace t;
  // A [0,100) and B [50,150) overlap for 50 ns; C [60,90) overlaps both; a SEND too.
  t.events = {ev(0, ir::OpKind::F, 0, 100), ev(1, ir::OpKind::F, 50, 100), ev(2, ir::OpKind::B, 60, 30),
              ev(0, ir::OpKind::SEND, 0, 500)};
  // Capacity 1: A runs alone 0–50 (1), with B 50–60 (½), with B and C 60–90 (⅓), with B 90–100 (½).
  const auto one = shared_rates(t, 1.0);
  CHECK(one[0] == Approx((50 + 10 / 2.0 + 30 / 3.0 + 10 / 2.0) / 100));
  CHECK(one[1] == Approx((10 / 2.0 + 30 / 3.0 + 10 / 2.0 + 50) / 100));
  CHECK(one[2] == Approx(1 / 3.0));
  CHECK(one[3] == 1.0);  // not a compute op
  // Capacity 2: only the three-way stretch is shared (⅔ each).
  const auto two = shared_rates(t, 2.0);
  CHECK(two[0] == Approx((70 + 30 * 2 / 3.0) / 100));
  CHECK(two[2] == Approx(2 / 3.0));
  // No sharing.
  CHECK(shared_rates(t, 0) == std::vector<double>(4, 1.0));
}
