// cmd_sim.cpp — `tdpipe sim SCENARIO`: predict every schedule's timeline and
// print a comparison table (or JSON).
#include <iostream>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/planner/generators.hpp"
#include "tdpipe/planner/schedule_report.hpp"
#include "tdpipe/planner/shared_device.hpp"
#include "tdpipe/traces/chrome_json.hpp"
#include "tdpipe/traces/profile.hpp"
#ifdef TDPIPE_HAVE_SIMGRID
#include <chrono>
#include <string>

#include "tdpipe/sim/simulate.hpp"
#endif

namespace tdpipe::apps {
namespace {

#ifdef TDPIPE_HAVE_SIMGRID
constexpr const char* kDefaultEngine = "simgrid";
#else
constexpr const char* kDefaultEngine = "analytic";
#endif

struct SimArgs {
  std::string scenario;
  std::string engine = kDefaultEngine;
  std::string schedule;
  int slices = 0;
  std::string profile;
  bool profile_ops_only = false;
  bool json = false;
  std::string trace_out;
  std::int64_t max_ops = 0;
};

/// One run of the table: a schedule, its slices (0: the scenario's) and, for auto, the
/// memory budget it is built under ("": the scenario's).
struct Run {
  std::string schedule;
  int slices = 0;
  std::string budget;
  std::string label() const { return file_label() + (slices == planner::kAutoSlices ? " S=auto" : ""); }
  /// Schedule and budget, for trace file names (the plan's S is added to them).
  std::string file_label() const { return budget.empty() ? schedule : schedule + ":" + budget; }
};

/// Runs: one, or every generator (tdpipe at S = 2 and 4, the scenario's S and, for
/// model scenarios, TeraPipe's S; auto at S = 1 under the 1f1b and 2x1f1b budgets and
/// the scenario's own, and at the scenario's S > 1 and TeraPipe's S under its budget).
std::vector<Run> runs_for(const SimArgs& a, const ir::Scenario& sc) {
  std::vector<Run> runs;
  if (a.schedule != "all") {
    runs.push_back({a.schedule.empty() ? sc.schedule : a.schedule, a.slices, ""});
    return runs;
  }
  const int own = a.slices > 0 ? a.slices : sc.parallel.slices_auto ? 1 : sc.parallel.slices;
  const bool terapipe = !sc.synthetic;  // TeraPipe's cuts need tokens
  for (const auto& name : planner::schedule_names()) {
    if (name == "tdpipe") {
      std::vector<int> slices = {2, 4};
      if (own > 1 && own != 2 && own != 4) slices.push_back(own);
      if (terapipe) slices.push_back(planner::kAutoSlices);
      for (int s : slices) runs.push_back({name, s, ""});
    } else if (name == "auto") {
      std::vector<std::string> budgets = {"1f1b", "2x1f1b"};
      if (sc.parallel.memory_budget != "1f1b" && sc.parallel.memory_budget != "2x1f1b")
        budgets.push_back(sc.parallel.memory_budget);
      for (const auto& b : budgets) runs.push_back({name, 1, b});
      if (own > 1) runs.push_back({name, own, sc.parallel.memory_budget});
      if (terapipe) runs.push_back({name, planner::kAutoSlices, sc.parallel.memory_budget});
    } else {
      runs.push_back({name, 0, ""});
    }
  }
  return runs;
}

#ifdef TDPIPE_HAVE_SIMGRID
/// The SimGrid engine (sim::simulate), with a progress bar on stderr once a run has
/// taken more than a second.
traces::Trace simulate_simgrid(const ir::Plan& plan) {
  sim::SimOptions opt;
  const auto t0 = std::chrono::steady_clock::now();
  bool shown = false;
  opt.progress = [&](double f) {
    if (!shown && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1)) return;
    shown = true;
    const int bar = static_cast<int>(f * 40);
    fmt::print(stderr, "\r  simulating {} [{}{}] {:3.0f}%", plan.schedule, std::string(bar, '#'),
               std::string(40 - bar, ' '), 100 * f);
  };
  const sim::SimResult res = sim::simulate(plan, opt);
  if (shown) fmt::print(stderr, "\n");
  return res.trace;
}
#endif

/// The engine's prediction; ranks sharing one device (a calibration profile of the CPU
/// backend or one GPU's loopback) share it by processor sharing (planner::predict_shared).
traces::Trace predict(const planner::BuiltPlan& built, const SimArgs& a) {
  if (a.engine == "analytic")
    return planner::predict_shared(built.lowered, [](const ir::Plan& p) { return planner::evaluate(p); });
#ifdef TDPIPE_HAVE_SIMGRID
  if (a.engine == "simgrid") return planner::predict_shared(built.lowered, simulate_simgrid);
#endif
  throw Error(fmt::format("--engine {}: this build has no such engine (available: analytic{})",
                          a.engine, std::string(kDefaultEngine) == "simgrid" ? ", simgrid" : ""));
}

std::string trace_path(const std::string& base, const std::string& schedule, int slices, bool many) {
  if (!many) return base;
  std::string tag = schedule + (slices > 1 ? fmt::format("-s{}", slices) : "");
  const auto dot = base.rfind(".json");
  if (dot == std::string::npos) return base + "-" + tag + ".json";
  return base.substr(0, dot) + "-" + tag + ".json";
}

std::string gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / double(1u << 30)); }

