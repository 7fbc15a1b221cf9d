// cmd_search.cpp — `tdpipe search SCENARIO`: which layout and schedule to run the
// scenario's model with on its cluster (or --gpus N). planner::search_layouts ranks
// the space with the analytic engine (branch and bound, exact top K); the top K are
// then re-simulated with SimGrid. Under `mpirun -n K` the planning rounds and the
// re-simulations are split over the processes and gathered (rank 0 prints).
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "tdpipe/ir/atomic_file.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_check.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/generators.hpp"
#include "tdpipe/planner/search.hpp"
#include "tdpipe/traces/profile.hpp"
#ifdef TDPIPE_HAVE_SIMGRID
#include "tdpipe/sim/simulate.hpp"
#include "tdpipe/traces/metrics.hpp"
#endif
#ifdef TDPIPE_HAVE_MPI
#include <mpi.h>
#endif

namespace tdpipe::apps {
namespace {

struct SearchArgs {
  std::string scenario;
  int gpus = 0;
  std::vector<int> global_batches;
  int top = 5;
  bool json = false, csv = false;
  std::string objective = "time";
  std::vector<std::string> schedules;
  std::vector<std::string> recomputes;
  std::string sequence_parallel = "both";
  int max_micro_batch = 8, max_chunks = 8;
  bool no_simgrid = false;
  std::string output;
  std::int64_t max_ops = 0;
  std::string profile;  // a stack profile (tdpipe calibrate --from-run)
};

/// The processes of an `mpirun` launch (one when not launched by MPI, or built without it).
class Workers {
 public:
  Workers() {
#ifdef TDPIPE_HAVE_MPI
    if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK")) {
      MPI_Init(nullptr, nullptr);
      mpi_ = true;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
      MPI_Comm_size(MPI_COMM_WORLD, &size_);
    }
#endif
  }
  ~Workers() {
#ifdef TDPIPE_HAVE_MPI
    if (mpi_) MPI_Finalize();
#endif
  }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }

  /// Every process's `text`, in rank order.
  std::vector<std::string> all_gather(const std::string& text) const {
    if (size_ == 1) return {text};
    std::vector<std::string> out;
#ifdef TDPIPE_HAVE_MPI
    int len = static_cast<int>(text.size());
    std::vector<int> lens(static_cast<std::size_t>(size_)), offsets(static_cast<std::size_t>(size_), 0);
    MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD);
    int total = 0;
    for (int r = 0; r < size_; ++r) offsets[r] = total, total += lens[r];
    std::string all(static_cast<std::size_t>(total), '\0');
    MPI_Allgatherv(text.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, MPI_COMM_WORLD);
    for (int r = 0; r < size_; ++r) out.push_back(all.substr(offsets[r], lens[r]));
#endif
    return out;
  }

 private:
  bool mpi_ = false;
  int rank_ = 0, size_ = 1;
};

nlohmann::json outcome_json(const planner::Candidate& c) {
  return {{"verdict", static_cast<int>(c.verdict)}, {"reason", c.reason},
          {"planned", c.planned},                   {"iteration", c.iteration_seconds},
          {"compute", c.compute_seconds},           {"comm", c.comm_seconds},
          {"bubble", c.bubble_seconds},             {"tokens_per_second", c.tokens_per_second},
          {"mfu", c.mfu},                           {"peak_bytes", c.peak_bytes},
          {"hbm_bytes", c.hbm_bytes},               {"score", c.score}};
}

void read_outcome(const nlohmann::json& j, planner::Candidate& c) {
  c.verdict = static_cast<planner::Verdict>(j.at("verdict").get<int>());
  c.reason = j.at("reason").get<std::string>();
  c.planned = j.at("planned").get<bool>();
  c.iteration_seconds = j.at("iteration").get<double>();
  c.compute_seconds = j.at("compute").get<double>();
  c.comm_seconds = j.at("comm").get<double>();
  c.bubble_seconds = j.at("bubble").get<double>();
  c.tokens_per_second = j.at("tokens_per_second").get<double>();
  c.mfu = j.at("mfu").get<double>();
  c.peak_bytes = j.at("peak_bytes").get<double>();
  c.hbm_bytes = j.at("hbm_bytes").get<double>();
  c.score = j.at("score").get<double>();
}

std::string seconds_text(double s) {
  return s >= 1 ? fmt::format("{:.3f} s", s) : fmt::format("{:.2f} ms", s * 1e3);
}

