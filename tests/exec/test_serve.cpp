// test_serve.cpp — serving plans on the CPU backend: every planner's tokens equal
// single-device greedy decoding, KV use stays within the plan's capacity, the cached
// inference path equals recomputation, and bad plans are refused by name.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "exec_test_util.hpp"
#include "tdpipe/exec/cpu/gpt.hpp"
#include "tdpipe/exec/cpu/serve.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/serving.hpp"
#include "tdpipe/planner/serving.hpp"

using namespace tdpipe;
using exec::cpu::GptConfig;
using exec::cpu::GptStage;
using exec::cpu::InferItem;
using exec::cpu::KvCache;
using exec::cpu::Mat;

namespace {

ir::Scenario serve_scenario() { return ir::load_scenario(exec::test::source_path("scenarios/serve-tiny-cpu.yaml")); }

std::vector<ir::Request> serve_requests(const ir::Scenario& sc) { return ir::serving_requests(*sc.serving); }

// Items that recompute a request preempted earlier: position 0 of a request already served.
int recomputed_items(const ir::ServePlan& serve) {
  std::set<int> seen;
  int n = 0;
  for (const ir::ServeBatch& b : serve.batches)
    for (const ir::ServeItem& i : b.items) {
      if (i.position == 0 && seen.count(i.request)) ++n;
      seen.insert(i.request);
    }
  return n;
}

// A small model of two stages for the inference unit tests.
GptConfig small_config() {
  GptConfig c;
  c.layers = 3;
  c.hidden = 16;
  c.heads = 2;
  c.ffn = 32;
  c.seq = 24;
  c.vocab = 40;
  return c;
}

// Logits of the last position of `ids` on a whole-model stage, from an empty cache.
Mat full_logits(GptStage& model, const std::vector<int>& ids) {
  KvCache fresh;
  return model.infer({InferItem{0, 0, static_cast<int>(ids.size()), &fresh, ids}}, Mat());
}

double max_abs_diff(const Mat& a, const Mat& b) {
  REQUIRE(a.rows() == b.rows());
  REQUIRE(a.cols() == b.cols());
  return (a - b).cwiseAbs().maxCoeff();
}

}  // namespace

TEST_CASE("serving on the CPU: every planner's tokens equal greedy decoding within the KV capacity", "[exec][serve]") {
  const ir::Scenario sc = serve_scenario();
  const std::vector<ir::Request> requests = serve_requests(sc);
  const auto reference = exec::cpu::greedy_reference(sc, requests, sc.serving->seed);
  REQUIRE(reference.size() == requests.size());
  for (const std::string planner : {"pp", "tp", "tdpipe"}) {
    INFO("planner " << planner);
    const ir::Plan plan = planner::plan_serving(sc, planner, requests);
    const exec::cpu::ServeRun run = exec::cpu::run_serving(plan);
    REQUIRE(run.tokens.size() == requests.size());
    for (std::size_t r = 0; r < requests.size(); ++r) {
      INFO("request " << r);
      CHECK(run.tokens[r].size() == static_cast<std::size_t>(requests[r].output));
      CHECK(run.tokens[r] == reference[r]);
    }
    // KV: never more tokens than the plan's capacity on any rank, and some held.
    REQUIRE(run.peak_kv_tokens.size() == static_cast<std::size_t>(plan.num_ranks()));
    for (int rank = 0; rank < plan.num_ranks(); ++rank) {
      const auto k = static_cast<std::size_t>(rank);
      const double capacity = plan.serve->kv_capacity_bytes[k] / plan.serve->kv_bytes_per_token[k];
      INFO("rank " << rank << ": peak " << run.peak_kv_tokens[k] << " tokens, capacity " << capacity);
      CHECK(run.peak_kv_tokens[k] > 0);
      CHECK(static_cast<double>(run.peak_kv_tokens[k]) <= capacity);
    }
    // The trace: origin cpu, one event per op of every rank, named and sized as the op
    // (a PREFILL/DECODE's bytes: the plan's KV bytes after it).
    CHECK(run.trace.origin == "cpu");
    CHECK(run.trace.ranks == plan.num_ranks());
    std::map<std::pair<int, std::string>, std::int64_t> planned, measured;
    std::size_t ops = 0;
    for (int rank = 0; rank < plan.num_ranks(); ++rank)
      for (const ir::Op& op : plan.ranks[static_cast<std::size_t>(rank)]) {
        ++ops;
        if (ir::is_serving(op.kind)) planned[{rank, traces::event_of(op, rank, 0, 0).name}] = op.bytes;
      }
    CHECK(run.trace.events.size() == ops);
    for (const traces::TraceEvent& e : run.trace.events)
      if (e.kind && ir::is_serving(*e.kind)) {
        CHECK(measured.count({e.rank, e.name}) == 0);
        measured[{e.rank, e.name}] = e.bytes;
      }
    CHECK(measured == planned);
  }
}

