// test_lowering.cpp — compute-only → lowered: exact SEND/RECV placement and batches
// (1F1B, zb-v's V with its same-rank tip, interleaved), deps, bytes, DP buckets, OPT.
#include <catch2/catch.hpp>

#include <string>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/lowering.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/validate.hpp"

using namespace tdpipe::ir;

namespace {

/// The text form without its header line.
std::string rank_lines(const Plan& plan) {
  const std::string text = to_text(plan);
  std::string out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(pos, nl - pos);
    if (!line.empty() && line[0] != '#') out += line + "\n";
    pos = nl + 1;
  }
  return out;
}

int index_of(const Plan& plan, int rank, const std::string& text) {
  const auto& ops = plan.ranks[rank];
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (op_to_text(ops[i]) == text) return static_cast<int>(i);
  return -1;
}

}  // namespace

TEST_CASE("lower: 1F1B p=2 m=3 — SENDs after producers, RECVs posted by the time data is ready",
          "[lowering]") {
  // Reference timeline (1 ns per op): rank 1 runs F0 1-2, BW0 2-3 while F1 is ready
  // on rank 0 at 2, so RECV(F1<r0) is posted before BW0, as the zero-bubble event
  // logic receives it; rank 0 pairs SEND(F1) with RECV(B0) as Megatron does.
  const Plan plan = plan_from_text(
      "rank0: F0 F1 BW0 F2 BW1 BW2\n"
      "rank1: F0 BW0 F1 BW1 F2 BW2\n");
  LoweringOptions opt;
  opt.p2p_bytes = [](const Op& producer) -> std::int64_t {
    return producer.kind == OpKind::F ? 1000 + producer.mb : 7;
  };
  const Plan low = lower(plan, opt);
  CHECK(low.lowered);
  CHECK(rank_lines(low) ==
        "rank0: F0 SEND(F0>r1) F1 SEND(F1>r1)+RECV(B0<r1) BW0 F2 SEND(F2>r1)+RECV(B1<r1) BW1 RECV(B2<r1) BW2 OPT\n"
        "rank1: RECV(F0<r0) F0 RECV(F1<r0) BW0 SEND(B0>r0) F1 BW1 SEND(B1>r0)+RECV(F2<r0) F2 BW2 SEND(B2>r0) OPT\n");

  SECTION("comm ops are on the p2p stream with the producer's bytes") {
    const Op& send = low.ranks[0][index_of(low, 0, "SEND(F1>r1)")];
    CHECK(send.stream == Stream::P2P);
    CHECK(send.bytes == 1001);
    CHECK(send.batch >= 0);
    const Op& recv = low.ranks[1][index_of(low, 1, "RECV(F1<r0)")];
    CHECK(recv.bytes == 1001);
    CHECK(low.ranks[1][index_of(low, 1, "SEND(B1>r0)")].bytes == 7);
    CHECK(low.ranks[0][index_of(low, 0, "RECV(B1<r1)")].bytes == 7);
    // A lone comm op is not batched.
    CHECK(low.ranks[0][index_of(low, 0, "SEND(F0>r1)")].batch == -1);
  }
  SECTION("explicit deps: SEND → producer, consumer → RECV, OPT → last backward") {
    const Op& send = low.ranks[0][index_of(low, 0, "SEND(F1>r1)")];
    REQUIRE(send.deps == std::vector<OpRef>{{0, index_of(low, 0, "F1")}});
    const Op& bw0 = low.ranks[0][index_of(low, 0, "BW0")];
    REQUIRE(bw0.deps == std::vector<OpRef>{{0, index_of(low, 0, "RECV(B0<r1)")}});
    CHECK(low.ranks[0][index_of(low, 0, "F1")].deps.empty());
    const Op& opt_op = low.ranks[1].back();
    CHECK(opt_op.kind == OpKind::OPT);
    REQUIRE(opt_op.deps == std::vector<OpRef>{{1, index_of(low, 1, "BW2")}});
  }
  SECTION("the result validates and lowering twice is refused") {
    const ValidationReport rep = validate(low);
    REQUIRE(rep.ranks.size() == 2);
    CHECK(rep.ranks[0].peak_inflight == 2);
    CHECK(rep.ranks[1].peak_inflight == 1);
    REQUIRE_THROWS_WITH(lower(low, opt), Catch::Matchers::Contains("already lowered"));
  }
  SECTION("text round trip of the lowered plan keeps the batches") {
    CHECK(rank_lines(plan_from_text(to_text(low))) == rank_lines(low));
  }
  SECTION("overlap_p2p false: each compute op waits for the sends posted since the last one") {
    LoweringOptions blocking = opt;
    blocking.overlap_p2p = false;
    const Plan b = lower(plan, blocking);
    CHECK(rank_lines(b) == rank_lines(low));  // the same order, more dependencies
    auto at = [&](int r, const char* text) { return OpRef{r, index_of(b, r, text)}; };
    CHECK(b.ranks[0][index_of(b, 0, "F1")].deps == std::vector<OpRef>{at(0, "SEND(F0>r1)")});
    CHECK(b.ranks[0][index_of(b, 0, "BW0")].deps == std::vector<OpRef>{at(0, "RECV(B0<r1)"), at(0, "SEND(F1>r1)")});
    CHECK(b.ranks[1][index_of(b, 1, "F1")].deps == std::vector<OpRef>{at(1, "RECV(F1<r0)"), at(1, "SEND(B0>r0)")});
    CHECK(b.ranks[1].back().deps == std::vector<OpRef>{at(1, "BW2"), at(1, "SEND(B2>r0)")});  // OPT
    CHECK(b.ranks[0][index_of(b, 0, "F0")].deps.empty());
    // A RECV posted ahead (rank 1's RECV(F1) before BW0) gates only the op that needs it.
    CHECK(b.ranks[1][index_of(b, 1, "BW0")].deps == low.ranks[1][index_of(low, 1, "BW0")].deps);
    CHECK(validate(b).ranks.size() == 2);  // with the deadlock replay
  }
}

