// cmd_trace.cpp — `tdpipe trace stats|convert`: what a trace says, in tdpipe's terms, and
// the same trace in another format (Chrome/Perfetto JSON, or per-rank Kineto files for
// HTA). Reads every format read_trace knows (tdpipe and Chrome JSON, Kineto files or
// folders, Nsight Systems SQLite exports).
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "tdpipe/traces/metrics.hpp"
#include "tdpipe/traces/trace_io.hpp"

namespace tdpipe::apps {
namespace {

struct TraceArgs {
  std::string input, output, to = "chrome";
  bool json = false;
};

void run_stats(const TraceArgs& a) {
  const traces::Trace t = traces::read_trace(a.input);
  const traces::Metrics m = traces::compute_metrics(t);
  if (a.json) {
    nlohmann::json ranks = nlohmann::json::array();
    for (std::size_t r = 0; r < m.ranks.size(); ++r) {
      const auto& x = m.ranks[r];
      ranks.push_back({{"rank", r},
                       {"span", x.span_ns * 1e-9},
                       {"compute", x.compute_ns * 1e-9},
                       {"exposed_comm", x.exposed_comm_ns * 1e-9},
                       {"hidden_comm", x.hidden_comm_ns * 1e-9},
                       {"idle_in_span", x.idle_in_span_ns() * 1e-9},
                       {"idle_fraction", x.idle_fraction}});
    }
    std::cout << nlohmann::json{{"trace", a.input},
                                {"origin", t.origin},
                                {"schedule", t.schedule},
                                {"scenario", t.scenario},
                                {"ranks", t.ranks},
                                {"events", t.events.size()},
                                {"iteration_time", m.iteration_ns * 1e-9},
                                {"bubble_fraction", m.bubble_fraction},
                                {"per_rank", std::move(ranks)}}
                     .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
    return;
  }
  fmt::print("{}: {} trace{}{}, {} ranks, {} events\n", a.input, t.origin,
             t.schedule.empty() ? "" : ", schedule " + t.schedule, t.scenario.empty() ? "" : ", scenario " + t.scenario,
             t.ranks, t.events.size());
  fmt::print("iteration {:.6f} s (first start to last end, all ranks), bubble {:.2f} % (1 − mean compute / iteration)\n",
             m.iteration_ns * 1e-9, 100 * m.bubble_fraction);
  fmt::print("{:>5} {:>12} {:>12} {:>12} {:>12} {:>12} {:>8}\n", "rank", "span ms", "compute ms", "exposed ms",
             "hidden ms", "idle ms", "idle %");
  for (std::size_t r = 0; r < m.ranks.size(); ++r) {
    const auto& x = m.ranks[r];
    fmt::print("{:>5} {:>12.3f} {:>12.3f} {:>12.3f} {:>12.3f} {:>12.3f} {:>8.2f}\n", r, x.span_ns * 1e-6,
               x.compute_ns * 1e-6, x.exposed_comm_ns * 1e-6, x.hidden_comm_ns * 1e-6, x.idle_in_span_ns() * 1e-6,
               100 * x.idle_fraction);
  }
  fmt::print("span: the rank's first op start to last op end; idle: span − compute − exposed comm;\n"
             "idle %: (iteration − compute) / iteration, the rank's share of the bubble\n");
}

void run_convert(const TraceArgs& a) {
  const traces::Trace t = traces::read_trace(a.input);
  traces::write_trace(t, a.output, traces::trace_format_from_string(a.to));
  fmt::print("{} ({} ranks, {} events) → {} ({})\n", a.input, t.ranks, t.events.size(), a.output,
             a.to == "kineto" ? fmt::format("{} Kineto files, rank<N>.json", t.ranks) : "Chrome/Perfetto JSON");
}

}  // namespace

void add_trace_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("trace", "Read a trace in any format tdpipe knows: its metrics, or convert it");
  cmd->require_subcommand(1);
  const char* input_help =
      "Trace: tdpipe/Chrome JSON, a Kineto file or a folder of per-rank Kineto files (.json or .json.gz), "
      "or an Nsight Systems SQLite export";

  auto stats = std::make_shared<TraceArgs>();
  CLI::App* s = cmd->add_subcommand("stats", "Per-rank compute, communication and idle time of a trace");
  s->add_option("trace", stats->input, input_help)->required()->check(CLI::ExistingPath);
  s->add_flag("--json", stats->json, "Print JSON instead of a table");
  s->callback([stats] { run_stats(*stats); });

  auto convert = std::make_shared<TraceArgs>();
  CLI::App* c = cmd->add_subcommand("convert", "Write a trace in another format");
  c->add_option("trace", convert->input, input_help)->required()->check(CLI::ExistingPath);
  c->add_option("output", convert->output,
                "Output: a file (chrome) or a folder of rank<N>.json files (kineto; HTA reads it)")
      ->required();
  c->add_option("--to", convert->to, "Output format")->check(CLI::IsMember({"chrome", "kineto"}))->capture_default_str();
  c->callback([convert] { run_convert(*convert); });
}

}  // namespace tdpipe::apps