std::string gib(double b) { return fmt::format("{:.1f} GiB", b / double(1u << 30)); }

nlohmann::json layout_json(const planner::Layout& l) {
  return {{"label", l.label()},
          {"gpus", l.gpus},
          {"tensor", l.tensor},
          {"pipeline", l.pipeline},
          {"data", l.data},
          {"chunks", l.chunks},
          {"micro_batch", l.micro_batch},
          {"global_batch", l.global_batch},
          {"recompute", ir::recompute_name(l.recompute)},
          {"sequence_parallel", l.sequence_parallel},
          {"schedule", l.schedule},
          {"slices", l.slices == planner::kAutoSlices ? nlohmann::json("auto") : nlohmann::json(l.slices)},
          {"memory_budget", l.budget},
          {"layers_per_stage", l.partition_auto ? "auto" : "even"}};
}

/// Why a search ranked nothing, with the nearest layout by memory.
std::string no_fit_message(const planner::SearchResult& res) {
  const planner::Candidate* nearest = nullptr;
  double best = 1e300;
  for (const auto& c : res.candidates) {
    if (c.verdict != planner::Verdict::NoFit || !(c.hbm_bytes > 0)) continue;
    const double need = std::max(c.static_bytes, c.peak_bytes) / c.hbm_bytes;
    if (need < best) best = need, nearest = &c;
  }
  std::string msg = fmt::format("no layout of the {} considered fits and runs", res.considered);
  if (nearest) msg += fmt::format("; the nearest, {}: {}", nearest->layout.label(), nearest->reason);
  return msg + " (more GPUs, a smaller global batch or micro-batch, or recompute)";
}

/// The category of a loser's reason: the word before its first ':'.
std::string loss_kind(const planner::Candidate& c) {
  const auto colon = c.reason.find(':');
  return colon == std::string::npos ? c.reason : c.reason.substr(0, colon);
}