TEST_CASE("serving on the CPU: pp preempts and recomputes and the recomputed requests' tokens still match",
          "[exec][serve]") {
  const ir::Scenario sc = serve_scenario();
  const std::vector<ir::Request> requests = serve_requests(sc);
  const ir::Plan plan = planner::plan_serving(sc, "pp", requests);
  REQUIRE(recomputed_items(*plan.serve) > 0);
  std::set<int> recomputed;
  std::set<int> seen;
  for (const ir::ServeBatch& b : plan.serve->batches)
    for (const ir::ServeItem& i : b.items) {
      if (i.position == 0 && seen.count(i.request)) {
        recomputed.insert(i.request);
        CHECK(i.tokens > requests[static_cast<std::size_t>(i.request)].prompt);  // prompt + tokens generated
      }
      seen.insert(i.request);
    }
  const auto reference = exec::cpu::greedy_reference(sc, requests, sc.serving->seed);
  const exec::cpu::ServeRun run = exec::cpu::run_serving(plan);
  for (int r : recomputed) {
    INFO("recomputed request " << r);
    CHECK(run.tokens[static_cast<std::size_t>(r)] == reference[static_cast<std::size_t>(r)]);
  }
}

TEST_CASE("serving on the CPU: a decode batch's items in another order give the same tokens", "[exec][serve]") {
  // Requests are independent: swapping two items of a batch (and so their places in the
  // hidden states and in the token buffer sent back) changes no token.
  const ir::Scenario sc = serve_scenario();
  const std::vector<ir::Request> requests = serve_requests(sc);
  ir::Plan plan = planner::plan_serving(sc, "tdpipe", requests);
  int swapped = 0;
  for (ir::ServeBatch& b : plan.serve->batches)
    if (b.items.size() >= 3 && !b.has_prefill() && swapped < 3) {
      std::swap(b.items.front(), b.items.back());
      ++swapped;
    }
  REQUIRE(swapped == 3);
  const exec::cpu::ServeRun run = exec::cpu::run_serving(plan);
  CHECK(run.tokens == exec::cpu::greedy_reference(sc, requests, sc.serving->seed));
}

TEST_CASE("GptStage::infer: a prefill then cached decodes equal recomputing the whole sequence", "[exec][serve]") {
  const GptConfig c = small_config();
  GptStage model(c, 0, 1);
  std::vector<int> ids = exec::cpu::prompt_tokens(3, 0, 7, c.vocab);
  KvCache cache;
  Mat logits = model.infer({InferItem{0, 0, 7, &cache, ids}}, Mat());
  for (int step = 0; step < 8; ++step) {
    INFO("decode step " << step);
    CHECK(max_abs_diff(logits, full_logits(model, ids)) <= 1e-12);
    const int next = exec::cpu::greedy_tokens(logits).front();
    CHECK(next == exec::cpu::greedy_tokens(full_logits(model, ids)).front());
    ids.push_back(next);
    REQUIRE(cache.tokens == static_cast<int>(ids.size()) - 1);
    logits = model.infer({InferItem{0, static_cast<int>(ids.size()) - 1, 1, &cache, {next}}}, Mat());
  }
}

