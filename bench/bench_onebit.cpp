// bench_onebit.cpp — 1-bit Adam against Adam, side by side in one run:
//  1. measured on the CPU executor (tiny-gpt-cpu, p = 2, 1f1b): the bytes the
//     data-parallel wire really carried per step, in the warm-up (Adam) and after it
//     (sign bits + scales), for d = 2 and 4, and the ratio to Adam's fp64 wire and to an
//     fp16 wire (what a GPU job all-reduces);
//  2. the tiny corpus's loss curve, Adam and 1-bit Adam, d = 2;
//  3. predicted at scale (SimGrid and analytic engines): GPT-3 175B, t = 8, p = 8,
//     d = 16 on HDR InfiniBand — DP time per rank and the iteration time.
//
//   build/<dir>/bench/bench_onebit [SOURCE_DIR] [LOSS_STEPS] [WARMUP]
#include "bench_help.hpp"
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/sim/simulate.hpp"
#include "tdpipe/traces/metrics.hpp"

using namespace tdpipe;

namespace {

ir::Scenario with_data(const ir::Scenario& base, int d, bool onebit, int warmup) {
  ir::Scenario sc = base;
  sc.parallel.data = d;
  sc.cluster.gpus_per_node = sc.parallel.pipeline * d;
  sc.parallel.global_batch = base.parallel.global_batch * d;  // m stays
  if (onebit) sc.parallel.optimizer = "onebit-adam";
  sc.parallel.onebit_warmup_steps = warmup;
  return sc;
}

exec::cpu::RunResult train(const ir::Scenario& sc, int steps, const std::string& root) {
  exec::cpu::CpuRunOptions opt;
  opt.train.steps = steps;
  opt.train.corpus_path = root + "/data/tiny_corpus.txt";
  opt.train.adam.lr = 1e-2;  // as the tests train the tiny corpus
  return exec::cpu::run_cpu(planner::build_plan(sc, "1f1b").lowered, opt);
}

// Per-rank DP time of a trace (collectives' busy time, mean over ranks) and its exposed part.
std::pair<double, double> dp_ms(const traces::Trace& t) {
  std::vector<std::vector<traces::TimeSpan>> compute(static_cast<std::size_t>(t.ranks)),
      dp(static_cast<std::size_t>(t.ranks));
  for (const auto& e : t.events) {
    if (!e.kind || e.rank < 0 || e.rank >= t.ranks) continue;
    const traces::TimeSpan span{e.start_ns, e.end_ns()};
    if (ir::is_compute(*e.kind)) compute[static_cast<std::size_t>(e.rank)].push_back(span);
    if (ir::is_collective(*e.kind)) dp[static_cast<std::size_t>(e.rank)].push_back(span);
  }
  double busy = 0, exposed = 0;
  for (int r = 0; r < t.ranks; ++r) {
    const auto u = traces::busy_union(compute[static_cast<std::size_t>(r)], dp[static_cast<std::size_t>(r)]);
    busy += static_cast<double>(u.hidden_comm_ns + u.exposed_comm_ns()) * 1e-6 / t.ranks;
    exposed += static_cast<double>(u.exposed_comm_ns()) * 1e-6 / t.ranks;
  }
  return {busy, exposed};
}

}  // namespace

