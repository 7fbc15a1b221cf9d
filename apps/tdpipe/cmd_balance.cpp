// cmd_balance.cpp — `tdpipe balance SCENARIO [--trace T.json …]`: the load balancer.
// Each trace is one measured (or simulated) iteration of the scenario's plan; per-rank
// slowdowns against the cost model are smoothed by an EWMA, then layers are
// re-partitioned and stages assigned to devices (planner/balance.hpp).
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "tdpipe/ir/atomic_file.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/balance.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/cost_model.hpp"
#include "tdpipe/planner/generators.hpp"
#include "tdpipe/traces/chrome_json.hpp"
#include "tdpipe/traces/trace_io.hpp"

namespace tdpipe::apps {
namespace {

struct BalanceArgs {
  std::string scenario;
  std::string schedule;
  std::vector<std::string> traces;
  double alpha = 0.3;
  std::string output;
  bool json = false;
  std::int64_t max_ops = 0;
};

void run_balance(const BalanceArgs& a) {
  if (!(a.alpha > 0 && a.alpha <= 1))
    throw Error(fmt::format("--alpha {}: expected 0 < alpha <= 1 (the weight of each newer trace)", a.alpha));
  const ir::Scenario sc = ir::load_scenario(a.scenario);
  const std::string schedule = a.schedule.empty() ? sc.schedule : a.schedule;
  const std::vector<double> ones(static_cast<std::size_t>(sc.stages()), 1.0);
  planner::Slowdown slowdown{ones, ones};
  if (!a.traces.empty()) {
    const planner::BuiltPlan built = planner::build_plan(sc, schedule, 0, a.max_ops);
    planner::Ewma device(a.alpha), ends(a.alpha);
    for (const std::string& path : a.traces) {
      try {
        const planner::Slowdown s = planner::measured_slowdown(sc, built.lowered, traces::read_trace(path));
        device.add(s.device);
        ends.add(s.ends);
      } catch (const Error& e) {
        throw Error(fmt::format("{}: {}", path, e.what()));
      }
    }
    slowdown = {device.value(), ends.value()};
  }
  const planner::Rebalance b = planner::rebalance(sc, slowdown);
  if (!a.output.empty()) ir::write_file_atomic(a.output, ir::to_json(b.scenario).dump(2) + "\n", "balanced scenario");
  if (a.json) {
    nlohmann::json j = {{"slowdown", slowdown.device}, {"ends_slowdown", slowdown.ends},
                                 {"layers_before", b.layers_before},
                        {"layers_after", b.layers_after}, {"device_of_stage", b.device_of_stage},
                        {"seconds_before", b.seconds_before}, {"seconds_after", b.seconds_after},
                        {"spread_before", b.spread_before},   {"spread_after", b.spread_after},
                        {"rounds", b.rounds}};
    std::cout << j.dump(2) << "\n";
    return;
  }
  fmt::print("scenario {}: p={} {} layers; {} trace(s), EWMA alpha {}\n\n", sc.name, sc.stages(), sc.model.layers,
             a.traces.size(), a.alpha);
  fmt::print("{:>5} | {:>8} {:>6} {:>10} {:>6} {:>12} | {:>4} {:>10} {:>6} {:>12}\n", "stage", "slowdown", "ends",
             "gpu", "layers", "F+B+W", "slot", "gpu", "layers", "F+B+W");
  for (int k = 0; k < sc.stages(); ++k) {
    const int slot = b.device_of_stage[static_cast<std::size_t>(k)];
    fmt::print("{:>5} | {:>8.3f} {:>6.3f} {:>10} {:>6} {:>9.2f} ms | {:>4} {:>10} {:>6} {:>9.2f} ms\n", k,
               slowdown.device[k], slowdown.ends[k], planner::gpu_of_rank(sc, k).name, b.layers_before[k], 1e3 * b.seconds_before[k], slot,
               planner::gpu_of_rank(sc, slot).name, b.layers_after[k], 1e3 * b.seconds_after[k]);
  }
  fmt::print("\nslowest / fastest stage: {:.1f} % before, {:.1f} % after ({} round(s) of partition and "
             "assignment)\n",
             100 * b.spread_before, 100 * b.spread_after, b.rounds);
  fmt::print("parallel.layers_per_stage: [{}]{}\n", fmt::join(b.layers_after, ", "),
             a.output.empty() ? "" : fmt::format(" (written to {})", a.output));
}

}  // namespace

void add_balance_command(CLI::App& app) {
  auto args = std::make_shared<BalanceArgs>();
  CLI::App* cmd = app.add_subcommand(
      "balance", "Re-partition layers (and assign stages to devices) from measured or simulated stage times");
  cmd->add_option("scenario", args->scenario, "Scenario file (YAML or JSON)")->required();
  cmd->add_option("--trace", args->traces,
                  "A measured (tdpipe exec --trace-out) or simulated trace of the scenario's plan; repeat for "
                  "successive iterations (without: the cost model's own stage times)")
      ->check(CLI::ExistingPath);
  cmd->add_option("--schedule", args->schedule, "Schedule the traces ran (default: the scenario's)")
      ->check(CLI::IsMember(planner::schedule_names()));
  cmd->add_option("--alpha", args->alpha, "EWMA weight of each newer trace (0 < alpha <= 1)")->capture_default_str();
  cmd->add_option("-o,--output", args->output, "Write the balanced scenario (JSON, with layers_per_stage)");
  cmd->add_flag("--json", args->json, "Print JSON instead of a table");
  add_max_ops_option(cmd, args->max_ops);
  cmd->callback([args] { run_balance(*args); });
}

}  // namespace tdpipe::apps
