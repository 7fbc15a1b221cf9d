// test_serving_report.cpp — a serving run's figures from a hand-timed trace: token
// times, throughput, each stage's bubbles by cause and its KV use, exactly.
#include <catch2/catch.hpp>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/traces/serving_report.hpp"

using namespace tdpipe;

namespace {

constexpr std::int64_t kMs = 1'000'000;

/// Requests 0 (3 prompt, 3 output) and 1 (2 prompt, 1 output); batch 0 prefills both
/// (phase 0), batches 1 and 2 decode request 0 (phase 1); two ranks.
ir::Plan plan() {
  ir::Plan p;
  p.schedule = "serve-tdpipe";
  p.stages = 2;
  p.microbatches = 3;
  ir::ServePlan s;
  s.planner = "tdpipe";
  s.requests = {{3, 3}, {2, 1}};
  s.batches = {{{{0, 0, 3}, {1, 0, 2}}, 0, {}}, {{{0, 3, 1}}, 1, {}}, {{{0, 4, 1}}, 1, {}}};
  s.kv_bytes_per_token = {10, 10};
  s.kv_capacity_bytes = {1000, 1000};
  p.serve = s;
  p.ranks.resize(2);
  return p;
}

traces::TraceEvent op(ir::OpKind kind, int rank, int mb, std::int64_t start_ms, std::int64_t end_ms, std::int64_t kv) {
  traces::TraceEvent e;
  e.kind = kind;
  e.rank = rank;
  e.mb = mb;
  e.name = std::string(ir::to_string(kind)) + std::to_string(mb);
  e.start_ns = start_ms * kMs;
  e.dur_ns = (end_ms - start_ms) * kMs;
  e.bytes = kv;
  return e;
}

traces::Trace trace() {
  traces::Trace t;
  t.origin = "analytic";
  t.ranks = 2;
  using K = ir::OpKind;
  t.events = {op(K::PREFILL, 0, 0, 0, 10, 100), op(K::DECODE, 0, 1, 30, 35, 200), op(K::DECODE, 0, 2, 50, 55, 300),
              op(K::PREFILL, 1, 0, 12, 20, 100), op(K::DECODE, 1, 1, 37, 40, 200), op(K::DECODE, 1, 2, 57, 60, 300)};
  return t;
}

}  // namespace

TEST_CASE("serving report: tokens, throughput, bubbles by cause, KV", "[serving]") {
  const auto r = traces::serving_report(plan(), trace());
  CHECK(r.requests == 2);
  CHECK(r.prompt_tokens == 5);
  CHECK(r.output_tokens == 4);
  CHECK(r.prefill_batches == 1);
  CHECK(r.decode_batches == 2);
  CHECK(r.phases == 2);
  CHECK(r.makespan_seconds == Approx(0.060));
  CHECK(r.output_tokens_per_second == Approx(4 / 0.060));
  CHECK(r.total_tokens_per_second == Approx(9 / 0.060));
  // First tokens when batch 0 ends on the last rank (20 ms); request 0's last at 60 ms:
  // (60 − 20) / 2 per output token after the first. Request 1 has one token: no TPOT.
  CHECK(r.ttft.p50 == Approx(0.020));
  CHECK(r.ttft.max == Approx(0.020));
  CHECK(r.tpot.mean == Approx(0.020));
  REQUIRE(r.stage.size() == 2);
  // Rank 0: busy 20, a phase switch 10 → 30, an imbalance wait 35 → 50, drain 55 → 60.
  CHECK(r.stage[0].busy_seconds == Approx(0.020));
  CHECK(r.stage[0].phase_switch_seconds == Approx(0.020));
  CHECK(r.stage[0].imbalance_seconds == Approx(0.015));
  CHECK(r.stage[0].fill_drain_seconds == Approx(0.005));
  // Rank 1: fill 0 → 12, switch 20 → 37, imbalance 40 → 57, no drain.
  CHECK(r.stage[1].fill_drain_seconds == Approx(0.012));
  CHECK(r.stage[1].phase_switch_seconds == Approx(0.017));
  CHECK(r.stage[1].imbalance_seconds == Approx(0.017));
  // KV held: 100 bytes from 10 to 35 ms, 200 to 55, 300 to 60 → 8,000 byte·ms over 60 ms.
  CHECK(r.stage[0].peak_kv_bytes == 300);
  CHECK(r.stage[0].mean_kv_bytes == Approx(8000.0 / 60));
  CHECK(r.stage[0].kv_capacity_bytes == 1000);
}

TEST_CASE("serving report: refuses a trace of another plan", "[serving]") {
  traces::Trace t = trace();
  t.events.pop_back();  // the last stage's batch 2 is missing
  CHECK_THROWS_WITH(traces::serving_report(plan(), t), Catch::Contains("no PREFILL/DECODE of batch 2"));
  ir::Plan training = plan();
  training.serve.reset();
  CHECK_THROWS_WITH(traces::serving_report(training, trace()), Catch::Contains("no serving table"));
  t = trace();
  t.events[1].mb = 7;
  CHECK_THROWS_WITH(traces::serving_report(plan(), t), Catch::Contains("names batch 7; the plan has 3"));
}

TEST_CASE("serving report: percentiles by nearest rank", "[serving]") {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  const auto d = traces::distribution_of(v);
  CHECK(d.p50 == 50);
  CHECK(d.p90 == 90);
  CHECK(d.p99 == 99);
  CHECK(d.max == 100);
  CHECK(d.mean == Approx(50.5));
  CHECK(traces::distribution_of({}).max == 0);
}
