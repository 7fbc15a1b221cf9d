// test_serving.cpp — serving planners and the inference cost model: the switch rule on
// hand-computed cases, KV accounting recomputed from the plan's table and never over
// the cap, every request's tokens produced once and in order, work stealing's balance,
// closed forms of decode (weight- and KV-read bound) and prefill (FLOP bound).
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "planner_test_util.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/ir/validate.hpp"
#include "tdpipe/planner/cost_fit.hpp"
#include "tdpipe/planner/cost_model.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/planner/serving.hpp"
#include "tdpipe/planner/serving_cost.hpp"

using namespace tdpipe;
using planner::test::scenario_path;

namespace {

ir::Scenario tiny() { return ir::load_scenario(scenario_path("serve-tiny-cpu.yaml")); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

/// KV blocks after each batch, recomputed from the serving table alone: a request holds
/// ⌈cached / B⌉ blocks from its (re)prefill; it is freed once it produced its last token,
/// or when a batch lists it as preempted. The figure is the batch's peak (before its
/// finished requests are freed).
std::vector<long long> blocks_from_table(const ir::ServePlan& s) {
  std::vector<long long> held(s.requests.size(), 0);
  long long blocks = 0;
  std::vector<long long> out;
  for (const auto& b : s.batches) {
    for (int r : b.preempted) {
      blocks -= ir::kv_blocks(held[static_cast<std::size_t>(r)], s.block_tokens);
      held[static_cast<std::size_t>(r)] = 0;
    }
    for (const auto& i : b.items) {
      auto& h = held[static_cast<std::size_t>(i.request)];
      if (i.position == 0) CHECK(h == 0);  // a prefill of a request whose cache was dropped
      blocks += ir::kv_blocks(i.position + i.tokens, s.block_tokens) - ir::kv_blocks(h, s.block_tokens);
      h = i.position + i.tokens;
    }
    out.push_back(blocks);
    for (const auto& i : b.items) {
      const auto& q = s.requests[static_cast<std::size_t>(i.request)];
      if (i.position + i.tokens - q.prompt + 1 == q.output) {
        blocks -= ir::kv_blocks(held[static_cast<std::size_t>(i.request)], s.block_tokens);
        held[static_cast<std::size_t>(i.request)] = 0;
      }
    }
  }
  return out;
}

/// Checks every request produced output tokens 0 … O − 1 exactly once each, in batch
/// order, and that a request's batches are at least P apart unless it had to wait (it
/// then depends on its previous batch's token RECV, which the validator's replay proves).
void check_tokens(const ir::Plan& plan) {
  const ir::ServePlan& s = *plan.serve;
  std::vector<int> next(s.requests.size(), 0);
  for (const auto& b : s.batches)
    for (const auto& i : b.items) {
      const int produced = i.position + i.tokens - s.requests[static_cast<std::size_t>(i.request)].prompt;
      INFO("request " << i.request);
      CHECK(produced == next[static_cast<std::size_t>(i.request)]);
      // A decode consumes the token just produced; a (re)prefill everything before it.
      if (i.position > 0) CHECK(i.tokens == 1);
      next[static_cast<std::size_t>(i.request)] = produced + 1;
    }
  for (std::size_t r = 0; r < s.requests.size(); ++r) CHECK(next[r] == s.requests[r].output);
}

}  // namespace

TEST_CASE("switch rule: the paper's intensities on hand-computed cases", "[serving]") {
  planner::SwitchInputs in;
  in.stages = 4;
  in.decode_batch = 64;
  in.decode_seconds = 0.010;
  in.full_batch = 256;
  in.full_seconds = 0.025;
  in.prefill_seconds = {0.10, 0.12, 0.08};
  in.decode_after_seconds = 0.02;
  auto d = planner::switch_decision(in);
  // decode: (64 / 0.010) / (256 / 0.025) = 0.625; prefill: 0.30 + 3·0.12 = 0.66 s,
  // bubble 3·(0.12 − 0.02) = 0.30 s, intensity (0.66 − 0.30) / 0.66 = 0.5454…
  CHECK(d.decode_intensity == Approx(0.625));
  CHECK(d.prefill_time == Approx(0.66));
  CHECK(d.bubble == Approx(0.30));
  CHECK(d.prefill_intensity == Approx(0.36 / 0.66));
  CHECK_FALSE(d.to_prefill);
  // A smaller decode batch at nearly the same step time: (32 / 0.009) / 10240 = 0.347 < 0.545.
  in.decode_batch = 32;
  in.decode_seconds = 0.009;
  d = planner::switch_decision(in);
  CHECK(d.decode_intensity == Approx(32 / 0.009 / 10240.0));
  CHECK(d.to_prefill);
  // Prefill shorter than the decode step after it: no bubble, intensity 1 — switch.
  in.decode_batch = 200;
  in.decode_seconds = 0.020;
  in.prefill_seconds = {0.01, 0.01};
  d = planner::switch_decision(in);
  CHECK(d.bubble == 0);
  CHECK(d.prefill_intensity == 1);
  CHECK(d.to_prefill);
  // Nothing admissible: stay.
  in.prefill_seconds.clear();
  CHECK_FALSE(planner::switch_decision(in).to_prefill);
}

TEST_CASE("serving planners: valid plans, KV within the cap, every token once", "[serving]") {
  const ir::Scenario sc = tiny();
  const auto requests = ir::serving_requests(*sc.serving);
  for (const std::string name : {"pp", "tp", "tdpipe"}) {
    SECTION(name) {
      const ir::Plan plan = planner::plan_serving(sc, name, requests);
      REQUIRE_NOTHROW(ir::validate(plan));
      REQUIRE(plan.serve);
      const ir::ServePlan& s = *plan.serve;
      CHECK(plan.schedule == "serve-" + name);
      CHECK(plan.num_ranks() == (name == "tp" ? 1 : 2));
      CHECK(plan.scenario.parallel.tensor == (name == "tp" ? 2 : 1));
      check_tokens(plan);
      // KV: the ops' bytes are the table's blocks, on every rank, and never over the cap.
      const auto blocks = blocks_from_table(s);
      for (int r = 0; r < plan.num_ranks(); ++r) {
        const double block_bytes = s.kv_bytes_per_token[static_cast<std::size_t>(r)] * s.block_tokens;
        for (const auto& op : plan.ranks[static_cast<std::size_t>(r)]) {
          if (!ir::is_serving(op.kind)) continue;
          INFO(name << " rank " << r << " batch " << op.mb);
          CHECK(op.bytes == std::llround(blocks[static_cast<std::size_t>(op.mb)] * block_bytes));
          CHECK(static_cast<double>(op.bytes) <= s.kv_capacity_bytes[static_cast<std::size_t>(r)]);
        }
      }
      const long long peak = *std::max_element(blocks.begin(), blocks.end());
      const double cap_blocks = s.kv_capacity_bytes[0] / (s.kv_bytes_per_token[0] * s.block_tokens);
      if (name == "tdpipe") {
        // The projection keeps the peak under kv_fraction of the blocks.
        CHECK(peak <= sc.serving->kv_fraction * cap_blocks);
        CHECK(peak > 0.5 * cap_blocks);  // and the memory is used
      }
      if (name == "pp") {
        // The tiny scenario's KV is small enough that vLLM's scheduler preempts.
        int recomputed = 0, preempted = 0;
        std::set<int> seen;
        for (const auto& b : s.batches) {
          preempted += static_cast<int>(b.preempted.size());
          for (const auto& i : b.items) {
            if (i.position == 0 && seen.count(i.request)) ++recomputed;
            seen.insert(i.request);
          }
        }
        CHECK(recomputed > 0);
        CHECK(recomputed == preempted);
        CHECK(peak <= cap_blocks);
      }
    }
  }
}

TEST_CASE("tdpipe planner: work stealing keeps decode batches within one of each other", "[serving]") {
  ir::Scenario sc = tiny();
  sc.cluster.groups[0].gpu.hbm_bytes = 1 << 30;  // KV never binds: one prefill window
  sc.parallel.pipeline = 2;
  // Equal lengths: nothing finishes before the end, so every decode round splits N evenly.
  std::vector<ir::Request> requests(11, ir::Request{6, 9});
  const ir::Plan plan = planner::plan_serving(sc, "tdpipe", requests);
  REQUIRE_NOTHROW(ir::validate(plan));
  const auto& batches = plan.serve->batches;
  int decode = 0;
  for (const auto& b : batches) {
    if (b.has_prefill()) continue;
    ++decode;
    INFO("decode batch " << decode);
    CHECK((b.items.size() == 5 || b.items.size() == 6));  // 11 over 2 in flight
  }
  CHECK(decode == 2 * 8);  // 8 decode steps per request, 2 batches per step

  // Prompts of two lengths, long ones first: count-balanced batches taken in queue order
  // would put all six long requests in the first decode batch (240 cached tokens against
  // 24). Only the first prefill batch's eight requests (six long, two short) are back for
  // it, so the best it can do is take both short ones: 4·40 + 2·4 against 2·40 + 4·4.
  std::vector<ir::Request> two;
  for (int r = 0; r < 12; ++r) two.push_back({r < 6 ? 40 : 4, 6});
  ir::Scenario roomy = sc;
  roomy.serving->max_batch_tokens = 512;
  const ir::Plan p3 = planner::plan_serving(roomy, "tdpipe", two);
  REQUIRE_NOTHROW(ir::validate(p3));
  std::vector<double> round_tokens;
  for (const auto& b : p3.serve->batches) {
    if (b.has_prefill()) continue;
    double cached = 0;
    for (const auto& i : b.items) cached += i.position;
    round_tokens.push_back(cached);
    if (round_tokens.size() == 2) break;
  }
  REQUIRE(round_tokens.size() == 2);
  CHECK(round_tokens[0] == 4 * 40 + 2 * 4);
  CHECK(round_tokens[1] == 2 * 40 + 4 * 4);

  // Mixed lengths: sizes in a round differ by at most one plus the requests that
  // finished in the round before (their batch comes back short until stolen from).
  ir::Scenario big = sc;
  big.serving->max_batch_requests = 64;
  std::vector<ir::Request> mixed;
  for (int r = 0; r < 40; ++r) mixed.push_back({4 + r % 7, 3 + (r * 7) % 19});
  const ir::Plan p2 = planner::plan_serving(big, "tdpipe", mixed);
  REQUIRE_NOTHROW(ir::validate(p2));
  const auto& b2 = p2.serve->batches;
  std::vector<int> finished_in(b2.size(), 0);
  for (std::size_t j = 0; j < b2.size(); ++j)
    for (const auto& i : b2[j].items)
      if (i.position + i.tokens - mixed[static_cast<std::size_t>(i.request)].prompt + 1 ==
          mixed[static_cast<std::size_t>(i.request)].output)
        ++finished_in[j];
  const int P = 2;
  for (std::size_t j = static_cast<std::size_t>(2 * P); j + 1 < b2.size(); ++j) {
    if (b2[j].has_prefill() || b2[j + 1].has_prefill() || b2[j].phase != b2[j + 1].phase) continue;
    if (b2[j - P].has_prefill() || b2[j - P].phase != b2[j].phase) continue;
    int finished = 0;
    for (std::size_t k = j - 2 * P; k < j + 1; ++k) finished += finished_in[k];
    const long a = static_cast<long>(b2[j].items.size()), b = static_cast<long>(b2[j + 1].items.size());
    INFO("batches " << j << ", " << j + 1);
    CHECK(std::labs(a - b) <= 1 + finished);
  }
}

TEST_CASE("serving cost: decode reads weights and KV, prefill is FLOP-bound", "[serving]") {
  const ir::Scenario sc =
      planner::serving_layout(ir::load_scenario(scenario_path("serve-llama2-13b-l20-pcie-4.yaml")), "pp");
  const planner::ServingCost cost(sc, 4);
  const auto& gpu = sc.cluster.groups[0].gpu;
  const auto& eff = planner::default_efficiencies();
  const double h = 5120, ffn = 13824, e = 2, hbm = gpu.hbm_bytes_per_second * eff.hbm;
  // KV of one token on one GPU: 10 layers · (K and V) · 5120 · 2 bytes.
  CHECK(cost.kv_bytes_per_token(1) == 10 * 2 * h * e);
  // Weights of a middle stage: 10 layers of 4h² + 3·h·ffn matrices and 4h norm/bias values.
  CHECK(cost.weight_bytes(1) == Approx(10 * (4 * h * h + 3 * h * ffn + 4 * h) * e));
  // One decode token at position 0 on a middle stage: each GEMM at its roofline (the
  // slower of its bytes through 90 % of HBM and its FLOPs at gemm_max of peak — here the
  // bytes), the token's own K/V read, the element-wise bytes and the kernels' fixed cost.
  auto gemm = [&](double n, double k) {
    return std::max(e * (k + k * n + n) / hbm, 2 * n * k / (gpu.peak_flops * eff.gemm_max));
  };
  const double layer = gemm(3 * h, h) + gemm(h, h) + gemm(2 * ffn, h) + gemm(h, ffn) + 2 * h * e / hbm +
                       (10 * h + 3 * ffn) * e / hbm + 27e-6;
  CHECK(cost.batch_seconds(1, {{0, 0, 1}}) == Approx(10 * layer).epsilon(1e-9));
  // 200 decode tokens at context 1000: the KV read (200 · 1000 tokens' K and V) dominates.
  std::vector<ir::ServeItem> decode(200, ir::ServeItem{0, 999, 1});
  const double kv_read = 200.0 * 1000 * cost.kv_bytes_per_token(1) / hbm;
  CHECK(cost.batch_seconds(1, decode) > kv_read);
  CHECK(cost.batch_seconds(1, decode) < 1.5 * kv_read);
  // A 2048-token prefill runs at most gemm_max of peak, and at least half of it; a
  // 1,024-token decode batch (past the L20's ~140 FLOP/byte) is FLOP-bound too, a
  // 32-token one reads the weights.
  std::vector<ir::ServeItem> prefill(4, ir::ServeItem{0, 0, 512});
  const double achieved = cost.batch_flops(1, prefill) / cost.batch_seconds(1, prefill) / gpu.peak_flops;
  CHECK(achieved < eff.gemm_max);
  CHECK(achieved > 0.5 * eff.gemm_max);
  std::vector<ir::ServeItem> d32(32, ir::ServeItem{0, 0, 1});
  const double weights_read = cost.weight_bytes(1) / hbm;
  CHECK(cost.batch_seconds(1, d32) > weights_read);
  CHECK(cost.batch_seconds(1, d32) < 1.1 * weights_read + 10 * 27e-6 + 32 * 10 * (10 * h + 3 * ffn) * e / hbm +
                                         32.0 * cost.kv_bytes_per_token(1) / hbm);
  // GQA: Qwen2.5-32B's 8 K/V heads of 40 → 16 layers · 2 · 1024 · 2 bytes per token per GPU.
  const ir::Scenario qwen =
      planner::serving_layout(ir::load_scenario(scenario_path("serve-qwen2.5-32b-l20-pcie-4.yaml")), "pp");
  CHECK(planner::ServingCost(qwen, 4).kv_bytes_per_token(0) == 16 * 2 * 1024 * 2);
  // tp over 4 GPUs: a quarter of the K/V heads per GPU, all-reduces on the PCIe link.
  const ir::Scenario tp =
      planner::serving_layout(ir::load_scenario(scenario_path("serve-llama2-13b-l20-pcie-4.yaml")), "tp");
  CHECK(tp.parallel.tensor == 4);
  CHECK(tp.parallel.pipeline == 1);
  const planner::ServingCost tp_cost(tp, 1);
  CHECK(tp_cost.kv_bytes_per_token(0) == 40 * 2 * h * e / 4);
  const double ar = planner::tp_collective_seconds(tp, gpu, ir::OpKind::ALLREDUCE, 64 * h * e, 4);
  std::vector<ir::ServeItem> d64(64, ir::ServeItem{0, 99, 1});
  CHECK(tp_cost.batch_seconds(0, d64) > 80 * ar);  // two all-reduces per layer, 40 layers
}

TEST_CASE("serving planners: clear errors", "[serving]") {
  const ir::Scenario sc = tiny();
  CHECK_THAT(error_of([&] { planner::plan_serving(sc, "vllm", {{3, 2}}); }),
             Catch::Contains("unknown serving planner 'vllm'"));
  CHECK_THAT(error_of([&] { planner::plan_serving(sc, "pp", {{60, 10}}); }),
             Catch::Contains("request 0: 60 prompt + 10 output tokens exceed the model's context of model.seq = 64"));
  ir::Scenario no_serving = sc;
  no_serving.serving.reset();
  CHECK_THAT(error_of([&] { planner::plan_serving(no_serving, "pp", {{3, 2}}); }), Catch::Contains("no serving:"));
  ir::Scenario small = sc;
  small.cluster.groups[0].gpu.hbm_bytes = 780000;  // weights + workspace leave 12 blocks of 4 tokens
  CHECK_THAT(error_of([&] { planner::plan_serving(small, "tdpipe", {{40, 20}}); }), Catch::Contains("KV blocks"));
  ir::Scenario budget = sc;
  budget.serving->max_batch_tokens = 40;
  CHECK_THAT(error_of([&] { planner::plan_serving(budget, "pp", {{30, 20}}); }),
             Catch::Contains("request 0: a prefill of up to 49 tokens (its prompt and output, recomputed) exceeds "
                             "serving.max_batch_tokens = 40"));
  CHECK_NOTHROW(planner::plan_serving(budget, "tdpipe", {{30, 20}}));  // tdpipe never recomputes: its prompt fits
  ir::Scenario mixed = sc;
  mixed.cluster.groups.push_back(mixed.cluster.groups[0]);
  CHECK_THAT(error_of([&] { planner::plan_serving(mixed, "pp", {{3, 2}}); }), Catch::Contains("2 kinds of GPU"));
  ir::Scenario tiny_mem = sc;
  tiny_mem.cluster.groups[0].gpu.hbm_bytes = 100000;
  CHECK_THAT(error_of([&] { planner::plan_serving(tiny_mem, "pp", {{3, 2}}); }),
             Catch::Contains("no room for a KV cache"));
}

TEST_CASE("serving: the analytic engine times a plan, the switch bubbles appear only for tdpipe", "[serving]") {
  const ir::Scenario sc = tiny();
  const auto requests = ir::serving_requests(*sc.serving);
  for (const std::string name : {"pp", "tdpipe"}) {
    const ir::Plan plan = planner::plan_serving(sc, name, requests);
    const auto trace = planner::evaluate(plan);
    std::set<int> phases;
    for (const auto& b : plan.serve->batches) phases.insert(b.phase);
    CHECK((name == "pp" ? phases.size() == 1 : phases.size() > 2));
    // Rank 0 starts batch j no earlier than the tokens of every request it holds came back.
    std::map<int, std::int64_t> end_last;  // batch → end on the last rank
    for (const auto& e : trace.events)
      if (e.kind && ir::is_serving(*e.kind) && e.rank == plan.num_ranks() - 1) end_last[e.mb] = e.end_ns();
    std::vector<int> prev(requests.size(), -1);
    for (const auto& e : trace.events) {
      if (!e.kind || !ir::is_serving(*e.kind) || e.rank != 0) continue;
      for (const auto& i : plan.serve->batches[static_cast<std::size_t>(e.mb)].items) {
        const int b = prev[static_cast<std::size_t>(i.request)];
        if (b >= 0) CHECK(e.start_ns >= end_last[b]);
      }
      for (const auto& i : plan.serve->batches[static_cast<std::size_t>(e.mb)].items)
        prev[static_cast<std::size_t>(i.request)] = e.mb;
    }
  }
}

TEST_CASE("serving: a fitted cost model prices PREFILL/DECODE with the forward's speeds", "[serving]") {
  const ir::Scenario sc = tiny();
  ir::Plan plan = planner::plan_serving(sc, "tdpipe", ir::serving_requests(*sc.serving));
  traces::Profile profile;
  profile.model.gpu = "cpu";
  // op, layer, gemm, attention, elementwise, comm, embedding, head, optimizer
  const std::vector<double> f = {2e-5, 3e-6, 5, 7, 11, 1, 13, 17, 0};
  profile.model.coefficients[ir::OpKind::F] = f;
  const ir::Plan before = plan;
  const auto applied = planner::apply_profile(profile, plan, /*ops_only=*/true);
  CHECK(applied.ops_kept == 0);
  const planner::ServingCost cost(plan.scenario, plan.num_ranks());
  int priced = 0;
  for (int r = 0; r < plan.num_ranks(); ++r)
    for (const auto& op : plan.ranks[static_cast<std::size_t>(r)]) {
      if (!ir::is_serving(op.kind)) continue;
      const auto& items = plan.serve->batches[static_cast<std::size_t>(op.mb)].items;
      const planner::CostParts p = cost.batch_parts(r, items);
      const double expected = f[0] + f[1] * cost.layers(r) + f[2] * p.gemm + f[3] * p.attention +
                              f[4] * p.elementwise + f[5] * p.comm + f[6] * p.embedding + f[7] * p.head;
      CHECK(op.est_seconds == Approx(expected).epsilon(1e-12));
      ++priced;
    }
  CHECK(priced == static_cast<int>(plan.serve->batches.size()) * plan.num_ranks());
  // Decode reads: a GEMM's term is its roofline time at peak, the KV read is attention's.
  const ir::Scenario big =
      planner::serving_layout(ir::load_scenario(scenario_path("serve-llama2-13b-l20-pcie-4.yaml")), "pp");
  const planner::ServingCost c13(big, 4);
  const planner::CostParts one = c13.batch_parts(1, {{0, 999, 1}});
  const auto& gpu = big.cluster.groups[0].gpu;
  CHECK(one.gemm == Approx(c13.weight_bytes(1) / gpu.hbm_bytes_per_second).epsilon(0.01));  // the weights, read once
  CHECK(one.attention > 1000 * c13.kv_bytes_per_token(1) / gpu.hbm_bytes_per_second);
  // Without forward speeds the profile prices nothing.
  ir::Plan other = before;
  traces::Profile no_f = profile;
  no_f.model.coefficients.clear();
  no_f.model.coefficients[ir::OpKind::BW] = f;
  CHECK(planner::apply_profile(no_f, other, true).ops_kept > 0);
}

TEST_CASE("serving planners: random workloads give valid plans within the KV cap", "[serving]") {
  // A property test over layouts, block sizes, caps and lengths: every plan validates
  // (the validator recomputes its KV from the table and checks the capacity, the table's
  // consistency and the deadlock-freedom of its transfers), or the planner refuses the
  // workload by name.
  std::mt19937_64 rng(42);
  auto pick = [&](std::initializer_list<int> v) { return *(v.begin() + static_cast<long>(rng() % v.size())); };
  int planned = 0;
  for (int run = 0; run < 150; ++run) {
    ir::Scenario sc = tiny();
    const int P = pick({1, 2, 4});
    sc.parallel.pipeline = P;
    sc.cluster.gpus_per_node = P;
    sc.serving->block_tokens = pick({1, 2, 4, 8});
    sc.serving->kv_fraction = pick({50, 90, 100}) / 100.0;
    sc.serving->max_batch_requests = pick({2, 3, 5, 8, 16});
    sc.serving->max_batch_tokens = pick({48, 64});
    sc.cluster.groups[0].gpu.hbm_bytes = pick({760000, 800000, 900000});
    std::vector<ir::Request> requests(static_cast<std::size_t>(5 + rng() % 30));
    for (auto& q : requests) q = {static_cast<int>(1 + rng() % 24), static_cast<int>(1 + rng() % 24)};
    for (const std::string name : {"pp", "tp", "tdpipe"}) {
      INFO("run " << run << " planner " << name << " P " << P << " B " << sc.serving->block_tokens << " cap "
                  << sc.serving->max_batch_requests << " hbm " << sc.cluster.groups[0].gpu.hbm_bytes);
      ir::Plan plan;
      try {
        plan = planner::plan_serving(sc, name, requests);
      } catch (const Error& e) {
        const std::string what = e.what();
        CHECK((what.find("KV blocks") != std::string::npos || what.find("no room for a KV cache") != std::string::npos ||
               what.find("cannot be admitted") != std::string::npos ||
               what.find("exceeds serving.max_batch_tokens") != std::string::npos));
        continue;
      }
      CHECK_NOTHROW(ir::validate(plan));
      ++planned;
    }
  }
  CHECK(planned > 250);  // most workloads fit (287 of 450 with this seed)
}
