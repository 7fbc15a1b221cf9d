// test_plan_io.cpp — the plan's text form and JSON: exact printing, round trips
// (text → IR → text, JSON → IR → JSON), inference without a header, parse errors.
#include <catch2/catch.hpp>

#include <random>

#include <nlohmann/json.hpp>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/scenario_io.hpp"

using namespace tdpipe::ir;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

Op compute(OpKind kind, int mb, int chunk = 0, int slice = 0) {
  Op op;
  op.kind = kind;
  op.mb = mb;
  op.chunk = chunk;
  op.slice = slice;
  op.stream = Stream::Compute;
  return op;
}

Op p2p(OpKind kind, OpKind payload, int mb, int peer, int chunk = 0, int slice = 0, int batch = -1) {
  Op op = compute(kind, mb, chunk, slice);
  op.payload = payload;
  op.peer = peer;
  op.batch = batch;
  op.stream = Stream::P2P;
  return op;
}

Op collective(OpKind kind, int bucket) {
  Op op;
  op.kind = kind;
  op.mb = -1;
  op.tag = bucket;
  op.stream = Stream::DP;
  return op;
}

Op opt() { return compute(OpKind::OPT, -1); }

/// Two ranks, two chunks, two slices, lowered with batches and a DP collective.
Plan sample_plan() {
  Plan plan;
  plan.schedule = "tdpipe";
  plan.stages = 2;
  plan.microbatches = 2;
  plan.chunks = 2;
  plan.slices = 2;
  plan.data = 2;
  plan.lowered = true;
  plan.stage_of = {{0, 2}, {1, 3}};
  plan.slice_tokens = {40, 24};
  plan.ranks = {
      {compute(OpKind::F, 0), compute(OpKind::F, 0, 0, 1),
       p2p(OpKind::SEND, OpKind::F, 0, 1, 0, 1, 0), p2p(OpKind::RECV, OpKind::B, 0, 1, 1, 1, 0),
       compute(OpKind::B, 0, 1, 1), compute(OpKind::W, 0, 1, 1), collective(OpKind::ALLREDUCE, 0),
       collective(OpKind::REDUCE_SCATTER, 1), collective(OpKind::ALL_GATHER, 1), opt()},
      {p2p(OpKind::RECV, OpKind::F, 0, 0, 0, 1), compute(OpKind::F, 0, 0, 1),
       compute(OpKind::BW, 1, 1, 0), p2p(OpKind::SEND, OpKind::B, 0, 0, 1, 1, 3),
       p2p(OpKind::SEND, OpKind::B, 1, 0, 1, 0, 3), p2p(OpKind::RECV, OpKind::F, 1, 0, 0, 0, 4), opt()},
  };
  return plan;
}

const std::string kSampleText =
    "# schedule=tdpipe p=2 m=2 v=2 S=2 d=2 lowered=1 slice_tokens=[40,24]\n"
    "rank0: F0 F0:s1 SEND(F0:s1>r1)+RECV(B0.c1:s1<r1) B0.c1:s1 W0.c1:s1 ALLREDUCE(b0) "
    "REDUCE_SCATTER(b1) ALL_GATHER(b1) OPT\n"
    "rank1: RECV(F0:s1<r0) F0:s1 BW1.c1 SEND(B0.c1:s1>r0)+SEND(B1.c1>r0) RECV(F1<r0) OPT\n";

}  // namespace

