// Fitting the cost model's parameters to measured op groups (planner/cost_fit.hpp).
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/cost_fit.hpp"
#include "tdpipe/planner/cost_model.hpp"
#include "tdpipe/traces/profile.hpp"

using namespace tdpipe;
using ir::OpKind;

namespace {

ir::Scenario tiny() { return ir::load_scenario(TDPIPE_SOURCE_DIR "/scenarios/tiny-gpt-cpu.yaml"); }

ir::Plan lowered(const ir::Scenario& sc, const std::string& schedule, int slices = 0) {
  return planner::build_plan(sc, schedule, slices).lowered;
}

// A machine with known speeds: seconds per op, per layer, and 1 / fraction of peak per part.
traces::FittedCostModel machine() {
  traces::FittedCostModel m;
  //                          op     layer  gemm attn ew  comm emb head opt
  m.coefficients[OpKind::F] = {40e-6, 90e-6, 3.0, 5.0, 9.0, 1.0, 2.0, 2.5, 1.0};
  m.coefficients[OpKind::B] = {30e-6, 150e-6, 3.5, 4.0, 6.0, 1.0, 1.0, 3.0, 1.0};
  m.coefficients[OpKind::W] = {20e-6, 160e-6, 3.2, 1.0, 1.0, 1.0, 4.0, 1.5, 1.0};
  m.coefficients[OpKind::BW] = {45e-6, 300e-6, 3.4, 4.0, 6.0, 1.0, 4.0, 3.5, 1.0};
  m.coefficients[OpKind::OPT] = {100e-6, 0, 1, 1, 1, 1, 1, 1, 2.5};
  return m;
}

// What calibrate measures of `plan` on that machine: one ProfileOp per (kind, virtual
// stage, slice), as exec::cpu::profile_ops files them.
traces::Profile measure(const ir::Plan& plan, const traces::FittedCostModel& truth) {
  traces::Profile p;
  std::map<std::tuple<int, int, int>, bool> seen;
  for (int r = 0; r < plan.num_ranks(); ++r)
    for (const ir::Op& op : plan.ranks[static_cast<std::size_t>(r)]) {
      if (!ir::is_compute(op.kind)) continue;
      const int chunk = op.kind == OpKind::OPT ? 0 : op.chunk;
      const int vs = plan.stage_of[static_cast<std::size_t>(r)][static_cast<std::size_t>(chunk)];
      const int slice = op.kind == OpKind::OPT ? -1 : op.slice;
      if (seen[{static_cast<int>(op.kind), vs, slice}]) continue;
      seen[{static_cast<int>(op.kind), vs, slice}] = true;
      traces::ProfileOp g;
      g.kind = op.kind;
      g.virtual_stage = vs;
      g.slice = slice;
      g.seconds = planner::fitted_seconds(truth, op.kind, planner::op_terms(plan, r, op));
      g.samples = 4;
      p.ops.push_back(g);
    }
  return p;
}

traces::FittedCostModel fit_on(const std::vector<ir::Plan>& plans, const traces::FittedCostModel& truth,
                               std::vector<traces::Profile>& measured) {
  measured.clear();
  for (const auto& plan : plans) measured.push_back(measure(plan, truth));
  std::vector<planner::MeasuredRun> runs;
  for (std::size_t i = 0; i < plans.size(); ++i) runs.push_back({&plans[i], &measured[i]});
  return planner::fit_cost_model(runs).model;
}

}  // namespace

