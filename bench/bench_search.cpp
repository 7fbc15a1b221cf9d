// bench_search.cpp — how long `tdpipe search` takes on large spaces: GPT-3 175B and
// Megatron-Turing 530B on 5,120 A100 80GB (640 DGX nodes, HDR InfiniBand), the analytic
// stage only (enumerate, prune, bound, plan the candidates that can still win). Prints
// the wall time, the layouts considered / pruned / planned and the winner.
//   bench_search            both models
//   bench_search FILE GPUS BATCH   one scenario file
//   bench_search --megatron        Megatron's published layouts (Narayanan et al. 2021) beside
//                                  the search's best, on Megatron's GPU counts and batches
//   bench_search --from-run        the compute efficiency fitted to the smallest of those runs
//                                  (calibrate --from-run), the others predicted with it
#include "bench_help.hpp"
#include <cstdio>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/report/schedule_report.hpp"
#include "tdpipe/planner/search.hpp"
#include "tdpipe/planner/stack_fit.hpp"
#include "tdpipe/traces/metrics.hpp"

namespace {

void run(const std::string& file, int gpus, int batch) {
  using namespace tdpipe;
  const ir::Scenario sc = ir::load_scenario(file);
  planner::SearchOptions o;
  o.gpus = gpus;
  o.global_batches = {batch};
  const planner::SearchResult r = planner::search_layouts(sc, o);
  fmt::print("{} on {} GPUs, global batch {}: {:.2f} s; {} layouts considered, {} pruned by memory, {} bounded, "
             "{} planned\n",
             sc.model.name, gpus, batch, r.seconds, r.considered, r.pruned_memory, r.pruned_bound, r.planned);
  for (int k = 0; k < int(r.top.size()); ++k) {
    const auto& c = r.candidates[r.top[k]];
    fmt::print("  #{} {:<52} {:8.3f} s  MFU {:4.1f} %  {:5.1f} GiB\n", k + 1, c.layout.label(),
               c.iteration_seconds, 100 * c.mfu, c.peak_bytes / double(1u << 30));
  }
}

/// Megatron's TFLOP/s per GPU: 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) per iteration (full
/// recompute counted, as Narayanan et al. 2021 count it) over the time and the GPUs.
double megatron_tflops(const tdpipe::ir::Scenario& sc, double seconds, int gpus) {
  const auto& m = sc.model;
  const double B = sc.parallel.global_batch, s = m.seq, l = m.layers, h = m.hidden, V = m.vocab;
  const double flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  return flops / seconds / gpus / 1e12;
}

struct MegatronCase {
  const char* label;
  const char* file;
  int gpus, batch, tensor, pipeline;
  double published_tflops;  // per GPU, Megatron's count
};
// Narayanan et al. 2021 (arXiv 2104.04473): 175B from Table 2 (PTD-P, model-parallel
// size 96 = t 8 × p 12, batch 1536 on 1536 GPUs); 530B and 1T from Table 1.
const MegatronCase kMegatronCases[] = {{"GPT-3 175B", "gpt3-175b-a100-8x8.yaml", 1536, 1536, 8, 12, 141},
                                       {"MT-NLG 530B", "turing-530b-a100-35x8.yaml", 2520, 2520, 8, 35, 163},
                                       {"GPT 1T", "gpt-1t-a100-384x8.yaml", 3072, 3072, 8, 64, 163}};

// A published run's layout as a scenario: micro-batch 1, full recompute, 1F1B.
tdpipe::ir::Scenario megatron_layout(const MegatronCase& c) {
  using namespace tdpipe;
  const ir::Scenario sc = ir::load_scenario(std::string(TDPIPE_SOURCE_DIR) + "/scenarios/" + c.file);
  planner::Layout l;
  l.gpus = c.gpus, l.tensor = c.tensor, l.pipeline = c.pipeline, l.data = c.gpus / (c.tensor * c.pipeline);
  l.micro_batch = 1, l.global_batch = c.batch, l.recompute = ir::Recompute::Full;
  l.schedule = "1f1b", l.chunks = 1;
  ir::Scenario layout = planner::apply_layout(sc, l);
  layout.parallel.layers_per_stage_auto = sc.model.layers % c.pipeline != 0;
  return layout;
}

// `tdpipe calibrate --from-run` as a user would run it: the compute efficiency fitted to
// the smallest published run (its TFLOP/s per GPU as an iteration time), then the larger
// runs predicted with it, beside what was published.
int from_run() {
  using namespace tdpipe;
  const MegatronCase& base = kMegatronCases[0];
  const ir::Scenario base_sc = megatron_layout(base);
  const double flops_per_gpu = megatron_tflops(base_sc, 1, base.gpus) * 1e12;  // Megatron's FLOPs / GPUs
  const double observed = flops_per_gpu / (base.published_tflops * 1e12);
  const planner::StackFit fit = planner::fit_compute_efficiency(base_sc, "1f1b", 0, observed);
  fmt::print("fitted to {} on {} GPUs ({:.0f} TFLOP/s per GPU published = {:.3f} s an iteration, 1F1B): "
             "compute_efficiency {:.4f} (modelled {:.3f} s)\n",
             base.label, base.gpus, base.published_tflops, observed, fit.efficiency, fit.modelled_seconds);
  fmt::print("{:<14} {:>6} {:>22} {:>12} {:>24} {:>24}\n", "model", "GPUs", "layout", "published",
             "predicted (default)", "predicted (fitted)");
  for (const MegatronCase& c : kMegatronCases) {
    const ir::Scenario sc = megatron_layout(c);
    const auto at_one = planner::predict_with_efficiency(sc, "1f1b", 0, 1);
    const auto fitted = planner::predict_with_efficiency(sc, "1f1b", 0, fit.efficiency);
    const double one = megatron_tflops(sc, at_one.fitted_seconds, c.gpus);
    const double fitted_tflops = megatron_tflops(sc, fitted.fitted_seconds, c.gpus);
    fmt::print("{:<14} {:>6} {:>22} {:>8.0f} TF/s {:>8.1f} TF/s ({:+5.1f} %) {:>8.1f} TF/s ({:+5.1f} %)\n", c.label,
               c.gpus, fmt::format("t{} p{} d{}", c.tensor, c.pipeline, c.gpus / (c.tensor * c.pipeline)),
               c.published_tflops, one, 100 * (one / c.published_tflops - 1), fitted_tflops,
               100 * (fitted_tflops / c.published_tflops - 1));
  }
  return 0;
}

int megatron() {
  using namespace tdpipe;
  for (const MegatronCase& c : kMegatronCases) {
    const ir::Scenario sc = ir::load_scenario(std::string(TDPIPE_SOURCE_DIR) + "/scenarios/" + c.file);
    fmt::print("{} on {} A100, global batch {}: published t={} p={} d={} mb=1, {:.0f} TFLOP/s per GPU\n", c.label,
               c.gpus, c.batch, c.tensor, c.pipeline, c.gpus / (c.tensor * c.pipeline), c.published_tflops);
    for (const char* schedule : {"1f1b", "interleaved"}) {
      planner::Layout l;
      l.gpus = c.gpus, l.tensor = c.tensor, l.pipeline = c.pipeline, l.data = c.gpus / (c.tensor * c.pipeline);
      l.micro_batch = 1, l.global_batch = c.batch, l.recompute = ir::Recompute::Full;
      l.schedule = schedule, l.chunks = std::string(schedule) == "interleaved" ? 2 : 1;
      ir::Scenario layout = planner::apply_layout(sc, l);
      layout.parallel.layers_per_stage_auto = sc.model.layers % (c.pipeline * l.chunks) != 0;
      try {
        const auto built = planner::build_plan(layout, schedule);
        const auto trace = planner::evaluate(built.lowered);
        const double t = double(traces::compute_metrics(trace).iteration_ns) * 1e-9;
        const auto report = report::make_report(built, trace, "analytic");
        fmt::print("  published layout, {:<18} predicted {:8.3f} s  {:5.1f} TFLOP/s per GPU ({:+.1f} % vs published)  "
                   "MFU {:4.1f} %  {}\n",
                   l.label().substr(l.label().find(schedule)), t, megatron_tflops(layout, t, c.gpus),
                   100 * (megatron_tflops(layout, t, c.gpus) / c.published_tflops - 1), 100 * report.mfu,
                   report.fits ? "fits" : report.fit_message);
      } catch (const std::exception& e) {
        fmt::print("  published layout, {}: not planned: {}\n", schedule, e.what());
      }
    }
    for (bool megatron_space : {true, false}) {
      planner::SearchOptions o;
      o.gpus = c.gpus;
      o.global_batches = {c.batch};
      o.top = 1;
      if (megatron_space) {
        o.schedules = {"1f1b", "interleaved"};
        o.recomputes = {ir::Recompute::Full};
        o.sequence_parallel = planner::SearchOptions::Toggle::Off;
      }
      const planner::SearchResult r = planner::search_layouts(sc, o);
      if (r.top.empty()) {
        fmt::print("  search ({}): nothing fits\n", megatron_space ? "Megatron-2021 space" : "full space");
        continue;
      }
      const auto& w = r.candidates[r.top[0]];
      ir::Scenario layout = planner::apply_layout(sc, w.layout);
      fmt::print("  search best, {:<19} {:<48} {:8.3f} s  {:5.1f} TFLOP/s per GPU  MFU {:4.1f} %  ({:.2f} s, {} planned "
                 "of {})\n",
                 megatron_space ? "Megatron-2021 space" : "full space", w.layout.label(), w.iteration_seconds,
                 megatron_tflops(layout, w.iteration_seconds, c.gpus), 100 * w.mfu, r.seconds, r.planned,
                 r.considered);
    }
  }
  fmt::print("(TFLOP/s per GPU by Megatron's count, full recompute included whatever the layout recomputes; "
             "MFU by model FLOPs without recompute)\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (tdpipe::bench::help_requested(argc, argv)) return 0;
  if (argc == 2 && std::string(argv[1]) == "--megatron") return megatron();
  if (argc == 2 && std::string(argv[1]) == "--from-run") return from_run();
  if (argc == 4) {
    run(argv[1], std::atoi(argv[2]), std::atoi(argv[3]));
    return 0;
  }
  const std::string dir = TDPIPE_SOURCE_DIR "/scenarios/";
  run(dir + "gpt3-175b-a100-8x8.yaml", 5120, 1536);
  run(dir + "turing-530b-a100-35x8.yaml", 5120, 2560);
  return 0;
}
