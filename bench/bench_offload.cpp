// bench_offload.cpp — time-shared parameter loading (parallel.param_offload: layers).
// Executed: the CPU backend's measured device peak of weights + Adam state per rank and
// its iteration time, with and without offload, on the tiny scenario (4 layers on 2
// stages, and 8). Predicted: peak memory per GPU and iteration time with and without,
// side by side, for Llama-2 70B on 4×8 A100 (the design document's "−37 % peak memory"
// case), both engines, four schedules; and the copy stream's share of the step.
//
//   build/default/bench/bench_offload [SCENARIO]
#include "bench_help.hpp"
#include <algorithm>
#include <string>
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

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct Row {
  double sim_s = 0, analytic_s = 0, peak_gib = 0, copy_gb = 0, copy_busy = 0;
};

Row predict(const ir::Scenario& sc, const std::string& schedule, int slices) {
  const auto built = planner::build_plan(sc, schedule, slices);
  const ir::Plan& plan = built.lowered;
  Row row;
  row.sim_s = sim::simulate(plan).iteration_seconds;
  row.analytic_s = static_cast<double>(traces::compute_metrics(planner::evaluate(plan)).iteration_ns) * 1e-9;
  double peak = 0;
  for (const auto& m : planner::memory_per_rank(plan, sc)) peak = std::max(peak, m.total_bytes());
  row.peak_gib = peak / kGiB;
  // Rank 0's host ↔ device traffic and how long its copy engine is busy.
  double bytes = 0, busy = 0;
  for (const auto& op : plan.ranks[0])
    if (op.stream == ir::Stream::Copy) {
      bytes += static_cast<double>(op.bytes);
      busy += op.est_seconds;
    }
  row.copy_gb = bytes / 1e9;
  row.copy_busy = row.sim_s > 0 ? busy / row.sim_s : 0;
  return row;
}

void executed(int layers) {
  ir::Scenario sc = ir::load_scenario(std::string(TDPIPE_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml");
  sc.model.layers = layers;
  exec::cpu::CpuRunOptions opt;
  opt.train.steps = 20;
  opt.train.corpus_path = std::string(TDPIPE_SOURCE_DIR) + "/data/tiny_corpus.txt";
  std::vector<exec::cpu::RunResult> runs;
  for (const char* mode : {"none", "layers"}) {
    sc.parallel.param_offload = mode;
    runs.push_back(exec::cpu::run_cpu(planner::build_plan(sc, "1f1b").lowered, opt));
  }
  const auto median_ms = [](const exec::cpu::RunResult& r) {
    std::vector<double> t(r.iteration_seconds.begin() + 1, r.iteration_seconds.end());
    return traces::median(t) * 1e3;
  };
  std::string peaks;
  for (std::size_t w = 0; w < runs[0].param_state_peak_bytes.size(); ++w)
    peaks += fmt::format("  rank {}: {:.1f} → {:.1f} KiB ({:+.1f} %)", w, runs[0].param_state_peak_bytes[w] / 1024.0,
                         runs[1].param_state_peak_bytes[w] / 1024.0,
                         100.0 * (double(runs[1].param_state_peak_bytes[w]) / double(runs[0].param_state_peak_bytes[w]) - 1));
  fmt::print("tiny, {} layers on 2 stages, 1f1b, 20 steps: iteration {:.2f} → {:.2f} ms (median after step 0, {:+.1f} %); "
             "losses equal: {}\n  weights + Adam state on the device, peak:{}\n",
             layers, median_ms(runs[0]), median_ms(runs[1]), 100 * (median_ms(runs[1]) / median_ms(runs[0]) - 1),
             runs[0].loss_per_step == runs[1].loss_per_step ? "yes" : "NO", peaks);
}

}  // namespace

int main(int argc, char** argv) {
  if (tdpipe::bench::help_requested(argc, argv)) return 0;
  fmt::print("Executed (CPU backend, none → layers):\n");
  executed(4);
  executed(8);
  fmt::print("\nPredicted:\n");
  const std::string path =
      argc > 1 ? argv[1] : std::string(TDPIPE_SOURCE_DIR) + "/scenarios/llama2-70b-a100-4x8.yaml";
  const ir::Scenario base = ir::load_scenario(path);
  fmt::print("{}: t={} p={} d={} m={} on {}×{} {}; host link {:.0f} GB/s per GPU each way\n", base.name,
             base.parallel.tensor, base.parallel.pipeline, base.parallel.data, base.parallel.microbatches(),
             base.cluster.nodes(), base.cluster.gpus_per_node, base.cluster.groups.front().gpu.name,
             ir::host_link_bytes_per_second(base.cluster, base.cluster.groups.front().gpu) / 1e9);
  fmt::print("{:<10} {:>2} | {:>10} {:>10} {:>9} | {:>10} {:>10} {:>9} {:>9} {:>6} | {:>7} {:>7}\n", "schedule", "S",
             "none: sim", "analytic", "peak", "layers: sim", "analytic", "peak", "PCIe GB", "busy", "memory", "time");
  const std::vector<std::pair<std::string, int>> rows = {{"1f1b", 1}, {"zb-h1", 1}, {"interleaved", 1}, {"tdpipe", 2}};
  for (const auto& [schedule, slices] : rows) {
    ir::Scenario off = base;
    off.parallel.param_offload = "layers";
    const Row a = predict(base, schedule, slices);
    const Row b = predict(off, schedule, slices);
    fmt::print("{:<10} {:>2} | {:>8.3f} s {:>8.3f} s {:>5.1f} GiB | {:>9.3f} s {:>8.3f} s {:>5.1f} GiB {:>9.1f} {:>5.0f}% | {:>+6.1f}% {:>+6.1f}%\n",
               schedule, slices, a.sim_s, a.analytic_s, a.peak_gib, b.sim_s, b.analytic_s, b.peak_gib, b.copy_gb,
               100 * b.copy_busy, 100 * (b.peak_gib / a.peak_gib - 1), 100 * (b.sim_s / a.sim_s - 1));
  }
  fmt::print("(peak: weights + gradients + optimizer state + peak activations per GPU, the worst rank; PCIe GB and busy: "
             "rank 0's copies per step and the share of the step its copy engine runs)\n");
  return 0;
}
