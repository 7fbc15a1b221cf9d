// cmd_plan.cpp — `tdpipe plan SCENARIO`: print or write a schedule's plan.
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "tdpipe/ir/atomic_file.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/generators.hpp"

namespace tdpipe::apps {
namespace {

struct PlanArgs {
  std::string scenario;
  std::string schedule;
  int slices = 0;
  std::string format = "text";
  std::string output;
  bool compute_only = false;
  std::int64_t max_ops = 0;
};

void run_plan(const PlanArgs& a) {
  const ir::Scenario scenario = ir::load_scenario(a.scenario);
  const std::string schedule = a.schedule.empty() ? scenario.schedule : a.schedule;
  const planner::BuiltPlan built = planner::build_plan(scenario, schedule, a.slices, a.max_ops);
  const ir::Plan& plan = a.compute_only ? built.compute_only : built.lowered;
  std::string text;
  if (a.format == "json") {
    text = ir::to_json(plan).dump(1) + "\n";
  } else {
    text = ir::to_text(plan);
    text += "# peak in-flight activations per rank:";
    for (const auto& r : built.report.ranks) text += fmt::format(" {}", r.peak_inflight);
    text += "\n";
  }
  if (a.output.empty()) {
    std::cout << text;
    return;
  }
  ir::write_file_atomic(a.output, text, "plan");
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand("plan", "Build a schedule's plan (schedule IR) for a scenario");
  cmd->add_option("scenario", args->scenario, "Scenario file (YAML)")->required();
  cmd->add_option("--schedule", args->schedule, "Schedule (default: the scenario's)")
      ->check(CLI::IsMember(planner::schedule_names()));
  add_slices_option(cmd, args->slices);
  cmd->add_option("--format", args->format, "Output form")->check(CLI::IsMember({"text", "json"}));
  cmd->add_option("-o,--output", args->output, "Write to FILE instead of stdout");
  cmd->add_flag("--compute-only", args->compute_only,
                "Print the generator's compute-only plan instead of the lowered one");
  add_max_ops_option(cmd, args->max_ops);
  cmd->callback([args] { run_plan(*args); });
}

}  // namespace tdpipe::apps
