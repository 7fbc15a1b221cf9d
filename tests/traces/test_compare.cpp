// test_compare.cpp — predicted vs measured: pairing, errors, drift, JSON.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/traces/compare.hpp"
#include "tdpipe/traces/pairing.hpp"

using namespace tdpipe;
using namespace tdpipe::traces;

namespace {

TraceEvent ev(int rank, const char* name, ir::OpKind kind, std::int64_t start, std::int64_t dur) {
  TraceEvent e;
  e.rank = rank;
  e.name = name;
  e.kind = kind;
  e.start_ns = start;
  e.dur_ns = dur;
  return e;
}

// Predicted: rank0 F0 [0,10) F1 [10,20) BW0 [30,50); rank1 F0 [10,20) BW0 [20,40) OPT [40,45).
Trace predicted() {
  using ir::OpKind;
  Trace t;
  t.origin = "analytic";
  t.schedule = "1f1b";
  t.ranks = 2;
  t.events = {ev(0, "F0", OpKind::F, 0, 10), ev(0, "F1", OpKind::F, 10, 10), ev(0, "BW0", OpKind::BW, 30, 20),
              ev(1, "F0", OpKind::F, 10, 10), ev(1, "BW0", OpKind::BW, 20, 20), ev(1, "OPT", OpKind::OPT, 40, 5)};
  return t;
}

}  // namespace

TEST_CASE("compare pairs ops by rank and name and measures the gap", "[traces][compare]") {
  using ir::OpKind;
  Trace measured;
  measured.origin = "cpu";
  measured.schedule = "1f1b";
  measured.ranks = 2;
  // Measured starts at 1000 (another origin) — starts are compared relative to the first event.
  // Durations: F0 12 (+20%), F1 10 (0), BW0 25 (−20% pred error: 20 vs 25), rank1 F0 10, BW0 20, OPT 5;
  // rank1 has an extra op the prediction lacks; rank0 BW0 starts 7 ns later than predicted.
  measured.events = {ev(0, "F0", OpKind::F, 1000, 12), ev(0, "F1", OpKind::F, 1012, 10),
                     ev(0, "BW0", OpKind::BW, 1037, 25), ev(1, "F0", OpKind::F, 1012, 10),
                     ev(1, "BW0", OpKind::BW, 1022, 20), ev(1, "OPT", OpKind::OPT, 1042, 5),
                     ev(1, "marker", OpKind::CKPT, 1047, 0)};
  const Comparison c = compare(predicted(), measured, CompareOptions{2});
  CHECK(c.predicted_iteration_ns == 50);
  CHECK(c.measured_iteration_ns == 62);
  CHECK(c.iteration_error == Approx((50.0 - 62) / 62));
  CHECK(c.matched == 6);
  CHECK(c.only_predicted == 0);
  CHECK(c.only_measured == 1);
  // Compute duration errors: |10−12|/12, 0, |20−25|/25, 0, 0, 0 → sorted 0,0,0,0,0.1667,0.2.
  CHECK(c.compute_duration_error.count == 6);
  CHECK(c.compute_duration_error.median == Approx(0));
  CHECK(c.compute_duration_error.p90 == Approx(1.0 / 6 + 0.5 * (0.2 - 1.0 / 6)));
  CHECK(c.compute_duration_error.max == Approx(0.2));
  // Rank 0 idle: predicted (50−40)/50 = 0.2; measured (62−47)/62.
  REQUIRE(c.ranks.size() == 2);
  CHECK(c.ranks[0].bubble_error_pp == Approx(100 * (0.2 - 15.0 / 62)));
  // Drift: rank0 BW0 predicted 30, measured 37 → +7; rank1 F0/BW0/OPT +2, rank0 F1 +2.
  REQUIRE(c.largest_drift.size() == 2);
  CHECK(c.largest_drift[0].rank == 0);
  CHECK(c.largest_drift[0].name == "BW0");
  CHECK(c.largest_drift[0].drift_ns() == 7);
  CHECK(c.largest_drift[1].drift_ns() == 2);
  CHECK(c.warnings.empty());

  const nlohmann::json j = to_json(c);
  CHECK(j["iteration_error"].get<double>() == Approx(c.iteration_error));
  CHECK(j["ranks"].size() == 2);
  CHECK(j["largest_drift"][0]["name"] == "BW0");
  CHECK(j["largest_drift"][0]["drift"].get<double>() == Approx(7e-9));
  CHECK(j["compute_duration_error"]["p90"].get<double>() == Approx(c.compute_duration_error.p90));
  CHECK(j["matched_ops"] == 6);
  const std::string text = to_text(c);
  CHECK_THAT(text, Catch::Contains("iteration time"));
  CHECK_THAT(text, Catch::Contains("rank   0"));
}

