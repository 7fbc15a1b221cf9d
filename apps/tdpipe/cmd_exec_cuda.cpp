// cmd_exec_cuda.cpp — `tdpipe exec … --backend cuda [--transport nccl|loopback]` and
// `tdpipe calibrate --backend cuda`: same outputs as the CPU backend, from the CUDA
// backend. Compiled to nothing without it.
#include "cuda_commands.hpp"

#if defined(TDPIPE_HAVE_CUDA)

#include <algorithm>
#include <cmath>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/exec/cuda/calibrate.hpp"
#include "tdpipe/exec/cuda/run.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/traces/chrome_json.hpp"
#include "tdpipe/traces/profile.hpp"

namespace tdpipe::apps {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double max_rel(const exec::cpu::ParamMap& got, const exec::cpu::ParamMap& want) {
  double worst = 0;
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    if (it == got.end()) continue;  // NCCL runs hold only this process's tensors
    double num = 0, den = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      num += (it->second[i] - w[i]) * (it->second[i] - w[i]);
      den += w[i] * w[i];
    }
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
  return worst;
}

}  // namespace

void run_exec_cuda(const CudaExecRequest& a) {
  const ir::Scenario sc = ir::load_scenario(a.scenario);
  const std::string schedule = a.schedule.empty() ? sc.schedule : a.schedule;
  const planner::BuiltPlan built = planner::build_plan(sc, schedule, a.slices);
  const ir::Plan& plan = built.lowered;

  exec::cuda::CudaRunOptions opt;
  opt.train.steps = a.steps;
  opt.train.adam.lr = a.lr;
  opt.train.data_seed = a.seed;
  opt.train.corpus_path = a.corpus;
  opt.transport = exec::cuda::transport_from_string(a.transport);
  opt.watchdog_seconds = a.watchdog;
  opt.device = a.device;
  const exec::cuda::CudaRunResult r = exec::cuda::run_cuda(plan, opt);
  if (!a.trace_out.empty()) {
    // Without MPI each NCCL process has only its own events: one file per process.
    const bool own_file = !r.root || (r.world_size > 1 && !exec::cuda::built_with_mpi());
    traces::write_trace(r.run.trace, own_file ? fmt::format("{}.rank{}", a.trace_out, r.world_rank) : a.trace_out);
  }
  if (!r.root) return;

  const auto& its = r.run.iteration_seconds;
  std::vector<double> steady(its.begin() + (its.size() > 1 ? 1 : 0), its.end());
  const double iteration = median(steady);
  nlohmann::json j;
  j["scenario"] = sc.name;
  j["schedule"] = plan.schedule;
  j["backend"] = "cuda";
  j["transport"] = a.transport;
  j["device"] = r.device_name;
  j["processes"] = r.world_size;
  j["pipeline"] = plan.stages;
  j["data"] = plan.data;
  j["microbatches"] = plan.microbatches;
  j["chunks"] = plan.chunks;
  j["slices"] = plan.slices;
  j["steps"] = a.steps;
  j["loss_per_step"] = r.run.loss_per_step;
  j["final_loss"] = r.run.loss_per_step.empty() ? 0.0 : r.run.loss_per_step.back();
  j["weights_l2"] = r.weights_l2;
  j["iteration_time"] = iteration;
  j["iteration_times"] = its;
  if (!a.trace_out.empty()) j["trace"] = a.trace_out;
  if (a.check) {
    exec::cpu::TrainOptions t = opt.train;
    const auto ref = exec::cpu::run_reference(sc, plan.data, plan.microbatches, t);
    double loss_err = 0;
    for (std::size_t i = 0; i < ref.loss_per_step.size(); ++i)
      loss_err = std::max(loss_err, std::abs(r.run.loss_per_step[i] - ref.loss_per_step[i]) /
                                        std::abs(ref.loss_per_step[i]));
    j["reference"] = {{"max_rel_loss_error", loss_err},
                      {"max_rel_weight_error", max_rel(r.run.weights, ref.weights)},
                      {"max_rel_grad_error", max_rel(r.run.grads, ref.grads)},
                      {"note", "CPU fp64 single-device reference; the GPU computes GEMMs in bf16"}};
  }
  if (a.json) {
    std::cout << j.dump(2) << "\n";
    return;
  }
  fmt::print("{} on {}: p={} d={} m={} v={} S={}, cuda backend ({} transport, {}), {} steps\n", plan.schedule,
             sc.name, plan.stages, plan.data, plan.microbatches, plan.chunks, plan.slices, a.transport,
             r.device_name, a.steps);
  for (std::size_t i = 0; i < r.run.loss_per_step.size(); ++i)
    if (i < 5 || i + 5 >= r.run.loss_per_step.size() || i % 50 == 0)
      fmt::print("  step {:>4}  loss {:.6f}  {:.3f} ms\n", i, r.run.loss_per_step[i], its[i] * 1e3);
  fmt::print("final loss {:.6f}, weights L2 {:.9g}, iteration time {:.3f} ms (median after step 0)\n",
             j["final_loss"].get<double>(), r.weights_l2, iteration * 1e3);
  if (a.check)
    fmt::print("vs single-device fp64 reference: loss {:.2e}, weights {:.2e}, grads {:.2e} (max relative)\n",
               j["reference"]["max_rel_loss_error"].get<double>(),
               j["reference"]["max_rel_weight_error"].get<double>(),
               j["reference"]["max_rel_grad_error"].get<double>());
  if (!a.trace_out.empty()) fmt::print("measured trace (last step): {}\n", a.trace_out);
}

void run_calibrate_cuda(const CudaCalibrateRequest& a) {
  const ir::Scenario sc = ir::load_scenario(a.scenario);
  const std::string schedule = a.schedule.empty() ? sc.schedule : a.schedule;
  const planner::BuiltPlan built = planner::build_plan(sc, schedule, a.slices);
  exec::cuda::CudaCalibrateOptions opt;
  opt.steps = a.steps;
  opt.warmup_steps = a.warmup;
  opt.train.corpus_path = a.corpus;
  opt.device = a.device;
  traces::Profile prof = exec::cuda::calibrate(built.lowered, opt);
  if (prof.scenario.empty()) prof.scenario = sc.name;
  traces::write_profile(prof, a.output);
  fmt::print("{}: {} ops measured on {} ({} schedule, p={} v={} S={}), loopback p2p {:.2f} us + {:.2f} GB/s, "
             "all-reduce {:.2f} us + {:.2f} GB/s\n",
             a.output, prof.ops.size(), prof.platform.device, schedule, built.lowered.stages, built.lowered.chunks,
             built.lowered.slices, prof.p2p.latency_seconds * 1e6, prof.p2p.bytes_per_second / 1e9,
             prof.collective.latency_seconds * 1e6, prof.collective.bytes_per_second / 1e9);
}

}  // namespace tdpipe::apps

#endif  // TDPIPE_HAVE_CUDA
