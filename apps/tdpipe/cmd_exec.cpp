// cmd_exec.cpp — `tdpipe exec SCENARIO --backend cpu`: train the scenario's model
// through a schedule for real, print losses and timing, write the measured trace.
#include <algorithm>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "cuda_commands.hpp"
#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/generators.hpp"
#include "tdpipe/traces/chrome_json.hpp"

namespace tdpipe::apps {
namespace {

struct ExecArgs {
  std::string scenario;
  std::string backend = "cpu";
  std::string schedule;
  int slices = 0;
  int steps = 20;
  double lr = 3e-3;
  std::uint64_t seed = 7;
  std::string corpus;
  double watchdog = 30;
  std::string trace_out;
  bool json = false;
  bool check = false;
  bool pin = false;                    // cpu backend
  std::string transport = "loopback";  // cuda backend
  int device = -1;                     // cuda backend, loopback
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double max_rel(const exec::cpu::ParamMap& got, const exec::cpu::ParamMap& want) {
  double worst = 0;
  for (const auto& [name, w] : want) {
    const auto& g = got.at(name);
    double num = 0, den = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      num += (g[i] - w[i]) * (g[i] - w[i]);
      den += w[i] * w[i];
    }
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
  return worst;
}

void run_exec(const ExecArgs& a) {
  if (a.backend == "cuda") {
#ifdef TDPIPE_HAVE_CUDA
    CudaExecRequest c;
    c.scenario = a.scenario;
    c.schedule = a.schedule;
    c.transport = a.transport;
    c.trace_out = a.trace_out;
    c.corpus = a.corpus;
    c.slices = a.slices;
    c.steps = a.steps;
    c.device = a.device;
    c.lr = a.lr;
    c.watchdog = a.watchdog;
    c.seed = a.seed;
    c.json = a.json;
    c.check = a.check;
    run_exec_cuda(c);
    return;
#else
    throw Error("--backend cuda: this tdpipe was built without the CUDA backend (configure with "
                "-DTDPIPE_WITH_CUDA=ON on a machine with nvcc and NCCL, e.g. the `gpu` preset)");
#endif
  }
  if (a.backend != "cpu")
    throw Error(fmt::format("--backend {}: expected cpu or cuda", a.backend));
  const ir::Scenario sc = ir::load_scenario(a.scenario);
  const std::string schedule = a.schedule.empty() ? sc.schedule : a.schedule;
  const planner::BuiltPlan built = planner::build_plan(sc, schedule, a.slices);
  const ir::Plan& plan = built.lowered;

  exec::cpu::CpuRunOptions opt;
  opt.train.steps = a.steps;
  opt.train.adam.lr = a.lr;
  opt.train.data_seed = a.seed;
  opt.train.corpus_path = a.corpus;
  opt.watchdog_seconds = a.watchdog;
  opt.pin_threads = a.pin;
  const exec::cpu::RunResult r = exec::cpu::run_cpu(plan, opt);
  if (!a.trace_out.empty()) traces::write_trace(r.trace, a.trace_out);

  // The first step pays for allocations; the median of the rest is the steady state.
  std::vector<double> steady(r.iteration_seconds.begin() + (r.iteration_seconds.size() > 1 ? 1 : 0),
                             r.iteration_seconds.end());
  const double iteration = median(steady);
  const double l2 = exec::cpu::weights_l2(r.weights);
  nlohmann::json j;
  j["scenario"] = sc.name;
  j["schedule"] = plan.schedule;
  j["backend"] = "cpu";
  j["pipeline"] = plan.stages;
  j["data"] = plan.data;
  j["microbatches"] = plan.microbatches;
  j["chunks"] = plan.chunks;
  j["slices"] = plan.slices;
  j["steps"] = a.steps;
  j["loss_per_step"] = r.loss_per_step;
  j["final_loss"] = r.loss_per_step.empty() ? 0.0 : r.loss_per_step.back();
  j["weights_l2"] = l2;
  j["iteration_time"] = iteration;
  j["iteration_times"] = r.iteration_seconds;
  if (!a.trace_out.empty()) j["trace"] = a.trace_out;
  if (a.check) {
    const auto ref = exec::cpu::run_reference(sc, plan.data, plan.microbatches, opt.train);
    double loss_err = 0;
    for (std::size_t i = 0; i < ref.loss_per_step.size(); ++i)
      loss_err = std::max(loss_err, std::abs(r.loss_per_step[i] - ref.loss_per_step[i]) /
                                        std::abs(ref.loss_per_step[i]));
    j["reference"] = {{"max_rel_loss_error", loss_err},
                      {"max_rel_weight_error", max_rel(r.weights, ref.weights)},
                      {"max_rel_grad_error", max_rel(r.grads, ref.grads)}};
  }
  if (a.json) {
    std::cout << j.dump(2) << "\n";
    return;
  }
  fmt::print("{} on {}: p={} d={} m={} v={} S={}, cpu backend, {} steps\n", plan.schedule, sc.name,
             plan.stages, plan.data, plan.microbatches, plan.chunks, plan.slices, a.steps);
  for (std::size_t i = 0; i < r.loss_per_step.size(); ++i)
    if (i < 5 || i + 5 >= r.loss_per_step.size() || i % 50 == 0)
      fmt::print("  step {:>4}  loss {:.6f}  {:.2f} ms\n", i, r.loss_per_step[i], r.iteration_seconds[i] * 1e3);
  fmt::print("final loss {:.6f}, weights L2 {:.9g}, iteration time {:.3f} ms (median after step 0)\n",
             j["final_loss"].get<double>(), l2, iteration * 1e3);
  if (a.check)
    fmt::print("vs single-device reference: loss {:.2e}, weights {:.2e}, grads {:.2e} (max relative)\n",
               j["reference"]["max_rel_loss_error"].get<double>(),
               j["reference"]["max_rel_weight_error"].get<double>(),
               j["reference"]["max_rel_grad_error"].get<double>());
  if (!a.trace_out.empty()) fmt::print("measured trace (last step): {}\n", a.trace_out);
}

}  // namespace

void add_exec_command(CLI::App& app) {
  auto args = std::make_shared<ExecArgs>();
  CLI::App* cmd = app.add_subcommand("exec", "Train the scenario's model through a schedule, for real");
  cmd->add_option("scenario", args->scenario, "Scenario file (YAML)")->required();
  cmd->add_option("--backend", args->backend, "Executor backend")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--schedule", args->schedule, "Schedule (default: the scenario's)")
      ->check(CLI::IsMember(planner::schedule_names()));
  cmd->add_option("--slices", args->slices, "Temporal slices S (tdpipe)")->check(CLI::PositiveNumber);
  cmd->add_option("--steps", args->steps, "Optimizer steps")->check(CLI::NonNegativeNumber);
  cmd->add_option("--lr", args->lr, "Adam learning rate");
  cmd->add_option("--seed", args->seed, "Data sampling seed");
  cmd->add_option("--corpus", args->corpus, "Training text (default: data/tiny_corpus.txt)");
  cmd->add_option("--watchdog", args->watchdog, "Seconds without progress before a run is declared hung");
  cmd->add_option("--trace-out", args->trace_out, "Write the last step's measured trace (Chrome JSON)");
  cmd->add_option("--transport", args->transport,
                  "cuda backend: loopback (every stage on one GPU) or nccl (one process per GPU)")
      ->check(CLI::IsMember({"loopback", "nccl"}));
  cmd->add_option("--device", args->device, "cuda backend, loopback: GPU index");
  cmd->add_flag("--json", args->json, "Print JSON instead of text");
  cmd->add_flag("--pin", args->pin, "Pin rank w's threads to core w mod cores");
  cmd->add_flag("--check", args->check, "Also run the single-device reference and report the difference");
  cmd->callback([args] { run_exec(*args); });
}

}  // namespace tdpipe::apps
