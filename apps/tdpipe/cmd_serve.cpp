// cmd_serve.cpp — `tdpipe serve SCENARIO`: plan a serving workload with the pp, tp and
// tdpipe planners, time each plan with an engine (or run it on the CPU backend), and
// print throughput, latency, bubbles by cause and KV use side by side.
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "tdpipe/ir/atomic_file.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/json_read.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/ir/validate.hpp"
#include "tdpipe/planner/cost_fit.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/planner/plan_input.hpp"
#include "tdpipe/planner/serving.hpp"
#include "tdpipe/report/shared_device.hpp"
#include "tdpipe/traces/profile.hpp"
#include "tdpipe/traces/serving_report.hpp"
#include "tdpipe/traces/trace_io.hpp"
#include "tdpipe/exec/cpu/serve.hpp"
#ifdef TDPIPE_HAVE_SIMGRID
#include "tdpipe/sim/simulate.hpp"
#endif

namespace tdpipe::apps {
namespace {

struct ServeArgs {
  std::string input;
  std::string planner;  ///< "": the scenario's
  std::string engine = kDefaultEngine;
  std::string backend;  ///< "": predict only; "cpu": execute on the CPU backend
  std::string requests_file;
  std::string profile;  ///< a calibration profile (tdpipe calibrate) pricing the ops
  int count = 0;  ///< > 0: the first `count` requests only
  bool json = false;
  std::string trace_out, plan_out;
};

/// `base` for one planner, `base` with "-PLANNER" before the extension for several.
std::string path_for(const std::string& base, const std::string& planner, bool many) {
  if (!many || base.empty()) return base;
  const std::filesystem::path p(base);
  return (p.parent_path() / (p.stem().string() + "-" + planner + p.extension().string())).string();
}

std::string pct(double part, double whole) { return whole > 0 ? fmt::format("{:.1f}%", 100 * part / whole) : "-"; }

void print_table(const ir::Scenario& sc, const std::vector<traces::ServingReport>& rows) {
  const auto& gpu = sc.cluster.groups.front().gpu;
  fmt::print("scenario {} ({}): {} on {} × {}", sc.name, sc.source_file, sc.model.name, sc.cluster.gpus(), gpu.name);
  if (!rows.empty())
    fmt::print(" | {} requests, {} prompt + {} output tokens", rows.front().requests, rows.front().prompt_tokens,
               rows.front().output_tokens);
  fmt::print("\n");
  fmt::print("{:<8} {:<6} {:>10} {:>11} {:>8} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7} {:>8} {:>7}\n", "planner",
             "layout", "engine", "out tok/s", "req/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "busy",
             "fill", "switch", "imbal", "peak KV", "phases");
  for (const auto& r : rows) {
    double busy = 0, fill = 0, sw = 0, imb = 0, kv = 0, cap = 0, total = 0;
    for (const auto& s : r.stage) {
      busy += s.busy_seconds;
      fill += s.fill_drain_seconds;
      sw += s.phase_switch_seconds;
      imb += s.imbalance_seconds;
      total += s.busy_seconds + s.fill_drain_seconds + s.phase_switch_seconds + s.imbalance_seconds;
      if (s.kv_capacity_bytes > 0 && s.peak_kv_bytes / s.kv_capacity_bytes > (cap > 0 ? kv / cap : -1)) {
        kv = s.peak_kv_bytes;
        cap = s.kv_capacity_bytes;
      }
    }
    fmt::print("{:<8} {:<6} {:>10} {:>11.0f} {:>8.2f} {:>8.2f}s {:>8.2f}s {:>7.1f}ms {:>7.1f}ms {:>7} {:>7} {:>7} {:>7} "
               "{:>8} {:>7}\n",
               r.planner, fmt::format("p{}t{}", r.stages, r.tensor), r.origin, r.output_tokens_per_second,
               r.requests_per_second, r.ttft.p50, r.ttft.p99, r.tpot.p50 * 1e3, r.tpot.p99 * 1e3, pct(busy, total),
               pct(fill, total), pct(sw, total), pct(imb, total), pct(kv, cap), r.phases);
  }
  auto find = [&](const char* name) -> const traces::ServingReport* {
    for (const auto& r : rows)
      if (r.planner == name) return &r;
    return nullptr;
  };
  const auto* td = find("tdpipe");
  for (const char* other : {"pp", "tp"})
    if (const auto* o = find(other); td && o && o->output_tokens_per_second > 0)
      fmt::print("tdpipe / {}: {:.2f}× the output throughput\n", other,
                 td->output_tokens_per_second / o->output_tokens_per_second);
  fmt::print("bubbles: share of stage time, summed over stages — fill = before a stage's first and after its last "
             "op, switch = before a batch of another phase window, imbal = every other wait\n");
}

/// The engine's prediction; stages sharing one device (a CPU calibration profile) share
/// it by processor sharing (report::predict_shared), as `tdpipe sim` predicts them.
traces::Trace predict(const ir::Plan& plan, const std::string& engine) {
  if (engine == "analytic") return report::predict_shared(plan, [](const ir::Plan& p) { return planner::evaluate(p); });
#ifdef TDPIPE_HAVE_SIMGRID
  return report::predict_shared(plan, [](const ir::Plan& p) { return sim::simulate(p).trace; });
#else
  throw Error("this build has no SimGrid: use --engine analytic");
#endif
}

void run_serve(const ServeArgs& a) {
  std::vector<ir::Plan> plans;
  ir::Scenario scenario;
  if (planner::is_plan_file(a.input)) {
    ir::Plan plan;
    try {
      plan = ir::plan_from_json(ir::parse_json(ir::read_file(a.input, "plan"), a.input));
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}", a.input, e.what()));
    }
    if (!plan.serve) throw Error(fmt::format("{}: a training plan; `tdpipe serve` runs serving plans (tdpipe sim runs this one)", a.input));
    if (!a.planner.empty() && a.planner != plan.serve->planner)
      throw Error(fmt::format("{}: a plan of the {} planner; --planner {} asks for another (a plan file is run as it is)",
                              a.input, plan.serve->planner, a.planner));
    if (!a.requests_file.empty() || a.count > 0)
      throw Error(fmt::format("{}: a plan file carries its requests; --requests and --count apply to scenarios", a.input));
    scenario = plan.scenario;
    plans.push_back(std::move(plan));
  } else {
    scenario = ir::load_scenario(a.input);
    if (!scenario.serving)
      throw Error(fmt::format("{}: no serving: section; `tdpipe serve` needs one (see scenarios/README.md)", a.input));
    std::vector<ir::Request> requests;
    if (!a.requests_file.empty()) {
      requests = ir::parse_requests(ir::read_file(a.requests_file, "requests file"), a.requests_file);
    } else {
      const std::string dir = std::filesystem::path(a.input).parent_path().string();
      requests = ir::serving_requests(*scenario.serving, dir);
    }
    if (a.count > static_cast<int>(requests.size()))
      fmt::print(stderr, "note: --count {}: the workload has {} requests; serving all of them\n", a.count,
                 requests.size());
    if (a.count > 0 && a.count < static_cast<int>(requests.size())) requests.resize(static_cast<std::size_t>(a.count));
    const std::string which = a.planner.empty() ? scenario.serving->planner : a.planner;
    const std::vector<std::string> names =
        which == "all" ? ir::serving_planner_names() : std::vector<std::string>{which};
    const std::string source = a.requests_file.empty() ? a.input : a.input + " with " + a.requests_file;
    for (const auto& name : names) {
      try {
        plans.push_back(planner::plan_serving(scenario, name, requests));
      } catch (const Error& e) {
        throw Error(fmt::format("{}: {} planner: {}", source, name, e.what()));
      }
    }
  }
  if (!a.profile.empty()) {
    const traces::Profile profile = traces::read_profile(a.profile);
    if (profile.model.empty())
      throw Error(fmt::format("{}: not a fitted cost model; serving ops are priced from a probe calibration "
                              "(tdpipe calibrate SCENARIO -o PROFILE, without --schedule or --from-run)",
                              a.profile));
    if (a.backend == "cpu")
      throw Error(fmt::format("{}: --profile prices a prediction; --backend cpu measures (drop one)", a.profile));
    for (ir::Plan& plan : plans) {
      const traces::ProfileApplied applied = planner::apply_profile(profile, plan);
      if (applied.ops_kept > 0)
        throw Error(fmt::format("{}: the profile's model has no forward (F) speeds to price {} serving ops with",
                                a.profile, applied.ops_kept));
    }
  }
  const bool many = plans.size() > 1;
  std::vector<traces::ServingReport> rows;
  nlohmann::json out = nlohmann::json::array();
  for (ir::Plan& plan : plans) {
    ir::validate(plan);
    const std::string& name = plan.serve->planner;
    if (!a.plan_out.empty()) {
      ir::write_file_atomic(path_for(a.plan_out, name, many), ir::to_json(plan).dump(), "plan");
      fmt::print(stderr, "wrote plan {}\n", path_for(a.plan_out, name, many));
    }
    const traces::Trace trace = a.backend == "cpu" ? exec::cpu::run_serving(plan).trace : predict(plan, a.engine);
    if (!a.trace_out.empty()) {
      traces::write_trace(trace, path_for(a.trace_out, name, many));
      fmt::print(stderr, "wrote trace {}\n", path_for(a.trace_out, name, many));
    }
    rows.push_back(traces::serving_report(plan, trace));
    out.push_back(traces::to_json(rows.back()));
  }
  if (a.json) {
    std::cout << nlohmann::json{{"scenario", scenario.name}, {"runs", out}}.dump(2) << "\n";
    return;
  }
  print_table(scenario, rows);
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  auto* cmd = app.add_subcommand(
      "serve", "Plan LLM serving of a scenario's requests (pp, tp, TD-Pipe) and predict or run it");
  cmd->add_option("scenario", args->input, "Scenario YAML with a serving: section, or a serving PLAN.json")
      ->required();
  cmd->add_option("--planner", args->planner, "pp, tp, tdpipe or all (default: the scenario's serving.planner)")
      ->check(CLI::IsMember({"pp", "tp", "tdpipe", "all"}));
  auto* engine = cmd->add_option("--engine", args->engine, "Prediction engine")
                     ->check(CLI::IsMember({"analytic", "simgrid"}))
                     ->capture_default_str();
  cmd->add_option("--backend", args->backend,
                  "Execute the plan instead of predicting it: cpu (the tiny GPT generates every token)")
      ->check(CLI::IsMember({"cpu"}))
      ->excludes(engine);
  cmd->add_option("--requests", args->requests_file, "JSON file of requests [{\"prompt\": P, \"output\": O}, …]");
  cmd->add_option("--count", args->count, "Serve only the first N requests")
      ->check(CLI::Validator(
          [](const std::string& text) {
            return text.find_first_not_of("0123456789") == std::string::npos && !text.empty() &&
                           text.size() < 10 && std::stol(text) >= 1
                       ? std::string()
                       : "expected a positive number of requests, got " + text;
          },
          "N"));
  cmd->add_option("--profile", args->profile,
                  "A probe calibration (tdpipe calibrate) of the machine: prices every PREFILL/DECODE with its "
                  "fitted forward speeds, and takes its links and shared device");
  cmd->add_flag("--json", args->json, "Print the reports as JSON");
  cmd->add_option("--trace-out", args->trace_out, "Write each run's trace (Chrome JSON; -PLANNER added for several)");
  cmd->add_option("--plan-out", args->plan_out, "Write each serving plan as JSON (-PLANNER added for several)");
  cmd->callback([args] { run_serve(*args); });
}

}  // namespace tdpipe::apps