TEST_CASE("op_to_text writes each kind of op", "[plan_io]") {
  CHECK(op_to_text(compute(OpKind::F, 0)) == "F0");
  CHECK(op_to_text(compute(OpKind::F, 12, 1)) == "F12.c1");
  CHECK(op_to_text(compute(OpKind::F, 0, 0, 2)) == "F0:s2");
  CHECK(op_to_text(compute(OpKind::F, 0, 1, 2)) == "F0.c1:s2");
  CHECK(op_to_text(compute(OpKind::BW, 3)) == "BW3");
  CHECK(op_to_text(compute(OpKind::B, 3)) == "B3");
  CHECK(op_to_text(compute(OpKind::W, 2, 1)) == "W2.c1");
  CHECK(op_to_text(opt()) == "OPT");
  CHECK(op_to_text(p2p(OpKind::SEND, OpKind::F, 0, 1, 1, 2)) == "SEND(F0.c1:s2>r1)");
  CHECK(op_to_text(p2p(OpKind::RECV, OpKind::B, 3, 2)) == "RECV(B3<r2)");
  CHECK(op_to_text(collective(OpKind::ALLREDUCE, 0)) == "ALLREDUCE(b0)");
  CHECK(op_to_text(collective(OpKind::REDUCE_SCATTER, 7)) == "REDUCE_SCATTER(b7)");
  Op on_dp = p2p(OpKind::SEND, OpKind::F, 0, 1);
  on_dp.stream = Stream::DP;
  CHECK(op_to_text(on_dp) == "SEND(F0>r1)@dp");
  Op f_on_p2p = compute(OpKind::F, 1);
  f_on_p2p.stream = Stream::P2P;
  CHECK(op_to_text(f_on_p2p) == "F1@p2p");
  Op ag = collective(OpKind::ALL_GATHER, 2);
  ag.chunk = 1;
  ag.stream = Stream::Compute;
  CHECK(op_to_text(ag) == "ALL_GATHER(b2.c1)@compute");
  CHECK(op_to_text(compute(OpKind::CKPT, 4)) == "CKPT4");
}

TEST_CASE("to_text prints the header and one line per rank, batches joined by +", "[plan_io]") {
  const Plan plan = sample_plan();
  CHECK(to_text(plan) == kSampleText);

  const Plan back = plan_from_text(kSampleText);
  CHECK(to_text(back) == kSampleText);
  // The text keeps everything but bytes, deps and costs; batch ids are renumbered per rank.
  Plan expected = plan;
  expected.ranks[1][3].batch = expected.ranks[1][4].batch = 0;
  expected.ranks[1][5].batch = -1;  // a batch of one is printed, and read back, as a lone op
  CHECK(back == expected);
}

TEST_CASE("text header: defaults omitted, non-default stage_of and odd names kept", "[plan_io]") {
  Plan plan;
  plan.schedule = "zb-v";
  plan.stages = 2;
  plan.microbatches = 1;
  plan.chunks = 2;
  plan.stage_of = {{0, 3}, {1, 2}};
  plan.ranks = {{compute(OpKind::F, 0), compute(OpKind::F, 0, 1)}, {compute(OpKind::F, 0)}};
  const std::string text = to_text(plan);
  CHECK(text ==
        "# schedule=zb-v p=2 m=1 v=2 S=1 d=1 stage_of=[[0,3],[1,2]]\n"
        "rank0: F0 F0.c1\n"
        "rank1: F0\n");
  CHECK(plan_from_text(text) == plan);

  plan.stage_of = {{0, 2}, {1, 3}};  // Megatron's c·p + r: the default, so not printed
  CHECK(to_text(plan) == "# schedule=zb-v p=2 m=1 v=2 S=1 d=1\nrank0: F0 F0.c1\nrank1: F0\n");
  CHECK(plan_from_text(to_text(plan)) == plan);

  plan.schedule = "my schedule \"v2\"";
  plan.ranks.push_back({});  // an empty rank line
  const std::string odd = to_text(plan);
  CHECK(odd == "# schedule=\"my schedule \\\"v2\\\"\" p=2 m=1 v=2 S=1 d=1\nrank0: F0 F0.c1\nrank1: F0\nrank2:\n");
  CHECK(plan_from_text(odd) == plan);
  CHECK(to_text(plan_from_text(odd)) == odd);

  plan.schedule = "";
  CHECK(to_text(plan_from_text(to_text(plan))) == to_text(plan));
  CHECK(plan_from_text(to_text(plan)).schedule.empty());
}

TEST_CASE("plan counts far beyond the plan's ops are refused before anything is sized by them (fuzz finding)",
          "[plan_io][bad-input]") {
  // bench/fuzz.sh's plan-text target: "# schedule= p=1000000085" made the reader build a
  // stage map of 10⁹ ranks (and the validator an index of as many cells): out of memory.
  REQUIRE_THROWS_WITH(plan_from_text("# schedule= p=1000000085\n"),
                      Catch::Contains("plan text header: p·v·m·S = 1000000085·1·0·1 forwards needed, but the plan "
                                      "has 0 ops"));
  REQUIRE_THROWS_WITH(plan_from_text("# schedule=x p=2 m=100000 v=100 S=1000\nrank0: F0\nrank1: F0\n"),
                      Catch::Contains("forwards needed, but the plan has 2 ops"));
  nlohmann::json j = to_json(plan_from_text("rank0: F0 BW0\nrank1: F0 BW0\n"));
  j["stages"] = 2000000000;
  REQUIRE_THROWS_WITH(plan_from_json(j), Catch::Contains("plan: p·v·m·S = 2000000000·"));
}

