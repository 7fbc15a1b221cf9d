// test_sim_closed_forms.cpp — synthetic times: the SimGrid engine reproduces the
// closed-form bubbles exactly and, with a fixed p2p latency, the analytic replay op by op.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "sim_test_util.hpp"
#include "tdpipe/ir/lowering.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/replay.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/traces/metrics.hpp"
#include "tdpipe/sim/simulate.hpp"
#include "tdpipe/traces/trace.hpp"

using namespace tdpipe;

namespace {

ir::Scenario synthetic(int p, int m, int v, double f_us, double b_us, double w_us, double latency_us) {
  ir::Scenario sc;
  sc.name = "synthetic-test";
  ir::Synthetic s;
  s.stages = p;
  s.microbatches = m;
  s.chunks = v;
  s.f_seconds = f_us * 1e-6;
  s.b_seconds = b_us * 1e-6;
  s.w_seconds = w_us * 1e-6;
  s.p2p_latency_seconds = latency_us * 1e-6;
  sc.synthetic = s;
  return sc;
}

std::int64_t rank_compute_ns(const ir::Plan& plan, int r) {
  std::int64_t total = 0;
  for (const auto& op : plan.ranks[r])
    if (ir::is_compute(op.kind)) total += std::llround(op.est_seconds * 1e9);
  return total;
}

}  // namespace

TEST_CASE("gpipe and 1f1b with zero communication: iteration (m+p-1)(F+B+W), idle (p-1)(F+B+W) per rank",
          "[sim][closed-form]") {
  const int p = 4, m = 8;
  for (const char* schedule : {"gpipe", "1f1b"}) {
    SECTION(schedule) {
      const auto built = planner::build_plan(synthetic(p, m, 1, 1000, 2000, 1500, 0), schedule);
      const auto res = sim::simulate(built.lowered);
      const std::int64_t per_mb = rank_compute_ns(built.lowered, 0) / m;  // F + B + W
      REQUIRE(per_mb == 4'500'000);
      CHECK(res.metrics.iteration_ns == (m + p - 1) * per_mb);
      REQUIRE(res.metrics.ranks.size() == static_cast<std::size_t>(p));
      for (int r = 0; r < p; ++r) {
        CHECK(res.metrics.ranks[r].compute_ns == m * per_mb);
        // Idle = iteration − compute; waiting in a posted RECV counts as (exposed) comm.
        CHECK(res.metrics.iteration_ns - res.metrics.ranks[r].compute_ns == (p - 1) * per_mb);
      }
      CHECK(res.metrics.bubble_fraction == Approx(double(p - 1) / (m + p - 1)).epsilon(1e-12));
      CHECK(res.trace.origin == "simgrid");
      // Free communication: RECVs wait for their peer, but no data takes time to move.
      for (auto t : res.transfer_ns) CHECK(t == 0);
    }
  }
}

TEST_CASE("interleaved with zero communication: bubble (p-1)(F+B+W)/v", "[sim][closed-form]") {
  const int p = 4, m = 8, v = 2;
  const auto built = planner::build_plan(synthetic(p, m, v, 1000, 1000, 1000, 0), "interleaved");
  const auto res = sim::simulate(built.lowered);
  const std::int64_t per_mb = rank_compute_ns(built.lowered, 0) / m;  // v chunks of F+B+W
  CHECK(res.metrics.iteration_ns == m * per_mb + (p - 1) * per_mb / v);
}

