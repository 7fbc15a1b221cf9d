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
#include "tdpipe/planner/cost_fit.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/planner/generators.hpp"
#include "tdpipe/planner/plan_input.hpp"
#include "tdpipe/report/schedule_report.hpp"
#include "tdpipe/report/shared_device.hpp"
#include "tdpipe/traces/chrome_json.hpp"
#include "tdpipe/traces/trace_io.hpp"
#include "tdpipe/traces/profile.hpp"
#ifdef TDPIPE_HAVE_SIMGRID
#include <chrono>
#include <string>

#include "tdpipe/sim/simulate.hpp"
#endif

namespace tdpipe::apps {
namespace {

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
  std::string fidelity = "reduced";
  std::vector<std::string> inject;
  int checkpoint_every = 0;
  double checkpoint_seconds = 0, detect_seconds = 1, restart_seconds = -1;
  int steps = 0;
  bool failure_options_given = false;  ///< any of the five above on the command line
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
traces::Trace simulate_simgrid(const ir::Plan& plan, sim::SimOptions opt) {
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
/// backend or one GPU's loopback) share it by processor sharing (report::predict_shared).
/// `faults`: the slow and link faults, simulated (SimGrid only).
#ifdef TDPIPE_HAVE_SIMGRID
using SimFaults = std::vector<sim::SimFault>;
#else
struct SimFaults {};  // (no simulator: no faults to simulate)
#endif
traces::Trace predict(const planner::BuiltPlan& built, const SimArgs& a, const SimFaults& faults = {}) {
  if (a.engine == "analytic")
    return report::predict_shared(built.lowered, [](const ir::Plan& p) { return planner::evaluate(p); });
#ifdef TDPIPE_HAVE_SIMGRID
  if (a.engine == "simgrid") {
    sim::SimOptions opt;
    opt.fidelity = a.fidelity == "plain" ? sim::Fidelity::Plain : sim::Fidelity::Reduced;
    opt.faults = faults;
    return report::predict_shared(built.lowered, [&](const ir::Plan& p) { return simulate_simgrid(p, opt); });
  }
#else
  (void)faults;
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

void print_table(const ir::Scenario& sc, const std::vector<report::ScheduleReport>& rows,
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

/// What --inject asks: faults the engine simulates (slow, link) and failures the
/// checkpoint-restart accounting charges (fail).
struct FaultRun {
  std::vector<std::string> described;
#ifdef TDPIPE_HAVE_SIMGRID
  std::vector<sim::SimFault> simulated, fails;
  sim::FailureOptions failure;
  ir::Placement placement;
  std::vector<int> affected;
#endif
  bool any() const { return !described.empty(); }
};

/// Per schedule: the fault-free iteration (slow/link faults) and the failure timeline.
struct FaultRow {
  double fault_free_iteration_seconds = 0;
  int trace_replica = 0, trace_tp = 0;  ///< the pipeline the trace shows: the one that ends last
#ifdef TDPIPE_HAVE_SIMGRID
  std::optional<sim::FailureTimeline> timeline;
#endif
};

FaultRun parse_faults(const SimArgs& a, const ir::Scenario& sc) {
  FaultRun fr;
  const bool failure_options = a.failure_options_given;
#ifdef TDPIPE_HAVE_SIMGRID
  std::vector<sim::SimFault> all;
  for (const auto& text : a.inject) {
    all.push_back(sim::parse_sim_fault(text));
    (all.back().kind == sim::SimFault::Kind::Fail ? fr.fails : fr.simulated).push_back(all.back());
  }
  if (!fr.simulated.empty() && a.engine != "simgrid")
    throw Error(fmt::format("--inject \"{}\": slow and link faults are simulated by the SimGrid engine "
                            "(--engine simgrid), not the analytic one",
                            fr.simulated.front().text));
  if (fr.fails.empty() && failure_options)
    throw Error("--checkpoint-every, --checkpoint-seconds, --detect-seconds, --restart-seconds and --steps price "
                "a failure: give them with --inject fail:rank=G,at=T");
  if (!fr.fails.empty()) {
    if (a.checkpoint_every < 1)
      throw Error(fmt::format("--inject \"{}\" needs --checkpoint-every N (iterations between checkpoints): the "
                              "restart resumes from the last complete one",
                              fr.fails.front().text));
    if (a.restart_seconds < 0)
      throw Error(fmt::format("--inject \"{}\" needs --restart-seconds S: relaunching the job, re-creating its "
                              "communicators and loading the checkpoint (minutes at scale; tdpipe cannot "
                              "know your scheduler's)",
                              fr.fails.front().text));
    fr.failure = {a.checkpoint_every, a.checkpoint_seconds, a.detect_seconds, a.restart_seconds, a.steps};
  }
  fr.placement = {sc.synthetic ? 1 : std::max(sc.parallel.tensor, 1), sc.stages(), std::max(sc.parallel.data, 1)};
  const sim::PlatformSpec platform = sc.synthetic ? sim::PlatformSpec{} : sim::platform_for(sc);
  for (const auto& f : all)
    if (sc.synthetic && f.kind == sim::SimFault::Kind::Link)
      throw Error(fmt::format("--inject \"{}\": a synthetic scenario has no network fabric (only a p2p latency)",
                              f.text));
  sim::check_sim_faults(all, fr.placement, platform);
  fr.affected = sim::affected_replicas(fr.simulated, fr.placement, platform);
  for (const auto& f : all) fr.described.push_back(sim::describe_sim_fault(f, fr.placement, platform));
#else
  (void)sc;
  if (!a.inject.empty() || failure_options)
    throw Error("--inject: this build has no simulator (built without SimGrid)");
#endif
  return fr;
}

/// A schedule's name with its slices when it has several (tdpipe and auto run at many).
std::string label(const report::ScheduleReport& r) {
  return r.slices > 1 && r.schedule.find(" S=") == std::string::npos ? fmt::format("{} S={}", r.schedule, r.slices)
                                                                    : r.schedule;
}

std::string seconds_text(double s) { return s >= 1 ? fmt::format("{:.3f} s", s) : fmt::format("{:.3f} ms", s * 1e3); }

#ifdef TDPIPE_HAVE_SIMGRID
nlohmann::json to_json(const sim::FailureTimeline& t) {
  nlohmann::json events = nlohmann::json::array();
  for (const auto& e : t.events)
    events.push_back({{"spec", e.text}, {"at_seconds", e.at_seconds}, {"fired", e.fired},
                      {"iteration", e.iteration}, {"restart_from_iteration", e.restart_from},
                      {"lost_seconds", e.lost_seconds}, {"resume_at_seconds", e.resume_at_seconds}});
  return {{"steps", t.steps},
          {"checkpoints", t.checkpoints},
          {"no_failure_seconds", t.no_failure_seconds},
          {"total_seconds", t.total_seconds},
          {"lost_seconds", t.lost_seconds},
          {"mean_iteration_seconds", t.mean_iteration_seconds},
          {"goodput", t.goodput},
          {"events", events}};
}
#endif

void print_faults(const SimArgs& a, const FaultRun& fr, const std::vector<report::ScheduleReport>& rows,
                  const std::vector<FaultRow>& extra) {
#ifdef TDPIPE_HAVE_SIMGRID
  fmt::print("\nfaults:\n");
  for (const auto& d : fr.described) fmt::print("  {}\n", d);
  if (!fr.simulated.empty()) {
    const int d = fr.placement.data;
    if (a.fidelity == "reduced" && d > 1) {
      std::string list;
      for (int r : fr.affected) list += fmt::format("{}{}", list.empty() ? "" : ", ", r);
      const int healthy = d - static_cast<int>(fr.affected.size());
      fmt::print("  simulated exactly: replica{} {} of {}{}\n", fr.affected.size() > 1 ? "s" : "", list, d,
                 healthy == 1   ? std::string(", one healthy replica for the other healthy one")
                 : healthy > 1 ? fmt::format(", one healthy replica standing for the other {}", healthy - 1)
                                : std::string());
    }
    fmt::print("  {:<24} {:>12} {:>12} {:>9}  {}\n", "schedule", "with faults", "fault-free", "change",
               "traced pipeline (ends last)");
    for (std::size_t i = 0; i < rows.size(); ++i)
      fmt::print("  {:<24} {:>12} {:>12} {:>+8.2f}%  replica {}, TP rank {}\n", label(rows[i]),
                 seconds_text(rows[i].iteration_seconds), seconds_text(extra[i].fault_free_iteration_seconds),
                 100 * (rows[i].iteration_seconds / extra[i].fault_free_iteration_seconds - 1), extra[i].trace_replica,
                 extra[i].trace_tp);
  }
  if (fr.fails.empty()) return;
  fmt::print("  failures: a checkpoint after every {} iteration{} ({}), detection {}, restart {}\n",
             fr.failure.checkpoint_every, fr.failure.checkpoint_every > 1 ? "s" : "",
             fr.failure.checkpoint_seconds > 0 ? seconds_text(fr.failure.checkpoint_seconds) + " to write"
                                               : "writes not charged: --checkpoint-seconds",
             seconds_text(fr.failure.detect_seconds), seconds_text(fr.failure.restart_seconds));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const sim::FailureTimeline& t = *extra[i].timeline;
    fmt::print("  {}: {} iterations of {}:\n", label(rows[i]), t.steps, seconds_text(t.iteration_seconds));
    for (const auto& e : t.events) {
      if (!e.fired) {
        fmt::print("    {}: never happens: the run ends at {}, before {}\n", e.text, seconds_text(t.no_failure_seconds),
                   seconds_text(e.at_seconds));
        continue;
      }
      fmt::print("    {}: in iteration {}; back to {}, {} of work lost; resumes at {}\n", e.text, e.iteration,
                 e.restart_from > 0 ? fmt::format("the checkpoint after iteration {}", e.restart_from)
                                    : std::string("the start"),
                 seconds_text(e.lost_seconds), seconds_text(e.resume_at_seconds));
    }
    fmt::print("    {} instead of {} without the failure{} (+{}), {} per iteration, goodput {:.1f}%\n",
               seconds_text(t.total_seconds), seconds_text(t.no_failure_seconds), t.events.size() > 1 ? "s" : "",
               seconds_text(t.lost_seconds),
               seconds_text(t.mean_iteration_seconds), 100 * t.goodput);
  }
#else
  (void)a, (void)fr, (void)rows, (void)extra;
#endif
}

void run_sim(const SimArgs& a) {
  // A plan file is predicted as it is: its scenario, schedule, slices and op costs.
  const std::optional<planner::PlanInput> plan_file =
      planner::load_plan_file(a.scenario, a.schedule == "all" ? "" : a.schedule, a.slices, a.max_ops);
  if (plan_file && a.schedule == "all")
    throw Error(fmt::format("{}: a plan file holds one schedule's plan; --schedule all needs the scenario file",
                            a.scenario));
  ir::Scenario sc = plan_file ? plan_file->scenario : ir::load_scenario(a.scenario);
  std::optional<traces::Profile> profile;
  if (!a.profile.empty()) {
    profile = traces::read_profile(a.profile);
    if (plan_file && profile->compute_efficiency > 0)
      throw Error(fmt::format("{}: a software-stack profile scales the cost model when planning; a plan file's costs "
                              "are fixed: give the scenario file with --profile",
                              a.profile));
    traces::apply_profile_to_scenario(*profile, sc);  // a stack profile's compute efficiency
    if (profile->compute_efficiency > 0)
      fmt::print(stderr, "note: {}: compute efficiency {:.4f} (fitted on {})\n", a.profile,
                 profile->compute_efficiency, profile->platform.device);
    if (!profile->model.empty() && !profile->scenario.empty() && profile->scenario != sc.name)
      fmt::print(stderr, "note: {}: cost model fitted on scenario '{}'; '{}' is another model shape, so its op "
                         "times are the fit carried to other sizes (its layouts were probed, this shape was not)\n",
                 a.profile, profile->scenario, sc.name);
  }
  const FaultRun faults = parse_faults(a, sc);
  const auto runs = plan_file ? std::vector<Run>{{plan_file->schedule, plan_file->built.lowered.slices, ""}}
                              : runs_for(a, sc);
  const bool many = runs.size() > 1;
  std::vector<report::ScheduleReport> rows;
  std::vector<FaultRow> extra;
  std::vector<std::pair<std::string, std::string>> failures;
  for (const Run& run : runs) {
    const std::string& schedule = run.schedule;
    const int slices = run.slices;
    try {
      ir::Scenario scenario = sc;
      if (!run.budget.empty()) scenario.parallel.memory_budget = run.budget;
      planner::BuiltPlan built =
          plan_file ? plan_file->built : planner::build_plan(scenario, schedule, slices, a.max_ops);
      if (profile) {
        const traces::ProfileApplied applied = planner::apply_profile(*profile, built.lowered, a.profile_ops_only);
        if (applied.ops_kept > 0)
          fmt::print(stderr, "note: {}: the profile has no entry for {} of {} compute ops; they keep the cost model's time\n",
                     a.profile, applied.ops_kept, applied.ops_kept + applied.ops_from_profile);
        if (applied.ops_fallback > 0)
          fmt::print(stderr, "note: {}: {} of {} compute ops are priced from another kind's fit (the probes ran no "
                             "{}): add a probe that runs them (calibrate --probes)\n",
                     a.profile, applied.ops_fallback, applied.ops_kept + applied.ops_from_profile,
                     profile->model.coefficients.count(ir::OpKind::BW) ? "split B and W" : "fused BW");
      }
      FaultRow fx;
#ifdef TDPIPE_HAVE_SIMGRID
      const traces::Trace trace = predict(built, a, faults.simulated);
      report::ScheduleReport row = report::make_report(built, trace, a.engine);
      if (!faults.simulated.empty()) {
        fx.fault_free_iteration_seconds = report::make_report(built, predict(built, a), a.engine).iteration_seconds;
        if (trace.metadata.count("replica")) fx.trace_replica = std::stoi(trace.metadata.at("replica"));
        if (trace.metadata.count("tp_rank")) fx.trace_tp = std::stoi(trace.metadata.at("tp_rank"));
      }
      if (!faults.fails.empty()) fx.timeline = sim::failure_timeline(row.iteration_seconds, faults.fails, faults.failure);
#else
      const traces::Trace trace = predict(built, a);
      report::ScheduleReport row = report::make_report(built, trace, a.engine);
#endif
      if (!a.trace_out.empty())
        traces::write_trace(trace, trace_path(a.trace_out, run.file_label() + (slices == planner::kAutoSlices ? "-terapipe" : ""), built.lowered.slices, many));
      rows.push_back(std::move(row));
      rows.back().schedule = run.label();
      extra.push_back(std::move(fx));
    } catch (const Error& e) {
      if (!many) throw;
      failures.emplace_back(slices > 1 ? fmt::format("{} S={}", run.label(), slices) : run.label(), e.what());
    }
  }
  if (a.json) {
    nlohmann::json out = nlohmann::json::array();
    for (std::size_t i = 0; i < rows.size(); ++i) {
      nlohmann::json row = report::to_json(rows[i]);
#ifdef TDPIPE_HAVE_SIMGRID
      if (faults.any()) {
        nlohmann::json fj = {{"specs", a.inject}};
        if (!faults.simulated.empty()) {
          fj["fault_free_iteration_seconds"] = extra[i].fault_free_iteration_seconds;
          fj["slowdown"] = rows[i].iteration_seconds / extra[i].fault_free_iteration_seconds;
          fj["trace_replica"] = extra[i].trace_replica;
          fj["trace_tp_rank"] = extra[i].trace_tp;
          fj["affected_replicas"] = faults.affected;
        }
        if (extra[i].timeline) fj["failure"] = to_json(*extra[i].timeline);
        row["faults"] = fj;
      }
#endif
      out.push_back(row);
    }
    for (const auto& [name, why] : failures) out.push_back({{"schedule", name}, {"error", why}});
    std::cout << (many ? out : out.front()).dump(2) << "\n";
    return;
  }
  print_table(sc, rows, failures);
  if (faults.any()) print_faults(a, faults, rows, extra);
}

}  // namespace

void add_sim_command(CLI::App& app) {
  auto args = std::make_shared<SimArgs>();
  CLI::App* cmd = app.add_subcommand("sim", "Predict the timeline of one or every schedule");
  cmd->add_option("scenario", args->scenario,
                  "Scenario file (YAML or JSON), or a plan file (tdpipe plan --format json -o PLAN.json: run as it is)")->required();
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
  cmd->add_option("--fidelity", args->fidelity,
                  "SimGrid: reduced (replica symmetry, TP folding; the default) or plain (every GPU and flow)")
      ->check(CLI::IsMember({"reduced", "plain"}))
      ->capture_default_str();
  cmd->add_option("--inject", args->inject,
                  "A fault (repeatable): slow:rank=G,factor=F (a straggler GPU), link:node=N,factor=F[,nic=J] "
                  "(degraded NICs), fail:rank=G,at=T (a GPU lost T = 10s, 5min, 2h into the run). G is a GPU "
                  "index: (replica·p + stage)·t + TP rank; see README \"Faults and recovery\"");
  std::vector<CLI::Option*> failure;
  failure.push_back(cmd->add_option("--checkpoint-every", args->checkpoint_every,
                  "fail: a checkpoint after every N iterations; the restart resumes from the last complete one")
      ->check(CLI::Range(1, 1 << 30)));
  failure.push_back(cmd->add_option("--checkpoint-seconds", args->checkpoint_seconds,
                  "fail: time one checkpoint write blocks the run (default 0)")
      ->check(CLI::Range(0.0, 1e9)));
  failure.push_back(cmd->add_option("--detect-seconds", args->detect_seconds,
                  "fail: from the loss to the job knowing (heartbeat or collective timeout)")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str());
  failure.push_back(cmd->add_option("--restart-seconds", args->restart_seconds,
                  "fail: relaunch, communicator set-up and checkpoint load (required with fail)")
      ->check(CLI::Range(0.0, 1e9)));
  failure.push_back(cmd->add_option("--steps", args->steps,
                  "fail: iterations in the run (default: up to the last interrupted one, redone)")
      ->check(CLI::Range(1, 1 << 30)));
  cmd->callback([args, failure] {
    for (const CLI::Option* o : failure) args->failure_options_given = args->failure_options_given || o->count() > 0;
    run_sim(*args);
  });
}

}  // namespace tdpipe::apps