TEST_CASE("hand-written text without a header: fields inferred, comments skipped", "[plan_io]") {
  const Plan plan = plan_from_text(
      "# 1F1B, p = 2, m = 3\n"
      "\n"
      "rank0: F0 F1 BW0 F2 BW1 BW2   # warm-up of one\n"
      "  rank1:   F0  BW0 F1 BW1 F2 BW2\r\n");
  CHECK(plan.schedule.empty());
  CHECK(plan.stages == 2);
  CHECK(plan.microbatches == 3);
  CHECK(plan.chunks == 1);
  CHECK(plan.slices == 1);
  CHECK(plan.data == 1);
  CHECK_FALSE(plan.lowered);
  CHECK(plan.stage_of == std::vector<std::vector<int>>{{0}, {1}});
  REQUIRE(plan.ranks.size() == 2);
  CHECK(plan.ranks[0].size() == 6);
  CHECK(plan.ranks[0][2] == compute(OpKind::BW, 0));
  CHECK(to_text(plan) ==
        "# schedule=\"\" p=2 m=3 v=1 S=1 d=1\nrank0: F0 F1 BW0 F2 BW1 BW2\nrank1: F0 BW0 F1 BW1 F2 BW2\n");

  const Plan sliced = plan_from_text("rank0: F0.c1:s3 SEND(F0.c1:s3>r1)\nrank1: RECV(F0.c1:s3<r0)\n");
  CHECK(sliced.chunks == 2);
  CHECK(sliced.slices == 4);
  CHECK(sliced.microbatches == 1);
  CHECK(sliced.lowered);
  CHECK(sliced.stage_of == std::vector<std::vector<int>>{{0, 2}, {1, 3}});
  CHECK(sliced.ranks[0][1] == p2p(OpKind::SEND, OpKind::F, 0, 1, 1, 3));
  CHECK(sliced.ranks[1][0] == p2p(OpKind::RECV, OpKind::F, 0, 0, 1, 3));
}

TEST_CASE("text parse errors name the line, the token and what was expected", "[plan_io]") {
  REQUIRE_THROWS_WITH(plan_from_text("rank0: F0 X1\n"),
                      StartsWith("plan text line 1, token 'X1': expected an op kind (F, B, W, BW, OPT, SEND"));
  REQUIRE_THROWS_WITH(plan_from_text("rank0: F0\nrank1: SEND(F0>1)\n"),
                      "plan text line 2, token 'SEND(F0>1)': expected 'r<peer>' after '>'");
  REQUIRE_THROWS_WITH(plan_from_text("rank0: RECV(F0>r1)\n"),
                      "plan text line 1, token 'RECV(F0>r1)': expected '<r<peer>' after the payload of RECV");
  REQUIRE_THROWS_WITH(plan_from_text("rank0: SEND(F0>r1\n"),
                      "plan text line 1, token 'SEND(F0>r1': expected ')' after the peer rank");
  REQUIRE_THROWS_WITH(plan_from_text("rank0: SEND(Q0>r1)\n"),
                      StartsWith("plan text line 1, token 'SEND(Q0>r1)': expected the payload kind"));
  REQUIRE_THROWS_WITH(plan_from_text("rank0: F0x\n"),
                      StartsWith("plan text line 1, token 'F0x': expected the end of the op at 'x'"));
  REQUIRE_THROWS_WITH(plan_from_text("rank0: F0.c\n"),
                      "plan text line 1, token 'F0.c': expected a chunk number after '.c'");
  REQUIRE_THROWS_WITH(plan_from_text("rank0: F0:s\n"),
                      "plan text line 1, token 'F0:s': expected a slice number after ':s'");
  REQUIRE_THROWS_WITH(plan_from_text("rank0: ALLREDUCE(0)\n"),
                      "plan text line 1, token 'ALLREDUCE(0)': expected 'b<bucket>' inside the parentheses");
  REQUIRE_THROWS_WITH(plan_from_text("rank0: F0@gpu\n"),
                      "plan text line 1, token 'F0@gpu': expected a stream after '@' (compute, p2p or dp)");
  REQUIRE_THROWS_WITH(plan_from_text("rank0: F99999999999\n"),
                      "plan text line 1, token 'F99999999999': expected a micro-batch number (in the range of int)");
  REQUIRE_THROWS_WITH(plan_from_text("rank0: SEND(F0>r1)++RECV(B0<r1)\n"),
                      "plan text line 1, token 'SEND(F0>r1)++RECV(B0<r1)': expected an op on each side of '+'");
  REQUIRE_THROWS_WITH(plan_from_text("rank0: F0\nrank2: F0\n"),
                      "plan text line 2, token 'rank2': expected 'rank1:' (rank lines in order from rank0)");
  REQUIRE_THROWS_WITH(plan_from_text("F0 F1\n"),
                      "plan text line 1, token 'F0 F1': expected 'rank0:' at the start of the line");
  REQUIRE_THROWS_WITH(plan_from_text("# schedule=1f1b p=x\n"),
                      "plan text line 1, token 'p=x': expected an integer ≥ 0 after 'p='");
  REQUIRE_THROWS_WITH(plan_from_text("# schedule=1f1b q=2\n"),
                      StartsWith("plan text line 1, token 'q=2': expected a header key"));
  REQUIRE_THROWS_WITH(plan_from_text("# schedule=1f1b stage_of=[[0],[x]]\n"),
                      "plan text line 1, token 'stage_of=[[0],[x]]': expected valid JSON after 'stage_of='");
  REQUIRE_THROWS_WITH(plan_from_text("# schedule=1f1b slice_tokens=[1,\"a\"]\n"),
                      StartsWith("plan text line 1, token 'slice_tokens=[1,\"a\"]': expected a JSON list of integers"));
  REQUIRE_THROWS_WITH(plan_from_text("rank0: F0\n# schedule=1f1b\n"),
                      StartsWith("plan text line 2, token 'schedule=1f1b': expected the plan header before"));
  REQUIRE_THROWS_WITH(plan_from_text("# schedule=a p=1 p=2\n"),
                      "plan text line 1, token 'p=2': expected 'p' only once in the header");
}

