// bench_planner.cpp — prints how long planning takes and how much memory it needs
// (the full planner::build_plan path, then its phases make_schedule, apply_costs,
// lower_validated (lower + validate, also timed apart), for p=64, m=1024, v=4 interleaved), and the analytic evaluator's
// throughput in ops/s on large plans. Figures, no pass/fail.
//
//   build/<dir>/bench/bench_planner            (docs/BENCHMARKS.md records a run)
//   build/<dir>/bench/bench_planner --build-plan-only   (first section only, e.g. under a profiler)
//   build/<dir>/bench/bench_planner --phases-only       (build_plan's phases one by one)
//   build/<dir>/bench/bench_planner --partition-only    (layers_per_stage auto, slices auto)
#include "bench_help.hpp"
#include <malloc.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tdpipe/ir/lowering.hpp"
#include "tdpipe/ir/replay.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/ir/validate.hpp"
#include "tdpipe/planner/balance.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/cost_model.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/planner/generators.hpp"

using namespace tdpipe;
namespace {

/// Process CPU seconds: the build machine is shared, so wall time mostly measures the
/// neighbours; the program is single-threaded, so CPU time is its own run time.
struct Clock {
  using time_point = double;
  static double now() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }
};

double since(double t0) { return Clock::now() - t0; }

/// Peak resident set (VmHWM) or current (VmRSS) of this process, MiB.
double rss_mib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(std::string(field).size())) / 1024.0;
  return -1;
}

/// Resets VmHWM to the current RSS (Linux ≥ 4.0), after handing freed heap back, so
/// the next section's peak is its own.
void reset_peak_rss() {
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";
}

/// User + system CPU seconds of this process (getrusage).
double rusage_cpu() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

/// Minor page faults and system CPU seconds so far (getrusage): fresh memory costs a
/// fault per 4 KiB page, a visible part of planning's time.
long minor_faults() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}
double sys_cpu() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_stime.tv_sec) + static_cast<double>(ru.ru_stime.tv_usec) * 1e-6;
}

/// CPU ms to touch 100 MiB of fresh memory once (a page fault per 4 KiB page): the
/// floor under any step that builds a plan or a trace of this size. Virtual machines
/// are much slower at it than bare metal.
double fresh_memory_ms_per_100mib() {
  const std::size_t n = std::size_t{128} << 20;
  void* mem = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return -1;
  char* p = static_cast<char*>(mem);
  const double t0 = Clock::now();
  for (std::size_t i = 0; i < n; i += 4096) p[i] = 1;
  const double t = Clock::now() - t0;
  munmap(mem, n);
  return t * 1e3 * 100.0 / 128.0;
}

double wall_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::size_t count_ops(const ir::Plan& plan) {
  std::size_t n = 0;
  for (const auto& ops : plan.ranks) n += ops.size();
  return n;
}

/// GPT-3-like synthetic costs (the README's synthetic scenario: F 18.5 µs, B 18.1 µs, W 9.3 µs, 0.6 µs p2p).
void add_costs(ir::Plan& plan) {
  ir::Synthetic syn;
  syn.stages = plan.stages;
  syn.microbatches = plan.microbatches;
  syn.chunks = plan.chunks;
  syn.f_seconds = 18522e-9;
  syn.b_seconds = 18086e-9;
  syn.w_seconds = 9337e-9;
  syn.p2p_latency_seconds = 601e-9;
  plan.scenario.name = "bench-synthetic";
  plan.scenario.synthetic = syn;
  for (auto& ops : plan.ranks)
    for (ir::Op& op : ops) {
      switch (op.kind) {
        case ir::OpKind::F: op.est_seconds = syn.f_seconds; op.mem_bytes = 1; break;
        case ir::OpKind::B: op.est_seconds = syn.b_seconds; op.mem_bytes = -1; break;
        case ir::OpKind::W: op.est_seconds = syn.w_seconds; break;
        case ir::OpKind::BW: op.est_seconds = syn.b_seconds + syn.w_seconds; op.mem_bytes = -1; break;
        default: break;
      }
    }
}

