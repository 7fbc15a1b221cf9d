// commands.hpp — each `tdpipe` subcommand registers itself on the CLI11 app.
#pragma once

#include <cstdint>

#include <CLI/CLI.hpp>

#include "tdpipe/planner/build_plan.hpp"

namespace tdpipe::apps {

/// --max-ops N on a command that builds plans (planner::kDefaultMaxOps by default).
inline void add_max_ops_option(CLI::App* cmd, std::int64_t& max_ops) {
  max_ops = planner::kDefaultMaxOps;
  cmd->add_option("--max-ops", max_ops, "Refuse plans estimated to have more ops than this (memory guard)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

void add_plan_command(CLI::App& app);     // cmd_plan.cpp
void add_sim_command(CLI::App& app);      // cmd_sim.cpp
void add_compare_command(CLI::App& app);  // cmd_compare.cpp
#ifdef TDPIPE_HAVE_EXEC
void add_exec_command(CLI::App& app);       // cmd_exec.cpp
void add_calibrate_command(CLI::App& app);  // cmd_calibrate.cpp
#endif

}  // namespace tdpipe::apps