TEST_CASE("text round trip holds for random printable plans", "[plan_io]") {
  std::mt19937 rng(7);
  const std::vector<OpKind> kinds = {OpKind::F,    OpKind::B,    OpKind::W,         OpKind::BW,
                                     OpKind::OPT,  OpKind::SEND, OpKind::RECV,      OpKind::ALLREDUCE,
                                     OpKind::LOAD, OpKind::CKPT, OpKind::ALL_GATHER, OpKind::REDUCE_SCATTER};
  for (int trial = 0; trial < 200; ++trial) {
    Plan plan;
    plan.schedule = trial % 3 ? "1f1b" : "x y";
    plan.stages = 1 + rng() % 4;
    plan.microbatches = rng() % 6;
    plan.chunks = 1 + rng() % 3;
    plan.slices = 1 + rng() % 3;
    plan.data = 1 + rng() % 2;
    plan.lowered = rng() % 2;
    if (rng() % 2) plan.slice_tokens = {int(rng() % 100), int(rng() % 100)};
    if (rng() % 2) plan.stage_of = {{int(rng() % 9)}, {}};
    plan.ranks.resize(plan.stages);
    for (auto& ops : plan.ranks) {
      const int n = rng() % 12;
      for (int i = 0; i < n; ++i) {
        Op op;
        op.kind = kinds[rng() % kinds.size()];
        op.mb = int(rng() % 5) - 1;
        op.chunk = rng() % 3;
        op.slice = rng() % 3;
        op.payload = rng() % 2 ? OpKind::F : OpKind::B;
        op.peer = rng() % 4;
        op.tag = rng() % 3;
        op.batch = rng() % 3 ? -1 : int(rng() % 2);
        op.stream = static_cast<Stream>(rng() % 3);
        ops.push_back(op);
      }
    }
    const std::string text = to_text(plan);
    INFO(text);
    Plan back;
    REQUIRE_NOTHROW(back = plan_from_text(text));
    REQUIRE(to_text(back) == text);
    // Mutated text either parses or fails with a tdpipe::Error naming a line.
    std::string bad = text;
    bad[rng() % bad.size()] = "+()<>:.@#rcsb0 \n-["[rng() % 17];
    try {
      plan_from_text(bad);
    } catch (const tdpipe::Error& e) {
      CHECK_THAT(std::string(e.what()), StartsWith("plan text line "));
    }
  }
}

