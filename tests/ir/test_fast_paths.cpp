// test_fast_paths.cpp — the additive fast paths of the IR agree with the plain ones:
// validate without the deadlock replay still runs every other check, replay_flat is
// replay's timing flattened, op_to_chars is op_to_text without a heap string, and
// lower() keeps the one global transfer order when a rank's compute ops end out of
// order (its general path).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/lowering.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/replay.hpp"
#include "tdpipe/ir/validate.hpp"

using namespace tdpipe::ir;
using Catch::Matchers::Contains;

namespace {

ValidateOptions without_replay() {
  ValidateOptions o;
  o.check_deadlock = false;
  return o;
}

}  // namespace

TEST_CASE("validate: check_deadlock = false skips the replay and nothing else", "[validate][fast]") {
  // Both ranks receive before they send: well formed, but deadlocks.
  const Plan deadlocks = plan_from_text(
      "rank0: F0 RECV(B0<r1) SEND(F0>r1) BW0\n"
      "rank1: RECV(F0<r0) F0 BW0 SEND(B0>r0)\n");
  REQUIRE_THROWS_WITH(validate(deadlocks), Contains("plan deadlocks under blocking send/recv"));
  const ValidationReport report = validate(deadlocks, without_replay());
  REQUIRE(report.ranks.size() == 2);
  CHECK(report.ranks[0].peak_inflight == 1);

  // A missing RECV is still rejected.
  const Plan missing = plan_from_text(
      "rank0: F0 SEND(F0>r1) RECV(B0<r1) BW0\n"
      "rank1: F0 BW0 SEND(B0>r0)\n");
  REQUIRE_THROWS_WITH(validate(missing, without_replay()),
                      Contains("rank 0 op #1 SEND(F0>r1) has no matching RECV(F0<r0) on rank 1"));
  // So is a backward before its forward.
  REQUIRE_THROWS_WITH(validate(plan_from_text("rank0: BW0 F0\n"), without_replay()),
                      Contains("BW0 (op #0) comes before F0 (op #1)"));
}

TEST_CASE("replay_flat: replay()'s timing, rank after rank", "[replay][fast]") {
  Plan plan = lower(plan_from_text("rank0: F0 F1 BW0 F2 BW1 BW2\nrank1: F0 BW0 F1 BW1 F2 BW2\n"
                                   "rank2: F0 BW0 F1 BW1 F2 BW2\n"),
                    LoweringOptions{});
  plan.stages = 3;
  const DurationFn d = [](const Op& op, int rank) -> std::int64_t {
    return op.kind == OpKind::SEND ? 7 : 10 + 3 * rank + (op.kind == OpKind::BW ? 11 : 0);
  };
  const ReplayResult nested = replay(plan, d);
  const std::vector<OpTiming> flat = replay_flat(plan, d);
  std::size_t g = 0;
  for (const auto& rank : nested.timing)
    for (const OpTiming& t : rank) {
      REQUIRE(g < flat.size());
      CHECK(flat[g].start_ns == t.start_ns);
      CHECK(flat[g].end_ns == t.end_ns);
      ++g;
    }
  CHECK(g == flat.size());
}

TEST_CASE("op_to_chars: op_to_text into a char buffer", "[plan_io][fast]") {
  std::vector<Op> ops;
  Op f;
  f.kind = OpKind::F;
  f.mb = 1023;
  f.chunk = 3;
  f.slice = 2;
  ops.push_back(f);
  Op send;
  send.kind = OpKind::SEND;
  send.payload = OpKind::B;
  send.mb = 123456789;
  send.chunk = 2147483647;
  send.slice = -2147483647 - 1;
  send.peer = 2147483647;
  send.stream = Stream::Compute;  // not its default: "@compute"
  ops.push_back(send);
  Op ar;
  ar.kind = OpKind::REDUCE_SCATTER;
  ar.tag = 17;
  ar.chunk = 1;
  ar.stream = Stream::DP;
  ops.push_back(ar);
  Op opt;
  opt.kind = OpKind::OPT;
  ops.push_back(opt);
  for (const Op& op : ops) {
    char buf[kOpTextMax];
    const std::string text = op_to_text(op);
    CAPTURE(text);
    CHECK(text.size() <= kOpTextMax);
    CHECK(std::string(buf, op_to_chars(op, buf, sizeof buf)) == text);
    // A short buffer gets the prefix that fits, never more.
    char small[5];
    CHECK(std::string(small, op_to_chars(op, small, sizeof small)) == text.substr(0, 5));
  }
}

TEST_CASE("lower: compute ops that end out of order on a rank keep the global order", "[lowering][fast]") {
  // Rank 0 runs F1 on the DP stream beside F0, so F1 ends first although it comes
  // second: its transfer is the earlier one on both ranks.
  Plan plan = plan_from_text("rank0: F0 F1@dp BW0 BW1\nrank1: F0 F1 BW0 BW1\n");
  for (auto& ops : plan.ranks)
    for (Op& op : ops) op.est_seconds = op.kind == OpKind::F ? 5e-9 : 2e-9;
  plan.ranks[0][0].est_seconds = 50e-9;  // rank 0's F0 ends after its F1
  const Plan low = lower(plan, LoweringOptions{});
  validate(low);  // with the replay: deadlock-free
  std::vector<std::string> sends, recvs;
  for (const Op& op : low.ranks[0])
    if (op.kind == OpKind::SEND) sends.push_back(op_to_text(op));
  for (const Op& op : low.ranks[1])
    if (op.kind == OpKind::RECV) recvs.push_back(op_to_text(op));
  CHECK(sends == std::vector<std::string>{"SEND(F1>r1)", "SEND(F0>r1)"});
  CHECK(recvs == std::vector<std::string>{"RECV(F1<r0)", "RECV(F0<r0)"});
}

TEST_CASE("lower_validated: validate(lower()) in one call, same plan, report and errors", "[lowering][fast]") {
  const Plan one_f_one_b = plan_from_text(
      "rank0: F0 F1 BW0 F2 BW1 F3 BW2 BW3\nrank1: F0 BW0 F1 BW1 F2 BW2 F3 BW3\n");
  for (const ValidateOptions& checks : {ValidateOptions{}, without_replay()}) {
    const LoweredPlan both = lower_validated(one_f_one_b, LoweringOptions{}, checks);
    const Plan lowered = lower(one_f_one_b, LoweringOptions{});
    CHECK(both.plan == lowered);
    const ValidationReport report = validate(lowered, checks);
    REQUIRE(both.report.ranks.size() == report.ranks.size());
    for (std::size_t r = 0; r < report.ranks.size(); ++r) {
      CHECK(both.report.ranks[r].peak_inflight == report.ranks[r].peak_inflight);
      CHECK(both.report.ranks[r].peak_activation_bytes == report.ranks[r].peak_activation_bytes);
    }
  }
  // An input lower() accepts but the validator rejects: the same error either way.
  const Plan twice = plan_from_text("rank0: F0 F0 BW0\n");
  std::string direct, fused;
  try {
    (void)validate(lower(twice, LoweringOptions{}));
  } catch (const tdpipe::Error& e) {
    direct = e.what();
  }
  try {
    (void)lower_validated(twice, LoweringOptions{}, ValidateOptions{});
  } catch (const tdpipe::Error& e) {
    fused = e.what();
  }
  CHECK_FALSE(direct.empty());
  CHECK(fused == direct);
}