TEST_CASE("GptStage::infer: a batch of two requests of different lengths equals two separate calls over two stages",
          "[exec][serve]") {
  const GptConfig c = small_config();
  GptStage first(c, 0, 2), last(c, 1, 2);
  const std::vector<int> a = exec::cpu::prompt_tokens(5, 0, 6, c.vocab);
  const std::vector<int> b = exec::cpu::prompt_tokens(5, 1, 4, c.vocab);
  // b has 3 tokens cached (one cache per stage); a is a prefill of 6, b a decode of its 4th.
  auto run = [&](const std::vector<std::vector<InferItem>>& per_stage) {
    return last.infer(per_stage[1], first.infer(per_stage[0], Mat()));
  };
  auto cached_b = [&](KvCache& c0, KvCache& c1) {
    const std::vector<int> head(b.begin(), b.begin() + 3);
    run({{InferItem{1, 0, 3, &c0, head}}, {InferItem{1, 0, 3, &c1, {}}}});
  };
  KvCache a0, a1, b0, b1;
  cached_b(b0, b1);
  const Mat together = run({{InferItem{0, 0, 6, &a0, a}, InferItem{1, 3, 1, &b0, {b[3]}}},
                            {InferItem{0, 0, 6, &a1, {}}, InferItem{1, 3, 1, &b1, {}}}});
  KvCache sa0, sa1, sb0, sb1;
  cached_b(sb0, sb1);
  const Mat alone_a = run({{InferItem{0, 0, 6, &sa0, a}}, {InferItem{0, 0, 6, &sa1, {}}}});
  const Mat alone_b = run({{InferItem{1, 3, 1, &sb0, {b[3]}}}, {InferItem{1, 3, 1, &sb1, {}}}});
  REQUIRE(together.rows() == 2);
  CHECK(max_abs_diff(together.row(0), alone_a) <= 1e-12);
  CHECK(max_abs_diff(together.row(1), alone_b) <= 1e-12);
  // And the two-stage split equals the whole model recomputing each sequence.
  GptStage whole(c, 0, 1);
  CHECK(max_abs_diff(alone_a, full_logits(whole, a)) <= 1e-12);
  CHECK(max_abs_diff(alone_b, full_logits(whole, b)) <= 1e-12);
  CHECK(a1.tokens == 6);
  CHECK(b1.tokens == 4);
  b1.truncate(2);
  CHECK(b1.tokens == 2);
  CHECK(b1.k.front().rows() == 2);
}

TEST_CASE("GptStage::infer refuses an item past model.seq or one whose cache does not match its position",
          "[exec][serve]") {
  const GptConfig c = small_config();
  GptStage model(c, 0, 1);
  KvCache cache;
  const std::vector<int> ids(25, 1);
  CHECK_THROWS_WITH(model.infer({InferItem{7, 0, 25, &cache, ids}}, Mat()),
                    Catch::Contains("request 7") && Catch::Contains("model.seq"));
  CHECK_THROWS_WITH(model.infer({InferItem{4, 2, 1, &cache, {1}}}, Mat()),
                    Catch::Contains("request 4") && Catch::Contains("KV cache"));
}

TEST_CASE("prompt tokens are deterministic and in the vocabulary and differ per request", "[exec][serve]") {
  const auto p = exec::cpu::prompt_tokens(7, 3, 50, 96);
  CHECK(p == exec::cpu::prompt_tokens(7, 3, 50, 96));
  CHECK(p != exec::cpu::prompt_tokens(7, 4, 50, 96));
  CHECK(p != exec::cpu::prompt_tokens(8, 3, 50, 96));
  CHECK(std::all_of(p.begin(), p.end(), [](int id) { return id >= 0 && id < 96; }));
  CHECK(std::set<int>(p.begin(), p.end()).size() > 20);
}

TEST_CASE("run_serving refuses a request longer than model.seq and a training plan by name", "[exec][serve]") {
  const ir::Scenario sc = serve_scenario();
  const std::vector<ir::Request> requests = serve_requests(sc);
  ir::Plan plan = planner::plan_serving(sc, "pp", requests);
  // A model of 24 positions: the first request needing more is named.
  plan.scenario.model.seq = 24;
  std::size_t first_long = requests.size();
  for (std::size_t r = 0; r < requests.size() && first_long == requests.size(); ++r)
    if (requests[r].prompt + requests[r].output - 1 > 24) first_long = r;
  REQUIRE(first_long < requests.size());
  const std::string named = "request " + std::to_string(first_long) + ":";
  CHECK_THROWS_AS(exec::cpu::run_serving(plan), Error);
  CHECK_THROWS_WITH(exec::cpu::run_serving(plan), Catch::Contains(named) && Catch::Contains("model.seq = 24"));
  ir::Scenario short_model = sc;
  short_model.model.seq = 24;
  CHECK_THROWS_WITH(exec::cpu::greedy_reference(short_model, requests, 7), Catch::Contains(named));

  const auto training = planner::build_plan(exec::test::small_scenario(2, 1, 4, 1), "1f1b", 1);
  CHECK_THROWS_AS(exec::cpu::run_serving(training.lowered), Error);
  CHECK_THROWS_WITH(exec::cpu::run_serving(training.lowered), Catch::Contains("no serving table"));
}
