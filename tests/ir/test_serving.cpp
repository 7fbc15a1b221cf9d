// test_serving.cpp — the serving vocabulary: the scenario's serving: section, requests
// (generated and read), the serving table in plan files, and the validator's checks.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/ir/serving.hpp"
#include "tdpipe/ir/validate.hpp"

using namespace tdpipe::ir;

namespace {

const char* kBase = R"(name: s
model: {layers: 4, hidden: 64, ffn: 256, heads: 4, seq: 64, vocab: 96}
cluster: {gpu: cpu, nodes: 1, gpus_per_node: 2}
parallel: {pipeline: 2}
)";

std::string with_serving(const std::string& serving) { return std::string(kBase) + "serving:\n" + serving; }

/// The error parse_scenario throws for `text` ("" when it parses).
std::string error_of(const std::string& text) {
  try {
    parse_scenario(text, "s.yaml");
  } catch (const tdpipe::Error& e) {
    return e.what();
  }
  return "";
}

/// A two-rank serving plan by hand: batches 0 (prefill of requests 0, 1) and 1 (their
/// decodes), each on both ranks, with the hidden SEND/RECV and the token return.
Plan two_rank_plan() {
  Plan p;
  p.schedule = "serve-test";
  p.stages = 2;
  p.microbatches = 2;
  p.lowered = true;
  p.stage_of = {{0}, {1}};
  p.scenario = parse_scenario(with_serving("  requests: 2\n"), "s.yaml");
  ServePlan s;
  s.planner = "pp";
  s.requests = {{3, 2}, {4, 2}};
  s.batches = {{{{0, 0, 3}, {1, 0, 4}}, 0}, {{{0, 3, 1}, {1, 4, 1}}, 0}};
  s.kv_bytes_per_token = {100, 100};
  s.kv_capacity_bytes = {1e6, 1e6};
  p.serve = s;
  auto op = [](OpKind k, int mb, int peer = -1, std::int64_t bytes = 0) {
    Op o;
    o.kind = k;
    o.mb = mb;
    o.peer = peer;
    o.bytes = bytes;
    o.payload = OpKind::F;
    o.stream = default_stream(k);
    o.est_seconds = 1e-3;
    return o;
  };
  p.ranks.resize(2);
  auto& r0 = p.ranks[0];
  // KV: one 16-token block per request after either batch, 100 bytes a token: 3,200.
  r0 = {op(OpKind::PREFILL, 0, -1, 3200), op(OpKind::SEND, 0, 1, 64), op(OpKind::RECV, 0, 1, 8),
        op(OpKind::DECODE, 1, -1, 3200), op(OpKind::SEND, 1, 1, 64), op(OpKind::RECV, 1, 1, 8)};
  r0[1].deps.push_back({0, 0});
  r0[3].deps.push_back({0, 2});
  r0[4].deps.push_back({0, 3});
  auto& r1 = p.ranks[1];
  r1 = {op(OpKind::RECV, 0, 0, 64), op(OpKind::PREFILL, 0, -1, 3200), op(OpKind::SEND, 0, 0, 8),
        op(OpKind::RECV, 1, 0, 64), op(OpKind::DECODE, 1, -1, 3200), op(OpKind::SEND, 1, 0, 8)};
  r1[1].deps.push_back({1, 0});
  r1[2].deps.push_back({1, 1});
  r1[4].deps.push_back({1, 3});
  r1[5].deps.push_back({1, 4});
  return p;
}

}  // namespace

TEST_CASE("serving: section defaults and overrides", "[serving]") {
  const Scenario sc = parse_scenario(with_serving("  requests: 10\n  prompt: {distribution: fixed, mean: 8}\n"
                                                  "  block_tokens: 4\n  planner: pp\n"),
                                     "s.yaml");
  REQUIRE(sc.serving);
  CHECK(sc.serving->requests == 10);
  CHECK(sc.serving->prompt.kind == "fixed");
  CHECK(sc.serving->prompt.mean == 8);
  CHECK(sc.serving->output.kind == "lognormal");  // ShareGPT-like default
  CHECK(sc.serving->output.mean == 338);
  CHECK(sc.serving->block_tokens == 4);
  CHECK(sc.serving->planner == "pp");
  CHECK(sc.serving->memory_fraction == 0.9);
  CHECK(sc.parallel.global_batch == 1);  // not required with serving:
  // The JSON form round-trips.
  CHECK(scenario_from_json(to_json(sc)) == sc);
  // Without serving:, global_batch stays required.
  CHECK_THAT(error_of(kBase), Catch::Contains("parallel.global_batch: missing"));
}

