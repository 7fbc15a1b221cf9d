// commands.hpp — each `tdpipe` subcommand registers itself on the CLI11 app.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tdpipe/planner/build_plan.hpp"

namespace tdpipe::apps {

/// The prediction engine `sim` and `serve` use unless told: SimGrid where the build has it.
#ifdef TDPIPE_HAVE_SIMGRID
inline constexpr const char* kDefaultEngine = "simgrid";
#else
inline constexpr const char* kDefaultEngine = "analytic";
#endif

/// The command line `tdpipe` was started with (main sets it): what `--backend cuda`
/// hands to tdpipe-cuda unchanged.
void set_invocation(int argc, char** argv);
const std::vector<std::string>& invocation();

/// --max-ops N on a command that builds plans (planner::kDefaultMaxOps by default).
inline void add_max_ops_option(CLI::App* cmd, std::int64_t& max_ops) {
  max_ops = planner::kDefaultMaxOps;
  cmd->add_option("--max-ops", max_ops, "Refuse plans estimated to have more ops than this (memory guard)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

/// --slices N|auto on a command that builds plans: N ≥ 1 temporal slices, or `auto`
/// (planner::kAutoSlices: TeraPipe's cuts). Left out: the scenario's.
inline void add_slices_option(CLI::App* cmd, int& slices) {
  cmd->add_option_function<std::string>(
         "--slices",
         [&slices](const std::string& text) {
           if (text == "auto") {
             slices = planner::kAutoSlices;
             return;
           }
           int v = 0;
           try {
             std::size_t used = 0;
             v = std::stoi(text, &used);
             if (used != text.size()) v = 0;
           } catch (const std::exception&) {
             v = 0;
           }
           if (v < 1) throw CLI::ValidationError("--slices", "expected a positive integer or auto, got " + text);
           slices = v;
         },
         "Temporal slices S for tdpipe and auto: a count, or `auto` (TeraPipe's dynamic programme picks S "
         "and the cuts)")
      ->type_name("N|auto");
}

void add_plan_command(CLI::App& app);     // cmd_plan.cpp
void add_sim_command(CLI::App& app);      // cmd_sim.cpp
void add_serve_command(CLI::App& app);    // cmd_serve.cpp
void add_compare_command(CLI::App& app);  // cmd_compare.cpp
void add_balance_command(CLI::App& app);  // cmd_balance.cpp
void add_search_command(CLI::App& app);   // cmd_search.cpp
void add_import_command(CLI::App& app);   // cmd_import.cpp
void add_trace_command(CLI::App& app);    // cmd_trace.cpp
void add_completion_command(CLI::App& app);  // cmd_completion.cpp: after the others
#ifdef TDPIPE_HAVE_EXEC
void add_exec_command(CLI::App& app);       // cmd_exec.cpp
void add_calibrate_command(CLI::App& app);  // cmd_calibrate.cpp
#endif

}  // namespace tdpipe::apps
