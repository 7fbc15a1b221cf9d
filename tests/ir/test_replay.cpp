// test_replay.cpp — the event engine: exact timings of hand-made plans (compute-only
// and lowered, with and without p2p latency), batches, collectives, deadlocks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/lowering.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/replay.hpp"

using namespace tdpipe::ir;

namespace {

/// Synthetic durations: F, B, W (BW = B + W), SEND = latency, everything else 0.
DurationFn synthetic(std::int64_t f, std::int64_t b, std::int64_t w, std::int64_t latency,
                     std::int64_t collective = 0) {
  return [=](const Op& op, int) -> std::int64_t {
    switch (op.kind) {
      case OpKind::F: return f;
      case OpKind::B: return b;
      case OpKind::W: return w;
      case OpKind::BW: return b + w;
      case OpKind::SEND: return latency;
      case OpKind::ALLREDUCE: return collective;
      default: return 0;
    }
  };
}

/// "start-end" of every compute op of a rank, in plan order.
std::string compute_times(const Plan& plan, const ReplayResult& r, int rank) {
  std::string out;
  const auto& ops = plan.ranks[rank];
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (!is_compute(ops[i].kind) || ops[i].kind == OpKind::OPT) continue;
    if (!out.empty()) out += ' ';
    out += op_to_text(ops[i]) + "@" + std::to_string(r.timing[rank][i].start_ns) + "-" +
           std::to_string(r.timing[rank][i].end_ns);
  }
  return out;
}

const char* k1f1b_p2_m3 =
    "rank0: F0 F1 BW0 F2 BW1 BW2\n"
    "rank1: F0 BW0 F1 BW1 F2 BW2\n";

}  // namespace

TEST_CASE("replay: compute-only 1F1B without latency is exact", "[replay]") {
  const Plan plan = plan_from_text(k1f1b_p2_m3);
  const ReplayResult r = replay(plan, synthetic(10, 20, 5, 0));
  CHECK(compute_times(plan, r, 0) == "F0@0-10 F1@10-20 BW0@45-70 F2@70-80 BW1@80-105 BW2@115-140");
  CHECK(compute_times(plan, r, 1) == "F0@10-20 BW0@20-45 F1@45-55 BW1@55-80 F2@80-90 BW2@90-115");
  // (m + p − 1)(F + B + W)
  CHECK(r.makespan_ns == 4 * 35);
}

TEST_CASE("replay: compute-only cross-rank dependencies add the SEND's duration", "[replay]") {
  // The zero-bubble paper's event logic: start = max(previous op ends, each
  // dependency ends + T_comm if it crosses ranks). Hand-computed with T_comm = 3.
  const Plan plan = plan_from_text(k1f1b_p2_m3);
  const ReplayResult r = replay(plan, synthetic(10, 20, 5, 3));
  CHECK(compute_times(plan, r, 0) == "F0@0-10 F1@10-20 BW0@51-76 F2@76-86 BW1@86-111 BW2@127-152");
  CHECK(compute_times(plan, r, 1) == "F0@13-23 BW0@23-48 F1@48-58 BW1@58-83 F2@89-99 BW2@99-124");
  CHECK(r.makespan_ns == 152);
}

TEST_CASE("replay: the synthetic SEND carries the producer's payload and ids", "[replay]") {
  const Plan plan = plan_from_text("rank0: F0.c0:s1 BW0:s1\nrank1: F0:s1 BW0:s1\n");
  std::vector<std::string> seen;
  replay(plan, [&](const Op& op, int rank) -> std::int64_t {
    if (op.kind == OpKind::SEND) seen.push_back(op_to_text(op) + " from " + std::to_string(rank));
    return 1;
  });
  std::sort(seen.begin(), seen.end());
  REQUIRE(seen == std::vector<std::string>{"SEND(B0:s1>r0) from 1", "SEND(F0:s1>r1) from 0"});
}

TEST_CASE("replay: lowered 1F1B with rendezvous SEND/RECV (hand-computed)", "[replay]") {
  const Plan lowered = lower(plan_from_text(k1f1b_p2_m3), LoweringOptions{});
  const ReplayResult r = replay(lowered, synthetic(10, 20, 5, 3));
  // A pair completes 3 ns after the later post; a batch is posted when all its
  // members' producers are done. Rank 0 posts SEND(F2>r1)+RECV(B1<r1) only after F2
  // (86), so B1, sent at 83, lands at 89 rather than 86 as in the compute-only replay.
  CHECK(compute_times(lowered, r, 0) == "F0@0-10 F1@10-20 BW0@51-76 F2@76-86 BW1@89-114 BW2@127-152");
  CHECK(compute_times(lowered, r, 1) == "F0@13-23 BW0@23-48 F1@48-58 BW1@58-83 F2@89-99 BW2@99-124");
  CHECK(r.makespan_ns == 152);
  // SEND(F1>r1)+RECV(B0<r1) on rank 0 is posted at 20 (after F1) and completes at 51.
  const auto& ops = lowered.ranks[0];
  int idx = -1;
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (op_to_text(ops[i]) == "RECV(B0<r1)") idx = static_cast<int>(i);
  REQUIRE(idx >= 0);
  CHECK(r.timing[0][idx].start_ns == 20);
  CHECK(r.timing[0][idx].end_ns == 51);
}

