// test_validate.cpp — the validator rejects each kind of broken plan with a message
// naming ranks and ops, and reports peak in-flight activations and bytes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/lowering.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/validate.hpp"

using namespace tdpipe::ir;
using Catch::Matchers::Contains;
using Catch::Matchers::Message;

namespace {

/// Megatron's 1F1B order in text form: min(p − r − 1, m) warm-up forwards, F/BW pairs, cool-down.
std::string one_f_one_b(int p, int m) {
  std::string out;
  for (int r = 0; r < p; ++r) {
    out += "rank" + std::to_string(r) + ":";
    const int warm = std::min(p - r - 1, m);
    int f = 0, b = 0;
    for (; f < warm; ++f) out += " F" + std::to_string(f);
    while (f < m) {
      out += " F" + std::to_string(f++);
      out += " BW" + std::to_string(b++);
    }
    while (b < m) out += " BW" + std::to_string(b++);
    out += "\n";
  }
  return out;
}

std::string gpipe(int p, int m) {
  std::string out;
  for (int r = 0; r < p; ++r) {
    out += "rank" + std::to_string(r) + ":";
    for (int f = 0; f < m; ++f) out += " F" + std::to_string(f);
    for (int b = 0; b < m; ++b) out += " BW" + std::to_string(b);
    out += "\n";
  }
  return out;
}

Plan with_memory(Plan plan, double f_bytes) {
  for (auto& ops : plan.ranks)
    for (Op& op : ops) {
      if (op.kind == OpKind::F) op.mem_bytes = f_bytes;
      if (op.kind == OpKind::BW) op.mem_bytes = -f_bytes;
    }
  return plan;
}

}  // namespace

TEST_CASE("validate: a missing op is named with its rank", "[validate]") {
  const Plan plan = plan_from_text("rank0: F0 F1 BW0 BW1\nrank1: F0 BW0 F1\n");
  REQUIRE_THROWS_MATCHES(validate(plan), tdpipe::Error,
                         Message("invalid plan: 1 problem(s) with compute ops:\n"
                                 "  missing BW1 (or B and W) on rank 1 (micro-batch 1, virtual stage 1, slice 0)"));
}

TEST_CASE("validate: a duplicate op is named with both positions", "[validate]") {
  const Plan plan = plan_from_text("rank0: F0 F0 BW0\nrank1: F0 BW0\n");
  REQUIRE_THROWS_MATCHES(validate(plan), tdpipe::Error,
                         Message("invalid plan: 1 problem(s) with compute ops:\n"
                                 "  duplicate F0: rank 0 op #0 F0 and rank 0 op #1 F0"));
}

TEST_CASE("validate: backward pieces must be one BW or one B plus one W", "[validate]") {
  SECTION("B without W") {
    REQUIRE_THROWS_WITH(validate(plan_from_text("rank0: F0 B0\nrank1: F0 BW0\n")),
                        Contains("missing W0 on rank 0 (rank 0 op #1 B0 computes the input gradient only)"));
  }
  SECTION("BW and W") {
    REQUIRE_THROWS_WITH(
        validate(plan_from_text("rank0: F0 BW0 W0\n")),
        Contains("rank 0 op #1 BW0 and rank 0 op #2 W0: a fused BW already computes the weight gradient"));
  }
  SECTION("B and BW") {
    REQUIRE_THROWS_WITH(
        validate(plan_from_text("rank0: F0 B0 BW0 W0\n")),
        Contains("rank 0 op #1 B0 and rank 0 op #2 BW0: a backward is either one BW or one B plus one W"));
  }
}

TEST_CASE("validate: order on a rank — B before its F, W before its B", "[validate]") {
  REQUIRE_THROWS_MATCHES(validate(plan_from_text("rank0: BW0 F0\nrank1: F0 BW0\n")), tdpipe::Error,
                         Message("invalid plan: 1 problem(s) with op order:\n"
                                 "  rank 0: BW0 (op #0) comes before F0 (op #1); a backward needs its "
                                 "forward's activations"));
  REQUIRE_THROWS_WITH(validate(plan_from_text("rank0: F0 W0 B0\nrank1: F0 B0 W0\n")),
                      Contains("rank 0: W0 (op #1) comes before B0 (op #2); W needs the output gradient its B "
                               "received"));
}

