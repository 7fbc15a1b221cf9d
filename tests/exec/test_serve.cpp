// test_serve.cpp — serving plans on the CPU backend: every planner's tokens equal
// single-device greedy decoding, KV use stays within the plan's capacity and the trace
// carries the KV the executor measured, the cached inference path equals recomputation
// and the training forward's loss, and bad plans are refused by name.
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

// Per batch, the KV tokens a rank holds once the batch ran, from the serving table alone:
// every request the batch left alive keeps its tokens (position + tokens of its latest
// item); a request is gone once its item produced its last output token, and one whose
// next item recomputes it (position 0: it is preempted, listed in a later batch's
// `preempted`) is gone from its latest item on, as the executor frees it.
std::vector<std::int64_t> expected_kv_tokens_after(const ir::ServePlan& serve) {
  const auto& batches = serve.batches;
  std::map<int, std::vector<std::pair<std::size_t, const ir::ServeItem*>>> items_of;  // request → (batch, item)
  for (std::size_t b = 0; b < batches.size(); ++b)
    for (const ir::ServeItem& i : batches[b].items) items_of[i.request].push_back({b, &i});
  std::vector<std::int64_t> out(batches.size(), 0);
  for (const auto& [r, items] : items_of) {
    const int prompt = serve.requests[static_cast<std::size_t>(r)].prompt;
    const int output = serve.requests[static_cast<std::size_t>(r)].output;
    for (std::size_t k = 0; k < items.size(); ++k) {
      const ir::ServeItem& item = *items[k].second;
      const bool last_token = item.position + item.tokens - prompt + 1 >= output;
      const bool recomputed_next = k + 1 < items.size() && items[k + 1].second->position == 0;
      if (recomputed_next) {  // the table lists the preemption between the two items
        bool listed = false;
        for (std::size_t b = items[k].first + 1; b <= items[k + 1].first; ++b) {
          const auto& p = batches[b].preempted;
          listed = listed || std::find(p.begin(), p.end(), r) != p.end();
        }
        INFO("request " << r << " recomputed in batch " << items[k + 1].first);
        CHECK(listed);
      }
      if (last_token || recomputed_next) continue;
      // Alive, holding position + tokens, from this item's batch until its next item's.
      const std::size_t until = k + 1 < items.size() ? items[k + 1].first : batches.size();
      for (std::size_t b = items[k].first; b < until; ++b) out[b] += item.position + item.tokens;
    }
  }
  return out;
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

// Runs `planner`'s plan on the CPU backend and checks its tokens against `reference`, its
// KV use against the plan's capacity, and the measured trace's KV bytes (the executor's,
// not the plan's copy) against the serving table.
void check_planner_run(const ir::Scenario& sc, const std::vector<ir::Request>& requests,
                       const std::vector<std::vector<int>>& reference, const std::string& planner) {
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
  // The trace: origin cpu, one event per op of every rank, named as the op. A
  // PREFILL/DECODE's bytes are measured: the tokens the rank cached after it at the
  // plan's bytes per token — exactly what the serving table says is alive then, and
  // never more than the plan's figure (blocks rounded up, finished requests not yet freed).
  CHECK(run.trace.origin == "cpu");
  CHECK(run.trace.ranks == plan.num_ranks());
  std::map<std::pair<int, std::string>, std::int64_t> planned;
  std::size_t ops = 0;
  for (int rank = 0; rank < plan.num_ranks(); ++rank)
    for (const ir::Op& op : plan.ranks[static_cast<std::size_t>(rank)]) {
      ++ops;
      if (ir::is_serving(op.kind)) planned[{rank, traces::event_of(op, rank, 0, 0).name}] = op.bytes;
    }
  CHECK(run.trace.events.size() == ops);
  const std::vector<std::int64_t> expected = expected_kv_tokens_after(*plan.serve);
  std::set<std::pair<int, std::string>> measured;
  int below_plan = 0;
  for (const traces::TraceEvent& e : run.trace.events) {
    if (!e.kind || !ir::is_serving(*e.kind)) continue;
    INFO("rank " << e.rank << " " << e.name);
    CHECK(measured.insert({e.rank, e.name}).second);
    REQUIRE(planned.count({e.rank, e.name}) == 1);
    REQUIRE(e.mb >= 0);
    REQUIRE(static_cast<std::size_t>(e.mb) < expected.size());
    const double per_token = plan.serve->kv_bytes_per_token[static_cast<std::size_t>(e.rank)];
    CHECK(e.bytes == std::llround(static_cast<double>(expected[static_cast<std::size_t>(e.mb)]) * per_token));
    CHECK(e.bytes <= planned[{e.rank, e.name}]);
    if (e.bytes < planned[{e.rank, e.name}]) ++below_plan;
  }
  CHECK(measured.size() == planned.size());
  CHECK(below_plan > 0);  // the measured figure is not the plan's copy
}

}  // namespace

