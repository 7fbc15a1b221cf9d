// bench_sim.cpp — SimGrid engine speed at scale: GPT-3 175B, t=8 p=8 1F1B, m=64 per
// pipeline, at d = 1, 16, 160 (64, 1,024, 10,240 GPUs). For each size: wall time and
// peak RSS of one simulated iteration with the reductions (Fidelity::Reduced) and in
// the plain mode (one actor set per GPU, every flow simulated), the speed ratio and the
// iteration-time difference. Prints figures; never pass/fail.
//
//   bench_sim [--data 1,16,160] [--plain-max-data N] [--microbatches M] [--bucket-mb MB]
//             [--inject SPEC]…   faults (tdpipe sim --inject): both fidelities simulate
//                               them; the reduced one is also run fault-free
//   bench_sim --published   Korthikanti et al. 2022 Table 5 runs, both engines
//   bench_sim --claims      the seed's GPT-3 175B 8×8 claims, schedule by schedule
//
// DP buckets follow Megatron-core's default: max(40 M, 1 M · d) parameters of bf16
// gradients, so the plain mode's ring-step flow count stays what Megatron would post.
#include "bench_help.hpp"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "tdpipe/ir/lowering.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/cost_model.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/planner/generators.hpp"
#include "tdpipe/report/schedule_report.hpp"
#include "tdpipe/traces/metrics.hpp"
#include "tdpipe/sim/simulate.hpp"

using namespace tdpipe;

namespace {

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::atoi(item.c_str()));
  return out;
}

ir::Plan gpt3_plan(int data, int microbatches, std::int64_t bucket_bytes) {
  auto sc = ir::load_scenario(std::string(TDPIPE_SOURCE_DIR) + "/scenarios/gpt3-175b-a100-8x8.yaml");
  sc.cluster.groups.front().nodes = 8 * data;
  sc.parallel.data = data;
  sc.parallel.global_batch = microbatches * data;
  planner::ScheduleParams params;
  params.stages = 8;
  params.microbatches = microbatches;
  ir::Plan plan = planner::make_schedule("1f1b", params);
  plan.data = data;
  plan.scenario = sc;
  planner::apply_costs(plan, sc);
  ir::LoweringOptions lo = planner::lowering_options(plan, sc);
  lo.bucket_bytes = bucket_bytes > 0 ? bucket_bytes : std::max<std::int64_t>(40'000'000, 1'000'000LL * data) * 2;
  return ir::lower(plan, lo);
}

struct Run {
  double wall = 0, engine_wall = 0, cpu = 0, rss_gb = 0, iteration = 0;
  std::int64_t actors = 0, flows = 0;
};

Run run(const ir::Plan& plan, sim::Fidelity fidelity, const std::vector<sim::SimFault>& faults = {}) {
  sim::SimOptions opt;
  opt.fidelity = fidelity;
  opt.faults = faults;
  opt.collective = sim::CollectiveAlgorithm::Ring;  // the plain mode simulates ring steps
  const auto t0 = std::chrono::steady_clock::now();
  const auto res = sim::simulate(plan, opt);
  Run r;
  r.wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.engine_wall = res.engine_wall_seconds;
  r.cpu = res.engine_cpu_seconds;
  r.rss_gb = static_cast<double>(res.engine_peak_rss_bytes) / 1e9;
  r.iteration = res.iteration_seconds;
  r.actors = res.actors;
  r.flows = res.flows;
  return r;
}

ir::Scenario scenario(const std::string& file) {
  return ir::load_scenario(std::string(TDPIPE_SOURCE_DIR) + "/scenarios/" + file);
}

// Korthikanti et al. 2022 (arXiv 2205.05198), Table 5: measured seconds per iteration.
int published() {
  struct Case {
    const char* label;
    const char* file;
    bool selective_sp;
    double measured;
  };
  const Case cases[] = {
      {"22B  t=8 p=1, full recompute", "megatron-22b-a100-1x8.yaml", false, 1.42},
      {"22B  t=8 p=1, SP + selective", "megatron-22b-a100-1x8.yaml", true, 1.10},
      {"530B t=8 p=35 v=3, full recompute", "turing-530b-a100-35x8.yaml", false, 49.05},
      {"530B t=8 p=35 v=3, SP + selective", "turing-530b-a100-35x8.yaml", true, 37.83},
  };
  std::printf("%-36s %9s | %10s %7s | %10s %7s | %8s\n", "run", "measured", "analytic", "err", "simgrid", "err",
              "sim.wall");
  for (const Case& c : cases) {
    ir::Scenario sc = scenario(c.file);
    if (c.selective_sp) {
      sc.parallel.recompute = ir::Recompute::Selective;
      sc.parallel.sequence_parallel = true;
    } else {
      sc.parallel.recompute = ir::Recompute::Full;
      sc.parallel.sequence_parallel = false;
    }
    const auto built = planner::build_plan(sc, sc.schedule);
    const auto analytic = traces::compute_metrics(planner::evaluate(built.lowered));
    const auto t0 = std::chrono::steady_clock::now();
    const auto res = sim::simulate(built.lowered);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double a = static_cast<double>(analytic.iteration_ns) * 1e-9, g = res.iteration_seconds;
    std::printf("%-36s %8.2fs | %9.2fs %+6.1f%% | %9.2fs %+6.1f%% | %7.2fs\n", c.label, c.measured, a,
                100 * (a / c.measured - 1), g, 100 * (g / c.measured - 1), wall);
  }
  return 0;
}

