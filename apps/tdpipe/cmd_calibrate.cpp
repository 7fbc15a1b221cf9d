// cmd_calibrate.cpp — `tdpipe calibrate --backend cpu SCENARIO -o profile.json`:
// measure this machine's op costs for the scenario's layers and its transport, as a
// profile `tdpipe sim --profile` reads; and `tdpipe calibrate --from-run SCENARIO
// --iteration-time T`: fit the software stack's compute efficiency to one observed run,
// as a profile that predicts any layout and scale on those GPUs.
#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "commands.hpp"
#include "cuda_commands.hpp"
#include "exec_common.hpp"
#include "tdpipe/exec/cpu/calibrate.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/ir/text.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/cost_fit.hpp"
#include "tdpipe/planner/generators.hpp"
#include "tdpipe/planner/stack_fit.hpp"
#include "tdpipe/traces/profile.hpp"

namespace tdpipe::apps {
namespace {

struct CalibrateArgs {
  std::string scenario;
  std::string backend = "cpu";
  std::string output;
  std::string schedule;
  int slices = 0;
  int steps = 5;
  int warmup = 3;
  std::string corpus;
  std::string shared_capacity;  // "", "fit" or a number
  std::int64_t max_ops = 0;
  std::string probes;           // layouts to fit the cost model on (default kDefaultProbes)
  bool probes_given = false;    // --probes on the command line (an empty list is an error)
  bool show_fit = false;        // print every measured op group beside the fit
  bool from_run = false;        // fit the compute efficiency to an observed run
  double iteration_time = 0, mfu = 0, tokens_per_s = 0;  // the observation (one of them)
};

// ---- --from-run: one observed run → cluster.compute_efficiency (planner/stack_fit.hpp) ----

void run_calibrate_from_run(const CalibrateArgs& a) {
  const int given = (a.iteration_time > 0) + (a.mfu > 0) + (a.tokens_per_s > 0);
  if (given != 1)
    throw Error("--from-run needs exactly one observation of the run: --iteration-time SECONDS, --mfu PERCENT "
                "or --tokens-per-s N");
  if (planner::is_plan_file(a.scenario))
    throw Error(fmt::format("{}: --from-run fits the cost model by planning the scenario at several efficiencies; "
                            "give the scenario file, not a plan file (its costs are fixed)",
                            a.scenario));
  ir::Scenario sc = ir::load_scenario(a.scenario);
  const std::string schedule = a.schedule.empty() ? sc.schedule : a.schedule;
  sc.cluster.compute_efficiency = 1;
  const planner::StackFit modelled = planner::predict_with_efficiency(sc, schedule, a.slices, 1, a.max_ops);
  // MFU and tokens/s are inversely proportional to the iteration for a fixed layout.
  const double at_one = modelled.fitted_seconds;
  const double target = a.iteration_time > 0 ? a.iteration_time
                        : a.mfu > 0          ? at_one * (100 * modelled.fitted_mfu) / a.mfu
                                             : double(sc.parallel.global_batch) * sc.model.seq / a.tokens_per_s;
  planner::StackFit fit;
  try {
    fit = planner::fit_compute_efficiency(sc, schedule, a.slices, target, a.max_ops);
  } catch (const Error& e) {
    if (a.mfu > 0 && a.mfu < 1)
      throw Error(fmt::format("{} (--mfu is in percent: {} means {} %, not {:.0f} %)", e.what(), a.mfu, a.mfu,
                              100 * a.mfu));
    throw;
  }
  const double efficiency = fit.efficiency;
  sc.cluster.compute_efficiency = efficiency;
  // The cost model's efficiencies are what well-tuned kernels reach (docs/BENCHMARKS.md);
  // a stack much faster than that more likely means an observation of another layout.
  if (efficiency > 1.25)
    fmt::print(stderr, "warning: the fit says this stack runs compute {:.0f} % faster than the cost model's "
                       "efficiencies allow; check the observation and the scenario's layout (batch, t, p, d, "
                       "recompute) against the run's\n", 100 * (efficiency - 1));

  traces::Profile prof;
  prof.compute_efficiency = efficiency;
  prof.platform.backend = "from-run";
  std::string gpus;
  for (const auto& g : sc.cluster.groups)
    if (("," + gpus + ",").find("," + g.gpu.name + ",") == std::string::npos)
      gpus += (gpus.empty() ? "" : ",") + g.gpu.name;
  prof.platform.device = gpus;
  prof.platform.description = fmt::format("software stack fitted to an observed iteration of {:.6g} s of {} ({}, "
                                          "t={} p={} d={}, {} GPUs)", target, sc.name, schedule, sc.parallel.tensor,
                                          sc.parallel.pipeline, sc.parallel.data, sc.cluster.gpus());
  prof.metadata["fitted_from"] = a.scenario;
  prof.metadata["schedule"] = schedule;
  prof.metadata["observed_iteration_seconds"] = fmt::format("{:.9g}", target);
  prof.metadata["modelled_iteration_seconds"] = fmt::format("{:.9g}", fit.modelled_seconds);
  prof.metadata["fitted_iteration_seconds"] = fmt::format("{:.9g}", fit.fitted_seconds);
  prof.metadata["engine"] = "analytic";
  traces::write_profile(prof, a.output);
  fmt::print("{}: compute efficiency {:.4f} on {} — compute kernels at {:.1f} % of the cost model's speed.\n"
             "  {} ({}): observed {:.4g} s an iteration; modelled {:.4g} s (MFU {:.1f} %); fitted {:.4g} s "
             "(MFU {:.1f} %)\n"
             "  predict any layout or scale on these GPUs: tdpipe sim OTHER.yaml --profile {}\n",
             a.output, efficiency, gpus, 100 * efficiency, sc.name, schedule, target, fit.modelled_seconds,
             100 * fit.modelled_mfu, fit.fitted_seconds, 100 * fit.fitted_mfu, a.output);
}

exec::cpu::SharingChoice sharing_choice(const std::string& text) {
  exec::cpu::SharingChoice c;
  if (text.empty()) return c;
  if (text == "fit") {
    c.fit = true;
    return c;
  }
  std::size_t used = 0;
  try {
    c.capacity = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(c.capacity > 0))
    throw Error("--shared-capacity " + text + ": expected `fit` or a positive number of ops the device runs at "
                "full speed at once");
  return c;
}

// ---- probes: the cost model's own parameters fitted to several layouts (cost_fit.hpp) ----

// Layouts that exercise every term the model has on a scenario's pipeline: split B and W
// with whole chunks and single layers (zb-h1, zb-v), fused BW likewise (1f1b,
// interleaved), and short slices after prefixes (tdpipe S=4).
constexpr const char* kDefaultProbes = "zb-h1,zb-v,1f1b,interleaved,tdpipe:4";

struct Probe {
  std::string schedule;
  int slices = 0;
};

std::vector<Probe> parse_probes(const std::string& text) {
  std::vector<Probe> out;
  for (const std::string& item : ir::split_commas(text)) {
    const std::size_t colon = item.find(':');
    Probe p{item.substr(0, colon), 0};
    const auto& names = planner::schedule_names();
    if (std::find(names.begin(), names.end(), p.schedule) == names.end())
      throw Error(fmt::format("--probes: '{}': expected SCHEDULE or SCHEDULE:SLICES with a schedule of {}", item,
                              fmt::join(names, ", ")));
    if (colon != std::string::npos) {
      std::size_t used = 0;
      try {
        p.slices = std::stoi(item.substr(colon + 1), &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != item.size() - colon - 1 || p.slices < 1 || p.slices > 4096)
        throw Error(fmt::format("--probes: '{}': expected a slice count 1 … 4096 after ':'", item));
    }
    for (const Probe& seen : out)
      if (seen.schedule == p.schedule && seen.slices == p.slices)
        throw Error(fmt::format("--probes: '{}' is given twice", item));
    out.push_back(p);
  }
  return out;
}

// Runs each probe layout of `a.scenario` through `measure` (one backend's calibration of
// one plan), fits the cost model on them and writes the profile.
void run_calibrate_probes(const CalibrateArgs& a, const std::function<traces::Profile(const ir::Plan&)>& measure) {
  const ir::Scenario sc = ir::load_scenario(a.scenario);
  if (sc.synthetic)
    throw Error(fmt::format("{}: scenario '{}' is synthetic (its op times are given): there is no cost model to fit; "
                            "measure one schedule with --schedule", a.scenario, sc.name));
  std::vector<ir::Plan> plans;
  std::vector<traces::Profile> measured;
  const std::vector<Probe> probes = parse_probes(a.probes_given ? a.probes : kDefaultProbes);
  for (const Probe& probe : probes) {
    const std::string name = probe.slices > 0 ? fmt::format("{} S={}", probe.schedule, probe.slices) : probe.schedule;
    try {
      plans.push_back(planner::build_plan(sc, probe.schedule, probe.slices, a.max_ops).lowered);
    } catch (const Error& e) {
      fmt::print(stderr, "note: probe {} skipped: {}\n", name, e.what());
      continue;
    }
    fmt::print(stderr, "probe {} ({} of {})\n", name, plans.size(), probes.size());
    measured.push_back(measure(plans.back()));
  }
  if (measured.empty()) throw Error(fmt::format("{}: no probe layout could be planned for this scenario", a.scenario));
  planner::CostFit fit;
  const traces::Profile prof = planner::fitted_profile(plans, measured, &fit);
  traces::write_profile(prof, a.output);

  const auto& m = prof.metadata;
  fmt::print("{}: cost model fitted to {} op groups of {} probe layouts ({}); |error| per group median {:.1f} %, "
             "max {:.1f} %; p2p hand-off {:.1f} us; shared capacity {}\n",
             a.output, fit.points.size(), plans.size(), fmt::join(ir::split_commas(m.at("probes")), ", "),
             100 * std::stod(m.at("fit_median_abs_error")), 100 * std::stod(m.at("fit_max_abs_error")),
             prof.p2p.latency_seconds * 1e6, m.count("shared_capacity") ? m.at("shared_capacity") : "-");
  // The coefficients: "op" and "layer" in µs, the parts as multiples of their time at peak.
  fmt::print("  {:<4}", "kind");
  for (int i = 0; i < traces::kCostTermCount; ++i)
    fmt::print(" {:>11}", i < 2 ? fmt::format("{} (us)", traces::kCostTerms[i]) : std::string(traces::kCostTerms[i]));
  fmt::print("\n");
  for (const auto& [kind, c] : fit.model.coefficients) {
    fmt::print("  {:<4}", ir::to_string(kind));
    for (int i = 0; i < traces::kCostTermCount; ++i)
      fmt::print(" {:>11.3g}", c[static_cast<std::size_t>(i)] * (i < 2 ? 1e6 : 1.0));
    fmt::print("\n");
  }
  if (a.show_fit) {
    fmt::print("  {:<22} {:<4} {:>5} {:>5} {:>7} {:>12} {:>12} {:>8}\n", "probe", "kind", "stage", "slice", "samples",
               "measured us", "fitted us", "error");
    for (const auto& p : fit.points)
      fmt::print("  {:<22} {:<4} {:>5} {:>5} {:>7} {:>12.1f} {:>12.1f} {:>+7.1f}%\n", p.layout, ir::to_string(p.kind),
                 p.virtual_stage, p.slice, p.samples, p.measured_seconds * 1e6, p.fitted_seconds * 1e6,
                 100 * (p.fitted_seconds - p.measured_seconds) / p.measured_seconds);
  }
  fmt::print("  predict any schedule of this scenario: tdpipe sim {} --schedule S --profile {}\n", a.scenario,
             a.output);
}

void run_calibrate(const CalibrateArgs& a) {
  if (a.from_run) return run_calibrate_from_run(a);
  exec::cpu::keep_freed_memory();  // steady step times from the first steps (run.hpp)
  if (a.iteration_time > 0 || a.mfu > 0 || a.tokens_per_s > 0)
    throw Error("--iteration-time, --mfu and --tokens-per-s describe an observed run: give --from-run too");
  if (a.probes_given && (!a.schedule.empty() || a.slices != 0))
    throw Error("--probes fits the cost model on several layouts; --schedule/--slices measure one: give one or the other");
  // Without a layout to measure, the probes fit the cost model (any layout); a plan file
  // or --schedule is measured as it is.
  const bool probing = a.schedule.empty() && a.slices == 0 && !planner::is_plan_file(a.scenario);
  if (!probing && a.probes_given)
    throw Error(fmt::format("{}: a plan file is measured as it is: --probes needs the scenario file", a.scenario));
  if (!probing && a.show_fit)
    throw Error("--show-fit prints the probes' fit: it goes without --schedule, --slices and plan files");
  if (probing && a.shared_capacity == "fit")
    throw Error("--shared-capacity fit fits one run's capacity; the probes are several runs fitted together: give a "
                "number, or leave the default (the CPU's cores, 1 for a GPU)");
#ifdef TDPIPE_HAVE_CUDA
  if (a.backend == "cuda") {
    CudaCalibrateRequest c;
    c.scenario = a.scenario;
    c.schedule = a.schedule;
    c.output = a.output;
    c.corpus = a.corpus;
    c.slices = a.slices;
    c.steps = a.steps;
    c.warmup = a.warmup;
    c.sharing = sharing_choice(a.shared_capacity);
    c.max_ops = a.max_ops;
    if (probing) return run_calibrate_probes(a, [&](const ir::Plan& plan) { return calibrate_cuda_plan(plan, c); });
    run_calibrate_cuda(c);
    return;
  }
#endif
  check_cpu_backend(a.backend);
  exec::cpu::CalibrateOptions opt;
  opt.steps = a.steps;
  opt.warmup_steps = a.warmup;
  opt.train.corpus_path = a.corpus;
  opt.sharing = sharing_choice(a.shared_capacity);
  if (probing) return run_calibrate_probes(a, [&](const ir::Plan& plan) { return exec::cpu::calibrate(plan, opt); });
  const LoadedPlan loaded = load_plan(a.scenario, a.schedule, a.slices, a.max_ops);
  const ir::Scenario& sc = loaded.scenario;
  const std::string& schedule = loaded.schedule;
  const planner::BuiltPlan& built = loaded.built;
  std::vector<ir::Plan> plans{built.lowered};
  // A fused-backward schedule never runs B or W alone; zb-h1 has the same layout
  // (one chunk, no slices) and splits them, so the profile can serve every schedule.
  const bool fused = std::none_of(built.lowered.ranks.begin(), built.lowered.ranks.end(), [](const auto& ops) {
    return std::any_of(ops.begin(), ops.end(), [](const ir::Op& o) { return o.kind == ir::OpKind::W; });
  });
  if (fused && built.lowered.chunks == 1 && built.lowered.slices == 1)
    plans.push_back(planner::build_plan(sc, "zb-h1", 1, a.max_ops).lowered);
  traces::Profile prof = exec::cpu::calibrate(plans, opt);
  if (prof.scenario.empty()) prof.scenario = sc.name;
  traces::write_profile(prof, a.output);
  fmt::print("{}: {} ops measured ({} schedule, p={} v={} S={}), p2p {:.2f} us + {:.2f} GB/s, "
             "all-reduce {:.2f} us + {:.2f} GB/s, {} ranks on {} cores, shared capacity {}\n",
             a.output, prof.ops.size(), schedule, built.lowered.stages, built.lowered.chunks,
             built.lowered.slices, prof.p2p.latency_seconds * 1e6, prof.p2p.bytes_per_second / 1e9,
             prof.collective.latency_seconds * 1e6, prof.collective.bytes_per_second / 1e9,
             prof.platform.ranks, prof.platform.cores, prof.metadata["shared_capacity"]);
}

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto args = std::make_shared<CalibrateArgs>();
  CLI::App* cmd = app.add_subcommand("calibrate", "Fit the cost model to this machine (probe runs) or to an observed run, for sim --profile");
  cmd->add_option("scenario", args->scenario,
                  "Scenario file (YAML or JSON), or a plan file (tdpipe plan --format json -o PLAN.json: run as it is)")->required();
  CLI::Option* backend =
      cmd->add_option("--backend", args->backend, "Executor backend")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("-o,--output", args->output, "Profile to write (JSON)")->required();
  cmd->add_option("--schedule", args->schedule, "Measure this schedule's layout (chunks, slices) alone: op times for this layout only "
                  "(so does --slices alone, with the scenario's schedule; default: fit the cost model on the "
                  "--probes layouts, for any layout)")
      ->check(CLI::IsMember(planner::schedule_names()));
  add_slices_option(cmd, args->slices);
  CLI::Option* steps =
      cmd->add_option("--steps", args->steps, "Measured steps (of each probe)")->check(CLI::PositiveNumber)->capture_default_str();
  CLI::Option* warmup =
      cmd->add_option("--warmup", args->warmup, "Unmeasured steps first (of each probe)")->check(CLI::NonNegativeNumber)->capture_default_str();
  CLI::Option* corpus = cmd->add_option("--corpus", args->corpus, "Training text (default: data/tiny_corpus.txt)");
  CLI::Option* capacity = cmd->add_option("--shared-capacity", args->shared_capacity,
                  "How many ops the shared device runs at full speed at once: a number, or `fit` (from the "
                  "run; default: the CPU's cores, 1 for a GPU)");
  add_max_ops_option(cmd, args->max_ops);
  CLI::Option* probes = cmd->add_option("--probes", args->probes,
                  fmt::format("Without --schedule: the layouts whose runs fit the cost model (default {}); "
                              "SCHEDULE or SCHEDULE:SLICES, comma-separated", kDefaultProbes));
  CLI::Option* show_fit = cmd->add_flag("--show-fit", args->show_fit,
                "With probes: print every measured op group (probe, kind, stage, slice) beside the fitted model");
  CLI::Option* from_run = cmd->add_flag("--from-run", args->from_run,
                "Run nothing: fit the software stack's compute efficiency (cluster.compute_efficiency) so that "
                "the scenario's predicted iteration equals one observed run's (give one of the next three); the "
                "profile then predicts any layout or scale on the same GPUs (tdpipe sim --profile)");
  // A fit runs nothing: the options of a measured calibration do not go with it.
  for (CLI::Option* measured : {backend, steps, warmup, corpus, capacity, probes, show_fit}) from_run->excludes(measured);
  cmd->add_option("--iteration-time", args->iteration_time, "--from-run: the observed seconds per iteration")
      ->check(CLI::Range(1e-9, 1e7));
  cmd->add_option("--mfu", args->mfu,
                  "--from-run: the observed model FLOPs utilisation in percent (Megatron's model FLOPs, no "
                  "recompute; as tdpipe reports it)")
      ->check(CLI::Range(1e-6, 100.0));
  cmd->add_option("--tokens-per-s", args->tokens_per_s, "--from-run: the observed training tokens per second")
      ->check(CLI::Range(1e-9, 1e15));
  cmd->callback([args, probes] {
    args->probes_given = probes->count() > 0;
    run_calibrate(*args);
  });
}

}  // namespace tdpipe::apps
