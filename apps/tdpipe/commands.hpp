// commands.hpp — each `tdpipe` subcommand registers itself on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace tdpipe::apps {

void add_plan_command(CLI::App& app);     // cmd_plan.cpp
void add_sim_command(CLI::App& app);      // cmd_sim.cpp
void add_compare_command(CLI::App& app);  // cmd_compare.cpp
#ifdef TDPIPE_HAVE_EXEC
void add_exec_command(CLI::App& app);       // cmd_exec.cpp
void add_calibrate_command(CLI::App& app);  // cmd_calibrate.cpp
#endif

}  // namespace tdpipe::apps
