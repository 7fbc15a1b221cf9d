// bench_loss_scale.cpp — fp16 training with per-slice dynamic loss scaling, side by side
// in one run, on the CPU executor (tiny-gpt-cpu, p = 2, TD-Pipe with 2 slices):
//  1. the loss curve of fp64, fp16 with the per-slice dynamic scaler, and fp16 with no
//     scaling (static scale 1), over LOSS_STEPS steps;
//  2. the first step's gradients against fp64's (worst tensor's relative error), scaled
//     and unscaled — the underflow a scale is there to prevent;
//  3. a scaler started far too high (2⁴⁰): the steps it skips backing off, and where each
//     slice's scale settles;
//  4. the cost of the emulation: median iteration time of fp16 (every activation and
//     gradient store rounded through binary16) over fp64's.
//
//   build/<dir>/bench/bench_loss_scale [SOURCE_DIR] [LOSS_STEPS]
#include "bench_help.hpp"
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"

using namespace tdpipe;

namespace {

exec::cpu::RunResult train(const ir::Scenario& sc, int steps, const std::string& root) {
  exec::cpu::CpuRunOptions opt;
  opt.train.steps = steps;
  opt.train.corpus_path = root + "/data/tiny_corpus.txt";
  opt.train.adam.lr = 1e-2;  // as the tests train the tiny corpus
  return exec::cpu::run_cpu(planner::build_plan(sc, "tdpipe").lowered, opt);
}

double worst_rel(const exec::cpu::ParamMap& got, const exec::cpu::ParamMap& want, std::string* name) {
  double worst = 0;
  for (const auto& [n, w] : want) {
    const auto& g = got.at(n);
    double num = 0, den = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      num += (g[i] - w[i]) * (g[i] - w[i]);
      den += w[i] * w[i];
    }
    const double e = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    if (e > worst) {
      worst = e;
      *name = n;
    }
  }
  return worst;
}

double median(std::vector<double> v) {
  if (v.size() > 1) v.erase(v.begin());  // step 0: allocations
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (tdpipe::bench::help_requested(argc, argv)) return 0;
  const std::string root = argc > 1 ? argv[1] : TDPIPE_SOURCE_DIR;
  const int steps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 200;
  ir::Scenario fp64 = ir::load_scenario(root + "/scenarios/tiny-gpt-cpu.yaml");  // dtype fp32: the executor's fp64
  ir::Scenario fp16 = fp64;
  fp16.model.dtype = "fp16";
  fp16.parallel.initial_loss_scale = 65536;  // PyTorch GradScaler's start
  ir::Scenario plain = fp16;
  plain.parallel.loss_scale = 1;

  fmt::print("tiny-gpt-cpu, tdpipe S=2, p=2, {} steps, Adam lr 1e-2\n\n", steps);
  const auto a = train(fp64, steps, root), b = train(fp16, steps, root), c = train(plain, steps, root);
  fmt::print("1. loss           fp64      fp16 dynamic   fp16 unscaled\n");
  for (int s = 0; s < steps; ++s)
    if (s < 3 || s + 1 == steps || (s + 1) % std::max(1, steps / 8) == 0)
      fmt::print("   step {:>4}  {:.6f}   {:.6f}       {:.6f}\n", s, a.loss_per_step[s], b.loss_per_step[s],
                 c.loss_per_step[s]);
  // One step's loss is noisy (each step draws new sequences): the last quarter's mean.
  const int tail = std::max(1, steps / 4);
  auto tail_mean = [&](const exec::cpu::RunResult& r) {
    double sum = 0;
    for (int s = steps - tail; s < steps; ++s) sum += r.loss_per_step[s];
    return sum / tail;
  };
  fmt::print("   mean of the last {} steps: {:.6f}   {:.6f}       {:.6f}\n", tail, tail_mean(a), tail_mean(b),
             tail_mean(c));
  int skipped = 0;
  for (const auto& st : b.loss_scale) skipped += st.skipped;
  fmt::print("   fp16 dynamic: {} steps skipped, scales now {}\n\n", skipped,
             exec::scales_text(b.state.loss_scale.scales));

  const auto a1 = train(fp64, 1, root), b1 = train(fp16, 1, root), c1 = train(plain, 1, root);
  std::string nb, nc;
  const double eb = worst_rel(b1.grads, a1.grads, &nb), ec = worst_rel(c1.grads, a1.grads, &nc);
  fmt::print("2. step 0 gradients vs fp64 (worst tensor, relative): scaled (65536) {:.2e} ({}), unscaled {:.2e} "
             "({}), ratio {:.1f}\n\n", eb, nb, ec, nc, ec / eb);

  ir::Scenario high = fp16;
  high.parallel.initial_loss_scale = 0x1p40;
  const auto h = train(high, 40, root);
  int backed = 0, first_good = -1;
  for (std::size_t k = 0; k < h.loss_scale.size(); ++k) {
    backed += h.loss_scale[k].skipped;
    if (first_good < 0 && !h.loss_scale[k].skipped) first_good = static_cast<int>(k);
  }
  fmt::print("3. started at 2^40: {} of 40 steps skipped, first applied step {}, scales now {} (log2 {:.0f}, {:.0f})\n\n",
             backed, first_good, exec::scales_text(h.state.loss_scale.scales),
             std::log2(h.state.loss_scale.scales.at(0)), std::log2(h.state.loss_scale.scales.at(1)));

  const double t64 = median(a.iteration_seconds), t16 = median(b.iteration_seconds);
  fmt::print("4. median iteration: fp64 {:.3f} ms, fp16 emulated {:.3f} ms, ratio {:.2f}\n", t64 * 1e3, t16 * 1e3,
             t16 / t64);
  return 0;
}