TEST_CASE("replay: without latency, the lowered plan times equal the compute-only ones", "[replay]") {
  const Plan plan = plan_from_text(k1f1b_p2_m3);
  const Plan lowered = lower(plan, LoweringOptions{});
  const ReplayResult a = replay(plan, synthetic(10, 20, 5, 0));
  const ReplayResult b = replay(lowered, synthetic(10, 20, 5, 0));
  for (int rank = 0; rank < 2; ++rank) CHECK(compute_times(plan, a, rank) == compute_times(lowered, b, rank));
}

TEST_CASE("replay: a batch moves its stream on only when every member completed", "[replay]") {
  // Rank 0 posts SEND(F0>r1)+SEND(F1>r1) together; rank 1 receives them in two
  // separate posts, the second only after its F0. The batch ends with the later pair.
  Plan plan = plan_from_text(
      "rank0: F0 F1 SEND(F0>r1)+SEND(F1>r1) RECV(B0<r1) BW0 RECV(B1<r1) BW1\n"
      "rank1: RECV(F0<r0) F0 RECV(F1<r0) BW0 SEND(B0>r0) F1 BW1 SEND(B1>r0)\n");
  const ReplayResult r = replay(plan, synthetic(10, 20, 5, 2));
  // SEND batch posted at 20 (after F1); RECV(F0) posted at 0 → pair ends 22.
  CHECK(r.timing[0][2].start_ns == 20);
  CHECK(r.timing[0][2].end_ns == 22);
  // rank 1: F0 22-32; RECV(F1) is posted at 22 (stream free at 22) → pair ends 24.
  CHECK(r.timing[1][1].start_ns == 22);
  CHECK(r.timing[1][2].start_ns == 22);
  CHECK(r.timing[0][3].end_ns == 24);
  // rank 0's next RECV(B0) cannot be posted before the batch completes (24).
  CHECK(r.timing[0][4].start_ns == 24);
}

TEST_CASE("replay: collectives run their duration once posted, after their deps", "[replay]") {
  Plan plan = plan_from_text("rank0: F0 BW0 ALLREDUCE(b0) OPT\n");
  plan.ranks[0][2].deps = {{0, 1}};
  plan.ranks[0][3].deps = {{0, 2}};
  const ReplayResult r = replay(plan, synthetic(10, 20, 5, 0, 7));
  CHECK(r.timing[0][2].start_ns == 35);
  CHECK(r.timing[0][2].end_ns == 42);
  CHECK(r.timing[0][3].start_ns == 42);
  CHECK(r.makespan_ns == 42);
}

TEST_CASE("replay: a compute-only cross-rank cycle is reported as a deadlock", "[replay]") {
  const Plan plan = plan_from_text("rank0: F0 BW0 F1 BW1\nrank1: F1 BW1 F0 BW0\n");
  REQUIRE_THROWS_MATCHES(
      replay(plan, synthetic(1, 1, 1, 0)), tdpipe::Error,
      Catch::Matchers::Message(
          "plan deadlocks under blocking send/recv (2 stream(s) blocked):\n"
          "  rank 0 blocked on BW0 (waits for BW0 on rank 1, which is blocked on F1)\n"
          "  rank 1 blocked on F1 (waits for F1 on rank 0, which is blocked on BW0)"));
}

TEST_CASE("replay: RECV before SEND on both ranks deadlocks, naming both peers", "[replay]") {
  const Plan plan = plan_from_text(
      "rank0: F0 RECV(B0<r1) SEND(F0>r1) BW0\n"
      "rank1: RECV(F0<r0) F0 BW0 SEND(B0>r0)\n");
  REQUIRE_THROWS_MATCHES(
      replay(plan, synthetic(1, 1, 1, 1)), tdpipe::Error,
      Catch::Matchers::Message(
          "plan deadlocks under blocking send/recv (4 stream(s) blocked):\n"
          "  rank 0 blocked on BW0 (waits for RECV(B0<r1) on rank 0)\n"
          "  rank 0 blocked on RECV(B0<r1) (peer rank 1 is blocked on RECV(F0<r0))\n"
          "  rank 1 blocked on F0 (waits for RECV(F0<r0) on rank 1)\n"
          "  rank 1 blocked on RECV(F0<r0) (peer rank 0 is blocked on RECV(B0<r1))"));
}

TEST_CASE("replay: a SEND without its RECV blocks forever and says so", "[replay]") {
  const Plan plan = plan_from_text("rank0: F0 SEND(F0>r1) BW0\nrank1: F0 BW0\n");
  REQUIRE_THROWS_WITH(replay(plan, synthetic(1, 1, 1, 1)),
                      Catch::Matchers::Contains("rank 0 blocked on SEND(F0>r1) (no matching RECV on rank 1)"));
}
