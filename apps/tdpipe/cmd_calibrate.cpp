// cmd_calibrate.cpp — `tdpipe calibrate --backend cpu SCENARIO -o profile.json`:
// measure this machine's op costs for the scenario's layers and its transport, as a
// profile `tdpipe sim --profile` reads.
#include <algorithm>
#include <exception>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "commands.hpp"
#include "cuda_commands.hpp"
#include "exec_common.hpp"
#include "tdpipe/exec/cpu/calibrate.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/generators.hpp"
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
  int warmup = 2;
  std::string corpus;
  std::string shared_capacity;  // "", "fit" or a number
  std::int64_t max_ops = 0;
};

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

void run_calibrate(const CalibrateArgs& a) {
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
    run_calibrate_cuda(c);
    return;
  }
#endif
  check_cpu_backend(a.backend);
  const LoadedPlan loaded = load_plan(a.scenario, a.schedule, a.slices, a.max_ops);
  const ir::Scenario& sc = loaded.scenario;
  const std::string& schedule = loaded.schedule;
  const planner::BuiltPlan& built = loaded.built;
  exec::cpu::CalibrateOptions opt;
  opt.steps = a.steps;
  opt.warmup_steps = a.warmup;
  opt.train.corpus_path = a.corpus;
  opt.sharing = sharing_choice(a.shared_capacity);
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
  CLI::App* cmd = app.add_subcommand("calibrate", "Measure op costs and transport on this machine");
  cmd->add_option("scenario", args->scenario, "Scenario file (YAML)")->required();
  cmd->add_option("--backend", args->backend, "Executor backend")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("-o,--output", args->output, "Profile to write (JSON)")->required();
  cmd->add_option("--schedule", args->schedule, "Schedule whose layout (chunks, slices) is measured")
      ->check(CLI::IsMember(planner::schedule_names()));
  add_slices_option(cmd, args->slices);
  cmd->add_option("--steps", args->steps, "Measured steps")->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", args->warmup, "Unmeasured steps first")->check(CLI::NonNegativeNumber);
  cmd->add_option("--corpus", args->corpus, "Training text (default: data/tiny_corpus.txt)");
  cmd->add_option("--shared-capacity", args->shared_capacity,
                  "How many ops the shared device runs at full speed at once: a number, or `fit` (from the "
                  "run; default: the CPU's cores, 1 for a GPU)");
  add_max_ops_option(cmd, args->max_ops);
  cmd->callback([args] { run_calibrate(*args); });
}

}  // namespace tdpipe::apps