TEST_CASE("lower: zb-v's V needs no transfer at its tip", "[lowering]") {
  // Virtual stages 0,1 go down ranks 0,1 and 2,3 come back up: rank 1 runs 1 and 2.
  Plan plan = plan_from_text(
      "rank0: F0 F0.c1 B0.c1 W0.c1 B0 W0\n"
      "rank1: F0 F0.c1 B0.c1 W0.c1 B0 W0\n");
  plan.stage_of = {{0, 3}, {1, 2}};
  LoweringOptions opt;
  opt.optimizer_step = false;
  const Plan low = lower(plan, opt);
  CHECK(rank_lines(low) ==
        "rank0: F0 SEND(F0>r1)+RECV(F0.c1<r1) F0.c1 B0.c1 SEND(B0.c1>r1) W0.c1 RECV(B0<r1) B0 W0\n"
        "rank1: RECV(F0<r0) F0 F0.c1 SEND(F0.c1>r0)+RECV(B0.c1<r0) B0.c1 W0.c1 B0 SEND(B0>r0) W0\n");
  const ValidationReport rep = validate(low);
  CHECK(rep.ranks[0].peak_inflight == 2);
}

TEST_CASE("lower: interleaved p=2 v=2 m=2 sends between chunks on both ranks", "[lowering]") {
  const Plan plan = plan_from_text(
      "rank0: F0 F1 F0.c1 F1.c1 BW0.c1 BW1.c1 BW0 BW1\n"
      "rank1: F0 F1 F0.c1 BW0.c1 F1.c1 BW1.c1 BW0 BW1\n");
  const Plan low = lower(plan, LoweringOptions{});
  CHECK(rank_lines(low) ==
        "rank0: F0 SEND(F0>r1) F1 SEND(F1>r1)+RECV(F0<r1) F0.c1 SEND(F0.c1>r1)+RECV(F1<r1) F1.c1 "
        "SEND(F1.c1>r1)+RECV(B0.c1<r1) BW0.c1 SEND(B0.c1>r1)+RECV(B1.c1<r1) BW1.c1 SEND(B1.c1>r1)+RECV(B0<r1) "
        "BW0 RECV(B1<r1) BW1 OPT\n"
        "rank1: RECV(F0<r0) F0 SEND(F0>r0)+RECV(F1<r0) F1 SEND(F1>r0)+RECV(F0.c1<r0) F0.c1 RECV(F1.c1<r0) "
        "BW0.c1 SEND(B0.c1>r0) F1.c1 RECV(B0.c1<r0) BW1.c1 SEND(B1.c1>r0) BW0 "
        "SEND(B0>r0)+RECV(B1.c1<r0) BW1 SEND(B1>r0) OPT\n");
  CHECK_NOTHROW(validate(low));
}

TEST_CASE("lower: sliced ops carry their slice - same-rank slice deps need nothing", "[lowering]") {
  const Plan plan = plan_from_text(
      "rank0: F0:s0 F0:s1 BW0:s1 BW0:s0\n"
      "rank1: F0:s0 F0:s1 BW0:s1 BW0:s0\n");
  LoweringOptions opt;
  opt.optimizer_step = false;
  const Plan low = lower(plan, opt);
  CHECK(rank_lines(low) ==
        "rank0: F0 SEND(F0>r1) F0:s1 SEND(F0:s1>r1)+RECV(B0:s1<r1) BW0:s1 RECV(B0<r1) BW0\n"
        "rank1: RECV(F0<r0) F0 RECV(F0:s1<r0) F0:s1 BW0:s1 SEND(B0:s1>r0) BW0 SEND(B0>r0)\n");
  CHECK_NOTHROW(validate(low));
}

