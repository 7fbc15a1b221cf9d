// cmd_exec.cpp — `tdpipe exec SCENARIO --backend cpu`: train the scenario's model
// through a schedule for real, print losses and timing, write the measured trace.
#include <algorithm>
#include <iostream>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "cuda_commands.hpp"
#include "exec_common.hpp"
#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/planner/balance.hpp"
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
  std::string rank_speed;              // cpu backend: "r:speed,…"
  int balance_every = 0;               // cpu backend: re-balance every K steps (0: never)
  double balance_alpha = 0.3;
  std::string transport = "loopback";  // cuda backend
  int device = -1;                     // cuda backend, loopback
  std::int64_t max_ops = 0;
};

/// --rank-speed "0:1,1:0.5": a speed in [0.01, 1] per listed pipeline rank (each once), 1
/// for the rest.
std::vector<double> parse_rank_speed(const std::string& text, int ranks) {
  std::vector<double> out(static_cast<std::size_t>(ranks), 1.0);
  if (text.empty()) return out;
  std::set<int> seen;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const std::size_t colon = item.find(':');
    int rank = -1;
    double speed = 0;
    std::size_t used_r = 0, used_s = 0;
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no colon");
      rank = std::stoi(item.substr(0, colon), &used_r);
      speed = std::stod(item.substr(colon + 1), &used_s);
    } catch (const std::exception&) {
      used_r = used_s = 0;
    }
    if (colon == std::string::npos || used_r != colon || used_s != item.size() - colon - 1 || used_s == 0)
      throw Error(fmt::format("--rank-speed {}: '{}' is not RANK:SPEED (e.g. 1:0.5)", text, item));
    if (rank < 0 || rank >= ranks)
      throw Error(fmt::format("--rank-speed {}: rank {} is not one of the plan's {} pipeline ranks", text, rank, ranks));
    if (!(speed >= 0.01 && speed <= 1))
      throw Error(fmt::format("--rank-speed {}: speed {} of rank {}; expected 0.01 ≤ speed ≤ 1", text, speed, rank));
    if (seen.count(rank)) throw Error(fmt::format("--rank-speed {}: rank {} is given twice", text, rank));
    seen.insert(rank);
    out[static_cast<std::size_t>(rank)] = speed;
    at = comma + 1;
  }
  return out;
}

void run_exec(const ExecArgs& a) {
#ifdef TDPIPE_HAVE_CUDA
  if (a.backend == "cuda" && (!a.rank_speed.empty() || a.balance_every > 0))
    throw Error("--rank-speed and --balance-every are the CPU backend's (--backend cpu)");
  if (a.backend == "cuda") {
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
    c.max_ops = a.max_ops;
    run_exec_cuda(c);
    return;
  }
#endif
  check_cpu_backend(a.backend);
  const LoadedPlan loaded = load_plan(a.scenario, a.schedule, a.slices, a.max_ops);
  const ir::Scenario& sc = loaded.scenario;
  ir::Plan plan = loaded.built.lowered;

  exec::cpu::CpuRunOptions opt;
  opt.train = train_options(a.steps, a.lr, a.seed, a.corpus);
  opt.watchdog_seconds = a.watchdog;
  opt.pin_threads = a.pin;
  opt.train.rank_speed = parse_rank_speed(a.rank_speed, plan.num_ranks());
  exec::cpu::RunResult r;
  if (a.balance_every > 0 && (plan.chunks != 1 || sc.synthetic))
    throw Error(fmt::format("--balance-every: the balancer re-partitions one model chunk per rank; {} runs {} "
                            "chunks", plan.schedule, plan.chunks));
  if (a.balance_every <= 0 || a.steps == 0) {
    r = exec::cpu::run_cpu(plan, opt);
  } else {
    // The load balancer in the loop: K steps, then each rank's slowdown from every
    // step's measured trace (EWMA), re-partition, re-plan, and go on from the weights and
    // Adam state of the last step (they migrate by name with their layers).
    planner::Ewma ewma(a.balance_alpha);
    ir::Scenario current = sc;
    std::vector<double> losses, iters;
    for (int done = 0; done < a.steps;) {
      opt.train.steps = std::min(a.balance_every, a.steps - done);
      opt.keep_step_traces = true;
      r = exec::cpu::run_cpu(plan, opt);
      for (const auto& t : r.step_traces) ewma.add(planner::measured_slowdown(plan, t));
      done += opt.train.steps;
      losses.insert(losses.end(), r.loss_per_step.begin(), r.loss_per_step.end());
      iters.insert(iters.end(), r.iteration_seconds.begin(), r.iteration_seconds.end());
      opt.start = r.state;
      // Measured: each rank's F/B/W time per micro-batch in the segment's last step.
      std::vector<double> stage_ms(static_cast<std::size_t>(plan.num_ranks()), 0.0);
      for (const auto& e : r.step_traces.back().events)
        if (e.kind && e.rank < plan.num_ranks() && ir::is_chunk_work(*e.kind))
          stage_ms[static_cast<std::size_t>(e.rank)] += 1e-6 * static_cast<double>(e.dur_ns) / plan.microbatches;
      const double measured =
          *std::max_element(stage_ms.begin(), stage_ms.end()) / *std::min_element(stage_ms.begin(), stage_ms.end()) - 1;
      fmt::print(stderr, "steps {}-{} on layers [{}]: F+B+W per micro-batch [{:.1f}] ms, slowest / fastest {:.0f} % "
                 "(measured, last step)\n",
                 done - opt.train.steps, done - 1, fmt::join(plan.stage_layers, ","), fmt::join(stage_ms, ", "),
                 100 * measured);
      if (done >= a.steps) break;
      const planner::Rebalance b = planner::rebalance(current, ewma.value());
      if (b.layers_after == plan.stage_layers && b.scenario.cluster.groups == current.cluster.groups) continue;
      fmt::print(stderr, "step {}: re-balanced to layers [{}] ({:.0f} % predicted)\n", done,
                 fmt::join(b.layers_after, ","), 100 * b.spread_after);
      // Stages that moved to other devices take those devices' history (and, in this
      // emulation, their speed) with them.
      ewma.reorder(b.device_of_stage);
      std::vector<double> speed = opt.train.rank_speed;
      for (std::size_t k = 0; k < speed.size(); ++k)
        speed[k] = opt.train.rank_speed[static_cast<std::size_t>(b.device_of_stage[k])];
      opt.train.rank_speed = speed;
      current = b.scenario;
      plan = planner::build_plan(current, loaded.schedule, a.slices, a.max_ops).lowered;
    }
    r.loss_per_step = std::move(losses);  // every segment's, in order
    r.iteration_seconds = std::move(iters);
    r.step_traces.clear();
    opt.train.steps = a.steps;  // the whole run, for the reference below
  }
  if (!a.trace_out.empty()) traces::write_trace(r.trace, a.trace_out);

  const double iteration = steady_iteration_seconds(r.iteration_seconds);
  const double l2 = exec::cpu::weights_l2(r.weights);
  nlohmann::json j = run_report(sc, plan, a.steps, r, l2, iteration, a.trace_out);
  j["backend"] = "cpu";
  if (a.check)
    add_reference_errors(j, r, exec::cpu::run_reference(sc, plan.data, plan.microbatches, opt.train),
                         /*skip_missing=*/false);
  if (a.json) {
    std::cout << j.dump(2) << "\n";
    return;
  }
  fmt::print("{} on {}: p={} d={} m={} v={} S={}, cpu backend, {} steps\n", plan.schedule, sc.name,
             plan.stages, plan.data, plan.microbatches, plan.chunks, plan.slices, a.steps);
  print_run_report(j, r, l2, iteration, 2, "single-device reference", a.trace_out);
}

}  // namespace