void run_search(const SearchArgs& a) {
  Workers workers;
  const bool lead = workers.rank() == 0;
  ir::Scenario sc = ir::load_scenario(a.scenario);
  if (!a.profile.empty()) {
    const traces::Profile profile = traces::read_profile(a.profile);
    if (!(profile.compute_efficiency > 0))
      throw Error(fmt::format("--profile {}: search takes a software stack's profile (tdpipe calibrate --from-run), "
                              "which scales the cost model it ranks layouts with; {}", a.profile,
                              profile.model.empty()
                                  ? "a measured op profile holds for its own layout only"
                                  : "a probe calibration prices a given plan's ops on the machine it measured "
                                    "(tdpipe sim --profile for each layout you consider)"));
    traces::apply_profile_to_scenario(profile, sc);
    if (lead)
      fmt::print(stderr, "note: {}: compute efficiency {:.4f} (fitted on {})\n", a.profile, profile.compute_efficiency,
                 profile.platform.device);
  }
  planner::SearchOptions o;
  o.gpus = a.gpus;
  o.global_batches = a.global_batches;
  o.objective = planner::objective_from_string(a.objective);
  o.top = a.top;
  o.schedules = a.schedules;
  for (const auto& r : a.recomputes) o.recomputes.push_back(ir::recompute_from(r));
  o.sequence_parallel = a.sequence_parallel == "on"    ? planner::SearchOptions::Toggle::On
                        : a.sequence_parallel == "off" ? planner::SearchOptions::Toggle::Off
                                                       : planner::SearchOptions::Toggle::Both;
  o.max_micro_batch = a.max_micro_batch;
  o.max_chunks = a.max_chunks;
  o.max_ops = a.max_ops;
  // Every process must cut the same planning rounds: agree on one thread count (the least).
  if (workers.size() > 1) {
    o.threads = std::min(4, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    for (const std::string& n : workers.all_gather(std::to_string(o.threads))) o.threads = std::min(o.threads, std::stoi(n));
  }
  const auto t0 = std::chrono::steady_clock::now();
  bool shown = false;
  if (lead)
    o.progress = [&, last = t0](double f, int planned) mutable {
      const auto now = std::chrono::steady_clock::now();
      if (now - t0 < std::chrono::milliseconds(500) || (now - last < std::chrono::milliseconds(100) && f < 1)) return;
      shown = true;
      last = now;
      const int bar = static_cast<int>(f * 40);
      fmt::print(stderr, "\r  searching [{}{}] {:3.0f}%  {} planned", std::string(bar, '#'),
                 std::string(40 - bar, ' '), 100 * f, planned);
    };
  planner::Exchange exchange;
  if (workers.size() > 1)
    exchange = [&](std::vector<planner::Candidate>& cands, const std::vector<int>& mine) {
      nlohmann::json out = nlohmann::json::array();
      for (int i : mine) out.push_back({{"index", i}, {"outcome", outcome_json(cands[i])}});
      for (const std::string& text : workers.all_gather(out.dump())) {
        const nlohmann::json theirs = nlohmann::json::parse(text);
        for (const auto& e : theirs) read_outcome(e.at("outcome"), cands[e.at("index").get<int>()]);
      }
    };
  planner::SearchResult res = planner::search_layouts(sc, o, workers.rank(), workers.size(), exchange);
  if (shown) fmt::print(stderr, "\n");

  // Re-simulate the top K with SimGrid, split over the processes.
  std::vector<double> simgrid(res.top.size(), 0.0);
  std::string engine = "analytic";
#ifdef TDPIPE_HAVE_SIMGRID
  if (!a.no_simgrid) {
    engine = "simgrid";
    nlohmann::json mine = nlohmann::json::object();
    for (std::size_t k = 0; k < res.top.size(); ++k) {
      if (int(k) % workers.size() != workers.rank()) continue;
      const planner::Candidate& c = res.candidates[res.top[k]];
      try {  // a failure here costs this row its SimGrid figure, not the ranking (or an MPI hang)
        const ir::Scenario layout = planner::apply_layout(sc, c.layout);
        const planner::BuiltPlan built = planner::build_plan(layout, c.layout.schedule, c.layout.plan_slices(), o.max_ops);
        const sim::SimResult r = sim::simulate(built.lowered, sim::SimOptions{});
        mine[std::to_string(k)] = double(traces::compute_metrics(r.trace).iteration_ns) * 1e-9;
      } catch (const std::exception& e) {
        fmt::print(stderr, "note: SimGrid could not re-simulate #{} ({}): {}\n", k + 1, c.layout.label(), e.what());
        mine[std::to_string(k)] = -1.0;
      }
      if (lead) fmt::print(stderr, "  simulated #{} with SimGrid\r", k + 1);
    }
    for (const std::string& text : workers.all_gather(mine.dump())) {
      const nlohmann::json theirs = nlohmann::json::parse(text);
      for (const auto& [k, v] : theirs.items()) simgrid[std::stoul(k)] = v.get<double>();
    }
    if (lead && !res.top.empty()) fmt::print(stderr, "{}\r", std::string(40, ' '));
  }
#endif
  if (!lead) return;
  if (!a.output.empty() && !res.top.empty())
    ir::write_file_atomic(a.output,
                          ir::to_json(planner::apply_layout(sc, res.candidates[res.top.front()].layout)).dump(2) + "\n",
                          "best layout's scenario");

  // Per schedule: its best layout (ranked, else its best bound) and why it lost.
  std::map<std::string, int> best_of;
  for (int i = 0; i < int(res.candidates.size()); ++i) {
    const auto& c = res.candidates[i];
    auto it = best_of.find(c.layout.schedule);
    // Ranked by score, then bounded by their bound's score, then the dropped (by need/HBM).
    auto rank_key = [&](const planner::Candidate& x) {
      const double need = x.hbm_bytes > 0 ? std::max(x.static_bytes, x.peak_bytes) / x.hbm_bytes : 1e300;
      return std::make_pair(x.verdict == planner::Verdict::Ranked ? 0 : x.verdict == planner::Verdict::Bounded ? 1 : 2,
                            x.verdict == planner::Verdict::Ranked    ? x.score
                            : x.verdict == planner::Verdict::Bounded ? x.bound_score
                                                                     : need);
    };
    if (it == best_of.end() || rank_key(c) < rank_key(res.candidates[it->second])) best_of[c.layout.schedule] = i;
  }
  std::map<std::string, int> losses;
  for (int i = 0; i < int(res.candidates.size()); ++i)
    if (res.top.empty() || i != res.top.front()) ++losses[loss_kind(res.candidates[i])];

  if (a.csv) {
    std::ostringstream out;
    out << "rank,label,gpus,tensor,pipeline,data,chunks,micro_batch,global_batch,recompute,sequence_parallel,"
           "schedule,slices,memory_budget,layers_per_stage,verdict,bound_s,bound_kind,iteration_s,simgrid_s,"
           "tokens_per_s,mfu,peak_gib,reason\n";
    std::vector<int> rank_of(res.candidates.size(), 0);
    for (std::size_t k = 0; k < res.top.size(); ++k) rank_of[res.top[k]] = int(k) + 1;
    for (int i = 0; i < int(res.candidates.size()); ++i) {
      const auto& c = res.candidates[i];
      std::string reason;  // a CSV field: quotes doubled
      for (char ch : c.reason) reason += ch == '"' ? std::string("\"\"") : std::string(1, ch);
      const bool bounded = c.bound_seconds > 0;
      const int k = rank_of[i];
      out << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},\"{}\"\n",
                         k ? std::to_string(k) : "", c.layout.label(), c.layout.gpus, c.layout.tensor,
                         c.layout.pipeline, c.layout.data, c.layout.chunks, c.layout.micro_batch,
                         c.layout.global_batch, ir::recompute_name(c.layout.recompute), c.layout.sequence_parallel ? 1 : 0,
                         c.layout.schedule, c.layout.slices == planner::kAutoSlices ? "auto" : std::to_string(c.layout.slices),
                         c.layout.budget, c.layout.partition_auto ? "auto" : "even", planner::to_string(c.verdict),
                         bounded ? fmt::format("{:.6g}", c.bound_seconds) : "",
                         bounded ? (c.rough_bound ? "rough" : "exact") : "",
                         c.planned ? fmt::format("{:.6g}", c.iteration_seconds) : "",
                         k && simgrid[k - 1] > 0 ? fmt::format("{:.6g}", simgrid[k - 1]) : "",
                         c.planned ? fmt::format("{:.6g}", c.tokens_per_second) : "",
                         c.planned ? fmt::format("{:.4f}", c.mfu) : "",
                         c.planned ? fmt::format("{:.2f}", c.peak_bytes / double(1u << 30)) : "", reason);
    }
    std::cout << out.str();
    if (res.top.empty()) throw Error(no_fit_message(res));
    return;
  }
  if (a.json) {
    nlohmann::json j;
    j["scenario"] = sc.name;
    j["objective"] = a.objective;
    j["seconds"] = res.seconds;
    j["considered"] = res.considered;
    j["pruned_memory"] = res.pruned_memory;
    j["pruned_bound"] = res.pruned_bound;
    j["planned"] = res.planned;
    j["top"] = nlohmann::json::array();
    for (std::size_t k = 0; k < res.top.size(); ++k) {
      const auto& c = res.candidates[res.top[k]];
      nlohmann::json row = layout_json(c.layout);
      row["analytic_seconds"] = c.iteration_seconds;
      if (simgrid[k] > 0) row["simgrid_seconds"] = simgrid[k];
      row["tokens_per_second"] = c.tokens_per_second;
      row["mfu"] = c.mfu;
      row["peak_memory_bytes"] = c.peak_bytes;
      row["score"] = c.score;
      row["why"] = c.reason;
      j["top"].push_back(row);
    }
    j["best_per_schedule"] = nlohmann::json::object();
    for (const auto& [name, i] : best_of) {
      const auto& c = res.candidates[i];
      nlohmann::json row = layout_json(c.layout);
      row["verdict"] = planner::to_string(c.verdict);
      if (c.planned) row["analytic_seconds"] = c.iteration_seconds;
      row["why"] = c.reason;
      j["best_per_schedule"][name] = row;
    }
    j["losses"] = losses;
    std::cout << j.dump(2) << "\n";
    if (res.top.empty()) throw Error(no_fit_message(res));
    return;
  }
  const auto& g = sc.cluster.groups;
  fmt::print("search {} ({} layers, h={}) on {} GPUs ({}), global batch {}, objective {}\n", sc.model.name,
             sc.model.layers, sc.model.hidden, a.gpus > 0 ? a.gpus : sc.cluster.gpus(),
             g.size() == 1 ? g[0].gpu.name : "mixed",
             a.global_batches.empty() ? std::to_string(sc.parallel.global_batch) : fmt::format("{}", fmt::join(a.global_batches, ",")),
             a.objective);
  fmt::print("{} layouts: {} do not fit (memory model, before planning), {} bounded out, {} planned (analytic), "
             "{} re-simulated ({}); {:.2f} s{}\n\n",
             res.considered, res.pruned_memory, res.pruned_bound, res.planned,
             engine == "simgrid" ? res.top.size() : std::size_t{0}, "simgrid", res.seconds,
             workers.size() > 1 ? fmt::format(" on {} processes", workers.size()) : "");
  if (!res.top.empty()) {
    fmt::print("{:>2}  {:<52} {:>10} {:>10} {:>6} {:>9} {:>6} {:>9}  {}\n", "#", "layout", "analytic", "simgrid",
               "diff", "tokens/s", "MFU", "mem/GPU", "behind #1");
    for (std::size_t k = 0; k < res.top.size(); ++k) {
      const auto& c = res.candidates[res.top[k]];
      fmt::print("{:>2}  {:<52} {:>10} {:>10} {:>6} {:>9.0f} {:>5.1f}% {:>9}  {}\n", k + 1, c.layout.label(),
                 seconds_text(c.iteration_seconds), simgrid[k] > 0 ? seconds_text(simgrid[k]) : "-",
                 simgrid[k] > 0 ? fmt::format("{:+.1f}%", 100 * (simgrid[k] / c.iteration_seconds - 1)) : "-",
                 c.tokens_per_second, 100 * c.mfu, gib(c.peak_bytes), k == 0 ? "" : c.reason);
    }
  }
  fmt::print("\nbest of each schedule, and why it lost:\n");
  for (const auto& [name, i] : best_of) {
    const auto& c = res.candidates[i];
    fmt::print("  {:<12} {:<52} {:>10}  {}\n", name, c.layout.label(),
               c.planned ? seconds_text(c.iteration_seconds) : "-", c.reason);
  }
  fmt::print("\nwhy the others lost:");
  for (const auto& [kind, n] : losses) fmt::print(" {} {};", kind, n);
  fmt::print("\n");
  if (!a.output.empty() && !res.top.empty()) fmt::print("best layout's scenario written to {}\n", a.output);
  if (res.top.empty()) throw Error(no_fit_message(res));
}

}  // namespace