// The seed's GPT-3 175B claims: bubble, communication share, tokens/s, peak memory.
int claims() {
  const ir::Scenario base = scenario("gpt3-175b-a100-8x8.yaml");
  std::printf("%-16s %4s | %10s %7s %9s %9s %10s %9s\n", "schedule", "S", "iteration", "bubble", "comm",
              "exposed", "tokens/s", "peak mem");
  struct Run {
    const char* name;
    int slices;
    const char* budget;  // the auto scheduler's memory budget
  };
  const Run runs[] = {{"1f1b", 1, ""},          {"interleaved", 1, ""},   {"zb-h1", 1, ""},
                      {"zb-h2", 1, ""},         {"zb-v", 1, ""},          {"tdpipe", 1, ""},
                      {"tdpipe", 2, ""},        {"tdpipe", 4, ""},        {"tdpipe", 8, ""},
                      {"tdpipe", planner::kAutoSlices, ""},               {"auto", 1, "1f1b"},
                      {"auto", 1, "2x1f1b"},    {"auto", 4, "max"},       {"auto", planner::kAutoSlices, "max"}};
  for (const auto& [name, slices, budget] : runs) {
    const std::string label = *budget ? std::string(name) + ":" + budget : std::string(name);
    const std::string s_label = slices == planner::kAutoSlices ? "auto" : std::to_string(slices);
    try {
      ir::Scenario sc = base;
      if (*budget) sc.parallel.memory_budget = budget;
      const auto built = planner::build_plan(sc, name, slices);
      const auto res = sim::simulate(built.lowered);
      const auto report = report::make_report(built, res.trace, "simgrid");
      double xfer = 0, exposed = 0, peak = 0;
      for (std::size_t r = 0; r < res.transfer_ns.size(); ++r) {
        xfer += static_cast<double>(res.transfer_ns[r]);
        exposed += static_cast<double>(res.exposed_transfer_ns[r]);
      }
      const double denom = static_cast<double>(res.metrics.iteration_ns) * static_cast<double>(res.transfer_ns.size());
      for (double b : report.peak_memory_bytes_per_rank) peak = std::max(peak, b);
      const std::string s_shown = slices == planner::kAutoSlices ? std::to_string(built.lowered.slices) + "*" : s_label;
      std::printf("%-16s %4s | %9.3fs %6.1f%% %8.1f%% %8.1f%% %10.0f %7.1fGiB\n", label.c_str(), s_shown.c_str(),
                  res.iteration_seconds, 100 * res.metrics.bubble_fraction, 100 * xfer / denom,
                  100 * exposed / denom, report.tokens_per_second, peak / double(1u << 30));
    } catch (const std::exception& e) {
      std::printf("%-16s %4s | not run: %s\n", label.c_str(), s_label.c_str(), e.what());
    }
  }
  std::printf("(S = N*: chosen by slices auto, TeraPipe's dynamic programme)\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (tdpipe::bench::help_requested(argc, argv)) return 0;
  if (argc > 1 && !std::strcmp(argv[1], "--published")) return published();
  if (argc > 1 && !std::strcmp(argv[1], "--claims")) return claims();
  std::vector<int> datas = {1, 16, 160};
  int plain_max = 1 << 30;
  int microbatches = 64;
  std::int64_t bucket_bytes = 0;
  std::vector<sim::SimFault> faults;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--inject")) faults.push_back(sim::parse_sim_fault(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--data")) datas = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--plain-max-data")) plain_max = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--microbatches")) microbatches = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--bucket-mb")) bucket_bytes = std::atoll(argv[i + 1]) * 1'000'000LL;
  }
  std::printf("GPT-3 175B, t=8 p=8, 1F1B, m=%d per pipeline, ring all-reduce, DP buckets %s, one iteration\n",
              microbatches,
              bucket_bytes > 0 ? (std::to_string(bucket_bytes / 1'000'000) + " MB").c_str()
                               : "max(40M, 1M·d) params");
  std::printf("wall: simulate() call; cpu: CPU time of the SimGrid process; RSS: its peak\n");
  for (const auto& f : faults) std::printf("fault: %s\n", f.text.c_str());
  std::printf("%6s %4s | %9s %9s %8s %7s %9s | %10s %9s %9s %9s %10s | %8s %9s\n", "GPUs", "d", "red.wall",
              "red.cpu", "red.RSS", "actors", "flows", "plain.wall", "plain.cpu", "plain.RSS", "actors",
              "flows", "cpu ratio", "iter.diff");
  for (int d : datas) {
    const ir::Plan plan = gpt3_plan(d, microbatches, bucket_bytes);
    const Run red = run(plan, sim::Fidelity::Reduced, faults);
    std::printf("%6d %4d | %8.3fs %8.3fs %6.3fGB %7lld %9lld |", 64 * d, d, red.wall, red.cpu, red.rss_gb,
                static_cast<long long>(red.actors), static_cast<long long>(red.flows));
    if (d <= plain_max) {
      const Run pl = run(plan, sim::Fidelity::Plain, faults);
      std::printf(" %9.3fs %8.3fs %7.3fGB %9lld %10lld | %7.1fx %+8.4f%%\n", pl.wall, pl.cpu, pl.rss_gb,
                  static_cast<long long>(pl.actors), static_cast<long long>(pl.flows), pl.cpu / red.cpu,
                  100.0 * (red.iteration / pl.iteration - 1));
    } else {
      std::printf(" %10s %9s %9s %9s %10s | %8s %9s\n", "-", "-", "-", "-", "-", "-", "-");
    }
    std::printf("         iteration: reduced %.6f s%s", red.iteration, d <= plain_max ? "" : " (plain skipped)");
    if (!faults.empty()) {
      const Run healthy = run(plan, sim::Fidelity::Reduced);
      std::printf("; fault-free %.6f s (%+.2f%% with the faults)", healthy.iteration,
                  100.0 * (red.iteration / healthy.iteration - 1));
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}