TEST_CASE("serving on the CPU: every planner's tokens equal greedy decoding within the KV capacity, the trace "
          "carrying measured KV bytes (tp: one rank on one device, its schedule's tokens checked)",
          "[exec][serve]") {
  const ir::Scenario sc = serve_scenario();
  const std::vector<ir::Request> requests = serve_requests(sc);
  const auto reference = exec::cpu::greedy_reference(sc, requests, sc.serving->seed);
  REQUIRE(reference.size() == requests.size());
  SECTION("pp") { check_planner_run(sc, requests, reference, "pp"); }
  SECTION("tp: one rank, run on one CPU device: its schedule's tokens, not tensor-parallel arithmetic") {
    // The tp planner folds the pipeline into one tensor-parallel group: its plan has one
    // rank (KV bytes per token its 1/tensor share), and the CPU backend runs that rank's
    // whole model on one device. So this checks the tp schedule's batches and tokens, not
    // any tensor-parallel split of the arithmetic (the CPU backend has none).
    REQUIRE(planner::plan_serving(sc, "tp", requests).num_ranks() == 1);
    check_planner_run(sc, requests, reference, "tp");
  }
  SECTION("tdpipe") { check_planner_run(sc, requests, reference, "tdpipe"); }
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

// Log-probability of token `target` under the one row of `logits` (a log-softmax).
double log_prob(const Mat& logits, int target) {
  REQUIRE(logits.rows() == 1);
  const double mx = logits.maxCoeff();
  return logits(0, target) - mx - std::log((logits.array() - mx).exp().sum());
}

TEST_CASE("GptStage::infer: its log-probabilities equal the training forward's cross-entropy (an independent "
          "check of its mask and norms)", "[exec][serve]") {
  // greedy_reference decodes with infer itself, so the training forward (block_forward,
  // the path the training runs' gradients check) is the reference here: its loss is
  // Σ −log p(target | prefix) over the positions, which infer gives position by position.
  GptConfig c = GptConfig::from_scenario(serve_scenario());  // the tiny model: 4 layers
  c.micro_batch = 1;
  c.partition.clear();  // one stage holding every layer
  REQUIRE(c.layers >= 2);  // a mask or norm error in layer 1 reaches the last row via layer 2's keys
  GptStage model(c, 0, 1);
  const int L = 40;
  REQUIRE(L + 1 <= c.seq);
  const std::vector<int> ids = exec::cpu::prompt_tokens(11, 2, L + 1, c.vocab);
  const std::vector<std::vector<int>> tokens{{ids.begin(), ids.begin() + L}};
  const std::vector<std::vector<int>> targets{{ids.begin() + 1, ids.end()}};
  double training_loss = 0;
  CHECK(model.forward(0, 0, 0, L, Mat(), &tokens, &targets, 1.0, &training_loss).size() == 0);
  REQUIRE(training_loss > 0);

  // log_p[j] = log p(ids[j + 1] | ids[0..j]): the last row of one prefill of the prefix [0, j + 1).
  std::vector<double> log_p(static_cast<std::size_t>(L));
  double infer_loss = 0;
  for (int k = 1; k <= L; ++k) {
    const std::vector<int> prefix(ids.begin(), ids.begin() + k);
    log_p[static_cast<std::size_t>(k - 1)] = log_prob(full_logits(model, prefix), ids[static_cast<std::size_t>(k)]);
    infer_loss -= log_p[static_cast<std::size_t>(k - 1)];
  }
  INFO("training loss " << training_loss << ", infer's " << infer_loss);
  CHECK(std::abs(infer_loss - training_loss) <= 1e-9 * std::abs(training_loss));

  SECTION("a prefill of k − 3 tokens then 3 cached single-token decodes give the same log-probabilities") {
    for (int k = 4; k <= L; ++k) {
      INFO("prefix of " << k << " tokens");
      KvCache cache;
      const std::vector<int> head(ids.begin(), ids.begin() + (k - 3));
      Mat logits = model.infer({InferItem{0, 0, k - 3, &cache, head}}, Mat());
      const auto near = [&](int j, const Mat& l) {
        const double want = log_p[static_cast<std::size_t>(j)];
        const double got = log_prob(l, ids[static_cast<std::size_t>(j + 1)]);
        CHECK(std::abs(got - want) <= 1e-9 * std::max(1.0, std::abs(want)));
      };
      near(k - 4, logits);
      for (int t = k - 3; t < k; ++t) {
        REQUIRE(cache.tokens == t);
        logits = model.infer({InferItem{0, t, 1, &cache, {ids[static_cast<std::size_t>(t)]}}}, Mat());
        near(t, logits);
      }
    }
  }
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