void add_search_command(CLI::App& app) {
  auto args = std::make_shared<SearchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "search", "Rank every layout and schedule for the scenario's model on its cluster (or --gpus N)");
  cmd->add_option("scenario", args->scenario, "Scenario file (YAML or JSON): the model and cluster")->required();
  cmd->add_option("--gpus", args->gpus, "GPUs to lay out (default: the scenario's cluster; homogeneous clusters)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--global-batch", args->global_batches,
                  "Sequences per iteration (default: the scenario's); several, comma-separated, for tokens_per_s "
                  "or cost")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  cmd->add_option("--profile", args->profile,
                  "A software stack's profile (tdpipe calibrate --from-run): its compute efficiency for every layout")
      ->check(CLI::ExistingFile);
  cmd->add_option("--top", args->top, "K: the best K by the analytic engine, re-simulated with SimGrid")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--objective", args->objective,
                  "time (iteration), tokens_per_s, or cost (GPU-hours per 1M tokens; also tries N/2, N/4, … GPUs)")
      ->check(CLI::IsMember({"time", "tokens_per_s", "cost"}))
      ->capture_default_str();
  cmd->add_option("--schedules", args->schedules, "Only these schedules (comma-separated; default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember(planner::schedule_names()));
  cmd->add_option("--recompute", args->recomputes, "Only these recompute modes (none, selective, full)")
      ->delimiter(',')
      ->check(CLI::IsMember(ir::scenario_recompute_names()));
  cmd->add_option("--sequence-parallel", args->sequence_parallel, "both, on or off")
      ->check(CLI::IsMember({"both", "on", "off"}))
      ->capture_default_str();
  cmd->add_option("--max-micro-batch", args->max_micro_batch, "Micro-batches 1, 2, 4, … up to this")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--max-chunks", args->max_chunks, "Interleaved chunks v = 2 … this")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
#ifdef TDPIPE_HAVE_SIMGRID
  cmd->add_flag("--no-simgrid", args->no_simgrid, "Skip the SimGrid re-simulation of the top K");
#endif
  auto* json = cmd->add_flag("--json", args->json, "Print JSON instead of a table");
  cmd->add_flag("--csv", args->csv, "Print every layout considered as CSV")->excludes(json);
  cmd->add_option("-o,--output", args->output, "Write the best layout's scenario (JSON) here");
  add_max_ops_option(cmd, args->max_ops);
  cmd->callback([args] { run_search(*args); });
}

}  // namespace tdpipe::apps