TEST_CASE("lower: data parallelism adds bucketed all-reduces and OPT after them", "[lowering]") {
  Plan plan = plan_from_text(
      "rank0: F0 F1 F0.c1 F1.c1 BW0.c1 BW1.c1 BW0 BW1\n"
      "rank1: F0 F1 F0.c1 BW0.c1 F1.c1 BW1.c1 BW0 BW1\n");
  plan.data = 4;
  LoweringOptions opt;
  opt.grad_bytes = [](int, int chunk) -> std::int64_t { return chunk == 1 ? 100 : 50; };
  opt.bucket_bytes = 40;
  opt.optimizer_seconds = [](int rank) { return 0.5 + rank; };

  SECTION("overlapped: a chunk's buckets start after its last backward") {
    const Plan low = lower(plan, opt);
    CHECK(rank_lines(low) ==
          "rank0: F0 SEND(F0>r1) F1 SEND(F1>r1)+RECV(F0<r1) F0.c1 SEND(F0.c1>r1)+RECV(F1<r1) F1.c1 "
          "SEND(F1.c1>r1)+RECV(B0.c1<r1) BW0.c1 SEND(B0.c1>r1)+RECV(B1.c1<r1) BW1.c1 SEND(B1.c1>r1)+RECV(B0<r1) "
          "ALLREDUCE(b0.c1) ALLREDUCE(b1.c1) ALLREDUCE(b2.c1) BW0 RECV(B1<r1) BW1 ALLREDUCE(b3) ALLREDUCE(b4) OPT\n"
          "rank1: RECV(F0<r0) F0 SEND(F0>r0)+RECV(F1<r0) F1 SEND(F1>r0)+RECV(F0.c1<r0) F0.c1 RECV(F1.c1<r0) "
          "BW0.c1 SEND(B0.c1>r0) F1.c1 RECV(B0.c1<r0) BW1.c1 SEND(B1.c1>r0) ALLREDUCE(b0.c1) "
          "ALLREDUCE(b1.c1) ALLREDUCE(b2.c1) BW0 SEND(B0>r0)+RECV(B1.c1<r0) BW1 SEND(B1>r0) ALLREDUCE(b3) "
          "ALLREDUCE(b4) OPT\n");
    const int ar = index_of(low, 0, "ALLREDUCE(b2.c1)");
    const Op& a = low.ranks[0][ar];
    CHECK(a.stream == Stream::DP);
    CHECK(a.bytes == 20);
    CHECK(a.tag == 2);
    REQUIRE(a.deps == std::vector<OpRef>{{0, index_of(low, 0, "BW1.c1")}});
    CHECK(low.ranks[0][index_of(low, 0, "ALLREDUCE(b4)")].bytes == 10);
    // Overlapped: each bucket may start once the last backward has produced its bytes
    // (chunk 1: 40 + 40 + 20 of 100; chunk 0: 40 + 10 of 50); the last one at its end.
    CHECK(low.ranks[0][index_of(low, 0, "ALLREDUCE(b0.c1)")].ready_after == Approx(0.4f));
    CHECK(low.ranks[0][index_of(low, 0, "ALLREDUCE(b1.c1)")].ready_after == Approx(0.8f));
    CHECK(a.ready_after == 1.0f);
    CHECK(low.ranks[0][index_of(low, 0, "ALLREDUCE(b3)")].ready_after == Approx(0.8f));
    CHECK(low.ranks[0][index_of(low, 0, "ALLREDUCE(b4)")].ready_after == 1.0f);
    const Op& o = low.ranks[1].back();
    CHECK(o.kind == OpKind::OPT);
    CHECK(o.est_seconds == 1.5);
    REQUIRE(o.deps.size() == 5);
    for (const OpRef& d : o.deps) CHECK(low.at(d).kind == OpKind::ALLREDUCE);
    CHECK_NOTHROW(validate(low));
  }
  SECTION("not overlapped: every bucket waits for the rank's last backward") {
    opt.overlap_dp = false;
    const Plan low = lower(plan, opt);
    const int last = index_of(low, 0, "BW1");
    for (const char* name : {"ALLREDUCE(b0.c1)", "ALLREDUCE(b3)"}) {
      const int i = index_of(low, 0, name);
      REQUIRE(i > last);
      REQUIRE(low.ranks[0][i].deps == std::vector<OpRef>{{0, last}});
      CHECK(low.ranks[0][i].ready_after == 1.0f);  // not before the rank's last backward ends
    }
  }
  SECTION("sharded optimizer (ZeRO-1): reduce-scatter before OPT, all-gather of each bucket after it") {
    opt.shard_optimizer = true;
    const Plan low = lower(plan, opt);
    CHECK(index_of(low, 0, "ALLREDUCE(b0.c1)") == -1);
    const auto& ops = low.ranks[0];
    const int o = index_of(low, 0, "OPT");
    REQUIRE(o >= 0);
    int scatters = 0, gathers = 0;
    for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
      const Op& op = ops[static_cast<std::size_t>(i)];
      if (op.kind == OpKind::REDUCE_SCATTER) {
        CHECK(i < o);
        CHECK(op.stream == Stream::DP);
        ++scatters;
      }
      if (op.kind == OpKind::ALL_GATHER) {
        CHECK(i > o);
        CHECK(op.stream == Stream::DP);
        CHECK(op.deps == std::vector<OpRef>{{0, o}});
        // The same bucket as the k-th reduce-scatter: tag, chunk and bytes.
        int k = 0;
        for (int j = 0; j < o; ++j)
          if (ops[static_cast<std::size_t>(j)].kind == OpKind::REDUCE_SCATTER && k++ == gathers) {
            CHECK(ops[static_cast<std::size_t>(j)].tag == op.tag);
            CHECK(ops[static_cast<std::size_t>(j)].chunk == op.chunk);
            CHECK(ops[static_cast<std::size_t>(j)].bytes == op.bytes);
          }
        ++gathers;
      }
    }
    CHECK(scatters == 5);
    CHECK(gathers == 5);
    for (const OpRef& d : ops[static_cast<std::size_t>(o)].deps) CHECK(low.at(d).kind == OpKind::REDUCE_SCATTER);
    CHECK_NOTHROW(validate(low));
  }
  SECTION("1-bit Adam: each bucket a COMPRESSED_ALLREDUCE of its packed bytes, where the all-reduce was") {
    const Plan plain = lower(plan, opt);
    opt.compress_element_bytes = 2;
    opt.compress_seconds = [](int rank, std::int64_t elements) { return 1e-6 * double(elements) + rank; };
    const Plan low = lower(plan, opt);
    REQUIRE(low.ranks[0].size() == plain.ranks[0].size());
    int compressed = 0;
    for (std::size_t i = 0; i < low.ranks[0].size(); ++i) {
      const Op& a = plain.ranks[0][i];
      const Op& c = low.ranks[0][i];
      if (a.kind != OpKind::ALLREDUCE) {
        CHECK(c == a);
        continue;
      }
      ++compressed;
      CHECK(c.kind == OpKind::COMPRESSED_ALLREDUCE);
      CHECK(c.deps == a.deps);
      CHECK(c.ready_after == a.ready_after);  // the gradients' share, as before
      CHECK(c.stream == Stream::DP);
      // 40 gradient bytes = 20 elements over d = 4: 4 × (4-byte scale + 1 byte of 5 bits).
      const std::int64_t elements = a.bytes / 2;
      CHECK(c.bytes == compressed_bucket_bytes(elements, 4));
      CHECK(c.est_seconds == Approx(1e-6 * double(elements)));
    }
    CHECK(compressed == 5);
    CHECK(low.ranks[0][index_of(low, 0, "COMPRESSED_ALLREDUCE(b0.c1)")].bytes == 4 * (4 + 1));
    for (const OpRef& d : low.ranks[0].back().deps) CHECK(low.at(d).kind == OpKind::COMPRESSED_ALLREDUCE);
    CHECK_NOTHROW(validate(low));
    CHECK(plan_from_text(to_text(low)).ranks[0][index_of(low, 0, "COMPRESSED_ALLREDUCE(b3)")].kind ==
          OpKind::COMPRESSED_ALLREDUCE);
    opt.shard_optimizer = true;
    CHECK_THROWS_WITH(lower(plan, opt), Catch::Contains("exclude each other"));
  }
  SECTION("no DP reduction with d = 1") {
    plan.data = 1;
    const Plan low = lower(plan, opt);
    CHECK(index_of(low, 0, "ALLREDUCE(b0.c1)") == -1);
  }
}

TEST_CASE("lower: refuses a plan that already has comm ops", "[lowering]") {
  Plan plan = plan_from_text("rank0: F0 SEND(F0>r1) BW0\nrank1: RECV(F0<r0) F0 BW0\n");
  plan.lowered = false;
  REQUIRE_THROWS_WITH(lower(plan, LoweringOptions{}),
                      Catch::Matchers::Contains("rank 0 op #1 SEND(F0>r1) is not a compute op"));
}