TEST_CASE("with a fixed latency the SimGrid engine equals the analytic replay op by op", "[sim][analytic]") {
  for (const char* schedule : {"1f1b", "interleaved", "zb-h1", "zb-v"}) {
    SECTION(schedule) {
      const auto built = planner::build_plan(synthetic(4, 8, 2, 1000, 1100, 900, 37), schedule);
      const ir::Plan& plan = built.lowered;
      const auto ref = ir::replay(plan, [&](const ir::Op& op, int) -> std::int64_t {
        if (ir::is_p2p(op.kind)) return 37'000;
        if (ir::is_collective(op.kind)) return 0;
        return std::llround(op.est_seconds * 1e9);
      });
      const auto res = sim::simulate(plan);
      CHECK(res.metrics.iteration_ns == ref.makespan_ns);
      // Ops of one (rank, stream) run in plan order, and the trace lists each stream's
      // events by start time: the k-th event of a stream is the stream's k-th op.
      std::size_t compared = 0;
      for (int r = 0; r < plan.num_ranks(); ++r)
        for (int st = 0; st < 3; ++st) {
          std::vector<const traces::TraceEvent*> evs;
          for (const auto& e : res.trace.events)
            if (e.rank == r && e.stream == st) evs.push_back(&e);
          std::size_t k = 0;
          for (std::size_t i = 0; i < plan.ranks[r].size(); ++i) {
            if (static_cast<int>(plan.ranks[r][i].stream) != st) continue;
            REQUIRE(k < evs.size());
            INFO("rank " << r << " op " << i << " " << evs[k]->name);
            CHECK(evs[k]->kind == plan.ranks[r][i].kind);
            CHECK(evs[k]->start_ns == ref.timing[r][i].start_ns);
            CHECK(evs[k]->end_ns() == ref.timing[r][i].end_ns);
            ++k;
            ++compared;
          }
        }
      CHECK(compared == res.trace.events.size());
    }
  }
}

TEST_CASE("SimGrid and the analytic engine (planner::evaluate) agree", "[sim][analytic]") {
  SECTION("synthetic, fixed latency: exactly") {
    const auto built = planner::build_plan(synthetic(4, 8, 1, 1000, 1100, 900, 37), "zb-h1");
    const auto a = traces::compute_metrics(planner::evaluate(built.lowered));
    const auto s = sim::simulate(built.lowered);
    CHECK(s.metrics.iteration_ns == a.iteration_ns);
    for (int r = 0; r < 4; ++r) CHECK(s.metrics.ranks[r].compute_ns == a.ranks[r].compute_ns);
  }
  SECTION("GPT-3 175B on 8 DGX A100: p2p never contends, so within 0.5 %") {
    const auto sc = ir::load_scenario(std::string(TDPIPE_SOURCE_DIR) + "/scenarios/gpt3-175b-a100-8x8.yaml");
    const auto built = planner::build_plan(sc, "1f1b");
    const auto a = traces::compute_metrics(planner::evaluate(built.lowered));
    const auto s = sim::simulate(built.lowered);
    CHECK(std::abs(double(s.metrics.iteration_ns) / double(a.iteration_ns) - 1) < 0.005);
  }
  SECTION("an uneven partition and TeraPipe's cuts: each rank computes exactly its plan's work") {
    auto sc = ir::load_scenario(std::string(TDPIPE_SOURCE_DIR) + "/scenarios/mixed-a100-h100.yaml");
    sc.parallel.layers_per_stage = {12, 12, 28, 28};
    sc.parallel.slices_auto = true;
    sc.parallel.global_batch = 4;  // m = 4 on p = 4: the fill is worth slicing
    const auto built = planner::build_plan(sc, "tdpipe");
    REQUIRE(built.lowered.stage_layers == std::vector<int>{12, 12, 28, 28});
    REQUIRE(built.lowered.slices > 1);
    REQUIRE(built.lowered.slice_tokens.front() != built.lowered.slice_tokens.back());
    const auto s = sim::simulate(built.lowered);
    const auto a = traces::compute_metrics(planner::evaluate(built.lowered));
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r);
      CHECK(std::abs(double(s.metrics.ranks[r].compute_ns) - double(rank_compute_ns(built.lowered, r))) <=
            double(built.lowered.ranks[r].size()));  // ns rounding per op
    }
    CHECK(std::abs(double(s.metrics.iteration_ns) / double(a.iteration_ns) - 1) < 0.01);
  }
}