int main(int argc, char** argv) {
  if (tdpipe::bench::help_requested(argc, argv)) return 0;
  const std::string root = argc > 1 ? argv[1] : TDPIPE_SOURCE_DIR;
  const int loss_steps = argc > 2 ? std::max(20, std::atoi(argv[2])) : 300;
  const int warmup = argc > 3 ? std::max(1, std::atoi(argv[3])) : loss_steps / 5;
  ir::Scenario tiny = ir::load_scenario(root + "/scenarios/tiny-gpt-cpu.yaml");
  tiny.parallel.bucket_mb = 0.1;  // several buckets per stage
  double load = 0;
  if (std::ifstream in("/proc/loadavg"); in) in >> load;
  fmt::print("bench_onebit: {} hardware threads, load average {:.2f}\n", std::thread::hardware_concurrency(), load);

  fmt::print("1. wire bytes per step, measured (tiny-gpt-cpu p=2 1f1b, warm-up 2 steps, 4 steps)\n");
  for (int d : {2, 4}) {
    const auto adam = train(with_data(tiny, d, false, 2), 4, root);
    const auto one = train(with_data(tiny, d, true, 2), 4, root);
    const double plain = static_cast<double>(adam.dp_wire_bytes.back());
    const double warm = static_cast<double>(one.dp_wire_bytes.front());
    const double packed = static_cast<double>(one.dp_wire_bytes.back());
    fmt::print("  d={}  Adam {:9.0f} B   1-bit warm-up {:9.0f} B   1-bit after {:7.0f} B   = 1/{:.1f} of Adam's fp64 "
               "wire, 1/{:.1f} of an fp16 wire   replicas differ by {:.1e}\n",
               d, plain, warm, packed, plain / packed, plain / 4 / packed, one.replica_divergence);
  }

  fmt::print("2. loss, tiny corpus, p=2 d=2, one micro-batch of 2 sequences per replica, {} steps, 1-bit Adam's "
             "warm-up {} steps (lr 1e-2)\n",
             loss_steps, warmup);
  ir::Scenario small = tiny;
  small.parallel.global_batch = 2;  // ×d below: one micro-batch of 2 sequences per replica
  const auto la = train(with_data(small, 2, false, warmup), loss_steps, root);
  const auto lc = train(with_data(small, 2, true, warmup), loss_steps, root);
  fmt::print("  {:>6} {:>10} {:>12}\n", "step", "Adam", "1-bit Adam");
  for (int s = 0; s < loss_steps; s += std::max(1, loss_steps / 10))
    fmt::print("  {:>6} {:>10.4f} {:>12.4f}\n", s + 1, la.loss_per_step[static_cast<std::size_t>(s)],
               lc.loss_per_step[static_cast<std::size_t>(s)]);
  auto tail = [](const std::vector<double>& l) { return std::accumulate(l.end() - 20, l.end(), 0.0) / 20; };
  const double ta = tail(la.loss_per_step), tc = tail(lc.loss_per_step);
  fmt::print("  mean of the last 20 steps: Adam {:.4f}, 1-bit Adam {:.4f} ({:+.1f} %)\n", ta, tc, 100 * (tc / ta - 1));
  // The same with the tests' narrower model (8 layers, hidden 16, seq 16): sign noise
  // weighs more on fewer, smaller weights.
  ir::Scenario narrow = small;
  narrow.model.layers = 8;
  narrow.model.hidden = 16;
  narrow.model.heads = 2;
  narrow.model.ffn = 32;
  narrow.model.seq = 16;
  narrow.model.vocab = 32;
  narrow.parallel.bucket_mb = 40;
  const auto na = train(with_data(narrow, 2, false, warmup), loss_steps, root);
  const auto nc = train(with_data(narrow, 2, true, warmup), loss_steps, root);
  const double nta = tail(na.loss_per_step), ntc = tail(nc.loss_per_step);
  fmt::print("  the 16-wide model of the exec tests (8 layers, seq 16), one bucket per stage: Adam {:.4f}, 1-bit Adam "
             "{:.4f} ({:+.1f} %)\n",
             nta, ntc, 100 * (ntc / nta - 1));

  fmt::print("3. predicted: GPT-3 175B t=8 p=8 d=16 1f1b m=16 on 128 DGX A100 nodes (HDR IB), 40 MiB buckets\n");
  ir::Scenario gpt3 = ir::load_scenario(root + "/scenarios/gpt3-175b-a100-8x8.yaml");
  gpt3.cluster.groups.front().nodes = 8 * 16;
  gpt3.parallel.data = 16;
  gpt3.parallel.global_batch = 16 * 16;
  double base_iter = 0;
  for (bool onebit : {false, true}) {
    ir::Scenario sc = gpt3;
    if (onebit) sc.parallel.optimizer = "onebit-adam";
    const ir::Plan plan = planner::build_plan(sc, "1f1b").lowered;
    std::int64_t bytes = 0;
    for (const ir::Op& op : plan.ranks[0])
      if (ir::is_collective(op.kind)) bytes += op.bytes;
    const auto r = sim::simulate(plan, {});
    const auto [busy, exposed] = dp_ms(r.trace);
    const auto [abusy, aexposed] = dp_ms(planner::evaluate(plan));
    const double iter = static_cast<double>(r.metrics.iteration_ns) * 1e-9;
    if (!onebit) base_iter = iter;
    fmt::print("  {:<11} rank-0 bucket bytes {:8.1f} MiB   DP per rank {:7.1f} ms (exposed {:6.1f})   analytic "
               "{:7.1f} ms (exposed {:6.1f})   iteration {:.3f} s{}\n",
               onebit ? "1-bit Adam" : "Adam", static_cast<double>(bytes) / (1 << 20), busy, exposed, abusy, aexposed,
               iter, onebit ? fmt::format("  ({:+.1f} %)", 100 * (iter / base_iter - 1)) : std::string());
  }
  return 0;
}