TEST_CASE("validate: slice order", "[validate]") {
  REQUIRE_THROWS_WITH(validate(plan_from_text("rank0: F0:s1 F0 BW0:s1 BW0\n")),
                      Contains("rank 0: F0:s1 (op #0) comes before F0 (op #1); slices of a micro-batch run "
                               "forward in order"));
  REQUIRE_THROWS_WITH(validate(plan_from_text("rank0: F0 F0:s1 BW0 BW0:s1\n")),
                      Contains("rank 0: BW0 (op #2) comes before BW0:s1 (op #3); backward runs slices in "
                               "reverse order"));
}

TEST_CASE("validate: ids out of range and bad stage maps", "[validate]") {
  Plan plan = plan_from_text("# schedule=x p=2 m=1 v=1 S=1 d=1\nrank0: F0 F1 BW0 BW1\nrank1: F0 BW0\n");
  REQUIRE_THROWS_WITH(validate(plan),
                      Contains("rank 0 op #1 F1: micro-batch 1 outside 0..0 (plan.microbatches = 1)"));
  plan = plan_from_text("rank0: F0 BW0\nrank1: F0 BW0\n");
  plan.stage_of = {{0}, {0}};
  REQUIRE_THROWS_MATCHES(validate(plan), tdpipe::Error,
                         Message("invalid plan: 2 problem(s) with plan shape:\n"
                                 "  virtual stage 0 is run by rank 0 chunk 0 and by rank 1 chunk 0\n"
                                 "  virtual stage 1 is run by no rank's chunk (stage_of)"));
}

TEST_CASE("validate: an op's duration must be a number of seconds every engine can time", "[validate]") {
  // Both engines time an op by est_seconds (a compressed all-reduce: its kernels); NaN,
  // negative or beyond int64 ns would mean different things to each.
  for (const double bad : {std::nan(""), -1e-6, 1e10}) {
    Plan plan = plan_from_text(one_f_one_b(2, 2));
    plan.ranks[1][0].est_seconds = bad;
    INFO(bad);
    REQUIRE_THROWS_WITH(validate(plan), Contains("rank 1 op #0 F0: est_seconds") &&
                                            Contains("expected a duration from 0 to 9e9 s"));
  }
  Plan ok = plan_from_text(one_f_one_b(2, 2));
  ok.ranks[1][0].est_seconds = 9e9;
  CHECK_NOTHROW(validate(ok));
}

TEST_CASE("validate: SEND/RECV pairing", "[validate]") {
  SECTION("a SEND without its RECV") {
    const Plan plan = plan_from_text(
        "rank0: F0 SEND(F0>r1) RECV(B0<r1) BW0\n"
        "rank1: F0 BW0 SEND(B0>r0)\n");
    REQUIRE_THROWS_MATCHES(validate(plan), tdpipe::Error,
                           Message("invalid plan: 1 problem(s) with SEND/RECV:\n"
                                   "  rank 0 op #1 SEND(F0>r1) has no matching RECV(F0<r0) on rank 1"));
  }
  SECTION("a cross-rank dependency with neither") {
    const Plan plan = plan_from_text("rank0: F0 SEND(F0>r1) RECV(B0<r1) BW0\nrank1: RECV(F0<r0) F0 BW0\n");
    REQUIRE_THROWS_WITH(validate(plan), Contains("rank 0 op #2 RECV(B0<r1) has no matching SEND(B0>r0) on rank 1"));
  }
  LoweringOptions opt;
  opt.p2p_bytes = [](const Op&) -> std::int64_t { return 100; };
  Plan low = lower(plan_from_text(one_f_one_b(3, 3)), opt);
  REQUIRE_NOTHROW(validate(low));
  SECTION("bytes differ") {
    for (Op& op : low.ranks[1])
      if (op_to_text(op) == "RECV(F0<r0)") op.bytes = 99;
    REQUIRE_THROWS_WITH(validate(low),
                        Contains("rank 0 op #1 SEND(F0>r1) carries 100 bytes but rank 1 op #0 RECV(F0<r0) expects 99"));
  }
  SECTION("wrong peer") {
    low.ranks[0][1].peer = 2;
    REQUIRE_THROWS_WITH(validate(low),
                        Contains("rank 0 op #1 SEND(F0>r2) goes to rank 2 but the consumer (virtual stage 1) runs "
                                 "on rank 1"));
  }
  SECTION("a transfer nobody needs: zb-v's tip stays on one rank") {
    const Plan plan = plan_from_text(
        "# schedule=zb-v p=2 m=1 v=2 S=1 d=1 lowered=1 stage_of=[[0,3],[1,2]]\n"
        "rank0: F0 SEND(F0>r1)+RECV(F0.c1<r1) F0.c1 B0.c1 SEND(B0.c1>r1) W0.c1 RECV(B0<r1) B0 W0\n"
        "rank1: RECV(F0<r0) F0 SEND(F0>r0) F0.c1 SEND(F0.c1>r0)+RECV(B0.c1<r0) B0.c1 W0.c1 B0 SEND(B0>r0) W0\n");
    REQUIRE_THROWS_MATCHES(validate(plan), tdpipe::Error,
                           Message("invalid plan (zb-v): 1 problem(s) with SEND/RECV:\n"
                                   "  rank 1 op #2 SEND(F0>r0): rank 1 op #1 F0 and its consumer (virtual stage 2) "
                                   "are on one rank or the consumer does not exist; no transfer is needed"));
  }
}