ir::LoweringOptions options() {
  ir::LoweringOptions opt;
  opt.p2p_bytes = [](const ir::Op&) -> std::int64_t { return 25'165'824; };  // b·s·h·2 of GPT-3 / t
  opt.grad_bytes = [](int, int) -> std::int64_t { return 0; };
  return opt;
}

/// Best of `reps` runs of the replay and of evaluate() on one plan.
void throughput(const char* label, const ir::Plan& plan, int reps) {
  const ir::DurationFn d = planner::analytic_durations(plan);
  const double ops = static_cast<double>(count_ops(plan));
  double best_replay = 1e30, best_eval = 1e30;
  std::int64_t makespan = 0;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    const ir::ReplayResult r = ir::replay(plan, d);
    best_replay = std::min(best_replay, since(t0));
    makespan = r.makespan_ns;
    t0 = Clock::now();
    const traces::Trace trace = planner::evaluate(plan);
    best_eval = std::min(best_eval, since(t0));
  }
  std::printf("  %-44s %9.0f ops  replay %7.1f ms = %6.1f M ops/s   evaluate()+trace %7.1f ms = %6.1f M ops/s"
              "   (iteration %.3f s)\n",
              label, ops, best_replay * 1e3, ops / best_replay / 1e6, best_eval * 1e3, ops / best_eval / 1e6,
              static_cast<double>(makespan) * 1e-9);
}

ir::Plan make(const char* name, int p, int m, int v) {
  planner::ScheduleParams sp;
  sp.stages = p;
  sp.microbatches = m;
  sp.chunks = v;
  ir::Plan plan = planner::make_schedule(name, sp);
  add_costs(plan);
  return plan;
}

/// Interleaved p=64 m=1024 v=4 with the README's synthetic costs.
ir::Scenario synthetic_scenario() {
  return ir::parse_scenario(R"(name: bench-synthetic-p64-m1024-v4
synthetic:
  stages: 64
  microbatches: 1024
  chunks: 4
  time: {F: 18.522, B: 18.086, W: 9.337}
  p2p_latency: 0.601
schedule: interleaved
)",
                            "bench-synthetic");
}

/// A GPT-3-like model (256 layers so that p·v = 256 divides them) on 64 nodes ×
/// 8 A100: tensor 8, pipeline 64, 4 chunks, 1024 micro-batches.
ir::Scenario model_scenario() {
  return ir::parse_scenario(R"(name: bench-gpt3-256l-p64-v4
model: {name: gpt3-256l, layers: 256, hidden: 12288, ffn: 49152, heads: 96, seq: 2048, vocab: 51200, dtype: bf16}
cluster: {gpu: a100-80g, nodes: 64, gpus_per_node: 8, nvlink_gbps: 2400, ib_gbps_per_nic: 200, nics_per_node: 8, topology: fat-tree}
parallel: {tensor: 8, pipeline: 64, data: 1, chunks: 4, micro_batch: 1, global_batch: 1024, recompute: selective, sequence_parallel: true, slices: 1}
schedule: interleaved
)",
                            "bench-model");
}