void print_table(const ir::Scenario& sc, const std::vector<planner::ScheduleReport>& rows,
                 const std::vector<std::pair<std::string, std::string>>& failures) {
  fmt::print("scenario {} ({}): p={} m={}", sc.name, sc.source_file, sc.stages(), sc.microbatches());
  if (!sc.synthetic) {
    fmt::print(" t={} d={} | {} on", sc.parallel.tensor, sc.parallel.data, sc.model.name);
    for (std::size_t i = 0; i < sc.cluster.groups.size(); ++i)
      fmt::print("{} {}×{} {}", i ? " +" : "", sc.cluster.groups[i].nodes, sc.cluster.gpus_per_node,
                 sc.cluster.groups[i].gpu.name);
  }
  fmt::print("\nengine: {}\n\n", rows.empty() ? "-" : rows.front().engine);
  fmt::print("{:<18} {:>2} {:>3} {:>12} {:>8} {:>10} {:>6} {:>14} {:>5}\n", "schedule", "v", "S",
             "iteration", "bubble", "tokens/s", "MFU", "peak mem/GPU", "fits");
  for (const auto& r : rows) {
    double peak = 0;
    for (double b : r.peak_memory_bytes_per_rank) peak = std::max(peak, b);
    const std::string iter = r.iteration_seconds >= 1 ? fmt::format("{:.3f} s", r.iteration_seconds)
                                                      : fmt::format("{:.3f} ms", r.iteration_seconds * 1e3);
    fmt::print("{:<18} {:>2} {:>3} {:>12} {:>7.1f}% {:>10} {:>6} {:>14} {:>5}\n", r.schedule, r.chunks,
               r.slices, iter, 100 * r.bubble_fraction,
               sc.synthetic ? "-" : fmt::format("{:.0f}", r.tokens_per_second),
               sc.synthetic ? "-" : fmt::format("{:.1f}%", 100 * r.mfu),
               sc.synthetic ? "-" : gib(peak), sc.synthetic ? "-" : (r.fits ? "yes" : "NO"));
  }
  for (const auto& r : rows)
    if (!r.fits) fmt::print("  {}: {}\n", r.schedule, r.fit_message);
  for (const auto& [name, why] : failures) fmt::print("  {}: not run: {}\n", name, why);
}

void run_sim(const SimArgs& a) {
  const ir::Scenario sc = ir::load_scenario(a.scenario);
  std::optional<traces::Profile> profile;
  if (!a.profile.empty()) profile = traces::read_profile(a.profile);
  const auto runs = runs_for(a, sc);
  const bool many = runs.size() > 1;
  std::vector<planner::ScheduleReport> rows;
  std::vector<std::pair<std::string, std::string>> failures;
  for (const Run& run : runs) {
    const std::string& schedule = run.schedule;
    const int slices = run.slices;
    try {
      ir::Scenario scenario = sc;
      if (!run.budget.empty()) scenario.parallel.memory_budget = run.budget;
      planner::BuiltPlan built = planner::build_plan(scenario, schedule, slices, a.max_ops);
      if (profile) {
        const traces::ProfileApplied applied = traces::apply_profile(*profile, built.lowered, a.profile_ops_only);
        if (applied.ops_kept > 0)
          fmt::print(stderr, "note: {}: the profile has no entry for {} of {} compute ops; they keep the cost model's time\n",
                     a.profile, applied.ops_kept, applied.ops_kept + applied.ops_from_profile);
      }
      const traces::Trace trace = predict(built, a);
      if (!a.trace_out.empty())
        traces::write_trace(trace, trace_path(a.trace_out, run.file_label() + (slices == planner::kAutoSlices ? "-terapipe" : ""), built.lowered.slices, many));
      rows.push_back(planner::make_report(built, trace, a.engine));
      rows.back().schedule = run.label();
    } catch (const Error& e) {
      if (!many) throw;
      failures.emplace_back(slices > 1 ? fmt::format("{} S={}", run.label(), slices) : run.label(), e.what());
    }
  }
  if (a.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : rows) out.push_back(planner::to_json(r));
    for (const auto& [name, why] : failures) out.push_back({{"schedule", name}, {"error", why}});
    std::cout << (many ? out : out.front()).dump(2) << "\n";
    return;
  }
  print_table(sc, rows, failures);
}

}  // namespace

void add_sim_command(CLI::App& app) {
  auto args = std::make_shared<SimArgs>();
  CLI::App* cmd = app.add_subcommand("sim", "Predict the timeline of one or every schedule");
  cmd->add_option("scenario", args->scenario, "Scenario file (YAML)")->required();
  cmd->add_option("--engine", args->engine, "Prediction engine")
      ->check(CLI::IsMember({"simgrid", "analytic"}))
      ->capture_default_str();
  std::vector<std::string> names = planner::schedule_names();
  names.push_back("all");
  cmd->add_option("--schedule", args->schedule, "Schedule, or `all` (default: the scenario's)")
      ->check(CLI::IsMember(names));
  add_slices_option(cmd, args->slices);
  CLI::Option* profile = cmd->add_option("--profile", args->profile,
                  "Calibration profile (from `tdpipe calibrate`): its op times and, unless --profile-ops-only, "
                  "its transport replace the cost model's (either engine)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--profile-ops-only", args->profile_ops_only,
                "Take only op times from --profile and keep the scenario's links (predicting another cluster)")
      ->needs(profile);
  cmd->add_flag("--json", args->json, "Print JSON instead of a table");
  cmd->add_option("--trace-out", args->trace_out,
                  "Write the predicted trace (Chrome/Perfetto JSON); with `all`, one file per schedule");
  add_max_ops_option(cmd, args->max_ops);
  cmd->callback([args] { run_sim(*args); });
}

}  // namespace tdpipe::apps