TEST_CASE("serving: errors name the line and field", "[serving]") {
  CHECK_THAT(error_of(with_serving("  planner: pq\n")), Catch::Contains("s.yaml:6: serving.planner"));
  CHECK_THAT(error_of(with_serving("  memory_fraction: 1.5\n")),
             Catch::Contains("serving.memory_fraction: expected at most 1"));
  CHECK_THAT(error_of(with_serving("  prompt: {distribution: fixed, mean: 3.5}\n")),
             Catch::Contains("serving.prompt.mean"));
  CHECK_THAT(error_of(with_serving("  prompt: {min: 10, max: 5}\n")), Catch::Contains("serving.prompt.max"));
  CHECK_THAT(error_of(with_serving("  requets: 5\n")), Catch::Contains("did you mean 'requests'"));
  CHECK_THAT(error_of(with_serving("  block_tokens: 0\n")), Catch::Contains("serving.block_tokens"));
  CHECK_THAT(error_of(with_serving("  requests: 24\n  requests_file: r.json\n")),
             Catch::Contains("s.yaml:6: serving.requests: not used with serving.requests_file"));
  CHECK_THAT(error_of("synthetic: {stages: 2, microbatches: 4, time: {F: 1, B: 1, W: 1}}\nserving: {requests: 3}\n"),
             Catch::Contains("s.yaml:2: serving: not used by a synthetic scenario"));
}

TEST_CASE("serving: generated lengths are seeded, bounded and have the stated mean", "[serving]") {
  ServingConfig c;
  c.requests = 20000;
  c.prompt = {"lognormal", 100, 0.5, 1, 1000000};  // clipping negligible: the mean is the target
  c.output = {"uniform", 0, 1, 5, 9};
  const auto a = serving_requests(c);
  CHECK(a == serving_requests(c));
  c.seed = 2;
  CHECK(a != serving_requests(c));
  double sum = 0;
  for (const auto& r : a) {
    sum += r.prompt;
    CHECK(r.output >= 5);
    CHECK(r.output <= 9);
  }
  CHECK(sum / a.size() == Approx(100).epsilon(0.02));
  // Clipped to [min, max].
  c.prompt = {"lognormal", 161, 1.0, 4, 1024};
  for (const auto& r : serving_requests(c)) {
    CHECK(r.prompt >= 4);
    CHECK(r.prompt <= 1024);
  }
  c.prompt = {"fixed", 7, 1, 1, 10};
  for (const auto& r : serving_requests(c)) CHECK(r.prompt == 7);
}