/// planner::build_plan (generate, cost, lower, validate) then planner::evaluate on
/// its lowered plan: wall time, CPU time (getrusage) and the peak RSS of each.
void full_path(const char* label, const ir::Scenario& scenario) {
  reset_peak_rss();
  const double rss0 = rss_mib("VmRSS:");
  double w0 = wall_now(), c0 = rusage_cpu(), s0 = sys_cpu();
  long f0 = minor_faults();
  planner::BuiltPlan built = planner::build_plan(scenario, "interleaved");
  const double wall = wall_now() - w0, cpu = rusage_cpu() - c0, sys = sys_cpu() - s0;
  const long faults = minor_faults() - f0;
  const double peak = rss_mib("VmHWM:");
  std::printf("  %-30s build_plan  wall %7.1f ms  cpu %7.1f ms (%5.1f system, %ld page faults)  peak RSS %6.1f MiB "
              "(%.1f before)  %zu → %zu ops\n",
              label, wall * 1e3, cpu * 1e3, sys * 1e3, faults, peak, rss0, count_ops(built.compute_only),
              count_ops(built.lowered));
  reset_peak_rss();
  const double rss1 = rss_mib("VmRSS:");
  w0 = wall_now();
  c0 = rusage_cpu();
  s0 = sys_cpu();
  f0 = minor_faults();
  const traces::Trace trace = planner::evaluate(built.lowered);
  const double ewall = wall_now() - w0, ecpu = rusage_cpu() - c0, esys = sys_cpu() - s0;
  const long efaults = minor_faults() - f0;
  const double ops = static_cast<double>(count_ops(built.lowered));
  std::int64_t makespan = 0;
  for (const auto& e : trace.events) makespan = std::max(makespan, e.start_ns + e.dur_ns);
  std::printf("  %-30s evaluate    wall %7.1f ms  cpu %7.1f ms (%5.1f system, %ld page faults)  = %5.1f M ops/s (cpu)"
              "  +%.1f MiB peak  iteration %.3f s\n",
              "", ewall * 1e3, ecpu * 1e3, esys * 1e3, efaults, ops / ecpu / 1e6, rss_mib("VmHWM:") - rss1,
              static_cast<double>(makespan) * 1e-9);
}

/// The auto scheduler: planner::build_plan("auto") (its cost table, the scheduler's
/// policy passes, lowering, validation), its peak RSS, and the predicted iteration
/// beside ZB-H1 / ZB-H2 under the same op times, at the 1F1B and twice-1F1B budgets.
void auto_scheduler(int p, int m, int S) {
  const std::string yaml = "name: bench-auto\nsynthetic: {stages: " + std::to_string(p) +
                           ", microbatches: " + std::to_string(m) + ", slices: " + std::to_string(S) +
                           ", time: {F: 18522, B: 18086, W: 9337}, p2p_latency: 601}\n";
  ir::Scenario sc = ir::parse_scenario(yaml, "bench-auto");
  auto iteration = [](const planner::BuiltPlan& built) {
    return static_cast<double>(ir::replay(built.lowered, planner::analytic_durations(built.lowered)).makespan_ns) * 1e-9;
  };
  for (const char* budget : {"1f1b", "2x1f1b"}) {
    sc.parallel.memory_budget = budget;
    reset_peak_rss();
    const double rss0 = rss_mib("VmRSS:");
    const double w0 = wall_now(), c0 = rusage_cpu();
    const planner::BuiltPlan built = planner::build_plan(sc, "auto", S);
    const double wall = wall_now() - w0, cpu = rusage_cpu() - c0;
    const double peak = rss_mib("VmHWM:");
    const double t_auto = iteration(built);
    const double t_ref = S == 1 ? iteration(planner::build_plan(sc, std::string(budget) == "1f1b" ? "zb-h1" : "zb-h2"))
                                : iteration(planner::build_plan(sc, "tdpipe", S));
    std::printf("  p=%-3d m=%-5d S=%d budget %-7s build_plan wall %7.1f ms cpu %7.1f ms  peak RSS %6.1f MiB "
                "(%.1f before)  %zu ops  iteration %.4f s vs %s %.4f s (%.2f%%)\n",
                p, m, S, budget, wall * 1e3, cpu * 1e3, peak, rss0, count_ops(built.compute_only), t_auto,
                S == 1 ? (std::string(budget) == "1f1b" ? "zb-h1" : "zb-h2") : "tdpipe (fused BW, 1F1B cap)", t_ref,
                100 * (t_auto / t_ref - 1));
  }
}