TEST_CASE("op terms: the parts of the cost model's work, per layer and per slice", "[cost_fit]") {
  const ir::Scenario sc = tiny();
  const ir::Plan one = lowered(sc, "zb-h1");     // 2 layers per stage
  const ir::Plan two = lowered(sc, "zb-v");      // 1 layer per virtual stage, V-shaped
  const ir::Plan sliced = lowered(sc, "tdpipe", 4);
  auto first = [](const ir::Plan& p, int rank, OpKind kind, int chunk = 0, int slice = 0) {
    for (const ir::Op& op : p.ranks[static_cast<std::size_t>(rank)])
      if (op.kind == kind && op.chunk == chunk && op.slice == slice) return planner::op_terms(p, rank, op);
    FAIL("no such op");
    return planner::CostTerms{};
  };
  // Rank 1 of zb-h1 holds layers 2–3 and the head; zb-v's rank 1 chunk 0 holds layer 1 only.
  const auto f2 = first(one, 1, OpKind::F), f1 = first(two, 1, OpKind::F);
  CHECK(f2[0] == 1);
  CHECK(f2[1] == 2);
  CHECK(f1[1] == 1);
  CHECK(f2[2] == Approx(2 * f1[2]).epsilon(1e-12));  // GEMM work ∝ layers
  CHECK(f2[7] > 0);                                   // the LM head is on zb-h1's rank 1
  CHECK(f1[7] == 0);                                  // … not on zb-v's middle chunk
  CHECK(first(one, 0, OpKind::F)[6] > 0);             // embedding on stage 0
  // The same parts as chunk_cost prices: a W's GEMM work = its FLOPs / peak.
  const ir::GpuSpec gpu = planner::gpu_of_rank(sc, 0);
  const auto w = first(one, 0, OpKind::W);
  const auto w_cost = planner::chunk_cost(sc, gpu, OpKind::W, 0, 2, 2, sc.model.seq, 0);
  CHECK(w[2] == Approx(w_cost.flops / gpu.peak_flops).epsilon(1e-12));
  // Slices: attention grows with the prefix at equal length (TD-Pipe's later slices).
  int prefix = 0;
  std::vector<double> per_token;
  for (int j = 0; j < 4; ++j) {
    const auto t = first(sliced, 0, OpKind::F, 0, j);
    per_token.push_back(t[3] / sliced.slice_tokens[static_cast<std::size_t>(j)]);
    prefix += sliced.slice_tokens[static_cast<std::size_t>(j)];
  }
  CHECK(prefix == sc.model.seq);
  CHECK(std::is_sorted(per_token.begin(), per_token.end()));
  CHECK(per_token.back() > per_token.front());
  // OPT: the optimizer step of the rank's parameters, nothing else.
  const auto opt = first(one, 0, OpKind::OPT);
  CHECK(opt[8] > 0);
  CHECK(opt[1] == 0);
  CHECK(opt[2] == 0);
}

TEST_CASE("a fitted model recovers a machine from probe layouts and predicts layouts it never ran",
          "[cost_fit]") {
  const ir::Scenario sc = tiny();
  const traces::FittedCostModel truth = machine();
  std::vector<ir::Plan> probes{lowered(sc, "zb-h1"), lowered(sc, "zb-v"), lowered(sc, "1f1b"),
                               lowered(sc, "interleaved"), lowered(sc, "tdpipe", 4)};
  std::vector<traces::Profile> measured;
  const traces::FittedCostModel fit = fit_on(probes, truth, measured);
  for (const auto& [kind, c] : fit.coefficients)
    for (double v : c) CHECK(v >= 0);
  // Held out: other schedules, other slice counts (other lengths and prefixes), another
  // partition. Every op is priced as the machine would run it, to rounding.
  ir::Scenario uneven = sc;
  uneven.parallel.layers_per_stage = {1, 3};
  std::vector<ir::Plan> others{lowered(sc, "gpipe"), lowered(sc, "zb-h2"), lowered(sc, "tdpipe", 2),
                               lowered(sc, "tdpipe", 3), lowered(uneven, "1f1b"), lowered(uneven, "zb-h1")};
  for (ir::Plan plan : others) {
    INFO(plan.schedule << " S=" << plan.slices << " layers " << plan.stage_layers.size());
    traces::Profile prof;
    prof.model = fit;
    const traces::ProfileApplied applied = planner::apply_profile(prof, plan);
    CHECK(applied.ops_kept == 0);
    CHECK(applied.ops_from_profile > 0);
    for (int r = 0; r < plan.num_ranks(); ++r)
      for (const ir::Op& op : plan.ranks[static_cast<std::size_t>(r)]) {
        if (!ir::is_compute(op.kind)) continue;
        const double want = planner::fitted_seconds(truth, op.kind, planner::op_terms(plan, r, op));
        CHECK(op.est_seconds == Approx(want).epsilon(1e-6));
      }
  }
}