TEST_CASE("serving: a requests file is read strictly", "[serving]") {
  CHECK(parse_requests(R"([{"prompt": 3, "output": 2}, {"output": 1, "prompt": 9}])", "r.json") ==
        std::vector<Request>{{3, 2}, {9, 1}});
  CHECK(parse_requests(R"({"requests": [{"prompt": 3, "output": 2}]})", "r.json").size() == 1);
  CHECK(parse_requests(R"([{"id": "a7", "prompt": 3, "output": 2}])", "r.json") == std::vector<Request>{{3, 2}});
  auto err = [](const std::string& text) {
    try {
      parse_requests(text, "r.json");
    } catch (const tdpipe::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(err("[]"), Catch::Contains("r.json: no requests"));
  CHECK_THAT(err(R"([{"prompt": 3}])"), Catch::Contains("requests[0].output: missing"));
  CHECK_THAT(err(R"([{"prompt": 0, "output": 2}])"), Catch::Contains("requests[0].prompt: expected a token count"));
  CHECK_THAT(err(R"([{"prompt": 3, "output": 2, "x": 1}])"), Catch::Contains("requests[0].x: unknown key"));
  CHECK_THAT(err("{"), Catch::Contains("r.json"));
}

TEST_CASE("serving: a serving plan round-trips through JSON and validates", "[serving]") {
  const Plan p = two_rank_plan();
  REQUIRE_NOTHROW(validate(p));
  CHECK(plan_from_json(to_json(p)) == p);
  CHECK(op_to_text(p.ranks[0][0]) == "PREFILL0");
  CHECK(op_to_text(p.ranks[1][4]) == "DECODE1");
}

TEST_CASE("serving: the validator refuses broken serving plans", "[serving]") {
  auto problem = [](Plan p) {
    try {
      validate(p);
    } catch (const tdpipe::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  Plan p = two_rank_plan();
  p.ranks[1][4].kind = OpKind::PREFILL;  // batch 1 holds no prompt
  CHECK_THAT(problem(p), Catch::Contains("batch 1 holds no prompt; expected DECODE"));
  p = two_rank_plan();
  p.ranks[0][3].bytes = 2000000;  // over the rank's KV capacity
  CHECK_THAT(problem(p), Catch::Contains("over the rank's capacity"));
  p = two_rank_plan();
  p.ranks[1][2].bytes = 16;  // token SEND and its RECV disagree
  CHECK_THAT(problem(p), Catch::Contains("differ in batch, payload or bytes"));
  p = two_rank_plan();
  std::swap(p.ranks[0][0], p.ranks[0][3]);  // batches out of order
  CHECK_THAT(problem(p), Catch::Contains("every rank runs the table's batches once, in order"));
  // The decode no longer waits for its requests' tokens.
  p = two_rank_plan();
  p.ranks[0][3].deps = {{0, 5}};
  CHECK_THAT(problem(p), Catch::Contains("DECODE1: does not wait for the tokens of batch 0"));
  // Rank 0 waits for batch 0's tokens before sending batch 0 on: the replay proves the deadlock.
  p = two_rank_plan();
  std::swap(p.ranks[0][1], p.ranks[0][2]);
  p.ranks[0][3].deps = {{0, 1}};
  CHECK_THAT(problem(p), Catch::Contains("deadlock"));
  // The table against itself and the ops.
  p = two_rank_plan();
  p.ranks[1][4].bytes = 0;
  CHECK_THAT(problem(p), Catch::Contains("DECODE1: KV bytes 0; the serving table implies 3200"));
  p = two_rank_plan();
  p.serve->batches[1].items[1] = {0, 4, 1};  // request 0 twice, the second past its cache
  CHECK_THAT(problem(p), Catch::Contains("request 0 twice in one batch"));
  CHECK_THAT(problem(p), Catch::Contains("request 0 at position 4, but its cache holds 4 tokens") ||
                             Catch::Contains("after its last output token"));
  p = two_rank_plan();
  p.serve->batches[1].items[0].position = 2;  // a decode that does not continue the cache
  CHECK_THAT(problem(p), Catch::Contains("request 0 at position 2, but its cache holds 3 tokens"));
  p = two_rank_plan();
  p.serve->requests[1].output = 3;  // request 1 never produces its third token
  CHECK_THAT(problem(p), Catch::Contains("request 1 produces 2 of its 3 output tokens"));
  p = two_rank_plan();
  p.serve->batches[0].preempted = {1};  // nothing cached yet
  CHECK_THAT(problem(p), Catch::Contains("request 1 is preempted but holds no KV cache"));
  // serve_from_json names the bad item.
  nlohmann::json j = to_json(two_rank_plan());
  j["serve"]["batches"][1]["items"][1] = 9;  // decode of request 0 at position 9 (it has 3 + 2 − 1 positions)
  try {
    plan_from_json(j);
    FAIL("accepted an item outside its request");
  } catch (const tdpipe::Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("plan.serve.batches[1].items[0].position"));
  }
}