TEST_CASE("plan JSON carries every field and round trips exactly", "[plan_io]") {
  Plan plan = sample_plan();
  plan.scenario = parse_scenario(
      "synthetic: {stages: 2, microbatches: 2, chunks: 2, slices: 2, time: {F: 10, B: 20, W: 5}}\n"
      "schedule: tdpipe\n",
      "s.yaml");
  plan.ranks[0][2].bytes = 1 << 20;
  plan.ranks[0][2].tag = 9;
  plan.ranks[1][1].deps = {{0, 2}, {1, 0}};
  plan.ranks[0][0].flops = 1.5e12;
  plan.ranks[0][0].mem_bytes = 123456.75;
  plan.ranks[0][4].mem_bytes = -123456.75;
  plan.ranks[0][0].est_seconds = 1e-3 / 3;
  plan.ranks[0][7].bytes = std::int64_t(1) << 40;

  const nlohmann::json j = to_json(plan);
  CHECK(j["ranks"][1][1]["deps"] == nlohmann::json::parse("[[0,2],[1,0]]"));
  CHECK(j["ranks"][0][2]["kind"] == "SEND");
  CHECK(j["ranks"][0][2]["payload"] == "F");
  CHECK(j["ranks"][0][2]["stream"] == "p2p");
  CHECK(j["ranks"][0][2]["bytes"] == 1 << 20);
  CHECK(j["scenario"]["synthetic"]["f_seconds"] == 10 / 1e6);
  CHECK(j["stage_of"] == nlohmann::json::parse("[[0,2],[1,3]]"));

  CHECK(plan_from_json(j) == plan);
  CHECK(to_json(plan_from_json(j)) == j);
  const std::string dumped = j.dump();
  CHECK(plan_from_json(nlohmann::json::parse(dumped)) == plan);  // doubles survive text exactly
  CHECK(to_json(plan_from_json(nlohmann::json::parse(dumped))).dump() == dumped);
}

TEST_CASE("plan JSON: defaults for omitted fields, errors name the field path", "[plan_io]") {
  const Plan minimal = plan_from_json(nlohmann::json::parse(
      R"({"ranks": [[{"kind": "F", "mb": 0}, {"kind": "SEND", "mb": 0, "peer": 1}], [{"kind": "RECV", "mb": 0, "peer": 0}]]})"));
  CHECK(minimal.stages == 2);
  CHECK(minimal.microbatches == 1);
  CHECK(minimal.lowered);
  CHECK(minimal.ranks[0][1].stream == Stream::P2P);  // the kind's default stream
  CHECK(minimal.ranks[0][0].batch == -1);
  CHECK(minimal.stage_of == std::vector<std::vector<int>>{{0}, {1}});

  nlohmann::json j = to_json(sample_plan());
  auto expect_error = [](nlohmann::json bad, const std::string& message) {
    REQUIRE_THROWS_WITH(plan_from_json(bad), message);
  };
  auto b = j;
  b["ranks"][1][2]["kind"] = "FW";
  expect_error(b, "plan.ranks[1][2].kind: expected an op kind (F, B, W, BW, OPT, SEND, RECV, ALLREDUCE, "
                  "REDUCE_SCATTER, ALL_GATHER, LOAD, OFFLOAD, CKPT, COMPRESSED_ALLREDUCE), got \"FW\"");
  b = j;
  b["ranks"][0][3]["deps"] = nlohmann::json::parse("[[0]]");
  expect_error(b, "plan.ranks[0][3].deps[0]: expected a [rank, index] pair, got [0]");
  b = j;
  b["ranks"][0][3]["deps"] = nlohmann::json::parse("[[0, 1.5]]");
  expect_error(b, "plan.ranks[0][3].deps[0][1]: expected an integer in [-2147483648, 2147483647], got 1.5");
  b = j;
  b["ranks"][0][0]["stream"] = "nvlink";
  expect_error(b, "plan.ranks[0][0].stream: expected a stream (compute, p2p or dp), got \"nvlink\"");
  b = j;
  b["ranks"][0][0]["mb_"] = 1;
  expect_error(b, "plan.ranks[0][0].mb_: unknown key; expected one of kind, mb, chunk, slice, payload, peer, "
                  "bytes, tag, batch, ready_after, stream, deps, flops, mem_bytes, est_seconds");
  b = j;
  b["ranks"][0][0]["flops"] = "many";
  expect_error(b, "plan.ranks[0][0].flops: expected a number, got \"many\"");
  b = j;
  b["ranks"][0][0].erase("kind");
  expect_error(b, "plan.ranks[0][0].kind: missing; expected an op kind (F, B, W, BW, OPT, SEND, RECV, "
                  "ALLREDUCE, REDUCE_SCATTER, ALL_GATHER, LOAD, OFFLOAD, CKPT, COMPRESSED_ALLREDUCE)");
  b = j;
  b["stage_of"][1][0] = -2.5;
  expect_error(b, "plan.stage_of[1][0]: expected an integer in [-2147483648, 2147483647], got -2.5");
  b = j;
  b["chunks"] = 0;
  expect_error(b, "plan.chunks: expected an integer in [1, 2147483647], got 0");
  b = j;
  b["ranks"] = 3;
  expect_error(b, "plan.ranks: expected a list of op lists, one per rank, got 3");
  b = j;
  b.erase("ranks");
  expect_error(b, "plan.ranks: missing; expected a list of op lists, one per rank");
  b = j;
  b["scenario"]["model"]["layers"] = "96";
  expect_error(b, "plan.scenario.model.layers: expected an integer, got \"96\"");
  b = j;
  b["lowered"] = 1;
  expect_error(b, "plan.lowered: expected true or false, got 1");
  expect_error(nlohmann::json::array(), "plan: expected an object, got []");
}