TEST_CASE("a fitted model's fallbacks: BW from B + W, B and W at BW's speeds", "[cost_fit]") {
  const ir::Scenario sc = tiny();
  const traces::FittedCostModel truth = machine();
  std::vector<traces::Profile> measured;
  // Split B and W only: a 1f1b plan's BW is priced as its B plus its W.
  const traces::FittedCostModel split = fit_on({lowered(sc, "zb-h1"), lowered(sc, "zb-v")}, truth, measured);
  REQUIRE(split.coefficients.count(OpKind::BW) == 0);
  ir::Plan fused = lowered(sc, "1f1b");
  traces::Profile prof;
  prof.model = split;
  CHECK(planner::apply_profile(prof, fused).ops_kept == 0);
  for (int r = 0; r < fused.num_ranks(); ++r)
    for (const ir::Op& op : fused.ranks[static_cast<std::size_t>(r)])
      if (op.kind == OpKind::BW) {
        ir::Op b = op, w = op;
        b.kind = OpKind::B;
        w.kind = OpKind::W;
        CHECK(op.est_seconds == Approx(planner::fitted_seconds(truth, OpKind::B, planner::op_terms(fused, r, b)) +
                                       planner::fitted_seconds(truth, OpKind::W, planner::op_terms(fused, r, w)))
                                    .epsilon(1e-6));
      }
  // Fused BW only: a zb-h1 plan's B and W take BW's coefficients on their own parts.
  const traces::FittedCostModel fused_only = fit_on({lowered(sc, "1f1b"), lowered(sc, "tdpipe", 4)}, truth, measured);
  REQUIRE(fused_only.coefficients.count(OpKind::B) == 0);
  ir::Plan split_plan = lowered(sc, "zb-h1");
  prof.model = fused_only;
  CHECK(planner::apply_profile(prof, split_plan).ops_kept == 0);
  for (int r = 0; r < split_plan.num_ranks(); ++r)
    for (const ir::Op& op : split_plan.ranks[static_cast<std::size_t>(r)])
      if (op.kind == OpKind::B)
        CHECK(op.est_seconds ==
              Approx(planner::fitted_seconds(fused_only, OpKind::BW, planner::op_terms(split_plan, r, op))));
  // No compute op measured at all: a clear error.
  traces::Profile empty;
  const ir::Plan plan = lowered(sc, "1f1b");
  CHECK_THROWS_WITH(planner::fit_cost_model({{&plan, &empty}}), Catch::Contains("measured no compute op"));
}

TEST_CASE("a speed the data make negative is pinned at zero, the rest refitted", "[cost_fit]") {
  const ir::Scenario sc = tiny();
  // A machine whose F costs shrink with layers beyond what a positive fixed cost allows:
  // fitting it would need a negative per-layer cost; the fit keeps every coefficient ≥ 0.
  traces::FittedCostModel odd = machine();
  odd.coefficients[OpKind::F] = {2000e-6, 0, 0.5, 0.5, 0.5, 1, 0.5, 0.5, 1};
  std::vector<traces::Profile> measured;
  std::vector<ir::Plan> probes{lowered(sc, "zb-h1"), lowered(sc, "zb-v"), lowered(sc, "tdpipe", 4)};
  for (const auto& plan : probes) measured.push_back(measure(plan, odd));
  // Make the 1-layer chunks slower than the model (e.g. a cold cache): per-layer cost < 0 would fit best.
  for (auto& op : measured[1].ops)
    if (op.kind == OpKind::F) op.seconds *= 1.5;
  std::vector<planner::MeasuredRun> runs;
  for (std::size_t i = 0; i < probes.size(); ++i) runs.push_back({&probes[i], &measured[i]});
  const planner::CostFit fit = planner::fit_cost_model(runs);
  const auto& f = fit.model.coefficients.at(OpKind::F);
  for (double v : f) CHECK(v >= 0);
  CHECK(f[1] == 0);  // the per-layer cost, pinned
  CHECK(fit.points.size() == measured[0].ops.size() + measured[1].ops.size() + measured[2].ops.size());
}