TEST_CASE("validate: an order that deadlocks under blocking send/recv", "[validate]") {
  SECTION("compute-only: a cross-rank cycle") {
    REQUIRE_THROWS_WITH(validate(plan_from_text("rank0: F0 BW0 F1 BW1\nrank1: F1 BW1 F0 BW0\n")),
                        Contains("rank 0 blocked on BW0 (waits for BW0 on rank 1, which is blocked on F1)"));
  }
  SECTION("lowered: both ranks receive before they send") {
    const Plan plan = plan_from_text(
        "rank0: F0 RECV(B0<r1) SEND(F0>r1) BW0\n"
        "rank1: RECV(F0<r0) F0 BW0 SEND(B0>r0)\n");
    REQUIRE_THROWS_WITH(validate(plan), Contains("plan deadlocks under blocking send/recv") &&
                                            Contains("rank 0 blocked on RECV(B0<r1) (peer rank 1 is blocked on "
                                                     "RECV(F0<r0))"));
  }
}

TEST_CASE("validate: peak in-flight activations — 1F1B holds p − r, GPipe m", "[validate]") {
  for (int p : {2, 4, 5}) {
    for (int m : {1, 3, 8}) {
      CAPTURE(p, m);
      const ValidationReport a = validate(with_memory(plan_from_text(one_f_one_b(p, m)), 3.0));
      const ValidationReport b = validate(with_memory(plan_from_text(gpipe(p, m)), 3.0));
      const ValidationReport c = validate(lower(plan_from_text(one_f_one_b(p, m)), LoweringOptions{}));
      for (int r = 0; r < p; ++r) {
        CHECK(a.ranks[r].peak_inflight == std::min(p - r, m));
        CHECK(a.ranks[r].peak_activation_bytes == 3.0 * std::min(p - r, m));
        CHECK(b.ranks[r].peak_inflight == m);
        CHECK(b.ranks[r].peak_activation_bytes == 3.0 * m);
        CHECK(c.ranks[r].peak_inflight == std::min(p - r, m));
      }
    }
  }
}

TEST_CASE("validate: W frees the rest of an activation", "[validate]") {
  Plan plan = plan_from_text("rank0: F0 F1 B0 W0 B1 W1\n");
  for (Op& op : plan.ranks[0]) {
    if (op.kind == OpKind::F) op.mem_bytes = 10;
    if (op.kind == OpKind::B) op.mem_bytes = -6;
    if (op.kind == OpKind::W) op.mem_bytes = -4;
  }
  const ValidationReport rep = validate(plan);
  CHECK(rep.ranks[0].peak_inflight == 2);
  CHECK(rep.ranks[0].peak_activation_bytes == 20);
}
