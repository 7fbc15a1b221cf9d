// bench_dp_overlap.cpp — the data-parallel gradient reduction, measured on the CPU
// executor: how much of each rank's DP communication is hidden under compute and how
// much is exposed, with parallel.overlap_grad_reduce on and off, for d = 2 and 4
// replicas of the tiny scenario (small buckets, so a chunk has several), plain
// all-reduce and the distributed optimizer side by side, with the analytic engine's
// prediction of the same split beside each (medians over steps 2…N); then the SimGrid
// engine's prediction of the same choices for GPT-3 175B at scale.
//
//   build/<dir>/bench/bench_dp_overlap [SOURCE_DIR] [STEPS]
#include "bench_help.hpp"
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/cost_model.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/sim/simulate.hpp"
#include "tdpipe/traces/metrics.hpp"

using namespace tdpipe;

namespace {

struct Split {
  double hidden_ms = 0, exposed_ms = 0;  // DP comm per rank, mean over ranks
};

// DP collectives against the compute stream, per rank, averaged over ranks.
Split dp_split(const traces::Trace& t) {
  std::vector<std::vector<traces::TimeSpan>> compute(static_cast<std::size_t>(t.ranks)),
      dp(static_cast<std::size_t>(t.ranks));
  for (const auto& e : t.events) {
    if (e.rank < 0 || e.rank >= t.ranks) continue;
    const traces::TimeSpan span{e.start_ns, e.end_ns()};
    if (!e.kind) continue;
    if (ir::is_compute(*e.kind)) compute[static_cast<std::size_t>(e.rank)].push_back(span);
    if (ir::is_collective(*e.kind)) dp[static_cast<std::size_t>(e.rank)].push_back(span);
  }
  Split s;
  for (int r = 0; r < t.ranks; ++r) {
    const auto u = traces::busy_union(compute[static_cast<std::size_t>(r)], dp[static_cast<std::size_t>(r)]);
    s.hidden_ms += static_cast<double>(u.hidden_comm_ns) * 1e-6 / t.ranks;
    s.exposed_ms += static_cast<double>(u.exposed_comm_ns()) * 1e-6 / t.ranks;
  }
  return s;
}

void run_case(const ir::Scenario& base, int d, bool overlap, bool sharded, int steps) {
  ir::Scenario sc = base;
  sc.parallel.data = d;
  sc.cluster.gpus_per_node = sc.parallel.pipeline * d;
  sc.parallel.global_batch = base.parallel.global_batch * d;  // m stays
  sc.parallel.overlap_grad_reduce = overlap;
  sc.parallel.distributed_optimizer = sharded;
  const ir::Plan plan = planner::build_plan(sc, "1f1b").lowered;
  int buckets = 0;
  for (const ir::Op& op : plan.ranks[0]) buckets += ir::is_gradient_reduction(op.kind);
  exec::cpu::CpuRunOptions opt;
  opt.train.steps = steps;
  opt.train.corpus_path = std::string(TDPIPE_SOURCE_DIR) + "/data/tiny_corpus.txt";
  opt.keep_step_traces = true;
  const exec::cpu::RunResult got = exec::cpu::run_cpu(plan, opt);
  std::vector<double> hidden, exposed, iteration;
  for (std::size_t s = 1; s < got.step_traces.size(); ++s) {  // step 0 warms up
    const Split x = dp_split(got.step_traces[s]);
    hidden.push_back(x.hidden_ms);
    exposed.push_back(x.exposed_ms);
    iteration.push_back(got.iteration_seconds[s] * 1e3);
  }
  const exec::cpu::RunResult ref = exec::cpu::run_reference(sc, d, sc.microbatches(), opt.train);
  double err = 0;
  for (const auto& [name, w] : ref.weights) {
    const auto& g = got.weights.at(name);
    for (std::size_t i = 0; i < w.size(); ++i) err = std::max(err, std::abs(g[i] - w[i]));
  }
  const Split predicted = dp_split(planner::evaluate(plan));
  fmt::print("  d={}  {:<14} {:<8} {:>3} buckets   iteration {:7.1f} ms   DP comm per rank: hidden {:6.2f} ms, "
             "exposed {:6.2f} ms   (analytic: hidden {:6.2f}, exposed {:6.2f})   |w − w_1dev| ≤ {:.1e}\n",
             d, sharded ? "reduce-scatter" : "all-reduce", overlap ? "overlap" : "serial", buckets,
             traces::median(iteration), traces::median(hidden), traces::median(exposed), predicted.hidden_ms,
             predicted.exposed_ms, err);
}

// Predicted at scale (SimGrid engine): GPT-3 175B, t 8 p 8 on 8·d DGX A100 nodes, m = 16.
void predict_case(const ir::Scenario& base, int d, bool overlap, bool sharded) {
  ir::Scenario sc = base;
  sc.cluster.groups.front().nodes = 8 * d;
  sc.parallel.data = d;
  sc.parallel.global_batch = 16 * d;
  sc.parallel.overlap_grad_reduce = overlap;
  sc.parallel.distributed_optimizer = sharded;
  const ir::Plan plan = planner::build_plan(sc, "1f1b").lowered;
  const auto r = sim::simulate(plan, {});
  const Split x = dp_split(r.trace);
  const auto mem = planner::memory_per_rank(plan, sc);
  fmt::print("  d={:<2} {:<14} {:<8} iteration {:8.3f} s   DP comm per rank: hidden {:7.1f} ms, exposed {:7.1f} ms   "
             "optimizer state rank 0 {:5.1f} GiB\n",
             d, sharded ? "reduce-scatter" : "all-reduce", overlap ? "overlap" : "serial",
             static_cast<double>(r.metrics.iteration_ns) * 1e-9, x.hidden_ms, x.exposed_ms,
             mem[0].optimizer_bytes / (1024.0 * 1024 * 1024));
}

}  // namespace

int main(int argc, char** argv) {
  if (tdpipe::bench::help_requested(argc, argv)) return 0;
  const std::string root = argc > 1 ? argv[1] : TDPIPE_SOURCE_DIR;
  const int steps = argc > 2 ? std::max(2, std::atoi(argv[2])) : 8;
  ir::Scenario sc = ir::load_scenario(root + "/scenarios/tiny-gpt-cpu.yaml");
  sc.parallel.bucket_mb = 0.1;  // ~5 buckets per stage of the tiny model
  double load = 0;
  if (std::ifstream in("/proc/loadavg"); in) in >> load;
  fmt::print("bench_dp_overlap: tiny-gpt-cpu p=2 1f1b, {} steps (medians of steps 2-{}), {} hardware threads, "
             "load average {:.2f}\n",
             steps, steps, std::thread::hardware_concurrency(), load);
  for (int d : {2, 4})
    for (bool sharded : {false, true})
      for (bool overlap : {true, false}) run_case(sc, d, overlap, sharded, steps);
  fmt::print("predicted (SimGrid): GPT-3 175B, t=8 p=8 1f1b m=16 on 8·d DGX A100 nodes (40 MiB buckets)\n");
  const ir::Scenario gpt3 = ir::load_scenario(root + "/scenarios/gpt3-175b-a100-8x8.yaml");
  for (int d : {2, 4})
    for (bool sharded : {false, true})
      for (bool overlap : {true, false}) predict_case(gpt3, d, overlap, sharded);
  return 0;
}