TEST_CASE("a fitted model's profile: JSON round trip and errors that name the field", "[cost_fit]") {
  // (A table profile of one layout is refused for another: test_profile.cpp.)
  traces::Profile p;
  p.scenario = "tiny-gpt-cpu";
  p.model = machine();
  p.model.gpu = "cpu";
  p.p2p.latency_seconds = 35e-6;
  const traces::Profile back = traces::profile_from_json(traces::to_json(p), "p.json");
  CHECK(back == p);
  auto bad = [&](const std::string& key, const nlohmann::json& value) {
    nlohmann::json j = traces::to_json(p);
    j["model"]["F"][key] = value;
    return j;
  };
  CHECK_THROWS_WITH(traces::profile_from_json(bad("gemms", 1.0), "p.json"),
                    Catch::Contains("p.json: model.F.gemms: unknown key"));
  CHECK_THROWS_WITH(traces::profile_from_json(bad("gemm", -1.0), "p.json"), Catch::Contains("model.F.gemm"));
  nlohmann::json j = traces::to_json(p);
  j["model"]["SEND"] = nlohmann::json::object();
  CHECK_THROWS_WITH(traces::profile_from_json(j, "p.json"), Catch::Contains("model.SEND"));
  // traces::apply_profile refuses a fitted model: only the planner can compute its terms.
  ir::Plan plan = lowered(tiny(), "1f1b");
  CHECK_THROWS_WITH(traces::apply_profile(p, plan), Catch::Contains("planner::apply_profile"));
  // A synthetic scenario has no shapes to price.
  const ir::Scenario syn = ir::load_scenario(TDPIPE_SOURCE_DIR "/scenarios/synthetic-uniform-p4-m8.yaml");
  ir::Plan sp = lowered(syn, "1f1b");
  CHECK_THROWS_WITH(planner::apply_profile(p, sp), Catch::Contains("synthetic"));
}

TEST_CASE("the fit's starting point is the cost model: Σ prior × terms ≈ chunk_cost where GEMMs are large",
          "[cost_fit]") {
  // GPT-3 175B's layers on A100s: GEMMs take milliseconds, so chunk_cost's efficiency
  // curves sit at their large-size limits, which the priors are. A prior off by a kind of
  // kernel (e.g. flash attention at the GEMM efficiency: 0.79 against 0.60) shows here.
  for (const char* attention : {"flash", "standard"})
    for (const auto recompute : {ir::Recompute::None, ir::Recompute::Selective, ir::Recompute::Full})
      for (const bool sp : {false, true}) {
        ir::Scenario sc = ir::load_scenario(TDPIPE_SOURCE_DIR "/scenarios/gpt3-175b-a100-8x8.yaml");
        sc.model.attention = attention;
        sc.parallel.recompute = recompute;
        sc.parallel.sequence_parallel = sp;
        const ir::Plan plan = planner::build_plan(sc, "zb-h1").lowered;
        traces::Profile measured;  // the cost model's own times, one group per kind and stage
        for (int r = 0; r < plan.num_ranks(); ++r)
          for (const ir::Op& op : plan.ranks[static_cast<std::size_t>(r)]) {
            if (!ir::is_compute(op.kind) || (op.kind != OpKind::OPT && op.mb != 0)) continue;
            traces::ProfileOp g;
            g.kind = op.kind;
            g.virtual_stage = plan.stage_of[static_cast<std::size_t>(r)][static_cast<std::size_t>(op.chunk)];
            g.slice = op.kind == OpKind::OPT ? -1 : op.slice;
            g.seconds = op.est_seconds;
            g.samples = 1;
            measured.ops.push_back(g);
          }
        const traces::FittedCostModel fit = planner::fit_cost_model({{&plan, &measured}}).model;
        INFO(attention << ", recompute " << static_cast<int>(recompute) << ", sequence parallel " << sp);
        for (int r = 0; r < plan.num_ranks(); ++r)
          for (const ir::Op& op : plan.ranks[static_cast<std::size_t>(r)]) {
            if (!ir::is_compute(op.kind) || (op.kind != OpKind::OPT && op.mb != 0)) continue;
            const planner::CostTerms t = planner::op_terms(plan, r, op);
            const planner::CostTerms prior = planner::cost_model_coefficients(sc, op.kind);
            double at_prior = 0;
            for (int i = 0; i < traces::kCostTermCount; ++i) at_prior += prior[static_cast<std::size_t>(i)] * t[i];
            CHECK(at_prior == Approx(op.est_seconds).epsilon(0.02));
            // Fitting the cost model's own times reproduces them (TP collectives, SP,
            // recompute, ends and the optimizer included).
            CHECK(planner::fitted_seconds(fit, op.kind, t) == Approx(op.est_seconds).epsilon(1e-6));
          }
      }
}

