// test_evaluator.cpp — the analytic evaluator: closed forms exact in integer ns
// for every generator (compute-only and lowered), p2p latency with the zero-bubble
// paper's event logic, link placement, collectives, and the trace it emits. Also:
// every generator's plan lowers and validates over a grid of p, m, v, S, d.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tdpipe/ir/lowering.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/ir/validate.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/report/shared_device.hpp"
#include "tdpipe/planner/generators.hpp"
#include "tdpipe/traces/handoff.hpp"
#include "tdpipe/traces/metrics.hpp"
#include "tdpipe/traces/profile.hpp"
#include "tdpipe/traces/sharing.hpp"

using namespace tdpipe;
using ir::Op;
using ir::OpKind;
using ir::Plan;

namespace {

struct Times {
  std::int64_t f, b, w;  ///< ns per op (per chunk, per slice)
};

/// A generator's plan with synthetic costs (ns) and p2p latency, optionally lowered.
Plan synthetic_plan(const std::string& name, int p, int m, int v, int S, Times t, std::int64_t latency_ns,
                    bool lowered) {
  planner::ScheduleParams sp;
  sp.stages = p;
  sp.microbatches = m;
  sp.chunks = v;
  sp.slices = S;
  Plan plan = planner::make_schedule(name, sp);
  ir::Synthetic syn;
  syn.stages = p;
  syn.microbatches = m;
  syn.chunks = plan.chunks;
  syn.f_seconds = static_cast<double>(t.f) * 1e-9;
  syn.b_seconds = static_cast<double>(t.b) * 1e-9;
  syn.w_seconds = static_cast<double>(t.w) * 1e-9;
  syn.p2p_latency_seconds = static_cast<double>(latency_ns) * 1e-9;
  plan.scenario.name = "synthetic-test";
  plan.scenario.synthetic = syn;
  for (auto& ops : plan.ranks)
    for (Op& op : ops) {
      if (op.kind == OpKind::F) op.est_seconds = syn.f_seconds;
      if (op.kind == OpKind::B) op.est_seconds = syn.b_seconds;
      if (op.kind == OpKind::W) op.est_seconds = syn.w_seconds;
      if (op.kind == OpKind::BW) op.est_seconds = syn.b_seconds + syn.w_seconds;
    }
  return lowered ? ir::lower(plan, ir::LoweringOptions{}) : plan;
}

/// Idle ns per rank: iteration − the rank's busy compute time (via traces::compute_metrics).
std::vector<std::int64_t> idle(const traces::Trace& trace) {
  const traces::Metrics m = traces::compute_metrics(trace);
  std::vector<std::int64_t> out;
  for (const auto& r : m.ranks) out.push_back(m.iteration_ns - r.compute_ns);
  return out;
}

/// End time of each compute op, keyed by rank and text form.
std::map<std::string, std::int64_t> compute_ends(const traces::Trace& trace) {
  std::map<std::string, std::int64_t> out;
  for (const auto& e : trace.events)
    if (e.kind && ir::is_compute(*e.kind) && *e.kind != OpKind::OPT)
      out[std::to_string(e.rank) + ":" + e.name] = e.end_ns();
  return out;
}

ir::Scenario tiny_scenario() {
  return ir::load_scenario(std::string(TDPIPE_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml");
}

/// A profile of tiny-gpt-cpu (p = 2) with uniform measured times for every stage:
/// F = 1 ms, B = 1.5 ms, W = 0.5 ms, OPT 0.25 ms; no link figures.
traces::Profile uniform_tiny_profile(const ir::Scenario& sc) {
  traces::Profile prof;
  prof.scenario = sc.name;
  prof.stages = 2;
  prof.ops = {{OpKind::F, -1, -1, 2, 1e-3, 5},
              {OpKind::B, -1, -1, 2, 1.5e-3, 5},
              {OpKind::W, -1, -1, 2, 0.5e-3, 5},
              {OpKind::OPT, -1, -1, 2, 0.25e-3, 5}};
  return prof;
}

}  // namespace

TEST_CASE("evaluator: GPipe and 1F1B idle (p−1)(F+B+W) per rank, exactly", "[evaluator]") {
  for (const Times t : {Times{18522, 18086, 9337}, Times{3, 2, 1}, Times{10, 25, 40}}) {
    for (int p : {2, 3, 4, 8}) {
      for (int m : {1, 3, 8, 16}) {
        for (const char* name : {"gpipe", "1f1b"}) {
          for (bool lowered : {false, true}) {
            CAPTURE(name, p, m, lowered, t.f, t.b, t.w);
            const auto trace = planner::evaluate(synthetic_plan(name, p, m, 1, 1, t, 0, lowered));
            REQUIRE(idle(trace) == std::vector<std::int64_t>(p, (p - 1) * (t.f + t.b + t.w)));
          }
        }
      }
    }
  }
}

TEST_CASE("evaluator: interleaved divides the bubble by v", "[evaluator]") {
  // Per-chunk times: a whole stage costs v·(F+B+W), so (p−1)·v(F+B+W)/v = (p−1)(F+B+W).
  for (const Times t : {Times{2, 3, 1}, Times{5, 4, 4}}) {
    for (int p : {2, 4}) {
      for (int v : {2, 3}) {
        for (int m : {p, 2 * p, 4 * p}) {
          for (bool lowered : {false, true}) {
            CAPTURE(p, v, m, lowered);
            const auto trace = planner::evaluate(synthetic_plan("interleaved", p, m, v, 1, t, 0, lowered));
            const std::int64_t stage = v * (t.f + t.b + t.w);
            REQUIRE(idle(trace) == std::vector<std::int64_t>(p, (p - 1) * stage / v));
          }
        }
      }
    }
  }
}

TEST_CASE("evaluator: ZB-H1 idles (p−1)(F+B−W) when W ≤ F", "[evaluator]") {
  for (const Times t : {Times{3, 2, 1}, Times{2, 2, 2}, Times{4, 3, 2}, Times{18522, 18086, 9337}}) {
    for (int p : {2, 4, 6}) {
      for (int m : {2 * p, 3 * p + 1}) {
        for (bool lowered : {false, true}) {
          CAPTURE(p, m, lowered, t.f, t.b, t.w);
          const auto trace = planner::evaluate(synthetic_plan("zb-h1", p, m, 1, 1, t, 0, lowered));
          REQUIRE(idle(trace) == std::vector<std::int64_t>(p, (p - 1) * (t.f + t.b - t.w)));
        }
      }
    }
  }
}

TEST_CASE("evaluator: ZB-V with F = B = W idles only the start offset - tdpipe divides by S",
          "[evaluator]") {
  for (bool lowered : {false, true}) {
    CAPTURE(lowered);
    const auto zbv = planner::evaluate(synthetic_plan("zb-v", 4, 8, 2, 1, Times{7, 7, 7}, 0, lowered));
    REQUIRE(idle(zbv) == std::vector<std::int64_t>(4, 3 * 7));
    for (int S : {1, 2, 4}) {
      const auto td = planner::evaluate(synthetic_plan("tdpipe", 4, 8, 1, S, Times{5, 5, 5}, 0, lowered));
      REQUIRE(idle(td) == std::vector<std::int64_t>(4, 3 * 15));
    }
  }
}

TEST_CASE("evaluator: p2p latency follows the zero-bubble paper's event logic", "[evaluator]") {
  SECTION("hand-computed 1F1B p=2 m=3, F=10 B=20 W=5, T_comm=3") {
    // Compute-only: start = max(previous op ends, each dependency ends + T_comm if it
    // crosses ranks). Rank 1: F0 13-23, BW0 23-48, F1 48-58, BW1 58-83, F2 89-99, BW2 99-124;
    // rank 0 ends with BW2 127-152.
    const auto a = planner::evaluate(synthetic_plan("1f1b", 2, 3, 1, 1, Times{10, 20, 5}, 3, false));
    const auto ea = compute_ends(a);
    CHECK(ea.at("1:F0") == 23);
    CHECK(ea.at("1:F1") == 58);
    CHECK(ea.at("1:F2") == 99);
    CHECK(ea.at("0:BW0") == 76);
    CHECK(ea.at("0:BW2") == 152);
    // Lowered with the scenario's latency in its reference timeline: every RECV is
    // posted by the time its SEND is, so here the blocking plan meets that timeline.
    const auto b = planner::evaluate(synthetic_plan("1f1b", 2, 3, 1, 1, Times{10, 20, 5}, 3, true));
    CHECK(compute_ends(b) == ea);
    CHECK(b.events.size() > a.events.size());
  }
  SECTION("every schedule: lowered ends equal compute-only ends without latency, never earlier with it") {
    struct Case {
      const char* name;
      int p, m, v, S;
    };
    for (const Case c : {Case{"gpipe", 4, 8, 1, 1}, Case{"1f1b", 4, 8, 1, 1}, Case{"interleaved", 4, 8, 2, 1},
                         Case{"zb-h1", 4, 8, 1, 1}, Case{"zb-h2", 4, 8, 1, 1}, Case{"zb-v", 4, 8, 2, 1},
                         Case{"tdpipe", 4, 8, 1, 3}, Case{"1f1b", 3, 2, 1, 1}}) {
      for (std::int64_t lat : {0, 1, 4}) {
        CAPTURE(c.name, lat);
        const Times t{6, 5, 3};
        const auto a = compute_ends(planner::evaluate(synthetic_plan(c.name, c.p, c.m, c.v, c.S, t, lat, false)));
        const auto b = compute_ends(planner::evaluate(synthetic_plan(c.name, c.p, c.m, c.v, c.S, t, lat, true)));
        REQUIRE(a.size() == b.size());
        for (const auto& [op, end] : a) {
          CAPTURE(op);
          if (lat == 0) REQUIRE(b.at(op) == end);
          else REQUIRE(b.at(op) >= end);
        }
      }
    }
  }
}

TEST_CASE("evaluator: links follow the placement - collectives are rings", "[evaluator]") {
  Plan plan = ir::plan_from_text("rank0: F0 BW0\nrank1: F0 BW0\nrank2: F0 BW0\nrank3: F0 BW0\n");
  ir::Scenario& sc = plan.scenario;
  ir::GpuSpec gpu;
  gpu.name = "a100-80g";
  gpu.nvlink_bytes_per_second = 300e9;
  sc.cluster.groups = {{gpu, 4}};
  sc.cluster.gpus_per_node = 8;
  sc.cluster.ib_bytes_per_second_per_nic = 25e9;
  sc.cluster.nvlink_latency_seconds = 2e-6;
  sc.cluster.ib_latency_seconds = 5e-6;
  sc.parallel.tensor = 4;
  sc.parallel.pipeline = 4;
  // TP groups of 4: ranks 0, 1 on node 0, ranks 2, 3 on node 1.
  CHECK(planner::p2p_seconds(plan, 0, 1, 3'000'000) == Approx(2e-6 + 3e6 / 300e9));
  CHECK(planner::p2p_seconds(plan, 1, 2, 3'000'000) == Approx(5e-6 + 3e6 / 25e9));
  CHECK(planner::p2p_seconds(plan, 2, 3, 0) == Approx(2e-6));
  // DP replica d of rank r starts at GPU (d·4 + r)·4: replicas sit on other nodes → IB.
  plan.data = 2;
  CHECK(planner::allreduce_seconds(plan, 0, 1'000'000) == Approx(2.0 * 1 / 2 * 1e6 / 25e9 + 2 * 5e-6));
  // t = 1, p = 2, d = 4: rank 0's replicas are GPUs 0, 2, 4, 6 — one node → NVLink.
  sc.parallel.tensor = 1;
  plan.ranks.resize(2);
  plan.data = 4;
  CHECK(planner::allreduce_seconds(plan, 0, 1'000'000) == Approx(2.0 * 3 / 4 * 1e6 / 300e9 + 6 * 2e-6));
  plan.data = 1;
  CHECK(planner::allreduce_seconds(plan, 0, 1'000'000) == 0);

  SECTION("durations of a lowered plan") {
    plan.data = 2;
    sc.cluster.nvlink_bytes_per_second = 100e9;  // overrides the GPU's
    plan.ranks = ir::plan_from_text("rank0: F0 BW0\nrank1: F0 BW0\n").ranks;
    for (auto& ops : plan.ranks)
      for (Op& op : ops) op.est_seconds = op.kind == OpKind::F ? 1e-6 : 2e-6;
    ir::LoweringOptions opt;
    opt.p2p_bytes = [](const Op&) -> std::int64_t { return 400'000; };
    opt.grad_bytes = [](int, int) -> std::int64_t { return 1'000'000; };
    const Plan low = ir::lower(plan, opt);
    const ir::DurationFn d = planner::analytic_durations(low);
    for (int r = 0; r < 2; ++r)
      for (const Op& op : low.ranks[r]) {
        CAPTURE(ir::op_to_text(op));
        if (op.kind == OpKind::SEND) CHECK(d(op, r) == 2000 + 4000);     // 2 µs + 400 kB / 100 GB/s
        if (op.kind == OpKind::F) CHECK(d(op, r) == 1000);
        if (op.kind == OpKind::BW) CHECK(d(op, r) == 2000);
        // Replicas of t=1, p=2, d=2 share node 0: 2·½·1 MB / 100 GB/s + 2·2 µs.
        if (op.kind == OpKind::ALLREDUCE) CHECK(d(op, r) == 10000 + 4000);
      }
    const traces::Trace trace = planner::evaluate(low);
    CHECK(trace.origin == "analytic");
    CHECK(trace.ranks == 2);
    std::size_t ops = 0;
    for (const auto& r : low.ranks) ops += r.size();
    REQUIRE(trace.events.size() == ops);
    // rank 0: F0 0-1000; SEND(F0>r1) posted at 1000 (rank 1's RECV at 0) → ends 7000.
    const auto& send = trace.events[1];
    CHECK(send.name == "SEND(F0>r1)");
    CHECK(send.kind == OpKind::SEND);
    CHECK(send.stream == static_cast<int>(ir::Stream::P2P));
    CHECK(send.peer == 1);
    CHECK(send.bytes == 400'000);
    CHECK(send.start_ns == 1000);
    CHECK(send.dur_ns == 6000);
    // rank 1: F0 7000-8000, BW0 8000-10000, SEND(B0>r0) 10000-16000; rank 0 BW0 16000-18000,
    // then ALLREDUCE 18000-32000 on the dp stream and OPT after it.
    const traces::TraceEvent& last = trace.events[low.ranks[0].size() - 1];
    CHECK(last.kind == OpKind::OPT);
    CHECK(last.start_ns == 32000);
  }
}

TEST_CASE("every schedule lowers and validates over a grid of p, m, v, S, d", "[evaluator][grid]") {
  for (const std::string& name : planner::schedule_names()) {
    for (int p : {1, 2, 3, 4, 6}) {
      for (int m : {1, 2, 4, 7, 12}) {
        for (int v : {1, 2, 3}) {
          if (name == "interleaved" && m % p != 0) continue;
          if (name != "interleaved" && v > 1) continue;
          for (int S : {1, 3}) {
            if (name != "tdpipe" && S > 1) continue;
            for (int d : {1, 2}) {
              CAPTURE(name, p, m, v, S, d);
              Plan plan = synthetic_plan(name, p, m, v, S, Times{4, 3, 2}, 1, false);
              plan.data = d;
              const ir::ValidationReport plain = ir::validate(plan);
              ir::LoweringOptions opt;
              opt.p2p_bytes = [](const Op& op) -> std::int64_t { return 100 + op.mb; };
              opt.grad_bytes = [](int, int) -> std::int64_t { return 90; };
              opt.bucket_bytes = 40;
              const Plan low = ir::lower(plan, opt);
              const ir::ValidationReport rep = ir::validate(low);
              REQUIRE(rep.ranks.size() == plain.ranks.size());
              for (std::size_t r = 0; r < rep.ranks.size(); ++r)
                REQUIRE(rep.ranks[r].peak_inflight == plain.ranks[r].peak_inflight);
              std::size_t allreduces = 0;
              for (const auto& ops : low.ranks)
                for (const Op& op : ops) allreduces += op.kind == OpKind::ALLREDUCE;
              REQUIRE(allreduces == (d > 1 ? static_cast<std::size_t>(p * low.chunks * 3) : 0u));
              REQUIRE_NOTHROW(planner::evaluate(low));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("evaluator: a calibration profile's op times and link drive the prediction", "[evaluator][profile]") {
  // tiny-gpt-cpu: p = 2, m = 4. Uniform measured times F = 1 ms, B = 1.5 ms, W = 0.5 ms,
  // OPT 0.25 ms: 1F1B idles (p−1)(F+B+W) per rank without latency; the profile's link
  // latency λ delays the iteration by one λ per rank-crossing hop on the critical path:
  // at least the 2(p−1) of the fill and drain, at most 2(m+p−1).
  const ir::Scenario sc = tiny_scenario();
  traces::Profile prof = uniform_tiny_profile(sc);
  for (const double latency : {1e-12, 100e-6}) {
    CAPTURE(latency);
    prof.p2p = {latency, 1e18};
    planner::BuiltPlan built = planner::build_plan(sc, "1f1b", 1);
    const traces::ProfileApplied applied = traces::apply_profile(prof, built.lowered);
    CHECK(applied.ops_kept == 0);
    CHECK(applied.ops_from_profile == 2 * (2 * 4 + 1));  // F, BW per micro-batch + OPT, per rank
    CHECK(applied.links);
    const auto trace = planner::evaluate(built.lowered);
    const std::int64_t lambda = std::llround(latency * 1e9);
    const traces::Metrics m = traces::compute_metrics(trace);
    const std::int64_t base = (4 + 1) * 3'000'000 + 250'000;
    if (lambda == 0) {
      CHECK(m.iteration_ns == base);
      CHECK(idle(trace) == std::vector<std::int64_t>(2, 3'000'000));
    } else {
      const std::int64_t extra = m.iteration_ns - base;
      CHECK(extra % lambda == 0);
      CHECK(extra >= 2 * lambda);
      CHECK(extra <= 2 * (4 + 1) * lambda);
    }
  }
  SECTION("ops only keeps the scenario's links") {
    prof.p2p = {1.0, 1.0};  // absurd: would dominate if applied
    planner::BuiltPlan built = planner::build_plan(sc, "1f1b", 1);
    const double before = built.lowered.scenario.cluster.nvlink_latency_seconds;
    CHECK_FALSE(traces::apply_profile(prof, built.lowered, /*ops_only=*/true).links);
    CHECK(built.lowered.scenario.cluster.nvlink_latency_seconds == before);
    CHECK(traces::compute_metrics(planner::evaluate(built.lowered)).iteration_ns < 20'000'000);
  }
}

TEST_CASE("the hand-off latency fitted from a trace is the one that produced it", "[evaluator][profile][handoff]") {
  // The fit inverts the engines' rule (consumer starts at producer end + λ + bytes/B):
  // fed the analytic engine's own trace of a plan whose links have latency λ, it
  // returns λ for every schedule, however many hand-offs are clean.
  const ir::Scenario sc = tiny_scenario();
  traces::Profile links;
  links.scenario = sc.name;
  links.p2p = {37e-6, 2e9};
  for (const auto& [schedule, slices] : std::vector<std::pair<std::string, int>>{
           {"gpipe", 1}, {"1f1b", 1}, {"interleaved", 1}, {"zb-h1", 1}, {"zb-v", 1}, {"tdpipe", 2}}) {
    CAPTURE(schedule, slices);
    planner::BuiltPlan built = planner::build_plan(sc, schedule, slices);
    traces::apply_profile(links, built.lowered);
    const traces::Trace trace = planner::evaluate(built.lowered);
    const auto fit = traces::fit_handoff_latency(built.lowered, {trace, trace}, 2e9);
    REQUIRE(fit);
    CHECK(fit->samples >= 3);
    CHECK(fit->latency_seconds == Approx(37e-6).margin(2e-9));  // ns rounding of each op
  }
  SECTION("calibration replaces the micro-benchmark's latency and keeps it in the metadata") {
    planner::BuiltPlan built = planner::build_plan(sc, "1f1b", 1);
    traces::apply_profile(links, built.lowered);
    const traces::Trace trace = planner::evaluate(built.lowered);
    traces::Profile prof;
    prof.p2p = {5e-6, 2e9};
    traces::fit_profile_p2p_latency(prof, built.lowered, {trace});
    CHECK(prof.p2p.latency_seconds == Approx(37e-6).margin(2e-9));
    CHECK(prof.metadata.at("p2p_latency_microbenchmark_seconds") == "5e-06");
    CHECK(std::stoi(prof.metadata.at("p2p_latency_samples")) >= 3);
  }
  SECTION("a single stage has no hand-offs: the profile stays as it is") {
    ir::Scenario one = sc;
    one.parallel.pipeline = 1;
    one.cluster.gpus_per_node = 1;
    planner::BuiltPlan built = planner::build_plan(one, "1f1b", 1);
    traces::Profile prof;
    prof.p2p = {5e-6, 2e9};
    traces::fit_profile_p2p_latency(prof, built.lowered, {planner::evaluate(built.lowered)});
    CHECK(prof.p2p.latency_seconds == 5e-6);
    CHECK(prof.metadata.empty());
  }
}

TEST_CASE("ranks sharing one device: processor sharing over the engine", "[evaluator][profile][sharing]") {
  // tiny-gpt-cpu, p = 2, m = 4, uniform work F = 1 ms, B = 1.5 ms, W = 0.5 ms, OPT 0.25 ms,
  // links ~0. Capacity 2 ≥ ranks: nothing is shared, the plain prediction. Capacity 1:
  // the device is never idle (some op is always ready), so the iteration is the sum of
  // all work, 2 · (4 · (1 + 2) + 0.25) = 24.5 ms; and each op, deduced back from the
  // trace as its calibration would, gets its work back.
  const ir::Scenario sc = tiny_scenario();
  traces::Profile prof = uniform_tiny_profile(sc);
  prof.p2p = {1e-12, 1e18};
  const report::Engine analytic = [](const ir::Plan& p) { return planner::evaluate(p); };
  for (const char* schedule : {"gpipe", "1f1b", "zb-h1"}) {
    CAPTURE(schedule);
    planner::BuiltPlan built = planner::build_plan(sc, schedule, 1);
    prof.platform.shared_capacity = 0;
    traces::apply_profile(prof, built.lowered);
    const std::int64_t plain = traces::compute_metrics(planner::evaluate(built.lowered)).iteration_ns;

    prof.platform.shared_capacity = 2;
    traces::apply_profile(prof, built.lowered);
    CHECK(built.lowered.scenario.cluster.shared_capacity == 2);
    CHECK(traces::compute_metrics(report::predict_shared(built.lowered, analytic)).iteration_ns == plain);

    prof.platform.shared_capacity = 1;
    traces::apply_profile(prof, built.lowered);
    const traces::Trace shared = report::predict_shared(built.lowered, analytic);
    CHECK(shared.metadata.at("shared_device_converged") == "true");
    const double iteration = double(traces::compute_metrics(shared).iteration_ns) * 1e-9;
    CHECK(iteration == Approx(24.5e-3).epsilon(0.003));
    CHECK(iteration > double(plain) * 1e-9);
    const auto rate = traces::shared_rates(shared, 1.0);
    const auto index = traces::plan_event_index(built.lowered, shared);
    for (std::size_t r = 0; r < built.lowered.ranks.size(); ++r)
      for (std::size_t i = 0; i < built.lowered.ranks[r].size(); ++i) {
        const Op& op = built.lowered.ranks[r][i];
        if (!ir::is_compute(op.kind)) continue;
        REQUIRE(index[r][i] >= 0);
        const auto& e = shared.events[static_cast<std::size_t>(index[r][i])];
        CAPTURE(r, e.name);
        CHECK(double(e.dur_ns) * 1e-9 * rate[static_cast<std::size_t>(index[r][i])] ==
              Approx(op.est_seconds).epsilon(0.003));
      }
  }
}

TEST_CASE("overlap_p2p false: each rank's compute waits for its transfers, and pays for them", "[evaluator][p2p]") {
  ir::Scenario sc = tiny_scenario();
  for (const char* schedule : {"1f1b", "interleaved", "zb-v"}) {
    CAPTURE(schedule);
    sc.parallel.overlap_p2p = true;
    const planner::BuiltPlan overlapped = planner::build_plan(sc, schedule, 1);
    sc.parallel.overlap_p2p = false;
    const planner::BuiltPlan blocking = planner::build_plan(sc, schedule, 1);
    const auto a = traces::compute_metrics(planner::evaluate(overlapped.lowered));
    const auto b = traces::compute_metrics(planner::evaluate(blocking.lowered));
    // The same ops, more dependencies: slower (a SEND completes when its peer has posted
    // the RECV, so the sender's compute now waits for the receiver too) …
    CHECK(b.iteration_ns > a.iteration_ns);
    // … because every compute op starts after each send posted before it has ended.
    const traces::Trace t = planner::evaluate(blocking.lowered);
    const auto index = traces::plan_event_index(blocking.lowered, t);
    int waited = 0;
    for (int r = 0; r < blocking.lowered.num_ranks(); ++r) {
      const auto& ops = blocking.lowered.ranks[static_cast<std::size_t>(r)];
      std::vector<int> posted;
      for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
        if (ops[static_cast<std::size_t>(i)].kind == OpKind::SEND) {
          posted.push_back(i);
          continue;
        }
        if (!ir::is_compute(ops[static_cast<std::size_t>(i)].kind)) continue;
        const auto& e = t.events[static_cast<std::size_t>(index[r][i])];
        for (int p : posted) {
          CHECK(e.start_ns >= t.events[static_cast<std::size_t>(index[r][p])].end_ns());
          ++waited;
        }
        posted.clear();
      }
    }
    CHECK(waited > 0);
    // Compute itself is unchanged: the bubble grows.
    CHECK(b.ranks[0].compute_ns == a.ranks[0].compute_ns);
  }
}