TEST_CASE("compare: repeated names pair in start order - mismatched traces are rejected", "[traces][compare]") {
  using ir::OpKind;
  Trace a;
  a.ranks = 1;
  a.events = {ev(0, "SEND(F0>r1)", OpKind::SEND, 10, 1), ev(0, "SEND(F0>r1)", OpKind::SEND, 0, 1)};
  Trace b = a;
  b.events[0].start_ns = 12;
  const Comparison c = compare(a, b);
  CHECK(c.matched == 2);
  CHECK(c.largest_drift[0].drift_ns() == 2);
  CHECK(c.compute_duration_error.count == 0);
  CHECK(c.all_duration_error.count == 2);

  Trace two = predicted();
  REQUIRE_THROWS_WITH(compare(two, a), Catch::Contains("the predicted trace has 2 ranks and the measured one 1"));
  Trace renamed = predicted();
  for (auto& e : renamed.events) e.name += "x";
  REQUIRE_THROWS_WITH(compare(predicted(), renamed), Catch::Contains("no op of the predicted trace"));
  renamed = predicted();
  renamed.schedule = "gpipe";
  CHECK(compare(predicted(), renamed).warnings.size() == 1);
}

TEST_CASE("quantile interpolates linearly", "[traces][compare]") {
  CHECK(quantile({}, 0.5) == 0);
  CHECK(quantile({3}, 0.9) == 3);
  CHECK(quantile({4, 1, 3, 2}, 0.5) == Approx(2.5));
  CHECK(quantile({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 0.9) == Approx(10));
  CHECK(quantile({0, 10}, 0.9) == Approx(9));
}

TEST_CASE("pair_ops pairs repeated keys in start order and leaves extras unpaired", "[pairing]") {
  Trace a, b;
  auto ev = [](std::string name, std::int64_t start) {
    TraceEvent e;
    e.name = std::move(name);
    e.start_ns = start;
    e.dur_ns = 10;
    return e;
  };
  // Foreign events: matched by (rank, stream, name) and occurrence.
  a.events = {ev("gemm", 50), ev("gemm", 0), ev("relu", 20)};
  b.events = {ev("gemm", 5), ev("relu", 30), ev("gemm", 60), ev("gemm", 90)};
  const OpPairing p = pair_ops(a, b);
  CHECK(p.pairs == 3);
  CHECK(p.pred_to_meas == std::vector<int>{2, 0, 1});  // 2nd gemm ↔ 2nd gemm
  CHECK(p.meas_to_pred == std::vector<int>{1, 2, 0, -1});
}

TEST_CASE("pair_ops does not pair ops of different ranks, kinds or slices", "[pairing]") {
  Trace a, b;
  TraceEvent e;
  e.kind = ir::OpKind::F;
  e.mb = 1;
  e.dur_ns = 5;
  a.events = {e};
  auto other_rank = e; other_rank.rank = 1;
  auto other_kind = e; other_kind.kind = ir::OpKind::B;
  auto other_slice = e; other_slice.slice = 1;
  b.events = {other_rank, other_kind, other_slice};
  CHECK(pair_ops(a, b).pairs == 0);
  b.events.push_back(e);
  const auto p = pair_ops(a, b);
  CHECK(p.pairs == 1);
  CHECK(p.pred_to_meas[0] == 3);
}

TEST_CASE("compare: a measured run of d replicas against the prediction of one - each replica compared",
          "[traces][compare]") {
  // The engines predict the p pipeline ranks of one replica; the executors measure all p·d
  // (world rank k·p + r). Replica 1 here runs 10 ns behind on rank 1.
  Trace measured = predicted();
  measured.origin = "cpu";
  measured.ranks = 4;
  measured.metadata["data"] = "2";
  const std::size_t n = measured.events.size();
  for (std::size_t i = 0; i < n; ++i) {
    TraceEvent e = measured.events[i];
    e.rank += 2;
    if (e.rank == 3) e.start_ns += 10;
    measured.events.push_back(e);
  }
  const Comparison c = compare(predicted(), measured);
  CHECK(c.matched == 12);
  CHECK(c.only_predicted == 0);
  CHECK(c.only_measured == 0);
  REQUIRE(c.ranks.size() == 4);
  CHECK(c.ranks[2].bubble_error_pp == Approx(c.ranks[0].bubble_error_pp));
  CHECK(c.predicted_iteration_ns == 50);
  CHECK(c.measured_iteration_ns == 55);  // replica 1's rank 1 ends at 55
  REQUIRE(c.largest_drift.size() >= 1);
  CHECK(c.largest_drift[0].rank == 3);
  CHECK(c.largest_drift[0].drift_ns() == 10);
  REQUIRE(c.warnings.size() == 1);
  CHECK_THAT(c.warnings[0], Catch::Contains("each of the 2 measured data-parallel replicas"));
  // A run whose metadata names another replica count is not of this plan.
  measured.metadata["data"] = "4";
  REQUIRE_THROWS_WITH(compare(predicted(), measured), Catch::Contains("4 data-parallel replicas by its metadata"));
}