TEST_CASE("a fitted profile: one GPU, pooled hand-off latency, what it was fitted on", "[cost_fit]") {
  const ir::Scenario sc = tiny();
  const traces::FittedCostModel truth = machine();
  std::vector<ir::Plan> plans{lowered(sc, "zb-h1"), lowered(sc, "tdpipe", 4)};
  std::vector<traces::Profile> measured{measure(plans[0], truth), measure(plans[1], truth)};
  measured[0].platform.device = "test CPU";
  measured[0].platform.shared_capacity = 2;
  measured[0].p2p = {40e-6, 1e9};
  measured[0].metadata = {{"p2p_latency_samples", "30"}, {"median_trace_iteration_seconds", "0.031"},
                          {"schedule", "zb-h1"}};
  measured[1].p2p = {100e-6, 1e9};
  measured[1].metadata = {{"p2p_latency_samples", "10"}, {"median_trace_iteration_seconds", "0.029"}};
  planner::CostFit fit;
  const traces::Profile p = planner::fitted_profile(plans, measured, &fit);
  CHECK(p.model == fit.model);
  CHECK(p.model.gpu == "cpu");
  CHECK(p.ops.empty());
  CHECK(p.stages == 0);
  CHECK(p.platform.device == "test CPU");
  CHECK(p.platform.shared_capacity == 2);
  CHECK(p.p2p.latency_seconds == Approx((30 * 40e-6 + 10 * 100e-6) / 40));  // weighted by clean hand-offs
  CHECK(p.metadata.at("p2p_latency_samples") == "40");
  CHECK(p.metadata.at("probes") == "zb-h1,tdpipe:4");
  CHECK(p.metadata.at("probe_zb-h1_median_trace_iteration_seconds") == "0.031");
  CHECK(p.metadata.at("probe_tdpipe:4_median_trace_iteration_seconds") == "0.029");
  CHECK(p.metadata.count("schedule") == 0);  // one probe's layout is not the profile's
  CHECK(p.metadata.at("fit_groups") == std::to_string(fit.points.size()));
  CHECK(std::stod(p.metadata.at("fit_max_abs_error")) < 1e-6);  // exact data, exact fit
  // Another GPU: refused, naming both.
  ir::Scenario big = ir::load_scenario(TDPIPE_SOURCE_DIR "/scenarios/gpt3-175b-a100-8x8.yaml");
  ir::Plan other = planner::build_plan(big, "1f1b").lowered;
  CHECK_THROWS_WITH(planner::apply_profile(p, other), Catch::Contains("fitted on GPU 'cpu' (test CPU)") &&
                                                          Catch::Contains("runs rank 0 on 'a100-80g'"));
  CHECK_THROWS_WITH(planner::fitted_profile({}, {}), Catch::Contains("0 probe plans but 0 measurements"));
}

TEST_CASE("a fitted model's profile refuses what it would ignore", "[cost_fit]") {
  traces::Profile p;
  p.model = machine();
  p.model.gpu = "cpu";
  nlohmann::json j = traces::to_json(p);
  CHECK(traces::profile_from_json(j, "p.json").model.gpu == "cpu");
  auto with = [&](const char* key, const nlohmann::json& v) {
    nlohmann::json k = j;
    k[key] = v;
    return k;
  };
  traces::ProfileOp op;
  traces::Profile table;
  table.ops.push_back(op);
  CHECK_THROWS_WITH(traces::profile_from_json(with("ops", traces::to_json(table)["ops"]), "p.json"),
                    Catch::Contains("p.json: ops: not allowed with \"model\""));
  CHECK_THROWS_WITH(traces::profile_from_json(with("stages", 2), "p.json"), Catch::Contains("p.json: stages: not allowed"));
  CHECK_THROWS_WITH(traces::profile_from_json(with("compute_efficiency", 0.9), "p.json"),
                    Catch::Contains("compute_efficiency: not allowed"));
  nlohmann::json only_gpu = j;
  only_gpu["model"] = {{"gpu", "cpu"}};
  CHECK_THROWS_WITH(traces::profile_from_json(only_gpu, "p.json"), Catch::Contains("expected at least one op kind"));
  nlohmann::json no_gpu = j;
  no_gpu["model"].erase("gpu");
  CHECK_THROWS_WITH(traces::profile_from_json(no_gpu, "p.json"), Catch::Contains("p.json: model.gpu: missing"));
}