TEST_CASE("stage_layers rides in the text header and JSON - checked against the stages and the model", "[plan_io]") {
  Plan plan = sample_plan();
  plan.scenario = parse_scenario(
      "synthetic: {stages: 2, microbatches: 2, chunks: 2, slices: 2, time: {F: 10, B: 20, W: 5}}\n", "s.yaml");
  plan.stage_layers = {1, 3, 2, 2};
  const std::string text = to_text(plan);
  CHECK_THAT(text, StartsWith("# schedule=tdpipe p=2 m=2 v=2 S=2 d=2 lowered=1 slice_tokens=[40,24] "
                              "stage_layers=[1,3,2,2]\n"));
  CHECK(plan_from_text(text).stage_layers == plan.stage_layers);
  CHECK(plan_from_json(to_json(plan)).stage_layers == plan.stage_layers);
  REQUIRE_THROWS_WITH(plan_from_text("# schedule=1f1b stage_layers=[1,2.5]\n"),
                      StartsWith("plan text line 1, token 'stage_layers=[1,2.5]': expected a JSON list of integers"));
  nlohmann::json j = to_json(plan);
  j["stage_layers"] = {1, 3, 2};
  REQUIRE_THROWS_WITH(plan_from_json(j), "plan.stage_layers: expected one layer count per virtual stage "
                                         "(stages*chunks = 2*2 = 4 entries), got [1,3,2]");
  j["stage_layers"] = {1, 3, -2, 2};
  REQUIRE_THROWS_WITH(plan_from_json(j), "plan.stage_layers: expected layer counts ≥ 0, got [1,3,-2,2]");
  // With a model scenario the counts must sum to its layers.
  plan.scenario = parse_scenario(
      "model: {name: m, layers: 8, hidden: 64, ffn: 256, heads: 4, seq: 64, vocab: 100}\n"
      "cluster: {gpu: a100-80g, nodes: 1, gpus_per_node: 2}\n"
      "parallel: {pipeline: 2, chunks: 2, global_batch: 2}\n",
      "m.yaml");
  CHECK(plan_from_json(to_json(plan)) == plan);
  plan.stage_layers = {1, 3, 2, 3};
  REQUIRE_THROWS_WITH(plan_from_json(to_json(plan)), "plan.stage_layers: the stages hold 9 layers in all; expected "
                                                     "the scenario's model.layers = 8");
  CHECK(layer_range({1, 3, 2, 2}, 8, 1, 4) == std::pair{1, 4});
  CHECK(layer_range({}, 8, 1, 4) == std::pair{2, 4});
  CHECK_THROWS_WITH(layer_range({1, 3, 2, 2}, 9, 0, 4), Contains("summing to the model's 9 layers"));
  CHECK_THROWS_WITH(layer_range({}, 8, 4, 4), Contains("out of range"));
}