void add_exec_command(CLI::App& app) {
  auto args = std::make_shared<ExecArgs>();
  CLI::App* cmd = app.add_subcommand("exec", "Train the scenario's model through a schedule, for real");
  cmd->add_option("scenario", args->scenario, "Scenario file (YAML)")->required();
  cmd->add_option("--backend", args->backend, "Executor backend")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--schedule", args->schedule, "Schedule (default: the scenario's)")
      ->check(CLI::IsMember(planner::schedule_names()));
  add_slices_option(cmd, args->slices);
  cmd->add_option("--steps", args->steps, "Optimizer steps")->check(CLI::NonNegativeNumber);
  cmd->add_option("--lr", args->lr, "Adam learning rate");
  cmd->add_option("--seed", args->seed, "Data sampling seed");
  cmd->add_option("--corpus", args->corpus, "Training text (default: data/tiny_corpus.txt)");
  // A floor, so that a mistyped limit cannot fail a healthy run: on a loaded machine an
  // op (or the first step's allocations) can go a good fraction of a second unseen.
  cmd->add_option("--watchdog", args->watchdog, "Seconds without progress before a run is declared hung (≥ 1)")
      ->check(CLI::Validator(
          [](const std::string& text) -> std::string {
            double v = 0;
            try {
              v = std::stod(text);
            } catch (const std::exception&) {
              return "expected a number of seconds, got '" + text + "'";
            }
            if (!(v >= 1 && v <= 1e6))
              return fmt::format("{} s is outside [1, 1e6]: below 1 s the watchdog would fail healthy runs on a "
                                 "loaded machine; expected at least 1 (default 30)",
                                 text);
            return {};
          },
          "SECONDS in [1, 1e6]"));
  cmd->add_option("--trace-out", args->trace_out, "Write the last step's measured trace (Chrome JSON)");
  cmd->add_option("--transport", args->transport,
                  "cuda backend: loopback (every stage on one GPU) or nccl (one process per GPU)")
      ->check(CLI::IsMember({"loopback", "nccl"}));
  cmd->add_option("--device", args->device, "cuda backend, loopback: GPU index");
  cmd->add_flag("--json", args->json, "Print JSON instead of text");
  cmd->add_flag("--pin", args->pin, "Pin rank w's threads to core w mod cores");
  cmd->add_option("--balance-every", args->balance_every,
                  "cpu backend: every K steps, re-partition the layers by the measured stage times (tdpipe "
                  "balance) and continue from the same weights and Adam state")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--balance-alpha", args->balance_alpha, "EWMA weight of each newer step for --balance-every")
      ->check(CLI::Range(1e-6, 1.0));
  cmd->add_option("--rank-speed", args->rank_speed,
                  "cpu backend: RANK:SPEED,… with SPEED in [0.01, 1] — stretch each F/B/W of those pipeline ranks to "
                  "1/SPEED of its time, a slower device (see `tdpipe balance`)");
  cmd->add_flag("--check", args->check, "Also run the single-device reference and report the difference");
  add_max_ops_option(cmd, args->max_ops);
  cmd->callback([args] { run_exec(*args); });
}

}  // namespace tdpipe::apps