/// Uneven partitions and TeraPipe's slices: the time of each dynamic programme, what it
/// chose, and the predicted iteration (analytic engine) beside the even split / fixed S.
void partition_and_slices() {
  const std::string dir = std::string(TDPIPE_SOURCE_DIR) + "/scenarios/";
  auto iteration = [](const planner::BuiltPlan& built) {
    return static_cast<double>(ir::replay(built.lowered, planner::analytic_durations(built.lowered)).makespan_ns) * 1e-9;
  };
  auto list = [](const std::vector<int>& v) {
    std::string out;
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
    return out;
  };
  struct Case {
    const char* file;
    const char* schedule;
  };
  std::printf("layers_per_stage: auto (min-max DP) against the even split:\n");
  for (const Case c : {Case{"gpt3-175b-a100-8x8.yaml", "1f1b"}, Case{"mixed-a100-h100.yaml", "1f1b"},
                       Case{"turing-530b-a100-35x8.yaml", "interleaved"}, Case{"llama2-70b-a100-4x8.yaml", "1f1b"}}) {
    ir::Scenario sc = ir::load_scenario(dir + c.file);
    const double t_even = iteration(planner::build_plan(sc, c.schedule));
    sc.parallel.layers_per_stage_auto = true;
    ir::Plan probe = planner::build_plan(sc, c.schedule).compute_only;
    const double w0 = wall_now();
    const std::vector<int> parts = planner::partition_layers(sc, probe.stage_of, probe.virtual_stages());
    const double wall = wall_now() - w0;
    const double t_auto = iteration(planner::build_plan(sc, c.schedule));
    std::printf("  %-28s %-11s DP %7.3f ms  [%s]  iteration %.3f s vs even %.3f s (%+.2f%%)\n", c.file, c.schedule,
                wall * 1e3, list(parts).c_str(), t_auto, t_even, 100 * (t_auto / t_even - 1));
  }
  std::printf("load balancer (planner::rebalance: partition <-> bottleneck assignment):\n");
  for (const auto& [file, slow] : {std::pair<const char*, std::vector<double>>{"mixed-a100-h100.yaml", {1, 1, 1, 1}},
                                   {"llama2-70b-a100-4x8.yaml", {1, 2, 1, 1}},
                                   {"gpt3-175b-a100-8x8.yaml", {1, 1, 1, 1.5, 1, 1, 1, 1}}}) {
    const ir::Scenario sc = ir::load_scenario(dir + file);
    const double w0 = wall_now();
    const planner::Rebalance b = planner::rebalance(sc, {slow, {}});
    const double wall = wall_now() - w0;
    std::printf("  %-28s slowdown [%s]  %7.3f ms  layers [%s] -> [%s]  slowest/fastest %+.1f%% -> %+.1f%%  (%d rounds)\n",
                file, [&] {
                  std::string o;
                  for (std::size_t i = 0; i < slow.size(); ++i) o += (i ? "," : "") + std::to_string(slow[i]).substr(0, 4);
                  return o;
                }().c_str(),
                wall * 1e3, list(b.layers_before).c_str(), list(b.layers_after).c_str(), 100 * b.spread_before,
                100 * b.spread_after, b.rounds);
  }
  std::printf("slices: auto (TeraPipe's DP, 128-unit grid) against the scenario's S, tdpipe and auto:max:\n");
  for (const char* file : {"llama7b-32k-a100-4x8.yaml", "llama7b-64k-a100-8x8.yaml", "llama7b-128k-a100-8x8.yaml",
                           "gpt3-175b-a100-8x8.yaml"}) {
    ir::Scenario sc = ir::load_scenario(dir + file);
    sc.parallel.memory_budget = "max";
    const double w0 = wall_now();
    const std::vector<int> cuts = planner::auto_slice_tokens(sc);
    const double wall = wall_now() - w0;
    for (const char* schedule : {"tdpipe", "auto"}) {
      const double t_auto = iteration(planner::build_plan(sc, schedule, planner::kAutoSlices));
      const double t_fixed = iteration(planner::build_plan(sc, schedule, sc.parallel.slices));
      std::printf("  %-28s %-6s DP %7.1f ms  S=%zu [%s]  iteration %.3f s vs S=%d %.3f s (%+.2f%%)\n", file, schedule,
                  wall * 1e3, cuts.size(), list(cuts).c_str(), t_auto, sc.parallel.slices, t_fixed,
                  100 * (t_auto / t_fixed - 1));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (tdpipe::bench::help_requested(argc, argv)) return 0;
  if (argc > 1 && std::strcmp(argv[1], "--partition-only") == 0) {
    partition_and_slices();
    return 0;
  }
  std::printf("bench_planner — planner and analytic evaluator\n\n");
  std::printf("Fresh memory on this machine: %.1f ms CPU per 100 MiB first touched (page faults).\n\n",
              fresh_memory_ms_per_100mib());
  const bool phases_only = argc > 1 && std::strcmp(argv[1], "--phases-only") == 0;
  const bool build_plan_only = argc > 1 && std::strcmp(argv[1], "--build-plan-only") == 0;
  std::printf("auto scheduler on the zero-bubble paper's op times (F 18.5, B 18.1, W 9.3 ms, link 0.6 ms):\n");
  auto_scheduler(64, 1024, 1);
  auto_scheduler(16, 64, 8);
  auto_scheduler(8, 24, 1);
  if (argc > 1 && std::strcmp(argv[1], "--auto-only") == 0) return 0;
  std::printf("\n");
  if (!phases_only) {
    std::printf("Full planning path, interleaved p=64 m=1024 v=4 (planner::build_plan, then planner::evaluate;\n"
                "cpu = getrusage user+sys, peak RSS = VmHWM reset before each step):\n");
    const ir::Scenario syn = synthetic_scenario();
    const ir::Scenario model = model_scenario();
    full_path("synthetic (bench-synthetic)", syn);
    full_path("model (gpt3-like, 512 GPUs)", model);
    if (build_plan_only) return 0;
  }

  std::printf("\nIts phases, as build_plan runs them, on the model scenario (process CPU time; peak RSS\n"
              "since the first phase, so it includes the plans held from the phases before):\n");
  ir::Plan lowered;
  {
    const ir::Scenario sc = model_scenario();
    reset_peak_rss();
    planner::ScheduleParams params;
    params.stages = sc.stages();
    params.microbatches = sc.microbatches();
    params.chunks = planner::chunks_for("interleaved", sc);
    auto t0 = Clock::now();
    ir::Plan compute = planner::make_schedule("interleaved", params);
    compute.data = sc.parallel.data;
    compute.scenario = sc;
    const double t_make = since(t0);
    const double hwm_make = rss_mib("VmHWM:");
    t0 = Clock::now();
    planner::apply_costs(compute, sc);
    const double t_costs = since(t0);
    ir::ValidateOptions no_replay;
    no_replay.check_deadlock = false;
    // What build_plan runs: lower and validate in one (the validator reuses lower's index).
    double t_both = 0, s_both = 0, hwm_both = 0;
    long f_both = 0;
    {
      t0 = Clock::now();
      const long f = minor_faults();
      const double s = sys_cpu();
      const ir::LoweredPlan both = ir::lower_validated(compute, planner::lowering_options(compute, sc), no_replay);
      t_both = since(t0);
      f_both = minor_faults() - f;
      s_both = sys_cpu() - s;
      hwm_both = rss_mib("VmHWM:");
    }
    t0 = Clock::now();
    const long f0 = minor_faults();
    const double s0 = sys_cpu();
    lowered = ir::lower(compute, planner::lowering_options(compute, sc));
    const double t_lower = since(t0);
    const long f_lower = minor_faults() - f0;
    const double s_lower = sys_cpu() - s0;
    const double hwm_lower = rss_mib("VmHWM:");
    t0 = Clock::now();
    const ir::ValidationReport rep = ir::validate(lowered, no_replay);
    const double t_validate = since(t0);
    const double hwm_validate = rss_mib("VmHWM:");
    t0 = Clock::now();
    const ir::ValidationReport rep_full = ir::validate(lowered);
    const double t_validate_full = since(t0);
    const double hwm_validate_full = rss_mib("VmHWM:");
    t0 = Clock::now();
    const ir::ValidationReport rep0 = ir::validate(compute);
    const double t_validate0 = since(t0);
    std::printf("  make_schedule         %8.1f ms   %zu compute ops           peak RSS %6.1f MiB\n", t_make * 1e3,
                count_ops(compute), hwm_make);
    std::printf("  apply_costs           %8.1f ms\n", t_costs * 1e3);
    std::printf("  lower_validated       %8.1f ms   lower + validate as build_plan runs them: the validator\n"
                "                                     reuses lower's op index; lower's order is deadlock-free, no\n"
                "                                     replay  peak RSS %6.1f MiB  (%ld page faults, %.1f ms system)\n",
                t_both * 1e3, hwm_both, f_both, s_both * 1e3);
    std::printf("  sum of the phases     %8.1f ms\n", (t_make + t_costs + t_both) * 1e3);
    std::printf("  the two apart (then freed and run again):\n");
    std::printf("  lower                 %8.1f ms   %zu ops after lowering  peak RSS %6.1f MiB  (%ld page faults, "
                "%.1f ms system)\n",
                t_lower * 1e3, count_ops(lowered), hwm_lower, f_lower, s_lower * 1e3);
    std::printf("  validate (lowered)    %8.1f ms   peak in-flight rank 0: %d  peak RSS %6.1f MiB\n"
                "                        (no replay; builds its own index of the lowered plan)\n",
                t_validate * 1e3, rep.ranks[0].peak_inflight, hwm_validate);
    std::printf("  not in build_plan: validate with the deadlock replay (any plan from elsewhere) %.1f ms, peak RSS "
                "%.1f MiB;\n  validate of the compute-only plan %.1f ms (peak in-flight rank 0: %d/%d)\n",
                t_validate_full * 1e3, hwm_validate_full, t_validate0 * 1e3, rep_full.ranks[0].peak_inflight,
                rep0.ranks[0].peak_inflight);
    std::printf("  (an ir::Op is %zu bytes, plus a heap block for deps beyond the first)\n", sizeof(ir::Op));
  }

  if (phases_only) return 0;
  std::printf("\nEvaluator throughput (best of 3; replay = ir::replay with analytic durations):\n");
  throughput("interleaved p=64 m=1024 v=4 (model), lowered", lowered, 3);
  lowered = ir::Plan{};
  {
    const ir::Plan plan = ir::lower(make("interleaved", 64, 1024, 4), options());
    throughput("interleaved p=64 m=1024 v=4, lowered", plan, 3);
  }
  {
    const ir::Plan plan = make("interleaved", 64, 1024, 4);
    throughput("interleaved p=64 m=1024 v=4, compute-only", plan, 3);
  }
  {
    const ir::Plan plan = ir::lower(make("1f1b", 64, 1024, 1), options());
    throughput("1f1b p=64 m=1024, lowered", plan, 3);
  }
  {
    const ir::Plan plan = ir::lower(make("zb-v", 64, 1024, 2), options());
    throughput("zb-v p=64 m=1024, lowered", plan, 3);
  }
  {
    const ir::Plan plan = ir::lower(make("zb-h1", 64, 1024, 1), options());
    throughput("zb-h1 p=64 m=1024, lowered", plan, 3);
  }
  return 0;
}