TEST_CASE("parameter offload: SimGrid runs gated segments and the copy stream exactly as the replay",
          "[sim][analytic][offload]") {
  // F0 BW0 OPT on one GPU, three layer blocks streamed through a window of two (the IR
  // test's hand-computed plan, in µs here): every op's start and end agree.
  ir::LoweringOptions opt;
  opt.offload_blocks = [](int, int) { return std::vector<std::int64_t>{10, 10, 10}; };
  opt.copy_seconds = [](int, std::int64_t bytes) { return static_cast<double>(bytes) * 1e-6; };
  ir::Plan plan = ir::lower(ir::plan_from_text("rank0: F0 BW0\n"), opt);
  plan.scenario = sim::testing::a100_cluster(1, 1, 1, 1);
  for (ir::Op& op : plan.ranks[0]) {
    if (op.kind == ir::OpKind::F) op.est_seconds = 30e-6;
    if (op.kind == ir::OpKind::BW) op.est_seconds = 60e-6;
    if (op.kind == ir::OpKind::OPT) op.est_seconds = 30e-6;
  }
  const auto ref = ir::replay(plan, [](const ir::Op& op, int) { return std::llround(op.est_seconds * 1e9); });
  CHECK(ref.makespan_ns == 470'000);
  const auto res = sim::simulate(plan);
  CHECK(res.metrics.iteration_ns == ref.makespan_ns);
  std::size_t compared = 0;
  for (int st = 0; st < ir::kStreamCount; ++st) {
    std::vector<const traces::TraceEvent*> evs;
    for (const auto& e : res.trace.events)
      if (e.stream == st) evs.push_back(&e);
    std::size_t k = 0;
    for (std::size_t i = 0; i < plan.ranks[0].size(); ++i) {
      if (static_cast<int>(plan.ranks[0][i].stream) != st) continue;
      REQUIRE(k < evs.size());
      INFO("op " << i << " " << evs[k]->name);
      CHECK(evs[k]->kind == plan.ranks[0][i].kind);
      CHECK(evs[k]->start_ns == ref.timing[0][i].start_ns);
      CHECK(evs[k]->end_ns() == ref.timing[0][i].end_ns);
      ++k;
      ++compared;
    }
  }
  CHECK(compared == plan.ranks[0].size());
}

TEST_CASE("parameter offload on Llama-2 70B: the engines agree, every weight crosses PCIe once per F and B",
          "[sim][analytic][offload]") {
  auto sc = ir::load_scenario(std::string(TDPIPE_SOURCE_DIR) + "/scenarios/llama2-70b-a100-4x8.yaml");
  sc.parallel.param_offload = "layers";
  sc.parallel.global_batch = 8;  // m = 8: a short step
  const auto built = planner::build_plan(sc, "1f1b");
  const ir::Plan& plan = built.lowered;
  const auto a = traces::compute_metrics(planner::evaluate(plan));
  const auto s = sim::simulate(plan);
  CHECK(std::abs(double(s.metrics.iteration_ns) / double(a.iteration_ns) - 1) < 0.005);
  for (int r = 0; r < plan.num_ranks(); ++r) {
    std::int64_t loaded = 0, offloaded = 0, state = 0;
    int readers = 0, copies = 0;
    for (const auto& op : plan.ranks[r]) {
      if (op.kind == ir::OpKind::F || op.kind == ir::OpKind::BW || op.kind == ir::OpKind::B) ++readers;
      if (op.stream == ir::Stream::Copy) ++copies;
      if (op.kind == ir::OpKind::LOAD) (op.mb >= 0 ? loaded : state) += op.bytes;
      if (op.kind == ir::OpKind::OFFLOAD) offloaded += op.bytes;
    }
    // 20 layers per rank of bf16 weights: Q and O 8192² each, K and V 8192·1024 (8 KV
    // heads of 128), SwiGLU's three 8192·28672, the column-parallel biases — all ÷ t = 8 —
    // and two replicated LayerNorms and row-parallel biases (6·8192).
    const double h = 8192, kv = 1024, ffn = 28672;
    const std::int64_t layer =
        std::llround(((2 * h * h + 2 * h * kv + 3 * h * ffn + (h + 2 * kv) + 2 * ffn) / 8 + 6 * h) * 2);
    const std::int64_t weights = 20 * layer;
    CHECK(readers == 2 * 8);
    CHECK(loaded == readers * weights);
    CHECK(state == 6 * weights);      // fp32 master + two moments, in
    CHECK(offloaded == 7 * weights);  // and out with the new bf16 weights
    std::int64_t events = 0;
    for (const auto& e : s.trace.events)
      if (e.rank == r && e.stream == static_cast<int>(ir::Stream::Copy)) ++events;
    CHECK(events == copies);
  }
}
